"""Grammar rows in the CPU module (Node): the WASM champion's decide({..., rowOffset, rowMasks}) and the
WASM draft's propose({..., firstStep, maskBits}) against the float64 references.

- decide on logits rows rowOffset .. rowOffset + m of a block whose earlier rows (forced tokens) are
  junk or NaN, each decided row masked by its own allowed-id bits (xgrammar's bitmask layout) and the
  policy's allowed ids: the decision words equal acceptance.decide_round on process_logits rows with
  that row's grammar (greedy: always; sampled: except inside the float64 margins of the tolerance
  table), a one-token row gives that token, an empty row the round reaches gives
  E_TARGET_NUMERIC_OR_MASK, bad offsets and mask shapes are E_BAD_ARGUMENT;
- propose: k = 1 calls with firstStep 0..k-1 equal one k-call bit for bit (tokens and p_draft), and
  masked k = 1 steps equal RunnerDraft.propose(first_step=i) with the mask as the policy's grammar
  (tokens always allowed, p_draft exactly 0 outside the mask, rows within the draft tolerances); an
  empty mask is E_PROCESSOR_INVALID; the worker's protocol handler passes first_step and mask_bits.

Models (tests/synthetic_models.py): odd_q8 (V = 301) and tiny_llama (V = 1000) champions, the
draft_tiny_llama draft (V = 301): none of them a multiple of 32 words, so the last mask word is partial.
"""
from __future__ import annotations

import base64
import dataclasses

import numpy as np
import pytest

from browser_fixture import REPO_ROOT
from node_harness import run_harness
from test_gpu_accept import as_decision, draft_proposals, js_policy
from test_wasm_champion import ensure_wasm, explain, reference_quantities
from tolerances import TOLERANCES
import synthetic_models

from exactspec.core import rng
from exactspec.core.acceptance import decide_round
from exactspec.core.backends import RunnerDraft
from exactspec.core.caches import LogicalCache
from exactspec.core.deciders import RngDecider
from exactspec.core.errors import ExactSpecError
from exactspec.core.policy import AllowedSetGrammar, SamplingPolicy
from exactspec.reference.processors import process_logits
from exactspec.reference.reference_llama import LlamaReference

HARNESS = REPO_ROOT / "web" / "tests" / "grammar_rows_harness.mjs"
WASM = REPO_ROOT / "web" / "build" / "cpu.wasm"
MAX_BLOCK = 9


def b64(array) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()


