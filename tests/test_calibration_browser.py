"""The load's calibration in headless Chromium (web/orchestrator/calibrate.mjs) on the shipped toy pair,
WASM champion: present in ready.info with V(1) > 0 and a sane shape, measured within its budget;
a second load in the same browser context reads it from IndexedDB; drift reported twice drops the
entry and measures again between requests; calibrate "off" has none and speculate "auto" still runs."""
import pytest

from browser_fixture import chromium_browser  # noqa: F401
from exactspec.host.browser_run import BrowserRuntime
from exactspec.reference.models import default_models_dir

MODELS = {"champion": "/web/models/champion/", "draft": "/web/models/draft/"}
WASM = {"championBackend": "wasm", "warmUp": False, "threads": 1}   # threads "auto" may choose either per load: another key
GREEDY = {"prompt": "And the LORD said", "config": {"temperature": 0, "max_new_tokens": 12}}


@pytest.fixture(scope="module")
def rt(chromium_browser):
    import os
    d = default_models_dir()
    runtime = BrowserRuntime(os.path.join(d, "champion"), os.path.join(d, "draft"), browser=chromium_browser,
                             champion_backend="wasm", warm_up=False, timeout_s=600)
    yield runtime
    runtime.close()


def load(rt, **options):
    out = rt.page.evaluate("([m, o]) => window.exactspecRunner.tryLoad(m, o)", [MODELS, {**WASM, **options}])
    assert "ready" in out, out
    return out["ready"]


def ask(rt, speculate):
    out = rt.page.evaluate("(p) => window.exactspecRunner.generate(p)",
                           {**GREEDY, "config": {**GREEDY["config"], "speculate": speculate}})
    assert "result" in out and out["result"]["error"] is None, out
    return out["result"]


def test_a_forced_load_measures_the_calibration_within_its_budget(rt):
    ready = load(rt, calibrate="force")
    c = ready["info"]["calibration"]
    assert c["source"] == "measured" and c["cache"] == "miss" and c["version"] == 1 and c["backend"] == "wasm"
    assert len(c["key"]) == 64 and c["budget_ms"] == 300
    v = c["verify_ms"]
    assert v[0] is None and len(v) == 10 and v[1] > 0
    assert v[9] >= v[1] * 0.8                                  # a shape check, not a timing assertion
    assert 1 in c["measured_n"] and 9 in c["measured_n"]
    # the toy pair has its draft: both its costs measured (a catch-up of 8 toy-draft ids is ~0.1 ms
    # more than one id, within a busy machine's noise: it may come out as 0, clamped)
    assert c["draft_ms_per_proposal"] > 0 and c["draft_catchup_ms_per_token"] is not None and c["draft_catchup_ms_per_token"] >= 0
    assert c["ms"] <= c["budget_ms"] + v[1] * 3, c             # within budget (the mandatory V(1) aside)
    assert ready["timing_ms"]["calibration"] >= c["ms"]
    env_key = rt.page.evaluate("() => window.exactspecRunner.info().info.calibration.key")
    assert env_key == c["key"]


def test_a_second_load_in_the_same_browser_context_reads_it_from_the_cache(rt):
    first = load(rt)["info"]["calibration"]                  # after the forced load above: cached
    again = load(rt)["info"]["calibration"]
    spot = again["spot_check"]                                 # V(1) timed now against the entry's
    assert spot["v1_ms"] > 0 and spot["ratio"] == pytest.approx(spot["v1_ms"] / first["verify_ms"][1], rel=1e-2)
    assert again["key"] == first["key"]
    if 0.75 <= spot["ratio"] <= 1.33:                          # (a busy machine can make it stale: then measured anew)
        assert again["source"] == "cache" and again["cache"] == "hit"
        assert again["verify_ms"] == first["verify_ms"] and again["measured_at"] == first["measured_at"]
    else:
        assert again["source"] == "measured" and again["cache"] == "stale" and again["measured_at"] != first["measured_at"]
    assert load(rt, calibrate="force")["info"]["calibration"]["source"] == "measured"


