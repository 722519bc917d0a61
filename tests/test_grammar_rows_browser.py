"""Grammar rows in headless Chromium (web/tests/grammar_rows_harness_browser.html):

- the WebGPU acceptor (web/gpu/accept.mjs, shaders/processors_rows.wgsl, SwiftShader):
  decide({..., rowOffset, rowMasks}) on the decided rows of a block whose forced rows come first (junk
  or NaN), each decided row masked by its own allowed-id bits, against acceptance.decide_round on
  process_logits rows with that row's grammar (the rounds tests/test_grammar_rows.py gives the WASM
  champion); processRows with an offset and masks against process_logits; refusals of offsets past the
  logits and of mis-shaped masks;
- the draft in its module worker (DraftWorkerClient): propose's firstStep and maskBits give what the
  draft gives called directly (the Node harness).
"""
from __future__ import annotations

import numpy as np
import pytest

from browser_fixture import chromium_browser, forward_console, http_server  # noqa: F401
from test_gpu_accept import as_decision, assert_explained, disagreement_margin, js_policy
from test_grammar_rows import (b64, build_masked_rounds, check_against_reference, draft_reference, mask_words, random_mask, reference_rows,
                               row_policy, run_node, unb64, MAX_BLOCK)
from test_wasm_draft import rel_url
from tolerances import within

from exactspec.core.policy import AllowedSetGrammar, SamplingPolicy
from exactspec.reference.processors import process_logits


@pytest.fixture(scope="module")
def harness(chromium_browser, http_server):  # noqa: F811
    context = chromium_browser.new_context()
    page = context.new_page()
    forward_console(page)
    page.goto(http_server.url + "/web/tests/grammar_rows_harness_browser.html")
    page.wait_for_function("() => window.grammarRowsHarnessReady === true", timeout=60_000)
    yield page
    context.close()


def decide_many(harness, V, sets, jobs):
    gpu_sets = [{"logitsB64": s["logits"]} for s in sets]
    return harness.evaluate("a => grammarRowsHarness.decideMany(a)",
                            {"V": V, "maxBlock": MAX_BLOCK, "sets": gpu_sets, "jobs": jobs})


