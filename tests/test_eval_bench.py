"""`exactspec bench --quick` end to end in headless Chromium (2 prompts, 2 arms, few tokens): the
run resumes from its checkpoints, results.json and report.md are well formed, the eight plots
exist in PNG and SVG, and a run recorded under other gates is refused. Run under the browser
lock (see README)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = "pytest-smoke"
RUN_DIR = os.path.join(REPO, "build", "eval", RUN)
ARGS = ["bench", "--run", RUN, "--quick", "--backends", "wasm", "--no-wllama", "--samples", "3", "--max-new-tokens", "6"]


def bench(*args):
    return subprocess.run([sys.executable, "-m", "exactspec", *args], cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def smoke():
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    first = bench(*ARGS)
    assert first.returncode == 0, first.stderr[-2000:]
    yield first
    shutil.rmtree(RUN_DIR, ignore_errors=True)


def test_quick_run_writes_well_formed_results(smoke):
    assert "8 requests planned, 0 already done" in smoke.stdout
    with open(os.path.join(RUN_DIR, "results.json")) as f:
        res = json.load(f)
    assert res["plan"]["arms"] == {"wasm": ["none", "draft-adaptive"]} and len(res["plan"]["prompts"]) == 2
    assert {a["arm"] for a in res["arms"]} == {"none", "draft-adaptive"}
    assert all(a["requests"] == 2 for a in res["arms"])
    gates = {v["id"]: v for v in res["gates"]["wasm"]["verdicts"]}
    assert gates["greedy_identity"]["value"] == 0 and gates["greedy_identity"]["passed"] is True
    assert gates["peak_memory"]["value"] is not None
    assert res["identities"]["same_prompt_ids_everywhere"] is True
    assert len(res["distribution"]["none"]) == 3
    assert res["conclusions"]["wasm"].split(":")[0] in ("adopt", "keep off", "adopt only for some strata")
    for name, paths in res["plots"].items():
        assert [os.path.splitext(p)[1] for p in paths] == [".png", ".svg"] and all(os.path.getsize(p) > 1000 for p in paths)
    assert len(res["plots"]) == 8
    with open(os.path.join(RUN_DIR, "report.md")) as f:
        report = f.read()
    assert "## Gates" in report and "| wasm | greedy_identity | 0 | == | 0 | pass |" in report


def test_rerun_resumes_from_checkpoints(smoke):
    again = bench(*ARGS)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "8 requests planned, 8 already done" in again.stdout


def test_report_refuses_a_run_recorded_under_other_gates(smoke):
    path = os.path.join(RUN_DIR, "run.json")
    with open(path) as f:
        run = json.load(f)
    run["plan"]["gates_sha256"] = "0" * 64
    with open(path, "w") as f:
        json.dump(run, f)
    r = bench("bench", "--run", RUN, "--report-only")
    assert r.returncode == 1
    assert "E_MANIFEST_MISMATCH" in r.stderr and "invalidates the run" in r.stderr