def test_drift_reported_twice_drops_the_entry_and_measures_again_between_requests(rt):
    rt.page.evaluate("() => { window.stagesSeen = []; window.exactspecProgress = (p) => window.stagesSeen.push(p.stage); }")
    before = load(rt, faults=True)["info"]["calibration"]
    rt.page.evaluate("() => window.exactspecRunner.fault({action: 'report_drift', value: 2.0, requests: 2})")
    ask(rt, "none")
    assert rt.page.evaluate("() => window.exactspecRunner.info().info.calibration.measured_at") == before["measured_at"]
    assert "calibration_due" not in rt.page.evaluate("() => window.stagesSeen")
    ask(rt, "none")                                            # the second in a row: dropped, measured when idle
    # announced before the result (the evaluation's page waits for the measurement on it)
    assert rt.page.evaluate("() => window.stagesSeen.filter((s) => s === 'calibration_due').length") == 1
    rt.page.wait_for_function("(t) => window.exactspecRunner.info().info.calibration.measured_at !== t",
                              arg=before["measured_at"], timeout=60000)
    after = rt.page.evaluate("() => window.exactspecRunner.info().info.calibration")
    assert after["source"] == "measured" and after["key"] == before["key"] and after["verify_ms"][1] > 0
    ask(rt, "none")                                            # requests run on after it
    # the new measurement is what the cache holds now
    reloaded = load(rt)["info"]["calibration"]
    assert reloaded["cache"] == "stale" or reloaded["measured_at"] == after["measured_at"]


def test_calibrate_off_has_none_and_auto_still_gives_the_champions_greedy_tokens(rt):
    ready = load(rt, calibrate="off")
    assert ready["info"]["calibration"] is None and ready["timing_ms"]["calibration"] == 0
    alone = ask(rt, "none")
    auto = ask(rt, "auto")
    assert auto["token_ids"] == alone["token_ids"]


def test_on_webgpu_the_budget_allows_few_points_and_says_what_it_skipped(rt):
    """SwiftShader's WebGPU (~40 ms a step): V(1) and V(5) are timed, the rest that did not fit in 300 ms is
    listed in `skipped` and interpolated (or n x V(1)); the calibration's key differs from WASM's."""
    wasm_key = load(rt)["info"]["calibration"]["key"]
    ready = load(rt, championBackend="webgpu", calibrate="force")
    c = ready["info"]["calibration"]
    assert ready["info"]["champion"]["backend"] == "webgpu" and c["backend"] == "webgpu" and c["key"] != wasm_key
    assert c["verify_ms"][1] > 0 and all(v is not None for v in c["verify_ms"][1:])
    assert c["verify_ms"][9] >= c["verify_ms"][1] * 0.8
    assert c["skipped"] and len(c["measured_n"]) < 9, c
    # V(5), k = 4's block, second (past the budget if need be): SwiftShader's V is flat to 5 rows and
    # ~1.7x from 6, and a line through V(1) and V(9) alone priced V(5) 27-47% high (test-split run #15)
    assert c["measured_n"][:2] == [1, 5], c
    assert c["ms"] <= c["budget_ms"] + 2 * c["verify_ms"][9], c     # one step's misprediction at most


def test_a_draft_that_arrives_after_ready_joins_the_calibration(rt):
    """draftInBackground: the load's calibration has no draft (its key says none); when the draft
    arrives a calibration is due, measured between requests with the draft's costs."""
    ready = load(rt, draftInBackground=True, faults=True, draftDelayMs=2500)
    first = ready["info"]["calibration"]
    assert ready["info"]["draft_loading"] is True and first["draft_ms_per_proposal"] is None
    rt.page.wait_for_function("() => window.exactspecRunner.info().info.calibration?.draft_ms_per_proposal > 0", timeout=60000)
    after = rt.page.evaluate("() => window.exactspecRunner.info().info.calibration")
    assert after["key"] != first["key"] and after["draft_catchup_ms_per_token"] is not None
    assert ask(rt, "auto")["stats"]["auto"]["calibration_key"] == after["key"]   # served to the next request
