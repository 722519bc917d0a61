"""The evaluation's run plan without a browser: arms per pair and backend, the interleaved schedule,
the distribution samples' keys and prompt rule (recomputed on the dev split), options refused."""
import argparse
import os

import pytest

from exactspec.core.errors import ExactSpecError
from exactspec.evaluation import arms as A
from exactspec.evaluation import runner as R
from exactspec.evaluation.corpus import load_corpus
from exactspec.host.cli import _add_bench_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def opts(*argv):
    p = argparse.ArgumentParser()
    _add_bench_args(p)
    return p.parse_args(list(argv))


def prompts_of(split):
    return load_corpus(os.path.join(REPO, R.CORPUS_DIR), os.path.join(REPO, R.LOCK_PATH), split)[0]


def test_arm_specs_and_configs():
    assert len(A.TOY_FULL) == 14 and "auto" in A.TOY_FULL and A.WEBGPU_SUBSET == ("none", "draft-k4", "auto")
    assert A.REAL_FULL == ("none", "none-spec", "auto", "draft-k2", "draft-k4", "lookup-k4")
    assert A.arm_spec("none-spec") == {"speculate": "none", "k": 0, "scheduler": "static", "engine": "spec"}
    assert A.arm_spec("auto") == {"speculate": "auto", "k": 8, "scheduler": "static", "engine": "spec"}
    assert A.arm_spec("none")["engine"] == "alone" and A.arm_spec("lookup-k4")["engine"] == "alone"
    assert A.arm_spec("draft-k3") == {"speculate": "draft", "k": 3, "scheduler": "static", "engine": "spec"}
    with pytest.raises(ValueError):
        A.arm_spec("draft-fast")
    cfg = A.request_config("auto", {"id": "x", "max_new_tokens": 32, "seed": 7, "chat": False}, 1.0)
    assert cfg["speculate"] == "auto" and cfg["seed"] == 7 and cfg["max_new_tokens"] == 32


def test_schedule_interleaves_every_topology_arm_once_per_prompt_and_temperature():
    prompts = [{"id": f"p{i}", "chat": i == 1} for i in range(3)]
    arms = {"toy-wasm": ["none", "auto"], "toy-webgpu": ["none"], "real-wasm": ["none", "auto"]}
    ids = {"toy-wasm": {"p0", "p1", "p2"}, "toy-webgpu": {"p0"}, "real-wasm": {"p1", "p2"}}
    keys = A.schedule(prompts, [0.0, 1.0], arms, ids, wllama=True)
    assert len(keys) == len(set(keys)) == 2 * (3 * 2 + 1 + 2 * 2 + 2)
    assert {k[2] for k in keys if k[0] == "toy-webgpu"} == {"p0"}
    assert {k[2] for k in keys if k[0] == "real-wasm"} == {"p1", "p2"}
    assert {k[2] for k in keys if k[0] == "toy-wllama"} == {"p0", "p2"}      # no chat prompts for wllama
    assert keys[0][:2] == ("toy-wasm", "none") and [k for k in keys if k[2] == "p1"][0][:2] == ("toy-wasm", "auto")
    twice = A.schedule(prompts, [0.0], {"toy-wasm": ["none"], "toy-webgpu": ["none"]},
                       {"toy-wasm": {"p0", "p1", "p2"}, "toy-webgpu": {"p0"}}, wllama=False, repeats=2)
    assert [k for k in twice if k[0] == "toy-webgpu"] == [("toy-webgpu", "none", "p0", 0.0, 0)]


