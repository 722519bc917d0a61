"""Gates and corpus lock: evaluation on synthetic metrics, a changed gate file refused, the
corpus lock catching an added, removed or changed file, and the shipped corpus and gates valid."""
import json
import math
import os
import shutil

import pytest

from exactspec.core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, ExactSpecError
from exactspec.evaluation import analysis as A
from exactspec.evaluation.corpus import (FIELDS, check_lock, file_hashes, load_corpus, lock_of, record_test_run,
                                        recorded_test_runs, select, write_lock)
from exactspec.evaluation.gates import (GATES_V2_PATH, GATES_V3_PATH, GATES_V4_PATH, check_same_gates, deciding_cell, evaluate, evaluate_v2, gates_hash, judge,
                                       load_gates)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = {"version": 1, "gates": [
    {"id": "same", "metric": "mismatches", "op": "==", "threshold": 0},
    {"id": "fast", "metric": "speedup", "op": ">=", "threshold": 2.0},
    {"id": "lean", "metric": "memory", "op": "<=", "threshold": 1.3},
    {"id": "strata", "metric": "per", "op": ">=", "threshold": 0.95, "per_stratum": True},
    {"id": "absent", "metric": "nothing", "op": ">=", "threshold": 1}]}


def test_gate_verdicts_exact():
    v = {g["id"]: g for g in evaluate(DOC, {"mismatches": 0, "speedup": 1.999, "memory": 1.3,
                                            "per": {"code": 1.2, "chat": 0.94, "json": None}})}
    assert v["same"]["passed"] is True and v["fast"]["passed"] is False and v["lean"]["passed"] is True
    assert v["strata"]["passed"] is False and v["strata"]["value"] == 0.94
    assert v["strata"]["per_stratum"] == {"code": (1.2, True), "chat": (0.94, False), "json": (None, None)}
    assert v["absent"]["passed"] is False and v["absent"]["value"] is None and v["absent"]["verdict"] == "fail (no data)"
    assert evaluate(DOC, {"per": {"code": 0.95}})[3]["passed"] is True


def test_no_data_is_a_fail_never_a_pass():
    """gates.evaluate (v1) once returned passed None for a metric without data, and the conclusion
    counted it as a pass: now every gate without data is "fail (no data)" with passed False."""
    v = {g["id"]: g for g in evaluate(DOC, {})}
    assert all(g["verdict"] == "fail (no data)" and g["passed"] is False for g in v.values())
    part = {g["id"]: g for g in evaluate(DOC, {"per": {"code": 1.2, "json": None}})}["strata"]
    assert part["verdict"] == "fail (no data)" and part["passed"] is False
    assert A.conclusion(evaluate(DOC, {"mismatches": 0}), {}) != "adopt"


def test_gate_file_is_checked_and_hashed(tmp_path):
    p = tmp_path / "gates.json"
    p.write_text(json.dumps(DOC))
    doc, h = load_gates(str(p))
    assert doc == DOC and h == gates_hash(json.dumps(DOC))
    p.write_text(json.dumps({"version": 1, "gates": [{"id": "x", "metric": "m", "op": "~", "threshold": 1}]}))
    with pytest.raises(ExactSpecError) as e:
        load_gates(str(p))
    assert e.value.code == E_BAD_ARGUMENT


def test_a_changed_gate_file_invalidates_the_run():
    h = gates_hash("a")
    check_same_gates(h, h)
    with pytest.raises(ExactSpecError) as e:
        check_same_gates(h, gates_hash("a "))
    assert e.value.code == E_MANIFEST_MISMATCH and "invalidates the run" in e.value.message


@pytest.mark.parametrize("change", ["edit", "add", "remove"])
def test_corpus_lock_catches_every_change(tmp_path, change):
    d = tmp_path / "corpus"
    shutil.copytree(os.path.join(REPO, "eval", "corpus"), d)
    lock = lock_of(file_hashes(str(d)))
    assert check_lock(str(d), lock) == lock["corpus_sha256"]
    name = sorted(os.listdir(d))[0]
    if change == "edit":
        (d / name).write_text((d / name).read_text() + "\n")
    elif change == "add":
        (d / "extra.jsonl").write_text("")
    else:
        os.remove(d / name)
    with pytest.raises(ExactSpecError) as e:
        check_lock(str(d), lock)
    assert e.value.code == E_MANIFEST_MISMATCH


CORPUS, LOCK = os.path.join(REPO, "eval", "corpus"), os.path.join(REPO, "eval", "corpus.lock.json")
STRATA = {"casual", "dialogue", "summary", "extraction", "json", "code", "repetitive", "unicode", "long_context", "adversarial",
          "structured"}


