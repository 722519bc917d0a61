"""WebGPU acceptor (web/gpu/accept.mjs) at Qwen2's vocabulary, V = 151936, on random logits.

A few rows only (SwiftShader runs a row on one CPU thread): processed rows against
processors.process_logits (float64) and the float32 twin, and decide() against decide_round,
with the workgroup size the acceptor picks for this V (64 on SwiftShader: a 4-invocation row
would need a 148 KiB private array, over the compiler's 64 KiB cap).
"""
from __future__ import annotations

import numpy as np
import pytest

from browser_fixture import chromium_browser, http_server  # noqa: F401
from exactspec.twins import accept_twins
from exactspec.core.errors import ExactSpecError
from exactspec.core.policy import SamplingPolicy
from test_gpu_accept import (as_decision, assert_explained, disagreement_margin, draft_proposals, harness,  # noqa: F401
                             js_policy, make_round_set, reference_decision, reference_rows, run_process_rows, run_rounds)
from tolerances import max_error, within

V = 151936


def test_workgroup_size_follows_the_vocabulary(harness):  # noqa: F811
    assert accept_twins.workgroup_size(4096) == 4 and accept_twins.workgroup_size(V) == 64
    info = harness.evaluate("async ([v]) => { await acceptHarness.init(v, 5); return acceptHarness.init(v, 5); }", [V])
    assert info["workgroupSize"] == (64 if info["architecture"] == "swiftshader" else 256)
    with pytest.raises(Exception, match="E_BAD_ARGUMENT|workgroupSize"):
        run_process_rows(harness, V, np.zeros((1, V), np.float32), [], [], SamplingPolicy(), workgroup_size=4)


def test_process_rows_at_151936(harness):  # noqa: F811
    gen = np.random.default_rng(151936)
    logits = (gen.standard_normal((3, V)) * 2.5).astype(np.float32)
    logits[1, gen.integers(0, V, 40)] = 9.0                  # ties at the top
    context = [int(c) for c in gen.integers(0, V, 12)] + [V - 1]
    proposals = [int(gen.integers(0, V)), V - 1]
    checked = near = 0
    for policy in (SamplingPolicy(), SamplingPolicy(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2,
                                                    suppress_token_ids=(0, V - 2)),
                   SamplingPolicy(top_p=0.6), SamplingPolicy(temperature=0, repetition_penalty=1.3)):
        got, out = run_process_rows(harness, V, logits, context, proposals, policy, greedy=policy.temperature == 0)
        twin, twin_status, _ = accept_twins.processors_rows(logits, context, proposals, policy)
        for i, want in enumerate(reference_rows(logits, context, proposals, policy)):
            assert not isinstance(want, ExactSpecError) and out["status"][i] & accept_twins.ROW_INVALID == 0
            if out["status"][i] & accept_twins.ROW_NEAR_TOP_P:
                near += 1
                continue
            label = (str(policy), i, max_error(got[i], want, "processed_probs"))
            assert within(got[i], want, "processed_probs") and within(got[i], twin[i], "processed_probs"), label
            assert np.array_equal(got[i] > 0, want > 1e-30), label
            if policy.temperature == 0:
                assert out["argmax"][i] == int(np.argmax(want))
            checked += 1
    print(f"processRows V={V}: {checked} rows checked, {near} near top-p")
    assert checked >= 10


def test_decide_at_151936(harness):  # noqa: F811
    gen = np.random.default_rng(7)
    sets, jobs, refs = [], [], []
    for s, style in enumerate(("close", "far", "disjoint")):
        logits, p_draft, policy = make_round_set(gen, V, 4, style)
        sets.append((logits, p_draft))
        seed = 2 * int(gen.integers(0, 2**62)) + 1
        for r in range(2):
            proposals = draft_proposals(p_draft, seed, r)
            jobs.append({"set": s, "proposals": proposals, "policy": js_policy(policy), "contextIds": [],
                         "seed": [seed & 0xFFFFFFFF, seed >> 32], "roundId": r, "stopTokenIds": [], "remaining": 9,
                         "greedy": False})
            refs.append((logits, p_draft, proposals, policy, seed, r))
    results, ms = run_rounds(harness, V, 5, sets, jobs)
    n_diff = twin_diff = 0
    for got, (logits, p_draft, proposals, policy, seed, r) in zip(results, refs):
        rows, want = reference_decision(logits, p_draft, proposals, policy, seed, r, [], 9, False)
        probs, status, argmax = accept_twins.processors_rows(logits[:len(proposals) + 1], [], proposals, policy)
        twin = accept_twins.accept_decide(probs, status, argmax, p_draft, proposals, seed, r, [], 9, False)
        if as_decision(got) != as_decision(want):
            n_diff += 1
            kind, margin = disagreement_margin(rows, p_draft, proposals, seed, r, as_decision(got), as_decision(want))
            assert_explained(kind, margin, (as_decision(got), as_decision(want)))
        twin_diff += as_decision(got) != as_decision(twin)
    print(f"decide V={V}: {n_diff}/{len(jobs)} disagreements with decide_round, {twin_diff} with the f32 twin, "
          f"{ms / len(jobs):.0f} ms per decide()")
    assert n_diff <= 1 and twin_diff <= 1
