"""exactspec.host.safe_files, the one way exactspec writes a file: never through a link (planted before the
write, or swapped in while it runs), the old file kept whole when a write fails, and no other writer
in py/exactspec or the tools that write for the command line (a source scan)."""
import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from exactspec.core.errors import E_IO, ExactSpecError
from exactspec.evaluation.runner import Checkpoints, _write_json
from exactspec.host.safe_files import _interrupts_held, append_text, copy_file, create_new, replacing, write_file
from exactspec.formats.safetensors import write_safetensors

ROOT = Path(__file__).resolve().parents[1]
VICTIM = b"the victim's own line\n"


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM)
    return path


def _refused(call, link) -> None:
    with pytest.raises(ExactSpecError) as e:
        call()
    assert e.value.code == E_IO and e.value.message.startswith(f"{link}: is a symbolic link"), e.value.message


@pytest.mark.parametrize("writer", [
    lambda p: write_file(p, b"new"), lambda p: write_file(p, "new"), lambda p: append_text(p, "new\n"),
    lambda p: write_safetensors(p, {"w": ("F32", (1,), b"\0\0\0\0")}), lambda p: _write_json(str(p), {"a": 1}),
    lambda p: copy_file(__file__, p),
])
def test_every_writer_refuses_a_link_and_leaves_its_target_alone(tmp_path, victim, writer):
    for target in ("victim.txt", "absent.txt"):   # an existing file, and a dangling link that would create one
        link = tmp_path / f"link_to_{target}"
        link.symlink_to(target)
        _refused(lambda: writer(link), link)
        assert victim.read_bytes() == VICTIM and not (tmp_path / "absent.txt").exists()
        assert link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link_to_absent.txt", "link_to_victim.txt", "victim.txt"]


def test_a_link_swapped_in_during_the_write_is_replaced_not_followed(tmp_path, victim):
    out = tmp_path / "out.json"
    out.write_text("old")
    with replacing(out, "w") as f:
        f.write("new")
        out.unlink()
        out.symlink_to("victim.txt")   # planted after the check, before the rename
    assert victim.read_bytes() == VICTIM
    assert not out.is_symlink() and out.read_text() == "new"


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, failure):
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    with pytest.raises(failure):
        with replacing(out) as f:
            f.write(b"half of the new")
            raise failure()
    assert out.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_create_new_opens_only_a_name_that_did_not_exist(tmp_path, victim):
    with create_new(tmp_path / "fresh") as f:
        f.write(b"x")
    with pytest.raises(ExactSpecError) as e:
        create_new(tmp_path / "fresh")
    assert e.value.code == E_IO
    (tmp_path / "link").symlink_to("victim.txt")
    _refused(lambda: create_new(tmp_path / "link"), tmp_path / "link")


def test_write_errors_are_one_coded_line(tmp_path):
    (tmp_path / "a_dir").mkdir()
    with pytest.raises(ExactSpecError) as e:
        write_file(tmp_path / "a_dir", b"x")
    assert e.value.code == E_IO and e.value.message.startswith(f"{tmp_path / 'a_dir'}: cannot write (")
    with pytest.raises(ExactSpecError) as e:
        write_file(tmp_path / "missing" / "x", b"x")
    assert (e.value.code, e.value.message) == (E_IO, f"{tmp_path / 'missing' / 'x'}: cannot write (No such file or directory)")
    assert os.listdir(tmp_path) == ["a_dir"]


def test_bench_checkpoints_append_and_refuse_a_link(tmp_path, victim):
    run = Checkpoints(str(tmp_path / "run"))
    run.append("wasm:none", {"a": 1})
    run.append("wasm:none", {"a": 2})
    assert run.load_all() == [{"a": 1}, {"a": 2}]
    os.symlink(victim, run.path("wasm:draft"))
    _refused(lambda: run.append("wasm:draft", {"a": 3}), run.path("wasm:draft"))
    assert victim.read_bytes() == VICTIM


