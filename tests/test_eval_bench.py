"""`exactspec bench --quick` end to end in headless Chromium (dev split, 2 prompts, arms champion
alone and auto, few tokens): the run resumes from its checkpoints; every engine load is recorded
with its breakdown, calibration and batch-invariance check; auto's choices and the distribution
samples are recorded; results.json and report.md are well formed, the plots exist in PNG and SVG,
and a run recorded under other gates is refused. Run under the browser lock (see README)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from exactspec.core.auto_policy import AutoPolicy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = "pytest-smoke"
RUN_DIR = os.path.join(REPO, "build", "eval", RUN)
ARGS = ["bench", "--run", RUN, "--split", "dev", "--quick", "--samples", "3", "--max-new-tokens", "6", "--load-repeats", "2"]


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
    assert "8 requests planned, 0 already done; 27 samples planned, 0 already done" in smoke.stdout
    with open(os.path.join(RUN_DIR, "results.json")) as f:
        res = json.load(f)
    assert res["plan"]["arms"] == {"toy-wasm": ["none", "auto"]} and len(res["plan"]["prompts"]) == 2
    assert res["plan"]["split"] == "dev" and res["plan"]["pairs"] == ["toy"]
    assert {a["arm"] for a in res["arms"]} == {"none", "auto"}
    assert all(a["requests"] == 2 for a in res["arms"])
    gates = {v["id"]: v for v in res["gates"]["toy-wasm"]["verdicts"]}
    assert gates["greedy_identity"]["value"] == 0 and gates["greedy_identity"]["verdict"] == "pass"
    assert res["identities"]["same_prompt_ids_everywhere"] is True
    assert res["commit"] and res["versions"]["policy"] == {"name": "auto", "version": AutoPolicy.version}
    for name, paths in res["plots"].items():
        assert [os.path.splitext(p)[1] for p in paths] == [".png", ".svg"] and all(os.path.getsize(p) > 1000 for p in paths)
    with open(os.path.join(RUN_DIR, "report.md")) as f:
        assert "## Gates" in f.read()


def test_every_load_is_recorded_with_its_breakdown_calibration_and_batch_check(smoke):
    with open(os.path.join(RUN_DIR, "run.json")) as f:
        run = json.load(f)
    assert set(run["loads"]) == {"toy-wasm-warmup", "toy-wasm-alone", "toy-wasm-spec"}
    # --load-repeats 2: each timed engine loaded once more, timed and unloaded
    assert [len(run["loads"][f"toy-wasm-{r}"]["load_ms_repeats"]) for r in ("alone", "spec")] == [1, 1]
    assert all(x > 0 for r in ("alone", "spec") for x in run["loads"][f"toy-wasm-{r}"]["load_ms_repeats"])
    assert all(t["total"] > 0 and "pyodide" in t for r in ("alone", "spec") for t in run["loads"][f"toy-wasm-{r}"]["timing_ms_repeats"])
    for name, load in run["loads"].items():
        assert load["pair"] == "toy" and load["backend"] == "wasm" and load["topology"] == "toy-wasm"
        assert load["load_ms"] > 0 and load["timing_ms"]["total"] > 0
        assert {"champion_load", "warmup", "calibration", "batch_check"} <= set(load["timing_ms"]), load["timing_ms"]
        assert load["calibration"]["version"] == 1 and load["calibration"]["verify_ms"][1] > 0
        assert load["batch_check"] and load["batch_check"] == load["info"]["batch_check"]
    # every load measured its own calibration (the timed loads do not read back the cold throwaway load's)
    assert all(load["calibration"]["source"] == "measured" for load in run["loads"].values())
    assert run["loads"]["toy-wasm-spec"]["calibration"]["draft_ms_per_proposal"] > 0
    assert run["loads"]["toy-wasm-alone"]["calibration"]["draft_ms_per_proposal"] is None
    assert set(run["cold"]) == {"toy-wasm-alone", "toy-wasm-spec"} and run["cold"]["toy-wasm-spec"]["arm"] == "auto"
    # both timed engines run the thread count the throwaway load chose (asked for, not chosen again)
    threads = {name: load["info"]["champion"] for name, load in run["loads"].items()}
    assert threads["toy-wasm-alone"]["threads"] == threads["toy-wasm-spec"]["threads"] == threads["toy-wasm-warmup"]["threads"]
    assert threads["toy-wasm-alone"]["threads_why"] == threads["toy-wasm-spec"]["threads_why"] == "requested"


def test_auto_requests_record_their_choices_and_samples_their_first_tokens(smoke):
    recs = []
    for name in os.listdir(os.path.join(RUN_DIR, "arms")):
        with open(os.path.join(RUN_DIR, "arms", name)) as f:
            recs += [json.loads(line) for line in f if line.strip()]
    auto = [r for r in recs if r.get("kind") == "request" and r["arm"] == "auto"]
    assert len(auto) == 4 and all(r["topology"] == "toy-wasm" and r["split"] == "dev" for r in auto)
    for r in auto:
        assert r["auto"]["policy"] == "auto" and sum(r["auto"]["rounds_by_method"].values()) == sum(x[5] for x in r["rounds"])
        assert len(r["auto_rounds"]) == len(r["rounds"])
        assert all(m in ("none", "draft", "lookup") and isinstance(k, int) and reason for m, k, reason in r["auto_rounds"])
    # a calibration a request's drift made due is recorded with it (eval.mjs waits for it); mostly none
    requests = [r for r in recs if r.get("kind") == "request"]
    assert all("recalibration" in r for r in requests)
    assert all(r["recalibration"] is None or r["recalibration"]["verify_ms"][1] > 0 for r in requests)
    samples = [r for r in recs if r.get("kind") == "sample"]
    assert sorted({(s["arm"], s["prompt_id"]) for s in samples}) == sorted(
        (a, p) for a in ("none", "auto", "draft-k4") for p in ("adversarial-1", "casual-1", "code-3"))
    assert len(samples) == 27 and all(1 <= len(s["token_ids"]) <= 4 and s["temperature"] == 1.0 for s in samples)


def test_rerun_resumes_from_checkpoints(smoke):
    again = bench(*ARGS)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "8 requests planned, 8 already done; 27 samples planned, 27 already done" in again.stdout


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
