"""The evaluation's pure maths on synthetic inputs with exact expected values: survival, E[G(k)],
cost model, N_min, break-even ratio, ECDF, Pareto frontier, homogeneity test; v2: per-token speed-ups, the
bootstrap, cells, the conditional distribution tests (the arms and schedule: tests/test_eval_arms.py)."""
import math

import pytest

from exactspec.evaluation import analysis as A
from exactspec.evaluation import metrics as M


def test_survival_is_conditional_acceptance_chained():
    # 4 rounds at k = 3: accepted 0, 1, 3, 2 -> position 1: 3/4; 2: 2/3; 3: 1/2 (reached by 3 and 2)
    rounds = [(3, 0), (3, 1), (3, 3), (3, 2)]
    s = M.survival(rounds, 4)
    assert s["a"] == [0.75, 2 / 3, 0.5, None]
    assert s["at_risk"] == [4, 3, 2, 0]
    assert s["S"][:3] == [0.75, 0.75 * (2 / 3), 0.75 * (2 / 3) * 0.5] and s["S"][3] is None


def test_survival_counts_only_rounds_that_proposed_the_position():
    # a round that proposed 1 and had it accepted says nothing about position 2
    s = M.survival([(1, 1), (2, 1), (2, 2)], 2)
    assert s["a"] == [1.0, 0.5] and s["at_risk"] == [3, 2]


def test_survival_stays_zero_after_a_position_nobody_passed():
    s = M.survival([(4, 1), (4, 1)], 4)
    assert s["a"] == [1.0, 0.0, None, None] and s["S"] == [1.0, 0.0, 0.0, 0.0]
    assert M.expected_tokens(s["S"], 4) == 2.0


def test_expected_tokens_and_constant_acceptance_closed_form():
    assert M.expected_tokens([0.5, 0.25, 0.125], 3) == 1.875
    assert M.expected_tokens([0.5, None], 2) is None
    alpha, k = 0.6, 5
    S = [alpha ** i for i in range(1, k + 1)]
    assert M.expected_tokens(S, k) == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha), rel=1e-12)


def test_cost_model_break_even_and_latency_ratio():
    # (4 x 0.5 + 6 + 1) / 3 = 3 ms/token against 4 alone: 1.333x; F = 30 ms pays back in 30 tokens
    c = M.spec_cost_per_token(0.5, 4, 6.0, 1.0, 3.0)
    assert c == 3.0 and M.speedup(4.0, c) == 4 / 3
    assert M.n_min(30.0, 4.0, 3.0) == 30.0
    assert M.n_min(30.0, 3.0, 3.0) == math.inf and M.n_min(30.0, 2.0, 3.0) == math.inf
    assert M.latency_ratio(30, 130.0, 3.0, 100.0, 4.0) == 1.0     # the break-even point itself
    assert M.latency_ratio(60, 130.0, 3.0, 100.0, 4.0) == 310 / 340
    assert M.speedup(None, 1.0) is None and M.speedup(1.0, 0.0) is None


def test_ecdf_median_and_pareto_front():
    assert M.ecdf([3, 1, None, 2]) == ([1, 2, 3], [1 / 3, 2 / 3, 1.0])
    assert M.median([None, 4, 1, 3]) == 3 and M.median([None]) is None
    pts = [(1, 5), (2, 2), (3, 3), (5, 1), (2, 2.5)]
    assert M.pareto_front(pts) == [0, 1, 3]


def test_homogeneity_p_value_separates_same_from_different():
    same_a = [0] * 50 + [1] * 30 + [2] * 20
    same_b = [0] * 48 + [1] * 33 + [2] * 19
    assert M.homogeneity_p_value(same_a, same_b) > 0.5
    assert M.homogeneity_p_value([0] * 80 + [1] * 20, [0] * 20 + [1] * 80) < 1e-6
    assert M.homogeneity_p_value([7] * 10, [7] * 10) == 1.0