def unb64(text, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


def run_node(cases: dict) -> dict:
    ensure_wasm()
    return run_harness(HARNESS, {"wasm": str(WASM), "max_block": MAX_BLOCK, **cases})


# ----------------------------------------------------------------------------- masks
def mask_words(allowed: np.ndarray, gen=None) -> np.ndarray:
    """(n, V) bool allowed -> (n, ceil(V / 32)) uint32: bit (id & 31) of word (id >> 5) set = allowed.
    With `gen`, the padding bits past V are random (xgrammar's are not promised): they must not matter."""
    allowed = np.atleast_2d(allowed)
    n, V = allowed.shape
    n_words = -(-V // 32)
    padded = np.zeros((n, n_words * 32), bool)
    padded[:, :V] = allowed
    if gen is not None:
        padded[:, V:] = gen.integers(0, 2, size=(n, n_words * 32 - V)).astype(bool)
    return np.packbits(padded, axis=1, bitorder="little").view("<u4").reshape(n, n_words)


def random_mask(gen, V, kind) -> np.ndarray:
    """(V,) bool: "wide" about half, "narrow" 2-6 ids, "one" exactly one, "all", "none"."""
    allowed = np.zeros(V, bool)
    if kind == "wide":
        allowed[gen.random(V) < 0.5] = True
    elif kind == "narrow":
        allowed[gen.choice(V, size=int(gen.integers(2, 7)), replace=False)] = True
    elif kind == "one":
        allowed[int(gen.integers(V))] = True
    elif kind == "all":
        allowed[:] = True
    return allowed


def row_policy(policy: SamplingPolicy, allowed: np.ndarray) -> SamplingPolicy:
    """The policy of one masked row: its grammar is the row's allowed ids AND the policy's allowed set."""
    ids = set(np.flatnonzero(allowed).tolist())
    if policy.grammar is not None:
        ids &= set(policy.grammar.allowed)
    return dataclasses.replace(policy, grammar=AllowedSetGrammar(ids))


def reference_rows(logits, context, proposals, policy, allowed):
    """Decided row i: process_logits(logits[i], context + proposals[:i]) with row i's mask (or its error)."""
    rows = []
    for i in range(logits.shape[0]):
        try:
            rows.append(process_logits(logits[i], list(context) + list(proposals[:i]), row_policy(policy, allowed[i])))
        except ExactSpecError as err:
            rows.append(err)
    return rows


# ----------------------------------------------------------------------------- decide
def champion_dir(which: str):
    return {"odd": synthetic_models.odd_q8, "tiny": lambda: synthetic_models.tiny_llama(seed=3)}[which]()


MASK_KINDS = ["wide", "wide", "narrow", "one", "all", "wide", "narrow", "none"]


def build_masked_rounds(gen, V, n_sets, rounds_per_set):
    """Blocks of F = offset + m + 1 rows: `offset` forced rows (random or NaN: never decided on), then
    m + 1 decided rows with per-row masks; rounds over policies, seeds, greedy, stops, remaining."""
    sets, jobs, refs = [], [], []
    for s in range(n_sets):
        offset = [1, 2, 3, 0, 4][s % 5]
        m = int(gen.integers(0, MAX_BLOCK - offset))
        block = (gen.standard_normal((offset + m + 1, V)) * gen.choice([0.5, 2.0, 5.0])).astype(np.float32)
        if s % 2:
            block[:offset] = np.nan                         # a decision that read a forced row would fail
        logits = block[offset:]
        allowed = np.stack([random_mask(gen, V, MASK_KINDS[int(gen.integers(len(MASK_KINDS)))]) for _ in range(m + 1)])
        if s % 4 == 0:
            allowed[:] = True                               # no id masked: the plain round, at an offset
        draft_logits = logits[:m] + gen.standard_normal((m, V)).astype(np.float32) * 0.5
        p_draft = np.zeros((m, V), np.float32)
        for i in range(m):                                  # the draft saw the same mask
            p_draft[i] = process_logits(draft_logits[i], [], row_policy(SamplingPolicy(), allowed[i])) \
                if allowed[i].any() else np.full(V, 1.0 / V)
        words = mask_words(allowed, gen)
        sets.append({"logits": b64(block)})
        seed = int(gen.integers(0, 2**63)) * 2 + int(gen.integers(0, 2))
        for r in range(rounds_per_set):
            round_id = int(gen.integers(0, 2**32))
            greedy = r % 4 == 3 or r % 6 == 1
            some = set(gen.choice(V, size=V // 2, replace=False).tolist())
            policy = [SamplingPolicy(), SamplingPolicy(temperature=0.7, top_k=max(1, V // 4), repetition_penalty=1.3),
                      SamplingPolicy(grammar=AllowedSetGrammar(some), suppress_token_ids=(0,)),
                      SamplingPolicy(temperature=0)][r % 4]
            context = [int(c) for c in gen.integers(0, V, size=int(gen.integers(0, 5)))]
            proposals = draft_proposals(p_draft, seed, round_id)
            if greedy:                                      # the reference's argmax chain, one deviation
                proposals = []
                for i in range(m):
                    row = reference_rows(logits[i:i + 1], list(context) + proposals, [], policy, allowed[i:i + 1])[0]
                    proposals.append(int(np.argmax(row)) if isinstance(row, np.ndarray) else i)
                if m and r % 8 == 7:
                    proposals[int(gen.integers(m))] = int(gen.integers(V))
            stops = [proposals[int(gen.integers(m))]] if m and r % 5 == 0 else [int(gen.integers(V))]
            remaining = int(gen.integers(m, m + 3)) if m else 1
            jobs.append({"set": s, "proposals": proposals, "policy": js_policy(policy), "contextIds": context,
                         "seed": [seed & 0xFFFFFFFF, seed >> 32], "roundId": round_id, "stopTokenIds": stops,
                         "remaining": remaining, "greedy": greedy, "rowOffset": offset, "rowMasks": b64(words),
                         "pDraft": b64(p_draft) if m and not greedy else None})
            refs.append((logits, p_draft, proposals, policy, allowed, seed, round_id, stops, remaining, greedy, context))
    return sets, jobs, refs


def check_against_reference(results, refs, label, explained=explain):
    """Every decision against decide_round on the masked reference rows -> (disagreements, outcomes).
    `explained(rows, p_draft, proposals, seed, round_id, got, want)`: whether a sampled disagreement
    is within the decider's arithmetic (the WASM champion's float64 one by default)."""
    n_diff, kinds = 0, {}
    for got, (logits, p_draft, proposals, policy, allowed, seed, round_id, stops, remaining, greedy, context) \
            in zip(results, refs):
        assert "thrown" not in got, (label, got)
        rows = reference_rows(logits, context, proposals, policy, allowed)
        p_rows = [None] * len(proposals) if greedy else [p_draft[i].astype(np.float64) for i in range(len(proposals))]
        with np.errstate(divide="ignore", invalid="ignore"):
            want = decide_round(rows, p_rows, proposals, RngDecider(seed), round_id, stops, remaining, greedy)
        got_t, want_t = as_decision(got), as_decision(want)
        kinds[want_t[4] or want_t[3] or "token"] = kinds.get(want_t[4] or want_t[3] or "token", 0) + 1
        if want_t[1] >= 0:                                  # a token the round emits is allowed by its row
            row = len(proposals) if want_t[2] < 0 else want_t[2]
            assert allowed[row][want_t[1]], (label, "reference emitted a masked token")
        if got_t != want_t:
            n_diff += 1
            assert not greedy, (label, "greedy decisions must be equal", got_t, want_t)
            assert explained(rows, p_draft, proposals, seed, round_id, got_t, want_t), (label, got_t, want_t)
        if got_t[1] >= 0:
            row = len(proposals) if got_t[2] < 0 else got_t[2]
            assert allowed[row][got_t[1]], (label, "the decider emitted a token its row's mask forbids", got_t)
    return n_diff, kinds


@pytest.mark.parametrize("which,V,n_sets,rounds_per_set", [("odd", 301, 40, 12), ("tiny", 1000, 12, 12)])
def test_decide_on_offset_rows_with_row_masks_matches_decide_round(which, V, n_sets, rounds_per_set):
    gen = np.random.default_rng(7100 + V)
    sets, jobs, refs = build_masked_rounds(gen, V, n_sets, rounds_per_set)
    out = run_node({"champion_dir": str(champion_dir(which)), "decide": {"sets": sets, "jobs": jobs}})
    n_diff, kinds = check_against_reference(out["decide"], refs, which)
    print(f"masked decide {which}: {n_diff}/{len(jobs)} disagreements; outcomes {kinds}")
    assert n_diff <= max(1, len(jobs) // 500)
    assert kinds.get("E_TARGET_NUMERIC_OR_MASK", 0) > 0 and kinds.get("token", 0) > len(jobs) // 3


def test_decide_one_token_rows_empty_rows_and_refusals():
    """Hand-made rounds on odd_q8 (V = 301) at rowOffset 2 of a 5-row block whose forced rows are NaN."""
    V, offset, m = 301, 2, 2
    gen = np.random.default_rng(5)
    n_words = -(-V // 32)
    block = (gen.standard_normal((offset + m + 1, V)) * 2).astype(np.float32)
    block[:offset] = np.nan
    logits = block[offset:]
    only = 123
    allowed = np.ones((m + 1, V), bool)
    allowed[2] = False
    allowed[2, only] = True                                 # the extra row allows one id
    empty_mid = allowed.copy()
    empty_mid[1] = False                                    # decided row 1 allows none
    one_first = allowed.copy()
    one_first[0] = False
    one_first[0, only] = True                               # decided row 0 allows `only` ...
    not_only = SamplingPolicy(grammar=AllowedSetGrammar([only + 1]))   # ... and the policy only `only + 1`
    greedy_props = []
    for i in range(m):
        greedy_props.append(int(np.argmax(reference_rows(logits[i:i + 1], greedy_props, [], SamplingPolicy(),
                                                         allowed[i:i + 1])[0])))
    p_equal = np.stack([process_logits(logits[i], greedy_props[:i], SamplingPolicy()) for i in range(m)]).astype(np.float32)
    base = {"proposals": greedy_props, "policy": js_policy(SamplingPolicy()), "contextIds": [], "seed": [9, 1],
            "roundId": 4, "stopTokenIds": [], "remaining": 10, "rowOffset": offset}
    jobs = [
        {**base, "set": 0, "greedy": True, "rowMasks": b64(mask_words(allowed))},                     # 0: extra = only
        {**base, "set": 0, "greedy": False, "rowMasks": b64(mask_words(allowed)), "pDraft": b64(p_equal)},   # 1: same, sampled
        {**base, "set": 0, "greedy": True, "rowMasks": b64(mask_words(empty_mid))},                   # 2: row 1 reached, empty
        {**base, "set": 0, "greedy": True, "proposals": [(greedy_props[0] + 1) % V, 0],               # 3: rejected at row 0:
         "rowMasks": b64(mask_words(empty_mid))},                                                     #    row 1 never read
        {**base, "set": 0, "greedy": True, "policy": js_policy(not_only), "rowMasks": b64(mask_words(one_first))},   # 4: AND: none
    ]
    errors = [
        {**base, "set": 0, "greedy": True, "rowOffset": 3},                                            # 3 + 3 rows > 5 kept
        {**base, "set": 0, "greedy": True, "rowOffset": -1},
        {**base, "set": 0, "greedy": True, "rowMasks": b64(np.zeros((m, n_words), "<u4"))},            # one row short
        {**base, "set": 0, "greedy": True, "rowMasks": b64(np.zeros((m + 1, n_words - 1), "<u4"))},    # words short
        {**base, "set": 0, "greedy": True, "proposals": [], "nRows": 1, "rowOffset": 4},              # the last row alone: fine
    ]
    out = run_node({"champion_dir": str(champion_dir("odd")), "decide": {"sets": [{"logits": b64(block)}], "jobs": jobs},
                    "decide_errors": {"sets": [{"logits": b64(block)}], "jobs": errors}})
    got = [as_decision(d) for d in out["decide"]]
    assert got[0] == (m, only, -1, "", ""), got[0]
    assert got[1] == (m, only, -1, "", ""), got[1]
    assert got[2] == (0, -1, -1, "", "E_TARGET_NUMERIC_OR_MASK"), got[2]
    assert got[3][:3] == (0, greedy_props[0], 0) and got[3][4] == "", got[3]
    assert got[4] == (0, -1, -1, "", "E_TARGET_NUMERIC_OR_MASK"), got[4]
    policies = [SamplingPolicy()] * 4 + [not_only]
    row_masks = [allowed, allowed, empty_mid, empty_mid, one_first]
    refs = [(logits, p_equal, j["proposals"], policies[k], row_masks[k], 9 + (1 << 32), 4, [], 10, j["greedy"], [])
            for k, j in enumerate(jobs)]
    assert check_against_reference(out["decide"], refs, "hand-made")[0] == 0
    codes = [d.get("thrown", "") for d in out["decide_errors"]]
    assert codes == ["E_BAD_ARGUMENT"] * 4 + [""], codes
    assert out["decide_errors"][4]["error_code"] == "", out["decide_errors"][4]   # row 4 is finite: decided


# ----------------------------------------------------------------------------- draft
_draft: dict = {}


def draft_reference():
    if not _draft:
        d = synthetic_models.draft_tiny_llama()
        _draft.update(dir=d, ref=LlamaReference.from_dir(d))
    return _draft["dir"], _draft["ref"]


def policy_json(p: SamplingPolicy) -> dict:
    return js_policy(p)


DRAFT_POLICIES = [SamplingPolicy(temperature=1.0), SamplingPolicy(temperature=0.0),
                  SamplingPolicy(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.2)]


def test_propose_in_k1_steps_with_first_step_equals_one_k_call():
    """No mask: k = 1 calls with firstStep 0..k-1 give one k-call's tokens and p_draft, bit for bit."""
    model_dir, ref = draft_reference()
    V = ref.vocab_size
    gen = np.random.default_rng(11)
    cases = []
    for n in range(18):
        policy = DRAFT_POLICIES[n % 3]
        prompt = gen.integers(0, V, int(gen.integers(3, 12))).tolist()
        seed = int(gen.integers(0, 2**63))
        cases.append({"feed": prompt, "start_pos": 0, "k": 6, "policy": policy_json(policy),
                      "seed": [seed & 0xFFFFFFFF, seed >> 32], "round_id": int(gen.integers(0, 2**32)),
                      "context": prompt[: int(gen.integers(0, len(prompt)))]})
    out = run_node({"draft_dir": str(model_dir), "split": cases})["split"]
    for c, o in zip(cases, out):
        assert o["whole"]["error_code"] == "" and o["split"]["error_codes"] == [""] * c["k"], o
        assert o["split"]["tokens"] == o["whole"]["tokens"], (c["policy"], o)
        assert unb64(o["split"]["p_draft"], "<u4").tobytes() == unb64(o["whole"]["p_draft"], "<u4").tobytes()


def test_runner_draft_first_step_splits_a_k_call():
    """The CPython reference: RunnerDraft.propose(first_step=i) in k = 1 calls equals one k-call."""
    _, ref = draft_reference()
    V = ref.vocab_size
    for seed in range(4):
        prompt = np.random.default_rng(seed).integers(0, V, 6).tolist()
        ref.reset()
        cache = LogicalCache("draft", prompt)
        cache.begin()
        whole = RunnerDraft(ref).propose(cache, 5, SamplingPolicy(), RngDecider(seed), 3, ())
        ref.reset()
        cache = LogicalCache("draft", prompt)
        cache.begin()
        runner = RunnerDraft(ref)
        split = [runner.propose(cache, 1, SamplingPolicy(), RngDecider(seed), 3, (), first_step=i).tokens[0]
                 for i in range(5)]
        assert split == whole.tokens, (seed, split, whole.tokens)


def masked_scenarios(ref, policy, seeds, n_steps, gen):
    """k = 1 steps, each with its own mask, through RunnerDraft.propose(first_step=i) with the mask as
    the grammar; the calls the WASM side gets and the reference's proposals."""
    V = ref.vocab_size
    calls, expected, masks = [], [], []
    kinds = ["wide", "narrow", "one", "wide", "all", "narrow"]
    for seed in seeds:
        ref.reset()
        cache = LogicalCache("draft", gen.integers(0, V, int(gen.integers(3, 12))).tolist())
        cache.begin()
        runner = RunnerDraft(ref)
        round_id = int(gen.integers(0, 2**32))
        for i in range(n_steps):
            allowed = random_mask(gen, V, kinds[(i + seed) % len(kinds)])
            if i == n_steps - 1 and seed % 3 == 0:
                allowed[:] = False                          # no token left: E_PROCESSOR_INVALID
            feed, start, context = cache.unmaterialized(), cache.n_materialized, list(cache.tokens)
            prop = runner.propose(cache, 1, row_policy(policy, allowed), RngDecider(seed), round_id, (), first_step=i)
            calls.append({"feed": list(map(int, feed)), "start_pos": start, "k": 1, "policy": policy_json(policy),
                          "seed": [seed & 0xFFFFFFFF, seed >> 32], "round_id": round_id, "context": context,
                          "first_step": i, "mask": b64(mask_words(allowed, gen))})
            expected.append(prop)
            masks.append(allowed)
            if prop.error is not None:
                break
    return calls, expected, masks


@pytest.mark.parametrize("policy", [SamplingPolicy(temperature=1.0), SamplingPolicy(temperature=0.0),
                                    SamplingPolicy(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.2,
                                                   grammar=AllowedSetGrammar(range(0, 301, 2)))],
                         ids=["T1", "greedy", "mixed-allowed"])
def test_masked_k1_steps_match_runner_draft(policy):
    model_dir, ref = draft_reference()
    gen = np.random.default_rng(23)
    seeds = list(range(1, 13))
    calls, expected, masks = masked_scenarios(ref, policy, seeds, 6, gen)
    out = run_node({"draft_dir": str(model_dir), "masked": calls})["masked"]
    e = TOLERANCES["draft_logits"].max_abs
    floor = TOLERANCES["draft_probs_f32"].max_abs
    rel_bound = 4 * e / policy.temperature if policy.temperature > 0 else 0.0
    n_mismatch = n_tokens = n_errors = 0
    tainted = set()
    for call, prop, allowed, got in zip(calls, expected, masks, out):
        seed = call["seed"][0]
        if seed in tainted:
            continue
        assert "thrown" not in got, got
        want_error = "" if prop.error is None else prop.error.code
        row_allowed = allowed if policy.grammar is None else allowed & np.isin(np.arange(len(allowed)), list(policy.grammar.allowed))
        if got["tokens"] != list(prop.tokens) or got["error_code"] != want_error:
            n_mismatch += 1
            tainted.add(seed)                               # its KV cache now holds another token
            continue
        n_errors += want_error != ""
        for y in got["tokens"]:
            n_tokens += 1
            assert row_allowed[y], ("a masked token was proposed", y)
            row = unb64(got["p_draft"], "<f4")
            assert np.all(row[~row_allowed] == 0), "p_draft is not 0 outside the mask"
            want_row = prop.p_draft_rows[0]
            assert np.all(np.abs(row - want_row) <= floor + rel_bound * np.abs(want_row))
    print(f"masked propose T={policy.temperature}: {n_tokens} tokens identical, {n_mismatch} mismatched, {n_errors} invalid rows")
    if policy.temperature == 0:
        assert n_mismatch == 0
    assert n_mismatch <= 1 and n_tokens > 30 and n_errors >= 3


def test_propose_refuses_bad_first_step_and_mask_words():
    model_dir, ref = draft_reference()
    V = ref.vocab_size
    ok = {"feed": [1, 2, 3], "start_pos": 0, "k": 2, "policy": policy_json(SamplingPolicy()), "seed": [1, 0],
          "round_id": 0, "context": []}
    n_words = -(-V // 32)
    cases = [{**ok, "first_step": -1}, {**ok, "first_step": 2**32 - 1}, {**ok, "first_step": 0.5},
             {**ok, "mask": b64(np.ones(n_words - 1, "<u4"))}, {**ok, "mask": b64(np.ones(n_words + 1, "<u4"))},
             {**ok, "first_step": 2**32 - 2, "mask": b64(np.full(n_words, 0xFFFFFFFF, "<u4"))}]   # fine: the last two steps
    out = run_node({"draft_dir": str(model_dir), "draft_errors": cases})["draft_errors"]
    assert [o.get("thrown", "") for o in out] == ["E_BAD_ARGUMENT"] * 5 + [""], out
    assert len(out[5]["tokens"]) == 2 and out[5]["error_code"] == ""


def test_worker_handler_passes_first_step_and_mask_bits():
    """The draft worker's protocol handler (draft_worker.mjs createHandler, driven in Node) gives the
    direct propose's answers for first_step and mask_bits."""
    model_dir, ref = draft_reference()
    V = ref.vocab_size
    gen = np.random.default_rng(31)
    base = {"feed": [5, 6, 7, 8], "start_pos": 0, "k": 1, "policy": policy_json(SamplingPolicy()), "seed": [3, 0],
            "round_id": 2, "context": [5, 6, 7, 8]}
    narrow = random_mask(gen, V, "narrow")
    cases = [{**base, "first_step": 5, "mask": None}, {**base, "first_step": 0, "mask": None},
             {**base, "first_step": 1, "mask": b64(mask_words(narrow))},
             {**base, "first_step": 1, "mask": b64(mask_words(np.zeros(V, bool)))}]
    out = run_node({"draft_dir": str(model_dir), "masked": cases, "worker": cases})
    for direct, reply in zip(out["masked"], out["worker"]):
        assert reply["kind"] == "proposals", reply
        assert (reply["tokens"], reply["error_code"], reply["p_draft"]) == \
            (direct["tokens"], direct["error_code"], direct["p_draft"])
    assert out["masked"][0]["tokens"] != out["masked"][1]["tokens"]     # step 5 draws another token than step 0
    assert narrow[out["worker"][2]["tokens"][0]]
    assert out["worker"][3]["error_code"] == "E_PROCESSOR_INVALID" and out["worker"][3]["tokens"] == []