def test_gate_repeats_add_passes_of_the_gate_arms_alone():
    """Repeats 2 with gate repeats 4: passes 0-1 every arm (wllama too), passes 2-3 only none, auto
    and none-spec, on WASM only; gate repeats below repeats change nothing."""
    prompts = [{"id": f"p{i}", "chat": False} for i in range(2)]
    arms = {"toy-wasm": ["none", "draft-k2", "auto", "none-spec"], "toy-webgpu": ["none", "auto"]}
    ids = {"toy-wasm": {"p0", "p1"}, "toy-webgpu": {"p0"}}
    keys = A.schedule(prompts, [0.0], arms, ids, wllama=True, repeats=2, gate_repeats=4)
    assert len(keys) == len(set(keys))
    late = [k for k in keys if k[4] >= 2]
    assert {k[1] for k in late} == {"none", "auto", "none-spec"} and {k[0] for k in late} == {"toy-wasm"}
    assert len(late) == 2 * 2 * 3 and {k[4] for k in keys if k[1] == "draft-k2"} == {0, 1}
    assert {k[4] for k in keys if k[0] == "toy-wllama"} == {0, 1}
    assert A.schedule(prompts, [0.0], arms, ids, wllama=True, repeats=2, gate_repeats=1) == \
        A.schedule(prompts, [0.0], arms, ids, wllama=True, repeats=2)


def test_plan_of_a_test_run_both_pairs_and_its_estimate():
    test = prompts_of("test")
    pl = R.plan_run(opts(), test)
    assert pl["pairs"] == ["toy", "real"] and set(pl["arms"]) == {"toy-wasm", "toy-webgpu", "real-wasm"}
    assert pl["not_run"] == [{"pair": "real", "backend": "webgpu", "why": R.REAL_WEBGPU_NOT_RUN}]
    assert pl["arms"]["real-wasm"] == list(A.REAL_FULL) and pl["arms"]["toy-wasm"] == list(A.TOY_FULL)
    assert len(pl["prompt_ids"]["toy-webgpu"]) == len({p["stratum"] for p in test})   # one prompt per stratum
    assert pl["sample_seeds"] == {"toy-wasm": 150, "toy-webgpu": 20, "real-wasm": 20}
    by_id = {p["id"]: p for p in test}
    dev = {p["id"]: p for p in prompts_of("dev")}
    s_keys = A.sample_keys(pl["sample_seeds"], list(R.SAMPLE_PROMPTS))
    assert len(s_keys) == (150 + 20) * 3 * 3 + 20 * 3 * 3      # every topology samples none, auto and draft k = 4
    est = (R.estimate_ms(pl["keys"], by_id, s_keys, dev, None) + sum(3 * A.LOAD_PRIOR_MS[t] for t in pl["arms"])) / 60000
    assert 10 < est <= 36, est       # a full test-split run of both pairs: about 34 min here (11 strata since issue 22;
    #                                  gates v4's WebGPU gate repeats ~6 min of it)


def test_real_pair_on_webgpu_runs_only_when_asked_and_then_the_webgpu_subset():
    pl = R.plan_run(opts("--real-backends", "wasm,webgpu"), prompts_of("test"))
    assert pl["not_run"] == [] and pl["arms"]["real-webgpu"] == list(A.WEBGPU_SUBSET)
    assert len(pl["prompt_ids"]["real-webgpu"]) == 11


def test_quick_plan_is_toy_wasm_none_and_auto_on_two_prompts():
    pl = R.plan_run(opts("--quick", "--split", "dev", "--samples", "3"), prompts_of("dev"))
    assert pl["arms"] == {"toy-wasm": ["none", "auto"]} and len(pl["prompts"]) == 2 and not pl["wllama"]
    assert len(pl["keys"]) == 8 and pl["sample_seeds"] == {"toy-wasm": 3}


def test_sample_prompts_follow_the_stated_rule_on_the_dev_split():
    from exactspec.evaluation.entropy import champion_first_token_probs
    from exactspec.reference.models import default_models_dir
    dev = prompts_of("dev")
    assert all(p["split"] == "dev" for p in dev)
    chosen = R.choose_sample_prompts(dev, lambda p: champion_first_token_probs(p, default_models_dir()))
    assert tuple(chosen) == R.SAMPLE_PROMPTS