def test_shipped_corpus_matches_its_lock_and_covers_the_strata():
    dev, h_dev = load_corpus(CORPUS, LOCK, "dev")
    test, h_test = load_corpus(CORPUS, LOCK, "test")
    assert h_dev != h_test
    for split, prompts, count in (("dev", dev, 3), ("test", test, 2)):
        assert {p["stratum"] for p in prompts} == STRATA
        assert all(sum(p["stratum"] == s for p in prompts) == count for s in STRATA)
        assert all(sorted(set(p) - {"response_format"}) == sorted(FIELDS) and p["split"] == split for p in prompts)
        # the structured stratum, and only it, carries a constraint (a JSON Schema), the same for every arm
        assert all((p["stratum"] == "structured") == ("response_format" in p) for p in prompts)
        assert all(p["response_format"]["type"] == "json_schema" for p in prompts if p["stratum"] == "structured")
    # the test split is prompts no run read before evaluation v2: ids -4 and -5 (v1's 30 prompts are all dev;
    # the structured stratum joined with issue 22: its -1..-3 dev, -4 and -5 test, as every stratum)
    assert sorted(p["id"].rsplit("-", 1)[1] for p in test) == ["4"] * 11 + ["5"] * 11
    everything = dev + test
    assert len({p["seed"] for p in everything}) == len(everything) and any(p["chat"] for p in test)
    assert [p["stratum"] for p in select(test, 1)] == sorted(STRATA)
    with open(LOCK) as f:
        lock = json.load(f)
    assert lock["splits"]["dev"]["sha256"] == h_dev and lock["splits"]["test"]["sha256"] == h_test
    doc, _ = load_gates(os.path.join(REPO, "eval", "gates.json"))
    assert {g["id"] for g in doc["gates"]} >= {"greedy_identity", "conversational_t1_2x", "no_stratum_below", "peak_memory"}


def test_a_dev_run_cannot_read_the_test_prompts(tmp_path):
    dev, _ = load_corpus(CORPUS, LOCK, "dev")
    assert dev and all(p["split"] == "dev" for p in dev)
    assert not {p["id"] for p in dev} & set(json.load(open(LOCK))["splits"]["test"]["ids"])
    with pytest.raises(ExactSpecError) as e:
        load_corpus(CORPUS, LOCK, "all")
    assert e.value.code == E_BAD_ARGUMENT
    with pytest.raises(TypeError):
        load_corpus(CORPUS, LOCK)                      # the split is always chosen, never defaulted to both
    # a test prompt moved into dev (and the files re-locked) is refused against the lock the run was planned with
    d = tmp_path / "corpus"
    shutil.copytree(CORPUS, d)
    write_lock(str(d), str(tmp_path / "lock.json"))
    planned = json.load(open(tmp_path / "lock.json"))
    path = d / "casual.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[3]["id"] == "casual-4" and lines[3]["split"] == "test"
    lines[3]["split"] = "dev"
    path.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n")
    planned["files"] = file_hashes(str(d))            # even with the file hashes refreshed by hand
    (tmp_path / "lock2.json").write_text(json.dumps(planned))
    with pytest.raises(ExactSpecError) as e:
        load_corpus(str(d), str(tmp_path / "lock2.json"), "dev")
    assert e.value.code == E_MANIFEST_MISMATCH and "dev split differs" in e.value.message


def test_test_split_runs_are_counted_once_per_run(tmp_path):
    path = str(tmp_path / "runs.json")
    assert recorded_test_runs(path) == []
    assert record_test_run("a", "abc", "2026-12-02", path) == 1
    assert record_test_run("a", "abc", "2026-12-02", path) == 1     # a resumed run is not counted again
    assert record_test_run("b", "def", "2026-12-03", path) == 2
    assert [r["run"] for r in recorded_test_runs(path)] == ["a", "b"]
    with open(os.path.join(REPO, "eval", "test_split_runs.json")) as f:
        assert isinstance(json.load(f)["runs"], list)


V2 = {"version": 2, "gates": [
    {"id": "same", "metric": "mismatches", "op": "==", "threshold": 0, "applies_to": "all"},
    {"id": "fast", "metric": "speedup", "op": ">=", "threshold": 1.5, "ci": True, "applies_to": ["real-wasm"]},
    {"id": "lean", "metric": "memory", "op": "<=", "threshold": 1.3, "ci": True},
    {"id": "strata", "metric": "per", "op": ">=", "threshold": 0.95, "per_stratum": True, "ci": True}]}


def test_ci_verdicts_pass_fail_inconclusive_and_no_data():
    assert judge(1.6, ">=", 1.5, (1.51, 1.7)) == "pass"
    assert judge(1.6, ">=", 1.5, (1.49, 1.7)) == "inconclusive"      # the point clears, the interval does not
    assert judge(1.4, ">=", 1.5, (1.3, 1.49)) == "fail"
    assert judge(1.4, ">=", 1.5, (1.3, 1.5)) == "inconclusive"
    assert judge(1.2, "<=", 1.3, (1.1, 1.29)) == "pass" and judge(1.2, "<=", 1.3, (1.1, 1.35)) == "inconclusive"
    assert judge(1.4, "<=", 1.3, (1.31, 1.5)) == "fail"
    assert judge(None, ">=", 1.5, None) == "fail (no data)" and judge(0, "==", 0) == "pass"


def test_v2_gates_per_topology_and_per_stratum_cells():
    m = {"mismatches": 0, "speedup": {"value": 1.6, "ci": (1.52, 1.7)}, "memory": {"value": 1.1, "ci": (1.05, 1.2)},
         "per": {"code T=0": {"value": 1.0, "ci": (0.96, 1.04)}, "code T=1": {"value": 0.97, "ci": (0.9, 1.05)}}}
    v = {g["id"]: g for g in evaluate_v2(V2, m, "real-wasm")}
    assert v["same"]["verdict"] == "pass" and v["fast"]["verdict"] == "pass" and v["lean"]["verdict"] == "pass"
    assert v["strata"]["verdict"] == "inconclusive" and v["strata"]["passed"] is False
    assert v["strata"]["value"] == 0.97 and v["strata"]["ci"] == (0.9, 1.05)      # the deciding cell is shown
    assert v["strata"]["cell"] == "code T=1"
    assert "fast" not in {g["id"] for g in evaluate_v2(V2, m, "toy-wasm")}          # applies_to
    m["per"]["json T=0"] = {"value": None, "ci": None}
    assert {g["id"]: g for g in evaluate_v2(V2, m, "toy-wasm")}["strata"]["verdict"] == "fail (no data)"
    m["per"]["json T=1"] = {"value": 0.8, "ci": (0.7, 0.9)}
    assert {g["id"]: g for g in evaluate_v2(V2, m, "toy-wasm")}["strata"]["verdict"] == "fail"
    none = {g["id"]: g for g in evaluate_v2(V2, {}, "real-wasm")}
    assert all(g["verdict"] == "fail (no data)" and not g["passed"] for g in none.values())
    # a CI gate given a value without an interval cannot pass
    assert evaluate_v2(V2, {"speedup": 2.0}, "real-wasm")[1]["verdict"] == "inconclusive"


