"""Run a node harness script (web/tests/*_harness.mjs) on a JSON case file; returns its JSON output."""
import json
import subprocess
import tempfile
from pathlib import Path


def run_harness(harness: Path, cases: dict, node_flags: tuple = ()) -> dict:
    """node_flags: e.g. ("--experimental-wasm-relaxed-simd",) for the relaxed-SIMD builds (Node 20's V8
    has relaxed SIMD behind that flag; Chromium has it on)."""
    with tempfile.TemporaryDirectory() as tmp:
        cin, cout = Path(tmp) / "cases.json", Path(tmp) / "out.json"
        cin.write_text(json.dumps(cases))
        proc = subprocess.run(["node", *node_flags, str(harness), str(cin), str(cout)], capture_output=True, text=True)
        assert proc.returncode == 0, f"node harness failed:\n{proc.stdout}\n{proc.stderr}"
        return json.loads(cout.read_text())


def run_module(module: Path, alias: str, script: str, timeout: int = 120):
    """An ES module snippet with `alias` bound to `module` (import * as alias); it prints one JSON value."""
    src = f'import * as {alias} from "{module.as_uri()}";\n{script}'
    proc = subprocess.run(["node", "--input-type=module", "-e", src], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