def test_goodness_of_fit_against_known_probabilities():
    probs = {0: 0.5, 1: 0.3, 2: 0.15, 3: 0.05}
    good = [0] * 50 + [1] * 30 + [2] * 15 + [3] * 5
    assert M.goodness_of_fit_p_value(good, probs) == 1.0
    assert M.goodness_of_fit_p_value([0] * 20 + [1] * 60 + [2] * 20, probs) < 1e-6
    assert M.goodness_of_fit_p_value([9] * 100, probs) < 1e-6     # a category the champion gives 0


def test_acceptance_by_entropy_bin():
    bins = M.acceptance_by_bin([(0.1, 1), (0.2, 0), (1.5, 1), (3.0, 0)], [0.0, 1.0, 2.0, 4.0])
    assert bins == [(0.0, 1.0, 2, 0.5), (1.0, 2.0, 1, 1.0), (2.0, 4.0, 1, 0.0)]
    assert M.entropy_nats([0.5, 0.5]) == math.log(2) and M.entropy_nats([1.0, 0.0]) == 0


def _rec(arm, prompt, t, total, first, n, rounds=(), backend="wasm", stratum="s", ids=None):
    return {"backend": backend, "arm": arm, "prompt_id": prompt, "stratum": stratum, "temperature": t,
            "total_ms": total, "first_token_ms": first, "token_ids": ids or list(range(n)), "rounds": list(rounds),
            "timing_ms": {"prefill": 5.0, "draft": 0.0, "verify": 0.0, "accept": 0.0, "total": total - 1}}


def test_per_request_speedups_and_greedy_mismatches():
    recs = [_rec("none", "a", 0.0, 100.0, 10.0, 10), _rec("draft-k2", "a", 0.0, 50.0, 10.0, 10),
            _rec("draft-k4", "a", 0.0, 200.0, 20.0, 10, ids=[9] * 10),
            _rec("wllama", "a", 0.0, 80.0, 8.0, 10, backend="wllama")]
    rows = {r["arm"]: r for r in A.per_request_speedups(recs)}
    assert rows["draft-k2"]["speedup"] == 2.0 and rows["draft-k2"]["decode_speedup"] == 90 / 40
    assert rows["draft-k4"]["speedup"] == 0.5 and rows["wllama"]["speedup"] == 1.25
    assert A.greedy_mismatches(recs) == {("wasm", "s"): 1}


def test_cost_model_from_records():
    alone = [_rec("none", "a", 0.0, 41.0, 5.0, 10, rounds=[[0, 0, 1, 0.0, 3.0]] * 10)]   # 4 ms/token page, 3 ms a step
    k4 = [_rec("draft-k4", "a", 0.0, 25.0, 5.0, 11, rounds=[[4, 2, 3, 2.0, 6.0], [4, 4, 5, 2.0, 6.0]])]
    k8 = [_rec("draft-k8", "a", 0.0, 25.0, 5.0, 11, rounds=[[8, 8, 9, 0, 0], [8, 2, 3, 0, 0]])]
    recs = alone + k4 + k8
    surv = A.survival_table(recs)
    c = A.cost_model(recs, surv, "wasm", 0.0, k=4)
    # S_1..S_4 = 1 (both rounds reach 2 accepted, then 1 of 2 survives position 3, 1 of 1 position 4)
    assert surv[("wasm", "all", 0.0)]["S"][:4] == [1.0, 1.0, 0.5, 0.5]
    assert c["expected_tokens"] == 4.0 and c["draft_ms_per_proposal"] == 0.5 and c["verify_ms_per_round"] == 6.0
    assert c["overhead_ms"] == 1.0 and c["predicted_ms_per_token"] == (2 + 6 + 1) / 4
    assert c["measured_ms_per_token"] == 2.0 and c["predicted_speedup"] == 4 / 2.25
    assert c["measured_over_predicted"] == pytest.approx(2.0 / (4 / 2.25))
    assert A.tokens_per_round(k4) == 4.0