def test_the_cell_shown_is_the_one_that_decides_the_verdict_not_the_lowest_value():
    # test-split run #15's toy-webgpu headline named a passing cell (1.09x [1.08, 1.11]) as auto's
    # worst stratum of an inconclusive gate: the lowest value, where a wider interval decided it
    per = {"long T=1": {"value": 1.09, "ci": (1.08, 1.11)}, "code T=0": {"value": 1.2, "ci": (0.9, 1.6)},
           "json T=0": {"value": 1.3, "ci": (0.94, 1.7)}}
    v = {g["id"]: g for g in evaluate_v2(V2, {"per": per}, "real-wasm")}["strata"]
    assert v["verdict"] == "inconclusive" and v["cell"] == "code T=0" and v["ci"] == (0.9, 1.6)
    per["unicode T=1"] = {"value": 1.5, "ci": (0.85, 1.2)}                 # the interval nearest to failing
    assert {g["id"]: g for g in evaluate_v2(V2, {"per": per}, "real-wasm")}["strata"]["cell"] == "unicode T=1"
    per["code T=1"] = {"value": 1.25, "ci": (0.91, 0.94)}                  # a failing cell outranks any
    assert {g["id"]: g for g in evaluate_v2(V2, {"per": per}, "real-wasm")}["strata"]["cell"] == "code T=1"
    cells = {"a": {"value": 1.0, "ci": (0.8, 1.2), "verdict": "inconclusive"},
             "b": {"value": 1.0, "ci": (0.9, 1.3), "verdict": "inconclusive"}}
    assert deciding_cell(cells, ">=") == "a" and deciding_cell(cells, "<=") == "b"
    assert deciding_cell({}, ">=") is None


def test_shipped_gates_v2_are_written_with_their_rule():
    doc, _ = load_gates(os.path.join(REPO, GATES_V2_PATH))
    assert doc["version"] == 2 and doc["confidence_interval"]["resamples"] == 2000
    assert "inconclusive" in doc["verdict_rule"] and "fail (no data)" in doc["verdict_rule"]
    ids = {g["id"]: g for g in doc["gates"]}
    assert ids["auto_never_slower"]["threshold"] == 0.95 and ids["auto_never_slower"]["ci"] and ids["auto_never_slower"]["per_stratum"]
    assert ids["auto_keeps_best_fixed"]["threshold"] == 0.9 and ids["greedy_identity"]["threshold"] == 0
    assert ids["real_conversational_t1"]["threshold"] == 1.5 and ids["real_conversational_t1"]["applies_to"] == ["real-wasm"]
    assert ids["end_to_end_with_loads"]["ci"] and ids["distribution"]["threshold"] == 0.001
    assert "per generated token" in doc["speedup"]


def _synthetic_run(run_dir):
    """A run directory as the runner leaves it (run.json + checkpoints) for one topology, with
    per-stratum auto speed-ups chosen to give each verdict: casual constant 1.25x (pass), dialogue
    0.90-1.10x (inconclusive), json 0.8x (fail); summary planned but never run (fail (no data))."""
    from exactspec.evaluation.runner import Checkpoints
    _, g_hash = load_gates(os.path.join(REPO, GATES_V2_PATH))
    ck = Checkpoints(str(run_dir))
    speed = {"casual": [1.25, 1.25], "dialogue": [0.9, 1.1], "json": [0.8, 0.8]}
    for s, ratios in speed.items():
        for i, ratio in enumerate(ratios):
            for t in (0.0, 1.0):
                for arm, ms in (("none", 100.0), ("auto", 100.0 / ratio), ("draft-k2", 90.0), ("none-spec", 100.0 / 1.1)):
                    ck.append(f"toy-wasm:{arm}", {
                        "kind": "request", "pair": "toy", "topology": "toy-wasm", "backend": "wasm", "engine": "toy-wasm-" + ("alone" if arm == "none" else "spec"),
                        "arm": arm, "prompt_id": f"{s}-{i}", "stratum": s, "split": "test", "temperature": t, "rep": 0, "seed": i,
                        "token_ids": list(range(10)), "n_tokens": 10, "max_new_tokens": 10, "first_token_ms": 10.0, "total_ms": ms,
                        "timing_ms": {"prefill": 5.0, "draft": 0.0, "verify": 0.0, "accept": 0.0, "total": ms - 1},
                        "rounds": [[0, 0, 1, 0.0, 3.0]] * 10, "auto": {"rounds_by_method": {"none": 10}} if arm == "auto" else None,
                        "peak_resident_bytes": {"champion": 1000, "draft": 100 if arm != "none" else 0}})
    for arm in ("none", "auto"):
        for seed in range(40):
            ck.append("samples__toy-wasm", {"kind": "sample", "pair": "toy", "backend": "wasm", "topology": "toy-wasm", "arm": arm,
                                            "prompt_id": "casual-0", "temperature": 1.0, "seed": seed, "token_ids": [seed % 3, 1, 2, 3]})
    run = {"run": run_dir.name, "commit": "abc1234", "versions": {"policy": "auto v1", "scheduler": "adaptive-k 3"},
           "test_split_runs": 1, "plan": {"split": "test", "split_sha256": "0" * 64, "gates_sha256": g_hash, "gates_version": 2,
                                          "prompts": sorted({f"{s}-{i}" for s in speed for i in range(2)}), "temperatures": [0.0, 1.0],
                                          "pairs": ["toy"], "strata": ["casual", "dialogue", "json", "summary"]},
           "loads": {"toy-wasm-alone": {"pair": "toy", "backend": "wasm", "topology": "toy-wasm", "load_ms": 1000.0,
                                        "timing_ms": {"champion_load": 500.0, "pyodide": 300.0},
                                        "load_ms_repeats": [1100.0, 900.0],
                                        "timing_ms_repeats": [{"champion_load": 520.0, "pyodide": 280.0}, {"champion_load": 480.0, "pyodide": 310.0}]},
                     "toy-wasm-spec": {"pair": "toy", "backend": "wasm", "topology": "toy-wasm", "load_ms": 1200.0, "load_ms_repeats": [1000.0, 1050.0],
                                       "timing_ms_repeats": [{"champion_load": 510.0, "pyodide": 700.0, "draft_load": 0.0}, None],
                                       "timing_ms": {"champion_load": 500.0, "draft_load": 150.0, "pyodide": 600.0},
                                       "draft_ready_ms": 1400.0, "draft_calibrated_ms": 1700.0}}}
    with open(os.path.join(run_dir, "run.json"), "w") as f:
        json.dump(run, f)