@pytest.mark.parametrize("V,n_sets,rounds_per_set", [(301, 30, 10), (1000, 10, 8)])
def test_gpu_decide_on_offset_rows_with_row_masks_matches_decide_round(harness, V, n_sets, rounds_per_set):
    gen = np.random.default_rng(7100 + V)                # the WASM test's rounds (fewer of them)
    sets, jobs, refs = build_masked_rounds(gen, V, n_sets, rounds_per_set)
    results = decide_many(harness, V, sets, jobs)

    def f32_explained(rows, p_draft, proposals, seed, round_id, got_t, want_t):   # the WGSL decider's float32
        kind, margin = disagreement_margin(rows, p_draft, proposals, seed, round_id, got_t, want_t)
        assert_explained(kind, margin, (got_t, want_t))
        return True
    n_diff, kinds = check_against_reference(results, refs, "GPU", f32_explained)
    print(f"GPU masked decide V={V}: {n_diff}/{len(jobs)} disagreements; outcomes {kinds}")
    assert n_diff <= max(1, len(jobs) // 500)
    assert kinds.get("E_TARGET_NUMERIC_OR_MASK", 0) > 0 and kinds.get("token", 0) > len(jobs) // 4


def test_gpu_one_token_rows_empty_rows_and_refusals(harness):
    """The WASM test's hand-made rounds (V = 301, rowOffset 2 of a 5-row block, forced rows NaN) and
    the acceptor's refusals."""
    V, offset, m, only = 301, 2, 2, 123
    gen = np.random.default_rng(5)
    n_words = -(-V // 32)
    block = (gen.standard_normal((offset + m + 1, V)) * 2).astype(np.float32)
    block[:offset] = np.nan
    logits = block[offset:]
    allowed = np.ones((m + 1, V), bool)
    allowed[2] = False
    allowed[2, only] = True
    empty_mid = allowed.copy()
    empty_mid[1] = False
    props = []
    for i in range(m):
        props.append(int(np.argmax(reference_rows(logits[i:i + 1], props, [], SamplingPolicy(), allowed[i:i + 1])[0])))
    base = {"set": 0, "proposals": props, "policy": js_policy(SamplingPolicy()), "contextIds": [], "seed": [9, 1],
            "roundId": 4, "stopTokenIds": [], "remaining": 10, "rowOffset": offset, "greedy": True}
    jobs = [
        {**base, "rowMasks": b64(mask_words(allowed))},                                  # extra row: only
        {**base, "rowMasks": b64(mask_words(empty_mid))},                                # row 1 empty, reached
        {**base, "proposals": [(props[0] + 1) % V, 0], "rowMasks": b64(mask_words(empty_mid))},   # never reached
        {**base, "rowOffset": 3},                                                        # 3 + 3 rows > 5
        {**base, "rowOffset": -1},
        {**base, "rowMasks": b64(np.zeros((m, n_words), "<u4"))},                        # a row short
        {**base, "rowMasks": b64(np.zeros((m + 1, n_words - 1), "<u4"))},                # words short
        {**base, "logitsRows": 4},                                                       # the forward kept 4: 2 + 3 > 4
        {**base, "proposals": [], "nRows": 1, "rowOffset": 4},                           # the last row alone: fine
    ]
    out = decide_many(harness, V, [{"logits": b64(block)}], jobs)
    assert as_decision(out[0]) == (m, only, -1, "", ""), out[0]
    assert as_decision(out[1]) == (0, -1, -1, "", "E_TARGET_NUMERIC_OR_MASK"), out[1]
    assert as_decision(out[2])[:3] == (0, props[0], 0) and as_decision(out[2])[4] == "", out[2]
    assert [o.get("thrown", "") for o in out[3:]] == ["E_BAD_ARGUMENT"] * 5 + [""], out[3:]
    assert as_decision(out[8])[1] == int(np.argmax(block[4])), out[8]


@pytest.mark.parametrize("V", [301, 1000])
def test_gpu_process_rows_with_offset_and_row_masks(harness, V):
    """processRows on rows rowOffset.. of a block, each with its own mask: process_logits with that
    row's grammar within processed_probs, exactly 0 outside the mask, invalid where the reference raises."""
    gen = np.random.default_rng(40 + V)
    offset, n = 3, 5
    block = (gen.standard_normal((offset + n, V)) * 3).astype(np.float32)
    block[:offset] = np.nan
    allowed = np.stack([random_mask(gen, V, kind) for kind in ["wide", "narrow", "one", "none", "all"]])
    context = [int(c) for c in gen.integers(0, V, size=5)]
    proposals = [int(p) for p in gen.integers(0, V, size=n - 1)]
    for policy in [SamplingPolicy(), SamplingPolicy(temperature=0.7, top_k=V // 5, repetition_penalty=1.3,
                                                    grammar=AllowedSetGrammar(range(0, V, 3)))]:
        out = harness.evaluate("a => grammarRowsHarness.processRows(a)", {
            "V": V, "maxBlock": MAX_BLOCK, "logitsB64": b64(block), "nRows": n, "rowOffset": offset,
            "rowMasks": b64(mask_words(allowed, gen)), "proposals": proposals, "contextIds": context,
            "policy": js_policy(policy), "greedy": False})
        probs = unb64(out["probsB64"], np.float32).reshape(n, V)
        want = reference_rows(block[offset:], context, proposals, policy, allowed)
        for i in range(n):
            if not isinstance(want[i], np.ndarray):
                assert out["status"][i] & 1, (i, "the reference refuses this row")
                continue
            assert out["status"][i] == 0, (i, out["status"][i])
            row_allowed = np.zeros(V, bool)
            row_allowed[list(row_policy(policy, allowed[i]).grammar.allowed)] = True
            assert np.all(probs[i][~row_allowed] == 0), i
            assert np.all(probs[i][want[i] > 1e-30] > 0) and np.all(probs[i][want[i] == 0] == 0), i
            assert within(probs[i], want[i], "processed_probs"), (i, float(np.max(np.abs(probs[i] - want[i]))))


def test_worker_client_passes_first_step_and_mask_bits(harness):
    """DraftWorkerClient.propose (the message to a real worker and its reply) with firstStep and
    maskBits equals the draft called directly in Node."""
    model_dir, ref = draft_reference()
    V = ref.vocab_size
    gen = np.random.default_rng(37)
    base = {"feed": [5, 6, 7, 8], "start_pos": 0, "k": 1, "policy": js_policy(SamplingPolicy()), "seed": [3, 0],
            "round_id": 2, "context": [5, 6, 7, 8]}
    calls = [{**base, "first_step": 5, "mask": None}, {**base, "first_step": 0, "mask": None},
             {**base, "k": 3, "first_step": 2, "mask": b64(mask_words(random_mask(gen, V, "wide")))},
             {**base, "first_step": 1, "mask": b64(mask_words(np.zeros(V, bool)))}]
    direct = run_node({"draft_dir": str(model_dir), "masked": calls})["masked"]
    got = harness.evaluate("a => grammarRowsHarness.workerPropose(a)",
                           {"wasmUrl": "/web/build/cpu.wasm", "modelUrl": rel_url(model_dir), "calls": calls})
    assert got == direct
    assert direct[0]["tokens"] != direct[1]["tokens"] and direct[3]["error_code"] == "E_PROCESSOR_INVALID"
