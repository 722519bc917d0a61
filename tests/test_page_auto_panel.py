"""The page's auto panel in words (web/ui/auto_panel.mjs, run in Node on synthetic objects of the
contracts: a tokens event's round.auto, stats.auto, ready.info.calibration, ready.info.batch_check
and champion_fallback): each method's sentence names it and its cost, absent fields say nothing."""
import json
import subprocess

from browser_fixture import REPO_ROOT

MODULE = (REPO_ROOT / "web" / "ui" / "auto_panel.mjs").as_uri()
LIVE = (REPO_ROOT / "web" / "ui" / "live_stats.mjs").as_uri()


def run_js(calls):
    """[(function name, args)] -> [result]: each call of auto_panel.mjs's export, in Node."""
    script = f"""
const m = await import({json.dumps(MODULE)});
const calls = {json.dumps(calls)};
console.log(JSON.stringify(calls.map(([f, args]) => m[f](...args))));
"""
    out = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def auto(method, k, none, draft=None, lookup=None, acc_draft=None, acc_lookup=None, reason="cheapest"):
    return {"method": method, "k": k, "cost_per_token_ms": {"none": none, "draft": draft, "lookup": lookup},
            "expected_tokens": {"draft": 2.5 if draft else None, "lookup": 1.5 if lookup else None},
            "acceptance": {"draft": acc_draft, "lookup": acc_lookup}, "reason": reason}


def test_each_method_in_words():
    draft, off, lookup, probe, margin, nothing, last = run_js([
        ["autoSentence", [auto("draft", 3, 5.6, draft=4.1, lookup=6.0, acc_draft=0.72)]],
        ["autoSentence", [auto("none", 0, 3.5, draft=7.9, acc_draft=0.31)]],
        ["autoSentence", [auto("lookup", 6, 7.0, lookup=6.2, acc_lookup=0.55)]],
        ["autoSentence", [auto("draft", 1, 3.5, draft=4.0, reason="probe")]],
        ["autoSentence", [auto("none", 0, 3.5, draft=3.4, lookup=9.0, acc_draft=0.4, reason="margin")]],
        ["autoSentence", [auto("none", 0, 3.5, reason="no_draft")]],
        ["autoSentence", [auto("none", 0, 3.5, draft=2.0, reason="last_token")]],
    ])
    first_probe, lookup_unknown = run_js([
        ["autoSentence", [auto("draft", 1, 7.4, acc_draft=0.5, reason="probe")]],
        ["autoSentence", [auto("lookup", 4, 7.4)]],
    ])
    assert first_probe == "Trying the draft, 1 token ahead, to measure its cost and acceptance (the champion alone: 7.4 ms a token)"
    assert lookup_unknown == "Prompt lookup found a match, 4 tokens ahead: its cost is not known yet (the champion alone: 7.4 ms a token)"
    unproven, untimed, no_match = run_js([
        ["autoSentence", [auto("none", 0, 3.5, draft=2.0, acc_draft=0.8)]],   # cheaper on its prior, not yet observed
        ["autoSentence", [auto("none", 0, None, reason="no_draft")]],
        ["autoSentence", [auto("none", 0, 3.5, reason="no_match")]],
    ])
    assert unproven == ("Speculation off: the draft might cost 2.0 ms a token against 3.5 ms alone, but its acceptance "
                        "is not measured enough yet (acceptance 80%)")
    assert untimed == "Speculation off: the champion alone runs until its step is timed"
    assert no_match == "Speculation off: prompt lookup found no match; the champion alone costs 3.5 ms a token"
    assert draft == ("Using the draft, 3 tokens ahead: it costs 4.1 ms a token against 5.6 ms for the champion alone "
                     "(acceptance 72%)")
    assert off == "Speculation off: the draft would cost 7.9 ms a token against 3.5 ms alone (acceptance 31%)"
    assert lookup == ("Prompt lookup found a match, 6 tokens ahead: 6.2 ms a token expected against 7.0 ms for the "
                      "champion alone (acceptance 55%)")
    assert probe == ("Trying the draft, 1 token ahead, to measure its acceptance: 4.0 ms a token expected against "
                     "3.5 ms for the champion alone")
    assert margin == ("Speculation off: the draft would cost 3.4 ms a token against 3.5 ms alone, not cheaper by the "
                      "margin (acceptance 40%)")      # the cheaper of the two alternatives is named
    assert nothing == ("Speculation off: no draft is loaded and prompt lookup has nothing to propose; the champion "
                       "alone costs 3.5 ms a token")
    assert last == "Champion alone for the last token: nothing is left to speculate on"


def test_absent_fields_say_nothing():
    results = run_js([
        ["autoSentence", [None]], ["autoSentence", [{}]], ["autoSentence", [{"method": "beam"}]],
        ["countMethods", [[{"proposed": 4, "accepted": 2}]]], ["roundsText", [None]],
        ["calibrationSentence", [None]], ["calibrationSentence", [{"version": 1}]],
        ["batchCheckSentence", [{}]], ["batchCheckSentence", [None]],
    ])
    assert results == [None] * 9


def test_rounds_by_method_live_then_from_the_result():
    rounds = ([{"auto": {"method": m}} for m in ("draft", "draft", "none", "lookup", "draft")] + [{"proposed": 0}]
              + [{"auto": {"method": "none"}, "steps": 6}])      # a chain of 6 baseline steps: 6 rounds
    counts, live, done = run_js([
        ["countMethods", [rounds]],
        ["roundsText", [{"draft": 3, "lookup": 1, "none": 1}]],
        ["roundsText", [None, {"policy": "auto", "version": 1, "rounds_by_method": {"none": 2, "draft": 0, "lookup": 5},
                               "switches": 1, "drift": 1.08, "calibration_key": "ab"}]],
    ])
    assert counts == {"draft": 3, "lookup": 1, "none": 7}
    assert live == "Rounds: 3 with the draft, 1 with prompt lookup, 1 champion alone"
    assert done == ("Rounds: 5 with prompt lookup, 2 champion alone; 1 switch of method; champion steps ran at 1.08x "
                    "the calibrated time")