def test_report_from_the_raw_file_alone_is_reproducible_and_judges_by_intervals(tmp_path):
    from exactspec.evaluation.report import pack_raw, read_raw, write_report_from_raw
    run_dir = tmp_path / "synthetic-run"
    _synthetic_run(run_dir)
    raw = str(tmp_path / "docs" / "raw.jsonl.gz")
    packed = pack_raw(str(run_dir), raw, with_entropy=False)
    first = open(raw, "rb").read()
    assert pack_raw(str(run_dir), raw, with_entropy=False)["bytes"] == len(first) and open(raw, "rb").read() == first
    shutil.rmtree(run_dir)                                   # nothing but the raw file from here on
    info, requests, samples, _ = read_raw(raw)
    assert info["commit"] == "abc1234" and len(requests) == 48 and len(samples) == 80 and packed["lines"] == 129
    a = write_report_from_raw(raw, str(tmp_path / "one"), with_plots=False)
    b = write_report_from_raw(raw, str(tmp_path / "two"), with_plots=False)
    one, two = (open(tmp_path / d / "report.md").read() for d in ("one", "two"))
    assert one == two and a["gates"] == b["gates"]
    cells = {v["id"]: v for v in a["gates"]["toy-wasm"]["verdicts"]}["auto_never_slower"]["cells"]
    assert cells["casual T=1"]["verdict"] == "pass" and cells["casual T=1"]["ci"] == pytest.approx((1.25, 1.25))
    assert cells["dialogue T=0"]["verdict"] == "inconclusive" and cells["json T=0"]["verdict"] == "fail"
    assert cells["summary T=0"]["verdict"] == "fail (no data)"
    assert "| toy-wasm | auto_never_slower | 0.8 (json T=0) | [0.8, 0.8] | >= | 0.95 | **fail** |" in one
    assert "| toy-wasm | dialogue | 0 | 2 | 0.995x | [0.900, 1.100] | **inconclusive** |" in one
    assert "| toy-wasm | greedy_identity | 0 | no CI | == | 0 | pass |" in one
    # the control (champion alone on auto's engine, 1.1x faster than on its own engine here): auto / control = 1.25 / 1.1
    assert "| toy-wasm | casual | 1 | 2 | 1.250x | [1.250, 1.250] | pass | draft-k2 | 1.125 | [1.125, 1.125] | pass | 1.136 | [1.136, 1.136] |" in one
    assert "| toy-wasm | real_conversational_t1 |" not in one                  # applies to real-wasm only
    assert "The test split has been run 1 time(s)" in one and "<!-- headline: generated by exactspec bench -->" in one
    # end to end with loads: (1000 + 256 x 10) / (1200 + 256 x 10 / ratio) per conversational request at T = 1
    e2e = {v["id"]: v for v in a["gates"]["toy-wasm"]["verdicts"]}["end_to_end_with_loads"]
    want = [(1000 + 2560) / (1200 + 2560 / r) for r in (1.25, 1.25, 0.9, 1.1)]
    assert e2e["value"] == pytest.approx(math.exp(sum(map(math.log, want)) / 4))
    in_way = [(1000 + 2560) / (1700 + 2560 / r) for r in (1.25, 1.25, 0.9, 1.1)]   # the background draft in front
    assert f"Had a session's first request waited for all of it: {math.exp(sum(map(math.log, in_way)) / 4):.2f}x." in one
    # beside the gate, each engine's median load (1000 and 1050 ms here) in the same statistic
    at_median = [(1000 + 2560) / (1050 + 2560 / r) for r in (1.25, 1.25, 0.9, 1.1)]
    assert "| toy-wasm-spec | 1200 (again: 1000, 1050) |" in one
    assert (f"champion alone 1000 ms, champion + draft 1050 ms; not the gate, which gates_v2.json defines on the timed "
            f"load): end to end {math.exp(sum(map(math.log, at_median)) / 4):.2f}x [") in one
    assert "the draft in the background: in at 1400, calibrated at 1700" in one
    # which stage a slower engine loses time in: medians over every load of each role, largest gap first
    # (alone: pyodide 300, 280, 310 -> 300; spec: 600, 700 -> 650; a repeat without a breakdown skipped)
    assert "toy-wasm: stages to ready, median over every load of each role (each engine pair's timed load and the " \
           "further loads; champion alone / champion + draft, ms): pyodide 300 / 650, champion_load 500 / 505." in one


