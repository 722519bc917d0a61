"""The CPU module has one name: wasm/build.sh writes cpu.wasm and cpu_mt.wasm (and their relaxed-SIMD twins
cpu_relaxed.wasm, cpu_mt_relaxed.wasm) and nothing else, and no
code in the repository loads a module by the names of the old separate builds (docs/champion_wasm.md)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
OLD_NAMES = re.compile(r"""[/"'`](?:champion|champion_mt|draft)\.wasm\b""")   # a path or URL naming an old module
CODE = (".py", ".mjs", ".js", ".sh", ".json", ".html")


def test_build_writes_only_the_cpu_module(tmp_path):
    subprocess.run(["bash", str(REPO_ROOT / "wasm" / "build.sh"), str(tmp_path)], check=True, capture_output=True, timeout=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.wasm", "cpu_mt.wasm", "cpu_mt_relaxed.wasm",
                                                           "cpu_relaxed.wasm"]
    # i32x4.relaxed_dot_i8x16_i7x16_add_s is opcode 0xfd 0x113 (LEB128: fd 93 02): only in the relaxed builds
    relaxed_dot = b"\xfd\x93\x02"
    for name in ("cpu", "cpu_mt"):
        assert relaxed_dot not in (tmp_path / f"{name}.wasm").read_bytes()
        assert relaxed_dot in (tmp_path / f"{name}_relaxed.wasm").read_bytes()


def old_module_paths(paths: list[Path]) -> list[str]:
    return [f"{p}:{n}" for p in paths
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OLD_NAMES.search(line)]


def test_no_code_names_an_old_module(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    code = [REPO_ROOT / f for f in tracked if f.endswith(CODE) and (REPO_ROOT / f).is_file()
            and f != "tests/test_wasm_build_outputs.py"]
    assert len(code) > 100 and old_module_paths(code) == []
    planted = tmp_path / "old.mjs"                               # the check can fail; a JS property is not a path
    planted.write_text('const u = new URL("../build/draft.wasm", base);\nconst x = champion.wasm.memory;\n')
    assert [s.split(":")[-1] for s in old_module_paths([planted])] == ["1"]