CALIBRATION = {"version": 1, "key": "ab" * 32, "source": "measured", "measured_at": "2026-12-02T02:00:00Z", "ms": 180,
               "backend": "wasm", "verify_ms": [None, 3.5, 4.0, 4.6, 5.1, 5.7, 6.2, 6.8, 7.3, 7.8],
               "verify_sampled_extra_ms_per_row": 0.05, "measured_n": [1, 9, 5, 3], "draft_ms_per_proposal": 0.6,
               "draft_catchup_ms_per_token": 0.2, "lookup_ms": None}


def test_calibration_in_one_line():
    failed, stale = run_js([
        ["calibrationSentence", [{"error": "E_INTERNAL: calibration round: status 5", "key": None}]],
        ["calibrationSentence", [{**CALIBRATION, "cache": "stale", "draft_ms_per_proposal": None, "measured_n": [1]}]],
    ])
    assert failed == ("This device could not be measured (E_INTERNAL: calibration round: status 5): auto keeps "
                      "speculation off until it has timed its own rounds")
    assert stale == "Measured at load in 180 ms (WASM): a champion step 3.5 ms (the cached one no longer matched this device)"
    measured, cached, no_draft, gpu_one_point = run_js([
        ["calibrationSentence", [CALIBRATION]],
        ["calibrationSentence", [{**CALIBRATION, "source": "cache"}]],
        ["calibrationSentence", [{**CALIBRATION, "draft_ms_per_proposal": None, "measured_n": [1, 5]}]],
        ["calibrationSentence", [{**CALIBRATION, "backend": "webgpu", "ms": 310.4, "measured_n": [1],
                                  "draft_ms_per_proposal": None}]],
    ])
    assert measured == ("Measured at load in 180 ms (WASM): a champion step 3.5 ms, a block of 9 rows 7.8 ms, "
                        "a draft proposal 0.60 ms")
    assert cached == ("Measured on this device earlier in 180 ms (WASM): a champion step 3.5 ms, a block of 9 rows "
                      "7.8 ms, a draft proposal 0.60 ms (from cache)")
    assert no_draft == "Measured at load in 180 ms (WASM): a champion step 3.5 ms, a block of 5 rows 5.7 ms"
    assert gpu_one_point == "Measured at load in 310 ms (WebGPU): a champion step 3.5 ms"   # interpolated n not quoted


def test_batch_check_and_the_fallback():
    check = {"backend": "webgpu", "positions": 5, "ms": 4.2, "result": "invariant", "first_mismatch": None}
    fallback = {"code": "E_BATCH_VARIANT", "message": "the champion's kernels gave different logits for the same "
                "positions run as one block and one by one"}
    ok, fell, fell_checked = run_js([
        ["batchCheckSentence", [{"batch_check": check}]],
        ["batchCheckSentence", [{"batch_check": {**check, "result": "variant"}, "champion_fallback": fallback}]],
        ["batchCheckSentence", [{"batch_check": {**check, "backend": "wasm", "ms": 1.3}, "champion_fallback": fallback}]],
    ])
    assert ok == "Kernels checked batch-invariant (WebGPU, 4.2 ms)"
    assert fell == ("The GPU champion was not used (E_BATCH_VARIANT: the champion's kernels gave different logits for "
                    "the same positions run as one block and one by one): the champion runs on WASM, so greedy "
                    "answers stay exactly the champion's")
    assert fell_checked == fell + "; the WASM kernels checked batch-invariant (WASM, 1.3 ms)"


def test_live_stats_carries_the_last_choice_and_the_counts():
    """live_stats.mjs: the last round's auto object (a final last-token round skipped) and the rounds
    by method; the load's calibration
    is a segment of the waterfall after the warm-up."""
    script = f"""
const {{ createLiveStats, waterfall }} = await import({json.dumps(LIVE)});
const live = createLiveStats(0);
const round = (method) => ({{ proposed: method === "none" ? 0 : 2, accepted: 1, draft_ms: 1, verify_ms: 2,
  auto: {{ method, k: method === "none" ? 0 : 2, cost_per_token_ms: {{ none: 3 }}, reason: "cheapest" }} }});
for (const m of ["draft", "none", "lookup"]) live.onTokens({{ token_ids: [1], sources: ["baseline"], round: round(m) }}, 5);
const ended = createLiveStats(0);
for (const m of ["draft", "lookup"]) ended.onTokens({{ token_ids: [1], round: round(m) }}, 5);
ended.onTokens({{ token_ids: [1], round: {{ ...round("none"), auto: {{ ...round("none").auto, reason: "last_token" }} }} }}, 6);
const plain = createLiveStats(0);
plain.onTokens({{ token_ids: [1, 2], sources: ["baseline"], round: {{ proposed: 0, accepted: 0 }} }}, 5);
const [a, b] = [live.snapshot(10), plain.snapshot(10)];
const segs = waterfall({{ warmup: 300, calibration: 120 }}, a.answer).map((x) => x.label);
console.log(JSON.stringify([a.auto.method, a.autoCounts, b.auto, b.autoCounts, segs.slice(0, 2), ended.snapshot(10).auto.method]));
"""
    out = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["lookup", {"draft": 1, "lookup": 1, "none": 1}, None, None, ["warm-up", "calibration"],
                                       "lookup"]   # a final last-token round leaves the last weighed choice shown