def _pairs(topology, stratum, ratios, t=1.0, arm="auto", mismatch=False):
    """champion alone and `arm` requests (10 tokens each) whose per-token speed-ups are `ratios`."""
    out = []
    for i, r in enumerate(ratios):
        base = {"topology": topology, "backend": topology.split("-")[1], "prompt_id": f"{stratum}-{i}", "stratum": stratum,
                "temperature": t, "rep": 0, "n_tokens": 10}
        out += [{**base, "arm": "none", "total_ms": 100.0, "token_ids": list(range(10))},
                {**base, "arm": arm, "total_ms": 100.0 / r, "token_ids": [9] * 10 if mismatch else list(range(10))}]
    return out


@pytest.mark.parametrize("case, want", [("pass", "pass"), ("fail", "fail"), ("inconclusive", "inconclusive"), ("none", "fail (no data)")])
def test_every_v2_gate_from_synthetic_records(case, want):
    doc, _ = load_gates(os.path.join(REPO, GATES_V2_PATH))
    conv = doc["conversational_strata"]
    ratios = {"pass": [2.0, 2.0], "fail": [1.1, 1.2], "inconclusive": [1.2, 2.0], "none": []}[case]
    recs = [x for s in conv for x in _pairs("real-wasm", s, ratios)]
    recs += [x for s in conv for x in _pairs("real-wasm", s, ratios, t=0.0)]
    rows = A.per_token_rows(recs)
    loads = {"real-wasm-alone": {"load_ms": 100.0}, "real-wasm-spec": {"load_ms": 300.0}}
    import random
    rng = random.Random(1)
    samples = [] if case == "none" else [
        {"topology": "real-wasm", "prompt_id": "p", "arm": arm, "seed": i,
         "token_ids": [rng.choice([1, 2]) if (arm == "none" or case != "fail") else 3]}
        for arm in ("none", "auto") for i in range(60)]
    metrics = {
        "greedy_mismatches": A.greedy_mismatches_v2(recs + ([] if case != "fail" else _pairs("real-wasm", "casual", [1.0], t=0.0, arm="draft-k4", mismatch=True)), "real-wasm"),
        "distribution_min_adjusted_p": A.distribution_tests(samples, "real-wasm")["min_adjusted_p"],
        "auto_speedup_per_stratum": A.auto_speedup_cells(rows, "real-wasm", conv, [0.0, 1.0]),
        "auto_over_best_fixed_per_stratum": A.auto_over_best_fixed_cells(rows, "real-wasm", conv, [0.0, 1.0]),
        "conversational_t1_auto_speedup": A.conversational_auto(rows, "real-wasm", conv),
        "end_to_end_gain_with_loads": A.end_to_end_with_loads(rows, loads, "real-wasm", conv, doc["end_to_end_tokens"])}
    v = {g["id"]: g["verdict"] for g in evaluate_v2(doc, metrics, "real-wasm")}
    assert v["real_conversational_t1"] == want
    assert v["auto_never_slower"] == {"inconclusive": "pass", "fail": "pass"}.get(case, want)      # all above 0.95x
    assert v["auto_keeps_best_fixed"] == ("fail (no data)" if case == "none" else "pass")          # best fixed = none
    # end to end: (100 + 256 x 10) / (300 + 256 x 10 / r): 2x -> 1.86 (pass), 1.1-1.2x -> 1.02-1.1 (pass at 1.0)
    assert v["end_to_end_with_loads"] == {"fail": "pass", "inconclusive": "pass"}.get(case, want)
    assert v["greedy_identity"] == {"inconclusive": "pass"}.get(case, want)
    assert v["distribution"] == {"inconclusive": "pass"}.get(case, want)
    assert v["peak_memory"] == v["break_even"] == "fail (no data)" and "cost_model" not in v      # not given; toy-wasm only
    # the no-CI gates, and the end-to-end gate failing and inconclusive, from their values
    assert {g["id"]: g["verdict"] for g in evaluate_v2(doc, {"peak_memory_ratio": 1.31, "n_min_tokens": 256,
            "end_to_end_gain_with_loads": {"value": 0.9, "ci": (0.85, 0.99)}}, "toy-wasm")}.items() >= {
        "peak_memory": "fail", "break_even": "pass", "end_to_end_with_loads": "fail"}.items()
    e2e = {g["id"]: g for g in evaluate_v2(doc, {"end_to_end_gain_with_loads": {"value": 1.0, "ci": (0.98, 1.02)}}, "toy-wasm")}
    assert e2e["end_to_end_with_loads"]["verdict"] == "inconclusive"