def test_choose_sample_prompts_counts_tokens_above_the_threshold():
    probs = {"a": {0: 0.5, 1: 0.5}, "b": {0: 0.3, 1: 0.3, 2: 0.06, 3: 0.04}, "b2": {0: 0.2, 1: 0.2, 2: 0.6},
             "c": {0: 0.2, 1: 0.2, 2: 0.2, 3: 0.4}, "d": {0: 0.2, 1: 0.2, 2: 0.2, 3: 0.4}}
    prompts = [{"id": k, "stratum": k[0]} for k in probs]
    assert R.choose_sample_prompts(prompts, lambda p: probs[p["id"]], n=2) == ["b", "c"]   # one per stratum
    assert R.choose_sample_prompts(prompts, lambda p: probs[p["id"]], n=5) == ["b", "c", "d"]


@pytest.mark.parametrize("argv, what", [(["--pairs", "toy,big"], "--pairs"), (["--backends", "cuda"], "cuda"),
                                        (["--webgpu-samples", "-1"], "--webgpu-samples")])
def test_bad_options_are_refused(argv, what):
    with pytest.raises(ExactSpecError) as e:
        R.check_args(opts(*argv))
    assert e.value.code == "E_BAD_ARGUMENT" and what in e.value.message


def test_the_real_pair_without_its_gguf_is_refused_with_the_fetch_command(monkeypatch):
    monkeypatch.setitem(A.PAIRS, "real", {**A.PAIRS["real"], "file": "build/models/absent/none.gguf"})
    with pytest.raises(ExactSpecError) as e:
        R.check_args(opts("--pairs", "toy,real"))
    assert e.value.code == "E_MODEL_LOAD" and "tools/fetch_models.py" in e.value.message and "--pairs toy" in e.value.message
    R.check_args(opts("--pairs", "toy"))


def test_report_only_of_an_unknown_run_names_both_places_it_looked():
    from exactspec.evaluation.bench import cmd_bench
    with pytest.raises(ExactSpecError) as e:
        cmd_bench(opts("--run", "no-such-run-h5", "--report-only", "--pairs", "toy"))
    assert e.value.code == "E_BAD_ARGUMENT" and "build/eval/no-such-run-h5/run.json" in e.value.message


def test_auto_distribution_samples_are_long_enough_to_speculate():
    """Test run #1 sampled 5 new tokens: auto never probes with fewer than probe_min_remaining
    tokens left, so its samples were champion-alone rounds and their test could not fail. The
    samples now leave auto room to speculate from its first round, and every topology samples a
    speculative fixed arm (draft k = 4) too."""
    from exactspec.core.auto_policy import DEFAULT_PARAMS
    from exactspec.evaluation import arms as arms_mod, runner
    assert runner.SAMPLE_NEW_TOKENS - 1 >= DEFAULT_PARAMS["probe_min_remaining"] + runner.SAMPLE_POSITIONS - 1
    for topo in ("toy-wasm", "toy-webgpu", "real-wasm"):
        assert {"none", "auto", "draft-k4"} <= set(arms_mod.sample_arms(topo)), topo