def test_plots_are_written_through_the_helper(tmp_path, victim):
    from exactspec.evaluation.plots import _save
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure()
    try:
        assert [Path(p).read_bytes()[:4] for p in _save(fig, str(tmp_path), "a")] == [b"\x89PNG", b"<?xm"]
        (tmp_path / "b.png").symlink_to("victim.txt")
        _refused(lambda: _save(fig, str(tmp_path), "b"), tmp_path / "b.png")
    finally:
        plt.close(fig)
    assert victim.read_bytes() == VICTIM


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupts_wait_until_the_renames_are_done(sig):
    """A signal sent to the process while move_into_place's renames run (another thread alive,
    as in a test run or a server) reaches its handler after the last rename, once."""
    seen, stop = [], threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    previous = signal.signal(sig, lambda *_: seen.append("delivered"))
    try:
        with _interrupts_held():
            os.kill(os.getpid(), sig)
            threading.Event().wait(0.05)
            seen.append("renames done")
    finally:
        signal.signal(sig, previous)
        stop.set()
    assert seen == ["renames done", "delivered"]


def test_the_snapshot_tool_refuses_a_link_before_any_work(tmp_path, victim):
    (tmp_path / "index.json").symlink_to(victim)
    r = subprocess.run(["node", "tools/pyodide_snapshot.mjs", str(tmp_path)], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"pyodide snapshot: E_IO: {tmp_path / 'index.json'}: is a symbolic link; exactspec never writes through a link"]
    assert victim.read_bytes() == VICTIM and sorted(os.listdir(tmp_path)) == ["index.json", "victim.txt"]


# Every way a file is written in these sources goes through exactspec.host.safe_files (Python) or the
# snapshot tool's writeFresh ("wx", then rename). Writers left on purpose are named here, with why.
SCANNED = ["py/exactspec/**/*.py", "tools/*.py", "tools/*.mjs", "tools/bench/*.py"]
LEFT_ALONE = {
    "py/exactspec/host/safe_files.py": "the helper itself",
    "tools/fetch_models.py": "its own mkstemp (O_EXCL) + os.replace into the folder it creates",
    "tools/synth_models.py": "test fixtures: transformers' save_pretrained writes the folder it makes",
}
WRITES = re.compile(r"""\bopen\(.*["'](w|wb|a|ab|x|xb|w\+|wb\+|a\+|r\+|rb\+)["']|\.write_(text|bytes)\(|"""
                    r"""shutil\.(copy|copyfile|copy2|move|copytree)\(|save_file\(|np\.save\(|\.tofile\(|"""
                    r"""\.savefig\((?!f,)|json\.dump\(|os\.replace\(|createWriteStream\(|writeFileSync\((?!tmp, )""")


def test_no_writer_bypasses_the_helper():
    hits = []
    for pattern in SCANNED:
        for path in sorted(ROOT.glob(pattern)):
            rel = path.relative_to(ROOT).as_posix()
            if rel in LEFT_ALONE:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if WRITES.search(line) and not line.lstrip().startswith(("#", "//", "*")):
                    hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, "write through exactspec.host.safe_files:\n" + "\n".join(hits)


def test_the_scan_sees_each_kind_of_write():
    for line in ['with open(p, "w") as f:', "open(os.path.join(a, b), 'wb')", "p.write_text(s)", "shutil.copyfile(a, b)",
                 "json.dump(x, f)", "fig.savefig(path)", "fs.writeFileSync(file, data)", "os.replace(a, b)"]:
        assert WRITES.search(line), line
    for line in ['open(p, "rb")', "json.dumps(x)", "fig.savefig(f, format=ext)", 'fs.writeFileSync(tmp, data, { flag: "wx" })',
                 "os.fdopen(fd, 'wb')", json.dumps({"mode": "w"})]:
        assert not WRITES.search(line), line