def test_each_topology_is_judged_over_its_planned_strata(tmp_path):
    from exactspec.evaluation.report import pack_raw, read_raw, summarise
    _synthetic_run(tmp_path / "run")
    raw = str(tmp_path / "raw.jsonl.gz")
    pack_raw(str(tmp_path / "run"), raw, with_entropy=False)
    info, requests, samples, failures = read_raw(raw)
    info["plan"]["strata_by_topology"] = {"toy-wasm": ["casual"]}
    res = summarise(info, requests, samples, failures)
    ns = {v["id"]: v for v in res["gates"]["toy-wasm"]["verdicts"]}["auto_never_slower"]
    assert sorted(ns["cells"]) == ["casual T=0", "casual T=1"] and ns["verdict"] == "pass"
    info["plan"]["strata_by_topology"] = {"toy-wasm": ["casual", "code"]}          # planned, never run
    ns = {v["id"]: v for v in summarise(info, requests, samples, failures)["gates"]["toy-wasm"]["verdicts"]}["auto_never_slower"]
    assert ns["verdict"] == "fail (no data)" and ns["cells"]["code T=1"]["verdict"] == "fail (no data)"
    info["plan"]["split"] = "dev"
    assert summarise(info, requests, samples, failures)["conclusions"]["toy-wasm"].endswith(
        "(dev split: tuning information, not the preregistered verdict)")


def test_fit_to_the_champions_exact_first_token_distribution():
    """Samples drawn from the champion's exact first-token distribution fit it; an arm that always
    writes the most likely token does not (a fault both arms shared would show here, not in the gate)."""
    import random
    from exactspec.evaluation.entropy import champion_first_token_probs
    from exactspec.evaluation.report import fit_to_champion
    from exactspec.reference.models import default_models_dir
    prompt = {p["id"]: p for p in load_corpus(CORPUS, LOCK, "dev")[0]}["casual-1"]
    q = champion_first_token_probs(prompt, default_models_dir())
    ids, rng = list(q), random.Random(0)
    samples = [{"topology": "toy-wasm", "prompt_id": "casual-1", "arm": "auto", "seed": i,
                "token_ids": [rng.choices(ids, [q[x] for x in ids])[0]]} for i in range(150)]
    samples += [{"topology": "toy-wasm", "prompt_id": "casual-1", "arm": "none", "seed": i, "token_ids": [max(q, key=q.get)]}
                for i in range(150)]
    fit = {x["arm"]: x for x in fit_to_champion(samples, default_models_dir())}
    assert fit["auto"]["p"] > 0.01 and fit["none"]["p"] < 1e-10 and fit["auto"]["n"] == 150


def test_end_to_end_with_a_background_draft_counts_the_load_to_ready_and_states_the_draft_in_the_way():
    """A draft loaded in the background (after ready, while the engine is idle): the gate's L_spec is
    the load to ready; value_draft_in_the_way puts the draft's load and calibration (to
    draft_calibrated_ms) in front of the session instead, so the report can say what that would cost."""
    rows = A.per_token_rows([x for s in ("casual", "dialogue") for x in _pairs("real-wasm", s, [1.1, 1.1])])
    loads = {"real-wasm-alone": {"load_ms": 1000.0},
             "real-wasm-spec": {"load_ms": 1000.0, "draft_ready_ms": 1500.0, "draft_calibrated_ms": 1800.0}}
    e2e = A.end_to_end_with_loads(rows, loads, "real-wasm", ["casual", "dialogue"], 256)
    assert e2e["value"] == pytest.approx((1000 + 2560) / (1000 + 2560 / 1.1))
    assert e2e["value_draft_in_the_way"] == pytest.approx((1000 + 2560) / (1800 + 2560 / 1.1))
    assert e2e["draft_in_background_to_ms"] == 1800.0 and e2e["load_spec_ms"] == 1000.0
    waited = A.end_to_end_with_loads(rows, {**loads, "real-wasm-spec": {"load_ms": 1800.0}}, "real-wasm", ["casual", "dialogue"], 256)
    assert waited["value"] == pytest.approx(e2e["value_draft_in_the_way"]) and waited["value_draft_in_the_way"] is None
    # break-even and the waterfall still charge the draft's own load when it came in the background
    assert A.draft_load_ms({"real-wasm-spec": {"timing_ms": {"draft_load": 0}, "draft_load_ms": 240.0}}, "real-wasm") == 240.0
    assert A.draft_load_ms({"real-wasm-spec": {"timing_ms": {"draft_load": 600.0}}}, "real-wasm") == 600.0


def test_the_median_of_further_loads_is_reported_beside_the_gate_and_leaves_the_gate_alone():
    """--load-repeats: each engine's further loads (load_ms_repeats) give the report a median load;
    the gate's own statistic keeps the timed engine's one load (gates_v2.json)."""
    rows = A.per_token_rows([x for s in ("casual", "dialogue") for x in _pairs("real-wasm", s, [1.1, 1.1])])
    loads = {"real-wasm-alone": {"load_ms": 1000.0, "load_ms_repeats": [1200.0, 1100.0]},
             "real-wasm-spec": {"load_ms": 3000.0, "load_ms_repeats": [1300.0, None, 1250.0]},
             "toy-wasm-alone": {"load_ms": 500.0}}
    med = A.loads_at_median(loads)
    assert med["real-wasm-alone"]["load_ms"] == 1100.0 and med["real-wasm-spec"]["load_ms"] == 1300.0
    assert med["toy-wasm-alone"] is loads["toy-wasm-alone"] and loads["real-wasm-spec"]["load_ms"] == 3000.0
    gate = A.end_to_end_with_loads(rows, loads, "real-wasm", ["casual", "dialogue"], 256)
    assert gate["value"] == pytest.approx((1000 + 2560) / (3000 + 2560 / 1.1))
    at_median = A.end_to_end_with_loads(rows, med, "real-wasm", ["casual", "dialogue"], 256)
    assert at_median["value"] == pytest.approx((1100 + 2560) / (1300 + 2560 / 1.1))