def test_plan_with_gate_repeats_and_the_option_checked():
    test = prompts_of("test")
    one = ("--webgpu-gate-repeats", "1")       # WebGPU's own gate repeats (gates v4): the next test
    base = R.plan_run(opts("--repeats", "2", *one), test)
    more = R.plan_run(opts("--repeats", "2", "--gate-repeats", "5", *one), test)
    extra = [k for k in more["keys"] if k not in set(base["keys"])]
    assert base["keys"] == [k for k in more["keys"] if k[4] < 2]
    assert {k[1] for k in extra} == set(A.GATE_ARMS) and {k[4] for k in extra} == {2, 3, 4}
    assert {k[0] for k in extra} == {"toy-wasm", "real-wasm"}
    with pytest.raises(ExactSpecError):
        R.check_args(opts("--gate-repeats", "-1"))
    with pytest.raises(ExactSpecError):
        R.check_args(opts("--toy-gate-repeats", "-1"))
    # the toy pair's own gate passes: toy-wasm's gate arms to 9, real-wasm's still to 5, nothing else added
    toy = R.plan_run(opts("--repeats", "2", "--gate-repeats", "5", "--toy-gate-repeats", "9", *one), test)
    reps = lambda keys, topo: sorted({k[4] for k in keys if k[0] == topo})
    assert reps(toy["keys"], "toy-wasm") == list(range(9)) and reps(toy["keys"], "real-wasm") == list(range(5))
    assert [k for k in toy["keys"] if k[4] < 5] == more["keys"]
    assert {k[1] for k in toy["keys"] if k[4] >= 5} == set(A.GATE_ARMS)
    none_for_toy = R.plan_run(opts("--repeats", "2", "--gate-repeats", "5", "--toy-gate-repeats", "0", *one), test)["keys"]
    assert sorted(none_for_toy) == sorted(k for k in more["keys"] if k[0] != "toy-wasm" or k[4] < 2)   # (rows rotate by length)
    with pytest.raises(ExactSpecError):
        R.check_args(opts("--load-repeats", "0"))
    assert opts().load_repeats == 3 and R.check_args(opts("--load-repeats", "1")) is None


def test_engine_pairs_per_topology_and_which_pair_serves_a_repeat():
    """Gates v3: each WASM topology loads --engine-pairs engine pairs (at most one a repeat it runs),
    WebGPU one; repeat r runs on pair r mod n, so every arm and champion alone compared for a
    (prompt, T, repeat) share their pair, and every pair serves every arm of the first passes."""
    test = prompts_of("test")
    pl = R.plan_run(opts("--repeats", "3", "--gate-repeats", "10", "--toy-gate-repeats", "20"), test)
    assert pl["engine_pairs"] == {"toy-wasm": 3, "toy-webgpu": 1, "real-wasm": 3}
    assert R.plan_run(opts(), test)["engine_pairs"] == {"toy-wasm": 1, "toy-webgpu": 1, "real-wasm": 1}   # one repeat: one pair
    assert R.plan_run(opts("--repeats", "2", "--engine-pairs", "5"), test)["engine_pairs"]["toy-wasm"] == 2
    served = {}
    for topo, arm, pid, t, rep in pl["keys"]:
        if topo != "toy-wllama":
            served.setdefault((topo, arm), set()).add(A.pair_of_repeat(rep, pl["engine_pairs"][topo]))
    assert served[("toy-wasm", "draft-k4")] == served[("real-wasm", "auto")] == {0, 1, 2}
    assert served[("toy-webgpu", "auto")] == {0}
    assert [A.engine_name("toy-wasm", "spec", j) for j in range(3)] == ["toy-wasm-spec", "toy-wasm-spec-pair1", "toy-wasm-spec-pair2"]
    # a test-split run loads the count the gate file names; another count is a dev-split run's
    with pytest.raises(ExactSpecError, match="--engine-pairs 2"):
        R.check_args(opts("--engine-pairs", "2", "--pairs", "toy"))
    assert R.check_args(opts("--engine-pairs", "2", "--pairs", "toy", "--split", "dev")) is None
    with pytest.raises(ExactSpecError, match="--engine-pairs must be >= 1"):
        R.check_args(opts("--engine-pairs", "0", "--pairs", "toy", "--split", "dev"))