def test_conclusion_in_the_specification_terms():
    v = lambda **kw: [{"id": k, "passed": p} for k, p in kw.items()]
    assert A.conclusion(v(greedy_identity=True, distribution=True, cost_model=True), {}) == "adopt"
    assert A.conclusion(v(greedy_identity=False, distribution=True), {}).startswith("keep off: it does not preserve")
    some = A.conclusion(v(greedy_identity=True, distribution=True, no_stratum_below=False), {"code": 1.3, "casual": 0.9})
    assert some.startswith("adopt only for some strata: code")
    assert A.conclusion(v(greedy_identity=True, no_stratum_below=False), {"casual": 0.9}).startswith("keep off: it does not win")


# ---- evaluation v2 ----
def test_bootstrap_fixed_seed_fixed_interval_and_constant_ratios_zero_width():
    data = [[0.9, 1.1, 1.3, 0.8, 1.0], [1.2, 1.4]]
    ci = M.bootstrap_ci(data)
    assert ci == M.bootstrap_ci(data) and ci[0] < M.geo_mean([v for g in data for v in g]) < ci[1]
    assert M.bootstrap_ci(data, seed=1) != ci                     # the seed is what fixes it
    assert M.bootstrap_ci(data, statistic=lambda v: M.geo_mean(v)) == pytest.approx(ci)   # the vectorised path agrees
    lo, hi = M.bootstrap_ci([[1.25] * 6, [1.25] * 3])
    assert lo == pytest.approx(1.25, abs=1e-12) and hi == pytest.approx(1.25, abs=1e-12)
    assert M.bootstrap_ci([[], [None]]) is None
    # stratified: a stratum's values are drawn only from that stratum (two constant strata -> fixed pooled mean)
    lo, hi = M.bootstrap_ci([[1.0, 1.0], [4.0, 4.0]])
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)