def test_calibrations_measured_again_after_drift_are_listed_per_engine():
    """Each request's `recalibration` (the calibration its drift made due, which the bench's page
    waited for after it) lands in the results per engine, naming the request; requests without one,
    and records from before the field existed, add nothing."""
    from exactspec.evaluation.report import recalibrations
    cal = {"verify_ms": [None, 55.0, 56.0, 58.0, 68.0, 78.0, 88.0, 98.0, 108.0, 119.0], "measured_n": [1, 3, 9]}
    base = {"engine": "toy-webgpu-spec", "arm": "auto", "prompt_id": "code-4", "temperature": 1.0, "rep": 0}
    records = [{**base, "recalibration": None}, {**base, "recalibration": cal}, {**base, "engine": "toy-webgpu-alone"},
               {**base, "arm": "draft-k4", "prompt_id": "json-4", "temperature": 0.0, "recalibration": {**cal, "measured_n": [1, 2]}}]
    assert recalibrations(records) == {"toy-webgpu-spec": [
        {"after": "auto code-4 T=1 rep 0", "v1_ms": 55.0, "v5_ms": 78.0, "measured_n": [1, 3, 9]},
        {"after": "draft-k4 json-4 T=0 rep 0", "v1_ms": 55.0, "v5_ms": 78.0, "measured_n": [1, 2]}]}
    assert recalibrations([base]) == {}


def _arm_row(topology, arm, t, value):
    return {"topology": topology, "arm": arm, "temperature": t, "speedup_per_token": value, "ci": (value - 0.01, value + 0.01)}


@pytest.mark.parametrize("control,gap", [(1.05, True), (0.95, True), (1.01, False), (0.99, False)])
def test_the_engines_difference_is_named_when_it_exceeds_two_percent_either_way(control, gap):
    """The conclusion's note on the engines: champion alone on auto's engine over champion alone's
    engine per T, auto's cells against its own engine, and the warning only beyond 2% (a faster or
    a slower control engine both make the never-slower cells read the engines)."""
    from exactspec.evaluation.report import _engines_sentence
    rows = [_arm_row("toy-wasm", "none", 0.0, 1.0), _arm_row("toy-wasm", "none-spec", 0.0, 1.0),
            _arm_row("toy-wasm", "none-spec", 1.0, control), _arm_row("real-wasm", "none-spec", 0.0, 1.3)]
    cells = {"code T=0": {"value": 0.97}, "json T=1": {"value": 1.03}, "casual T=0": {"value": None}}
    e = A.engine_difference(rows, cells, "toy-wasm")
    assert e["control_over_alone"] == {0.0: {"value": 1.0, "ci": (0.99, 1.01)}, 1.0: {"value": control, "ci": (control - 0.01, control + 0.01)}}
    assert e["auto_over_control"] == [0.97, 1.03] and e["gap"] is gap
    said = _engines_sentence(e)
    assert f"{control:.3f}x [{control - 0.01:.3f}, {control + 0.01:.3f}] at T = 1" in said and "0.970x to 1.030x" in said
    assert ("measure the engines' difference" in said) is gap
    assert A.engine_difference(rows, cells, "toy-webgpu") is None and _engines_sentence(None) == ""


# ---- gates v3: several engine pairs, cluster bootstrap ----
def _in_pairs(topology, stratum, ratio_by_pair, prompts=4, t=1.0):
    """champion alone and auto requests on engine pairs 0..n-1 (repeat r on pair r), auto's per-token
    speed-up constant within a pair: ratio_by_pair[j]."""
    out = []
    for j, ratio in enumerate(ratio_by_pair):
        for rec in _pairs(topology, stratum, [ratio] * prompts, t):
            out.append({**rec, "rep": j, "engine_pair": j})
    return out


def test_a_v3_cell_resamples_the_engine_pairs_and_a_v2_cell_does_not():
    """Auto 1.06x on one engine pair, 0.94x on the next, 1.0x on the third (the engines' draw, no
    mode's doing): the v3 cell's interval spans the pairs and its never-slower verdict is
    inconclusive; the same requests read as one engine pair (v2's method) give a narrow interval."""
    recs = _in_pairs("toy-wasm", "casual", [1.06, 0.94, 1.0])
    rows = A.per_token_rows(recs)
    assert {r["pair"] for r in rows} == {0, 1, 2}
    cell = A.auto_speedup_cells(rows, "toy-wasm", ["casual"], [1.0])["casual T=1"]
    assert cell["pairs"] == 3 and cell["ci"][0] <= 0.94 + 1e-9 and cell["ci"][1] >= 1.06 - 1e-9
    one = A.auto_speedup_cells([{**r, "pair": 0} for r in rows], "toy-wasm", ["casual"], [1.0])["casual T=1"]
    assert one["pairs"] == 1 and one["value"] == pytest.approx(cell["value"]) and one["ci"][0] > 0.97
    doc, _ = load_gates(os.path.join(REPO, GATES_V3_PATH))
    ns = {v["id"]: v for v in evaluate_v2(doc, {"auto_speedup_per_stratum": {"casual T=1": cell}}, "toy-wasm")}["auto_never_slower"]
    assert ns["verdict"] == "inconclusive"
    # the paired cells (auto against the best fixed arm, against its own engine) cluster by auto's pair too
    best = A.auto_over_best_fixed_cells(rows, "toy-wasm", ["casual"], [1.0])["casual T=1"]
    assert best["pairs"] == 3 and best["ci"][1] - best["ci"][0] > 0.1