def test_webgpu_gate_repeats_run_the_gate_arms_under_a_seed_per_repeat_at_t1():
    """Gates v4: a WebGPU topology runs repeat 0 with every arm and repeats 1..n-1 with its gate arms
    (champion alone and auto), on its one engine pair, whatever --repeats says; at T = 1 repeat r
    samples under the prompt's seed + r for every arm alike (so requests still pair), at T = 0 and on
    WASM under the prompt's seed. A test-split run uses the count eval/gates_v4.json names."""
    test = prompts_of("test")
    pl = R.plan_run(opts("--repeats", "3", "--webgpu-gate-repeats", "4", "--webgpu-per-stratum", "2"), test)
    web = [k for k in pl["keys"] if k[0] == "toy-webgpu"]
    assert {k[4] for k in web} == {0, 1, 2, 3} and pl["engine_pairs"]["toy-webgpu"] == 1
    assert {k[1] for k in web if k[4] == 0} == set(A.WEBGPU_SUBSET) and {k[1] for k in web if k[4] > 0} == {"none", "auto"}
    assert len([k for k in web if k[4] > 0]) == 3 * 22 * 2 * 2       # 3 passes x 22 prompts x 2 T x 2 arms
    assert sorted(k for k in pl["keys"] if k[0] != "toy-webgpu") == \
        sorted(k for k in R.plan_run(opts("--repeats", "3", "--webgpu-gate-repeats", "1", "--webgpu-per-stratum", "2"),
                                     test)["keys"] if k[0] != "toy-webgpu")      # nothing else moves (rows rotate by length)
    p = {"id": "x", "seed": 40, "max_new_tokens": 8, "chat": True}
    assert [A.repeat_seed("toy-webgpu", p, 1.0, r) for r in range(4)] == [40, 41, 42, 43]
    assert [A.repeat_seed("toy-webgpu", p, 0.0, r) for r in range(4)] == [40] * 4
    assert [A.repeat_seed("real-wasm", p, 1.0, r) for r in range(4)] == [40] * 4
    assert A.request_config("auto", p, 1.0, None, 42)["seed"] == A.request_config("none", p, 1.0, None, 42)["seed"] == 42
    assert R.check_args(opts("--pairs", "toy")) is None             # the default is the file's count
    with pytest.raises(ExactSpecError, match="--webgpu-gate-repeats 2"):
        R.check_args(opts("--pairs", "toy", "--webgpu-gate-repeats", "2"))
    assert R.check_args(opts("--pairs", "toy", "--webgpu-gate-repeats", "2", "--split", "dev")) is None
    assert R.check_args(opts("--pairs", "toy", "--webgpu-gate-repeats", "2", "--backends", "wasm")) is None
    with pytest.raises(ExactSpecError, match="must be >= 1"):
        R.check_args(opts("--webgpu-gate-repeats", "0", "--split", "dev"))


def test_constraint_warm_up_compiles_every_planned_constraint_on_every_engine_before_timing():
    """Gates v4: one throwaway one-token request (T = 0, no speculation) per constrained prompt on each
    engine of each pair, recorded with the compile it paid; a resumed run warms again (its engines are
    new); an unconstrained prompt is not sent; a refusal is an error naming the engine."""
    test = {p["id"]: p for p in prompts_of("test")}
    pl = {"prompt_ids": {"real-wasm": ["casual-4", "structured-4", "structured-5"]}, "engine_pairs": {"real-wasm": 2}}
    sent = []

    def call(fn, engine, req):
        sent.append((fn, engine, req["prompt"], req["config"]))
        first = sum(1 for s in sent if s[1] == engine and s[2] == req["prompt"]) == 1
        return {"total_ms": 900.0 if first else 300.0,
                "result": {"stats": {"structured": {"compile_ms": 600.0 if first else 0.1, "cached": not first}}}}

    run_info = {}
    R.warm_constraints(call, "real-wasm", pl, test, run_info)
    engines = ["real-wasm-alone", "real-wasm-spec", "real-wasm-alone-pair1", "real-wasm-spec-pair1"]
    assert [s[1] for s in sent] == [e for e in engines for _ in range(2)]
    assert {s[2] for s in sent} == {test["structured-4"]["prompt"], test["structured-5"]["prompt"]}
    cfg = sent[0][3]
    assert cfg["max_new_tokens"] == 1 and cfg["temperature"] == 0.0 and cfg["speculate"] == "none"
    assert cfg["response_format"] == test["structured-4"]["response_format"]
    assert list(run_info["constraint_warmup"]) == engines
    assert run_info["constraint_warmup"]["real-wasm-spec"][0] == {"prompt_id": "structured-4", "compile_ms": 600.0,
                                                                  "cached": False, "total_ms": 900.0}
    R.warm_constraints(call, "real-wasm", pl, test, run_info)        # resumed: the list is the new engines' only
    assert len(run_info["constraint_warmup"]["real-wasm-spec"]) == 2
    with pytest.raises(ExactSpecError, match="real-wasm-alone constraint warm-up structured-4"):
        R.warm_constraints(lambda *a: {"refused": {"code": "E_BAD_ARGUMENT", "message": "no"}}, "real-wasm", pl, test, {})
    assert R.plan_run(opts("--pairs", "toy"), prompts_of("test")) and "constraint_warmup" in R.load_gates(R.GATES_PATH)[0]