def _slow_cluster_bootstrap(clusters, resamples, seed, level=0.95):
    """The two-stage bootstrap written as its definition reads (loops, its own RNG stream)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(resamples):
        drawn = []
        for c in rng.integers(0, len(clusters), size=len(clusters)):
            for g in clusters[c]:
                drawn += [g[i] for i in rng.integers(0, len(g), size=len(g))]
        stats.append(M.geo_mean(drawn))
    return tuple(np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2]))


def test_cluster_bootstrap_carries_the_spread_between_engine_pairs():
    """Gates v3: two engine pairs, each constant within (1.1x and 0.9x): the clusters drawn are
    (1.1, 1.1), (1.1, 0.9) or (0.9, 0.9), so the interval is exactly [0.9, 1.1]; the v2 request
    bootstrap of the same 40 values pooled (what ignoring the pairs gives) is far narrower."""
    fast, slow = [[1.1] * 20], [[0.9] * 20]
    lo, hi = M.cluster_bootstrap_ci([fast, slow])
    assert lo == pytest.approx(0.9) and hi == pytest.approx(1.1)
    naive = M.bootstrap_ci([fast[0] + slow[0]])
    assert 0.93 < naive[0] and naive[1] < 1.06                 # the broken variant: the pairs' spread left out
    # one pair: exactly v2's stratified request bootstrap (a v2 run's intervals unchanged)
    data = [[0.9, 1.1, 1.3, 0.8, 1.0], [1.2, 1.4]]
    assert M.cluster_bootstrap_ci([data]) == M.bootstrap_ci(data)
    assert M.cluster_bootstrap_ci([[[]], [[None]]]) is None
    # strata stay strata inside each pair: constant strata 1 and 4 in both pairs -> the pooled mean 2, fixed
    lo, hi = M.cluster_bootstrap_ci([[[1.0, 1.0], [4.0, 4.0]], [[1.0, 1.0], [4.0, 4.0]]])
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    # against the definition written as loops (three pairs with spread inside them; 4000 resamples each,
    # fixed seeds): the vectorised draw, a pair drawn twice included, gives the same interval to 0.01
    clusters = [[[1.02, 0.97, 1.05, 0.99, 1.01, 0.95]], [[0.93, 0.96, 0.91, 0.98, 0.94, 0.97]], [[1.08, 1.03, 1.06, 1.1, 1.04, 1.07]]]
    fast_ci = M.cluster_bootstrap_ci(clusters, resamples=4000)
    slow_ci = _slow_cluster_bootstrap(clusters, 4000, seed=7)
    assert fast_ci == pytest.approx(slow_ci, abs=0.01), (fast_ci, slow_ci)
    assert fast_ci == M.cluster_bootstrap_ci(clusters, resamples=4000)   # the seed fixes it


def test_per_token_units_and_geometric_mean():
    assert M.ms_per_token(100.0, 20) == 5.0 and M.ms_per_token(100.0, 0) is None
    assert M.geo_mean([2.0, 0.5]) == pytest.approx(1.0) and M.geo_mean([None]) is None


def test_conditional_position_samples_and_bonferroni():
    a = [[1, 2, 3], [1, 2, 4], [1, 5, 6], [7]]
    b = [[1, 2, 3], [1, 9], [8, 8]]
    assert M.conditional_position_samples(a, b, 1) == ([], [1, 1, 1, 7], [1, 1, 8])
    assert M.conditional_position_samples(a, b, 2) == ([1], [2, 2, 5], [2, 9])      # prefix (1,) is the most common
    assert M.conditional_position_samples(a, b, 3) == ([1, 2], [3, 4], [3])
    assert M.conditional_position_samples(a, b, 9) == (None, [], [])
    assert M.bonferroni([0.01, 0.5, 0.0001]) == pytest.approx([0.03, 1.0, 0.0003])


def _v2(arm, prompt, t, total, n, stratum="casual", topology="toy-wasm", ids=None, rep=0):
    return {"topology": topology, "backend": topology.split("-")[1], "arm": arm, "prompt_id": prompt, "stratum": stratum,
            "temperature": t, "rep": rep, "total_ms": total, "n_tokens": n, "token_ids": ids or list(range(n))}


def test_per_token_speedup_compares_answers_of_different_lengths_fairly():
    # T = 1: champion alone wrote 32 tokens in 320 ms, auto 8 tokens in 40 ms (a sampled EOS): 10 / 5 = 2x per token,
    # not the 8x of the request times
    rows = A.per_token_rows([_v2("none", "a", 1.0, 320.0, 32), _v2("auto", "a", 1.0, 40.0, 8)])
    assert [r["ratio"] for r in rows] == [2.0]


def test_v2_cells_best_fixed_conversational_and_loads():
    recs = []
    for p, (alone, auto, k2) in {"c1": (100.0, 80.0, 50.0), "c2": (100.0, 80.0, 50.0)}.items():
        for t in (0.0, 1.0):
            recs += [_v2("none", p, t, alone, 10), _v2("auto", p, t, auto, 10), _v2("draft-k2", p, t, k2, 10)]
    rows = A.per_token_rows(recs)
    cells = A.auto_speedup_cells(rows, "toy-wasm", ["casual", "json"], [0.0, 1.0])
    assert cells["casual T=0"]["value"] == pytest.approx(1.25) and cells["casual T=0"]["ci"] == pytest.approx((1.25, 1.25))
    assert cells["json T=1"]["value"] is None and cells["json T=1"]["n"] == 0          # planned, no data
    best = A.auto_over_best_fixed_cells(rows, "toy-wasm", ["casual"], [1.0])["casual T=1"]
    assert best["best"] == "draft-k2" and best["value"] == pytest.approx(50 / 80)
    conv = A.conversational_auto(rows, "toy-wasm", ["casual", "dialogue"])
    assert conv["value"] == pytest.approx(1.25) and conv["n"] == 2
    # loads: alone 1000 ms, spec 1400 ms; N = 100 tokens at 10 vs 8 ms: (1000 + 1000) / (1400 + 800)
    e2e = A.end_to_end_with_loads(rows, {"toy-wasm-alone": {"load_ms": 1000.0}, "toy-wasm-spec": {"load_ms": 1400.0}},
                                  "toy-wasm", ["casual"], 100)
    assert e2e["value"] == pytest.approx(2000 / 2200) and e2e["ci"] == pytest.approx((2000 / 2200,) * 2)
    assert A.end_to_end_with_loads(rows, {}, "toy-wasm", ["casual"], 100)["value"] is None
    assert A.greedy_mismatches_v2(recs, "toy-wasm") == 0 and A.greedy_mismatches_v2(recs, "real-wasm") is None


def test_distribution_tests_conditional_and_bonferroni():
    import random
    rng = random.Random(5)
    samples = []
    for arm in ("none", "auto", "draft-k4"):
        for seed in range(200):
            first = rng.choice([1, 1, 2, 3])
            second = rng.choice([4, 5]) if arm != "draft-k4" else 6       # draft-k4 is wrong at position 2
            samples.append({"topology": "toy-wasm", "prompt_id": "p", "arm": arm, "seed": seed, "token_ids": [first, second, 7, 8]})
    d = A.distribution_tests(samples, "toy-wasm")
    by = {(t["arm"], t["position"]): t for t in d["tests"]}
    assert by[("auto", 2)]["prefix"] == [1] and by[("auto", 2)]["p"] > 0.001
    assert by[("draft-k4", 2)]["p_adjusted"] < 1e-6 and d["min_adjusted_p"] < 0.001
    # auto: positions 1..4; draft-k4: 1, 2 (past position 2 its most common prefix (1, 6) is one champion alone never
    # writes: fewer than 20 samples there, so those tests are not run; position 2 already shows the difference)
    assert sorted(by) == [("auto", 1), ("auto", 2), ("auto", 3), ("auto", 4), ("draft-k4", 1), ("draft-k4", 2)]
    assert d["m"] == 6 and all(t["p_adjusted"] == min(1.0, t["p"] * 6) for t in d["tests"])
    assert A.distribution_tests(samples, "real-wasm") == {"tests": [], "m": 0, "min_adjusted_p": None}


def test_one_request_has_no_interval_so_its_ci_gate_is_inconclusive():
    from exactspec.evaluation.gates import evaluate_v2
    rows = A.per_token_rows([_v2("none", "a", 1.0, 100.0, 10), _v2("auto", "a", 1.0, 50.0, 10)])
    cell = A.auto_speedup_cells(rows, "toy-wasm", ["casual"], [1.0])["casual T=1"]
    assert cell["value"] == 2.0 and cell["ci"] is None and cell["n"] == 1
    doc = {"gates": [{"id": "g", "metric": "m", "op": ">=", "threshold": 0.95, "per_stratum": True, "ci": True}]}
    assert evaluate_v2(doc, {"m": {"casual T=1": cell}}, "toy-wasm")[0]["verdict"] == "inconclusive"


def test_acceptance_for_a_target_speedup_inverts_the_iid_cost_model():
    """E[G(k)] = 1 + a + ... + a^k; the speed-up of draft k at acceptance a; the a that reaches a target
    (bisection), 0.0 when a = 0 already does, None when every proposal accepted still does not."""
    assert M.iid_expected_tokens(0.5, 3) == pytest.approx(1.875) and M.iid_expected_tokens(1.0, 4) == 5.0
    # c = 20 ms/token alone, V(3) = 24, d = 1, o = 1: at a = 0.5, k = 2: 1.75 * 20 / 27
    assert M.iid_speedup(0.5, 2, 20.0, 24.0, 1.0, 1.0) == pytest.approx(1.75 * 20 / 27)
    a = M.acceptance_for(1.5, 2, 20.0, 24.0, 1.0, 1.0)
    assert M.iid_speedup(a, 2, 20.0, 24.0, 1.0, 1.0) >= 1.5 > M.iid_speedup(a - 2e-4, 2, 20.0, 24.0, 1.0, 1.0)
    assert M.acceptance_for(2.5, 2, 20.0, 24.0, 1.0, 1.0) is None            # 3 tokens a round: at most 2.22x
    assert M.acceptance_for(1.0, 1, 20.0, 10.0, 1.0, 1.0) == 0.0              # a round cheaper than a step
    # proposals as trials that stop at the first rejection: (3 of 4 accepted, rejected) (2 of 2) (0 of 1)
    assert M.acceptance_mle([(4, 3), (2, 2), (1, 0), (0, 0)]) == (5 / 7, 7)
    assert M.acceptance_mle([]) == (None, 0)


def test_acceptance_needed_reads_the_runs_own_costs():
    """c = 11 ms/token alone (decode), V(1) = 10 ms a step, so o = 1; V(n) = 10 + 2 (n - 1) from the
    calibration (scaled by 10 / V_cal(1) = 2); d = 0.5 ms from the draft arm's rounds; its rounds
    accepted 3 of 4 trials (conversational) and 1 of 3 (code)."""
    alone = {"topology": "real-wasm", "backend": "wasm", "arm": "none", "temperature": 1.0, "stratum": "casual",
             "n_tokens": 11, "first_token_ms": 5.0, "total_ms": 115.0, "rounds": [[0, 0, 1, 0.0, 10.0]] * 11}
    draft = lambda stratum, rounds: {"topology": "real-wasm", "backend": "wasm", "arm": "draft-k2", "temperature": 1.0,
                                     "stratum": stratum, "rounds": rounds}
    recs = [alone, draft("casual", [[2, 2, 3, 1.0, 14.0], [2, 1, 2, 1.0, 14.0]]), draft("code", [[2, 0, 1, 1.0, 14.0]] * 3)]
    loads = {"real-wasm-spec": {"calibration": {"verify_ms": [None] + [5.0 + n for n in range(9)]}}}
    x = A.acceptance_needed(recs, loads, "real-wasm", 1.0, ["casual"])
    assert (x["c_alone_ms"], x["step_ms"], x["overhead_ms"], x["draft_ms_per_proposal"]) == (11.0, 10.0, 1.0, 0.5)
    assert x["verify_ms"]["2"] == 12.0 and x["verify_ms"]["9"] == 26.0
    k1 = M.acceptance_for(1.0, 1, 11.0, 12.0, 0.5, 1.0)      # (1 + a) 11 = 13.5: a = 0.227
    assert x["needed"]["1"]["a"] <= k1 and x["needed"]["1"]["a"] == pytest.approx(2.5 / 11, abs=2e-4)
    assert x["measured"] == {"all": 3 / 7, "all_trials": 7, "conversational": 3 / 4, "conversational_trials": 4}
    assert A.acceptance_needed(recs, {}, "real-wasm", 1.0, ["casual"]) is None      # no calibration: nothing said


def test_round_phases_split_a_round_per_arm_and_skip_runs_without_them():
    """Two none-spec requests (4 and 2 rounds) and one auto request: per request ms per round, then
    the median over requests; crossing is the call less the models' own timers; an old record
    (no phases) and another topology's are left out."""
    def rec(arm, rounds, verify, draft, call, choose, commit, emit, pause, topology="toy-wasm", phases=True):
        tm = {"verify": verify, "draft": draft, "prefill": 3.0, "total": 99.0}
        if phases:
            tm["phases"] = {"call": call, "choose": choose, "commit": commit, "emit": emit, "pause": pause}
        return {"topology": topology, "backend": "wasm", "arm": arm, "temperature": 0.0, "timing_ms": tm,
                "rounds": [[0, 0, 1, 0.0, 1.0]] * rounds}
    recs = [rec("none-spec", 4, 8.0, 0.0, 10.0, 0.0, 0.4, 1.2, 0.8),
            rec("none-spec", 2, 6.0, 0.0, 7.0, 0.0, 0.4, 0.6, 0.2),
            rec("auto", 5, 10.0, 1.0, 12.0, 1.0, 0.5, 1.5, 1.0),
            rec("auto", 5, 99.0, 9.0, 999.0, 9.0, 9.0, 9.0, 9.0, topology="real-wasm"),
            rec("none", 5, 10.0, 0.0, 11.0, 0.0, 0.1, 1.0, 0.5, phases=False)]
    out = A.round_phases(recs, "toy-wasm", 0.0)
    assert set(out) == {"none-spec", "auto"}                 # "none" recorded no phases
    ns = out["none-spec"]
    assert ns["models"] == pytest.approx((2.0 + 3.0) / 2) and ns["crossing"] == pytest.approx((0.5 + 0.5) / 2)
    assert ns["commit"] == pytest.approx((0.1 + 0.2) / 2) and ns["emit"] == pytest.approx((0.3 + 0.3) / 2)
    assert ns["rounds"] == 3.0
    au = out["auto"]
    assert (au["models"], au["crossing"], au["choose"], au["pause"]) == pytest.approx((2.2, 0.2, 0.2, 0.2))
    assert A.round_phases(recs, "toy-wasm", 1.0) == {}