def test_end_to_end_in_v3_charges_each_request_its_own_pairs_loads():
    """Pair 0's engines loaded in 1000 / 1200 ms, pair 1's in 1000 / 3000: each request's gain uses the
    loads of the pair that served it, and the interval resamples the pairs with their loads."""
    recs = [r for s in ("casual", "dialogue") for r in _in_pairs("real-wasm", s, [1.1, 1.1], prompts=2)]
    rows = A.per_token_rows(recs)
    loads = {"real-wasm-alone": {"load_ms": 1000.0}, "real-wasm-spec": {"load_ms": 1200.0},
             "real-wasm-alone-pair1": {"load_ms": 1000.0}, "real-wasm-spec-pair1": {"load_ms": 3000.0}}
    e2e = A.end_to_end_with_loads(rows, loads, "real-wasm", ["casual", "dialogue"], 256)
    g0, g1 = (1000 + 2560) / (1200 + 2560 / 1.1), (1000 + 2560) / (3000 + 2560 / 1.1)
    assert e2e["value"] == pytest.approx(math.sqrt(g0 * g1)) and e2e["n"] == 8
    assert e2e["ci"] == pytest.approx((g1, g0))                      # pairs drawn: (1, 1) ... (0, 0)
    assert e2e["load_spec_ms"] == 1200.0                             # the first pair's, as in v2
    missing = {k: v for k, v in loads.items() if k != "real-wasm-spec-pair1"}
    assert A.end_to_end_with_loads(rows, missing, "real-wasm", ["casual", "dialogue"], 256)["value"] is None   # no data: a fail


def test_shipped_gates_v3_are_v2_with_the_engine_pairs_method_only():
    v2, _ = load_gates(os.path.join(REPO, GATES_V2_PATH))
    v3, _ = load_gates(os.path.join(REPO, GATES_V3_PATH))
    assert v3["version"] == 3 and v3["engine_pairs"]["count"] == 3
    assert "engine pairs with replacement" in v3["confidence_interval"]["method"]
    same = lambda g: {k: v for k, v in g.items() if k != "what"}
    assert [same(g) for g in v3["gates"]] == [same(g) for g in v2["gates"]]     # no threshold, metric or scope moved
    assert {k for k in v3 if v3[k] != v2.get(k)} == {"version", "written", "engine_pairs", "confidence_interval", "gates"}
    assert [g["id"] for g, h in zip(v3["gates"], v2["gates"]) if g != h] == ["end_to_end_with_loads"]   # its loads: the pair's


def test_a_v3_run_is_judged_by_its_own_gate_file_and_says_how_its_intervals_were_drawn(tmp_path):
    from exactspec.evaluation.report import pack_raw, report_markdown, write_report_from_raw
    run_dir = tmp_path / "v3-run"
    _synthetic_run(run_dir)
    run_json = run_dir / "run.json"
    run = json.loads(run_json.read_text())
    _, v3_hash = load_gates(os.path.join(REPO, GATES_V3_PATH))
    run["plan"].update(gates_path=GATES_V3_PATH, gates_sha256=v3_hash, gates_version=3, engine_pairs={"toy-wasm": 3})
    run_json.write_text(json.dumps(run))
    raw = str(tmp_path / "raw.jsonl.gz")
    pack_raw(str(run_dir), raw, with_entropy=False)
    res = write_report_from_raw(raw, str(tmp_path / "out"), with_plots=False)
    assert res["gates_version"] == 3 and res["gates_file"] == "gates_v3.json"
    text = report_markdown(res)
    assert "gates v3): speed-ups per generated token against the champion alone, 95% cluster-bootstrap intervals " \
           "(engine pairs, then requests; engine pairs: toy-wasm 3)." in text
    assert "## Gates (v3:" in text and "which gates_v3.json defines on the timed loads of each engine pair" in text
    run["plan"]["gates_sha256"] = "0" * 64                           # recorded under another file: refused
    run_json.write_text(json.dumps(run))
    pack_raw(str(run_dir), raw, with_entropy=False)
    with pytest.raises(ExactSpecError):
        write_report_from_raw(raw, str(tmp_path / "out2"), with_plots=False)


def test_shipped_gates_v4_are_v3_with_two_method_notes_only():
    """v4 moves no gate, threshold, arm or interval: it adds the constraint warm-up and WebGPU's gate
    repeats (count 4), and new runs are recorded under it."""
    v3, _ = load_gates(os.path.join(REPO, GATES_V3_PATH))
    v4, _ = load_gates(os.path.join(REPO, GATES_V4_PATH))
    assert v4["version"] == 4 and v4["webgpu_gate_repeats"]["count"] == 4 and "response_format" in v4["constraint_warmup"]
    assert v4["gates"] == v3["gates"] and v4["confidence_interval"] == v3["confidence_interval"]
    assert {k for k in set(v3) | set(v4) if v3.get(k) != v4.get(k)} == {"version", "written", "constraint_warmup",
                                                                          "webgpu_gate_repeats"}
    from exactspec.evaluation import runner
    assert runner.GATES_PATH == GATES_V4_PATH                        # new runs are recorded under v4
