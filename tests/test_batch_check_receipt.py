"""The decider's numerical diagnostics in the receipt (receipt["numerics"], round_record.NumericsTally) on the
CPython reference path, and the receipt's champion_fallback_code (the browser's load-time batch check,
test_batch_check_browser.py). The WebGPU request that shows them is in test_batch_check_browser.py."""
import math

import pytest

from exactspec.core import deciders
from exactspec.core.orchestrator import GenerationConfig
from exactspec.core.receipts import ALLOWED_FIELDS, build_receipt
from exactspec.core.round_record import CLOSE_MARGIN, NumericsTally, decode, encode
from exactspec.reference.processors import SamplingPolicy
from toy_helpers import make_orchestrator

PROMPT = [5, 9, 14, 3, 22, 9, 14]


def outcome(u=None, a=None, near=False, status="verified"):
    words = encode(status, [1], None, 0.0, 0.0, None if u is None else (u, a))
    if near:
        words[3] |= 256                    # protocol.json near_top_p_flag on ended_by
    return decode(words)


def test_tally_counts_rounds_and_the_smallest_margin():
    t = NumericsTally()
    for o in (outcome(0.25, 0.75), outcome(0.5, 0.5000001, near=True), outcome(), outcome(0.3, 0.1, status="draft_failed")):
        t.add(o)
    s = t.summary()
    assert s["decided_rounds"] == 3 and s["near_top_p_rounds"] == 1 and s["judged_rounds"] == 2
    assert s["close_margin_rounds"] == 1 and s["close_margin"] == CLOSE_MARGIN
    assert s["min_acceptance_margin"] == pytest.approx(1e-7, abs=1e-7)     # float32 words: within their precision
    zero_words = encode("verified", [1], None)                          # the WGSL decider writes 0 where no test ran
    zero_words[6] = zero_words[7] = 0
    t2 = NumericsTally()
    t2.add(decode(zero_words))
    assert t2.summary()["judged_rounds"] == 0 and t2.summary()["min_acceptance_margin"] is None


def test_reference_receipt_carries_the_min_margin_of_the_rounds_accept_tests(monkeypatch):
    calls = []                              # (round_id, u, probability) of every accept test, in order
    original = deciders.RngDecider.bernoulli

    def recording(self, probability, domain, round_id, position):
        out = original(self, probability, domain, round_id, position)
        calls.append((round_id, *self.last_accept))
        return out
    monkeypatch.setattr(deciders.RngDecider, "bernoulli", recording)
    orch = make_orchestrator(seed=4)
    res = orch.generate(PROMPT, GenerationConfig(max_new_tokens=24, policy=SamplingPolicy(temperature=1.0),
                                                 speculate="draft", k=3, seed=11))
    numerics = res.receipt["numerics"]
    last = {}
    for round_id, u, a in calls:            # the round's last accept test decided it: the record's diag u, a
        last[round_id] = abs(u - float(a))
    assert numerics["judged_rounds"] == len(last) >= 2, (numerics, last)
    assert numerics["decided_rounds"] == res.stats["rounds"] + res.stats["baseline_steps"]
    assert numerics["near_top_p_rounds"] == 0                   # the float64 reference has no f32 boundary
    assert numerics["min_acceptance_margin"] == pytest.approx(min(last.values()), rel=1e-6, abs=1e-7)
    assert res.receipt["champion_fallback_code"] == "none" and tuple(res.receipt) == ALLOWED_FIELDS


def test_greedy_has_no_accept_test():
    res = make_orchestrator(seed=4).generate(PROMPT, GenerationConfig(max_new_tokens=12, policy=SamplingPolicy(temperature=0),
                                                                     speculate="draft", k=3))
    n = res.receipt["numerics"]
    assert n["judged_rounds"] == 0 and n["min_acceptance_margin"] is None and n["decided_rounds"] >= 1


def test_browser_environment_names_the_champion_fallback():
    stats = {"target_calls": 1, "draft_calls": 0, "proposed": 0, "accepted_count_histogram": [1],
             "rejection_position_histogram": [], "numeric_errors": 0}
    env = {"hardware_class": "wasm-simd/threads-1/q8act-v1/cpu-1-2", "browser_version": "chromium-1", "runtime_version": "x",
           "champion_backend": "wasm", "champion_fallback_code": "E_BATCH_VARIANT", "peak_resident_bytes": {}}
    receipt, _ = build_receipt(identities={}, policy_canonical={}, scheduler={}, seed=1, stats=stats, timing_ms={},
                               failure_code=None, fallback_code=None, environment=env, numerics=NumericsTally().summary())
    assert receipt["champion_fallback_code"] == "E_BATCH_VARIANT" and receipt["champion_backend"] == "wasm"
    assert receipt["numerics"]["min_acceptance_margin"] is None and not math.isnan(receipt["numerics"]["decided_rounds"])
