"""The orchestrator worker's Pyodide memory snapshot (tools/pyodide_snapshot.mjs, restored by
web/orchestrator/boot.mjs): used when it is current; when the served exactspec sources differ from
the ones it was made from, its exactspec modules are dropped and the served ones imported; a
snapshot whose bytes do not hash to its index, or none at all, means the ordinary boot. Every
case reports its status in ready.info.pyodide_snapshot and gives the same greedy answer."""
import json
import os
import subprocess

import pytest

from browser_fixture import REPO_ROOT, browser_page, chromium_browser, http_server  # noqa: F401
from engine_loads import FAST_LOAD

SNAPSHOT = REPO_ROOT / "build" / "pyodide_snapshot"
VARIANTS = REPO_ROOT / "build" / "test_snapshots"
MODELS = {"champion": "/web/models/champion/", "draft": "/web/models/draft/"}


@pytest.fixture(scope="module")
def snapshot():
    if not (SNAPSHOT / "index.json").exists():      # set-up makes it; a bare checkout makes it here
        subprocess.run(["node", "tools/pyodide_snapshot.mjs"], check=True, cwd=REPO_ROOT)
    return json.loads((SNAPSHOT / "index.json").read_text())


def variant(name: str, index: dict) -> str:
    """A served copy of the snapshot with this index.json: its URL path."""
    d = VARIANTS / name
    d.mkdir(parents=True, exist_ok=True)
    target = d / "snapshot.bin"
    if target.exists():
        target.unlink()
    os.link(SNAPSHOT / "snapshot.bin", target)
    (d / "index.json").write_text(json.dumps(index))
    return f"/build/test_snapshots/{name}/"


def load_and_answer(page, server, snapshot_path: str):
    page.goto(server.url + "/web/runner.html")
    page.wait_for_function("() => window.runnerReady === true")
    ready = page.evaluate("([m, o]) => window.exactspecRunner.load(m, o)",
                          [MODELS, {"championBackend": "wasm", "assets": {"snapshot": server.url + snapshot_path}, **FAST_LOAD}])
    out = page.evaluate("(p) => window.exactspecRunner.generate(p)",
                        {"prompt": "And the LORD said unto Moses,", "config": {"speculate": "draft", "temperature": 0,
                                                                               "max_new_tokens": 12}})
    return ready["info"]["pyodide_snapshot"], out["result"]["token_ids"]


def test_snapshot_used_refreshed_or_refused(browser_page, http_server, snapshot):  # noqa: F811
    status, want = load_and_answer(browser_page, http_server, "/build/pyodide_snapshot/")
    assert status == "used" and len(want) == 12
    cases = {
        "stale_sources": ({**snapshot, "py_sources": "0" * 64}, "used (exactspec sources changed since: re-imported)"),
        "bad_sha256": ({**snapshot, "sha256": "0" * 64}, "sha256 differs from its index.json"),
        "other_pyodide": ({**snapshot, "pyodide_version": "0.0.1"}, f"made for pyodide 0.0.1, not {snapshot['pyodide_version']}"),
    }
    for name, (index, expected) in cases.items():
        status, got = load_and_answer(browser_page, http_server, variant(name, index))
        assert status == expected, name
        assert got == want, name
    status, got = load_and_answer(browser_page, http_server, "/build/test_snapshots/none/")
    assert status.startswith("absent (HTTP 404") and got == want