def test_the_report_gives_each_constraints_compile_per_topology():
    from exactspec.evaluation.report import _constraint_warmup_lines
    res = {"topologies_run": ["real-wasm", "toy-wasm"], "constraint_warmup": {
        "real-wasm-alone": [{"prompt_id": "structured-4", "compile_ms": 640.0}, {"prompt_id": "structured-5", "compile_ms": 210.0}],
        "real-wasm-spec-pair1": [{"prompt_id": "structured-4", "compile_ms": 700.0}, {"prompt_id": "structured-5", "compile_ms": None}],
        "toy-wasm-alone": [{"prompt_id": "structured-4", "compile_ms": 150.0}]}}
    lines = _constraint_warmup_lines(res)
    assert lines == ["\nreal-wasm: each constraint compiled on each of its 2 engines before the timed requests (gates v4; in no "
                     "speed-up: its first use on an engine costs this once, in every mode alike), median [range] ms: "
                     "structured-4 670 [640, 700], structured-5 210 [210, 210].",
                     "\ntoy-wasm: each constraint compiled on each of its 1 engines before the timed requests (gates v4; in no "
                     "speed-up: its first use on an engine costs this once, in every mode alike), median [range] ms: "
                     "structured-4 150 [150, 150]."]
    assert _constraint_warmup_lines({"topologies_run": ["toy-wasm"]}) == []      # a v3 run: nothing


def test_stages_to_ready_take_every_load_of_each_role_every_engine_pair():
    """The report's stage medians read each role's loads over all its engine pairs (gates v3 on) and
    the further loads, not pair 0's alone; one load a role gives no table."""
    from exactspec.evaluation.report import load_stage_medians, role_loads
    loads = {"real-wasm-alone": {"timing_ms": {"warmup": 100.0, "total": 1000.0}, "timing_ms_repeats": [{"warmup": 110.0, "total": 1010.0}]},
             "real-wasm-alone-pair1": {"timing_ms": {"warmup": 300.0, "total": 1200.0}},
             "real-wasm-spec": {"timing_ms": {"warmup": 100.0, "total": 1000.0}, "timing_ms_repeats": [None]},
             "real-wasm-spec-pair1": {"timing_ms": {"warmup": 500.0, "total": 1400.0}},
             "real-wasm-spec-pair2": {"timing_ms": {"warmup": 700.0, "total": 1600.0}},
             "toy-wasm-spec": {"timing_ms": {"warmup": 1.0, "total": 2.0}}}
    spec = role_loads(loads, "real-wasm", "spec")
    assert spec == [loads["real-wasm-spec"], loads["real-wasm-spec-pair1"], loads["real-wasm-spec-pair2"]]
    rows = load_stage_medians(role_loads(loads, "real-wasm", "alone"), spec)
    assert rows == [("total", 1010.0, 1400.0), ("warmup", 110.0, 500.0)]   # pair 0 alone would read 105 / 100
    assert load_stage_medians([loads["toy-wasm-spec"]], [loads["toy-wasm-spec"]]) == []