def test_pooled_log_sd_and_the_requests_a_cell_needs():
    """Two groups in log space: {0, 2a} and {0, a, 2a}: squares a^2 + a^2 + (a^2 + 0 + a^2) over 1 + 2
    degrees of freedom; lone values and non-positive ones carry no spread. n is the first whose
    half-width z sd / sqrt(n) is inside log(true / threshold), and one fewer is not."""
    a = 0.1
    sd, dof = M.pooled_log_sd([[1.0, math.exp(2 * a)], [1.0, math.exp(a), math.exp(2 * a)], [3.0], [0.0, -1.0]])
    assert dof == 3 and sd == pytest.approx(math.sqrt(4 * a * a / 3))
    assert M.pooled_log_sd([[2.0], []]) == (None, 0)
    n = M.requests_to_clear(0.145, 0.95, 1.0)
    half = lambda k: 1.959964 * 0.145 / math.sqrt(k)
    assert half(n) < math.log(1 / 0.95) <= half(n - 1) and n == 31
    assert M.requests_to_clear(0.2, 0.95, 0.95) is None and M.requests_to_clear(None, 0.95) is None


def test_noise_and_power_reads_identical_requests_and_auto_cells():
    """Champion alone's repeats with the same answer are one group (a different answer is another);
    auto's per-request ratios group by (stratum, T); the needed n follows from auto's spread."""
    def alone(pid, ms, ids=(1, 2, 3, 4)):
        return {"topology": "toy-wasm", "backend": "wasm", "arm": "none", "prompt_id": pid, "temperature": 0.0,
                "token_ids": list(ids), "n_tokens": len(ids), "total_ms": ms}
    recs = [alone("p", 40.0), alone("p", 40.0 * math.exp(0.2)), alone("p", 10.0, ids=(9,)), alone("q", 80.0)]
    rows = [{"topology": "toy-wasm", "arm": "auto", "stratum": s, "temperature": 0.0, "ratio": r}
            for s, r in (("code", 1.0), ("code", math.exp(0.3)), ("json", 2.0), ("json", 2.0))]
    x = A.noise_and_power(recs, rows, "toy-wasm", 0.95)
    assert x["identical_dof"] == 1 and x["identical_log_sd"] == pytest.approx(math.sqrt(2 * 0.1 ** 2))
    assert x["auto_dof"] == 2 and x["auto_log_sd"] == pytest.approx(math.sqrt(2 * 0.15 ** 2 / 2))
    assert x["requests_per_cell"] == 2 and x["needed_at_1x"] == M.requests_to_clear(x["auto_log_sd"], 0.95, 1.0)
    assert A.noise_and_power(recs, rows, "real-wasm", 0.95) is None
