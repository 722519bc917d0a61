"""The real model's first answer tokens at T = 0.8, top-p = 0.9 follow the champion's distribution.

SmolLM2-135M-Instruct from its GGUF (the CPython float64 reference, gguf_pair.load_gguf_pair) on a
real chat prompt. Its logits after the prompt and after each short suffix the rounds reach are
computed once (KeptForwards); only the decision is sampled. The draft is the same model at
T = 1.2, top-k = 6 (a different proposal distribution at the same positions: flatter, and without
the tail). Each seed runs what the orchestrator runs for max_new_tokens = 2, k = 2: proposals drawn
from the draft rows by the draft_sample address of RngDecider(seed), then acceptance.decide_round;
a rejection ends the round and the next round (round_id = tokens emitted) proposes again. The
first token, and the pair of the first two (whose second depends on whether the first was
accepted), are checked against the champion's exact processed distribution by chi-square (cells
under 5 expected pooled, as in test_statistical.py) at ALPHA = 1e-4 per test, over the fixed seeds
0..N_SEEDS-1 (deterministic).

Two broken deciders must be rejected at the same sample size: a residual that resamples from
p_target instead of [p_target - p_draft]_+ (its output keeps the champion's support), and
acceptance with min(1, p_draft/p_target). Measured (N_SEEDS = 1000): the correct decision gives
p = 0.49 (first token, 22 cells) and 0.94 (pair); the broken residual p = 1.1e-15 and 8.4e-17; the
inverted ratio p = 1.4e-35 and 2.8e-34. Power of the first-token test against the broken residual:
its exact noncentrality is 0.1055 N = 105 at 21 degrees of freedom, power 0.99998 at alpha = 1e-4;
over five further disjoint blocks of 1000 seeds it was rejected every time (p <= 6e-14 first token,
<= 4e-12 pair) while the correct decision passed every time (p >= 0.17).
The same decisions through the full request loop: Orchestrator with RunnerChampion and a paired
RunnerDraft over the same real logits gives, seed for seed, exactly the tokens of the direct loop.
And through the WASM champion's C decision (Node) on the same rows as f32 logits: the same first
token for each of the 1000 seeds (measured: no flip), so the same chi-square.
With the draft shipped for this champion (web/models/smollm2-draft/) at the product's default
draft policy (the champion's), whose proposals often fall outside the champion's nucleus:
p = 0.995 (first token) and 0.954 (pair); the broken residual p = 6.2e-20 and 1.2e-20 (2026-12-01 18:40).
CPU time about 40 s (two cores, one BLAS thread).
Skipped only when build/models/status.json says the model is unavailable, with its reason.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from exactspec.core import acceptance
from exactspec.core.acceptance import decide_round
from exactspec.formats.chat import encode_chat_prompt
from exactspec.core.deciders import RngDecider
from exactspec.core.policy import SamplingPolicy
from exactspec.reference.processors import process_logits
from exactspec.core.rng import DRAFT_SAMPLE
from gguf_builders import REPO, smollm2_path
from test_statistical import chi_square_pvalue

MESSAGES = [{"role": "user", "content": "Tell me a joke."}]
TARGET_POLICY = SamplingPolicy(temperature=0.8, top_p=0.9)
DRAFT_POLICY = SamplingPolicy(temperature=1.2, top_k=6)
K = 2                  # proposals per round
N_TOKENS = 2           # the answer's first two tokens
N_SEEDS = 1000
N_ORCHESTRATOR_SEEDS = 64
ALPHA = 1e-4           # false-alarm rate of each chi-square test


class KeptForwards:
    """The real champion's logits for the prompt plus a short suffix, each position run once: a
    new sequence is fed from where it leaves the one the model holds (never before the suffix)."""

    def __init__(self, model, prompt_ids):
        self.model, self.prompt_ids = model, tuple(int(t) for t in prompt_ids)
        prompt_logits = model.forward(list(self.prompt_ids), 0)                  # (P, V)
        self._logits = {self.prompt_ids[:j + 1]: prompt_logits[j] for j in range(len(self.prompt_ids))}
        self._held = self.prompt_ids                                            # what the model's K/V hold
        self._rows = {}

    def logits(self, tokens: tuple) -> np.ndarray:
        """(V,) logits predicting the token after `tokens` (the prompt, then a suffix)."""
        if tokens not in self._logits:
            n = len(self.prompt_ids)
            assert tokens[:n] == self.prompt_ids and len(tokens) > n, "only suffixes of the prompt are kept"
            start = n
            while start < min(len(self._held), len(tokens) - 1) and self._held[start] == tokens[start]:
                start += 1
            fed_logits = self.model.forward(list(tokens[start:]), start)        # (len(tokens) - start, V)
            for j, row in enumerate(fed_logits, start):
                self._logits[tokens[:j + 1]] = row
            self._held = tokens
        return self._logits[tokens]

    def row(self, suffix: tuple, policy: SamplingPolicy) -> np.ndarray:
        """(V,) processed distribution after the prompt plus `suffix` under `policy` (float64)."""
        key = (suffix, policy)
        if key not in self._rows:
            tokens = self.prompt_ids + suffix
            self._rows[key] = process_logits(self.logits(tokens), list(tokens), policy)
        return self._rows[key]


class KeptForwardsRunner:
    """A logits runner (backends.py contract) whose forward returns KeptForwards' real logits for
    the sequence the caller has built, so the orchestrator runs its own calls on the real model."""

    def __init__(self, kept: KeptForwards):
        self.kept, self.tokens = kept, []
        self.vocab_size, self.max_context, self.identity = (kept.model.vocab_size, kept.model.max_context,
                                                            kept.model.identity)

    def forward(self, token_ids, start_pos: int) -> np.ndarray:
        assert 0 <= start_pos <= len(self.tokens)
        self.tokens = self.tokens[:start_pos] + [int(t) for t in token_ids]
        return np.stack([self.kept.logits(tuple(self.tokens[:j + 1])) for j in range(start_pos, len(self.tokens))])


class TargetRows:
    """The m+1 champion rows of a round, computed only when decide_round reaches them."""

    def __init__(self, kept: KeptForwards, context: tuple, proposals: list):
        self.kept, self.context, self.proposals = kept, context, proposals

    def __len__(self):
        return len(self.proposals) + 1

    def __getitem__(self, i):
        return self.kept.row(self.context + tuple(self.proposals[:i]), TARGET_POLICY)


def first_tokens(kept: KeptForwards, seed: int, draft: KeptForwards = None, draft_policy=DRAFT_POLICY) -> tuple:
    """The first N_TOKENS tokens of the speculative answer for one seed, round by round; the draft
    rows come from `draft` (default: the champion itself) under `draft_policy`."""
    draft = draft or kept
    decider, emitted = RngDecider(seed), []
    while len(emitted) < N_TOKENS:
        round_id, remaining, context = len(emitted), N_TOKENS - len(emitted), tuple(emitted)
        proposals, p_draft_rows = [], []
        for i in range(min(K, remaining)):
            p_draft = draft.row(context + tuple(proposals), draft_policy)
            proposals.append(decider.categorical(p_draft, DRAFT_SAMPLE, round_id, i))
            p_draft_rows.append(p_draft)
        decision = decide_round(TargetRows(kept, context, proposals), p_draft_rows, proposals, decider, round_id,
                                frozenset(), remaining, greedy=False)   # no stop ids, as in the orchestrator run
        assert decision.error is None, decision.error
        emitted += proposals[:decision.n_accepted]
        if decision.next_token is not None:
            emitted.append(decision.next_token)
    return tuple(emitted)


@pytest.fixture(scope="module")
def kept():
    from exactspec.reference.gguf_pair import load_gguf_pair
    pair = load_gguf_pair(smollm2_path())
    prompt_ids = encode_chat_prompt(pair.tokenizer, pair.tokenizer_config, MESSAGES)
    return KeptForwards(pair.orchestrator.champion.runner, prompt_ids)


def expected_distributions(kept: KeptForwards):
    """{(t1,): q1(t1)} and {(t1, t2): q1(t1) q2(t2 | t1)} over the champion's support."""
    q1 = kept.row((), TARGET_POLICY)
    first, pairs = {}, {}
    for t1 in np.flatnonzero(q1):
        first[(int(t1),)] = q1[t1]
        q2 = kept.row((int(t1),), TARGET_POLICY)
        for t2 in np.flatnonzero(q2):
            pairs[(int(t1), int(t2))] = q1[t1] * q2[t2]
    return first, pairs


def sample_answers(kept: KeptForwards, draft: KeptForwards = None, draft_policy=DRAFT_POLICY) -> list:
    """first_tokens for each of the fixed seeds 0..N_SEEDS-1."""
    return [first_tokens(kept, seed, draft, draft_policy) for seed in range(N_SEEDS)]


@pytest.fixture(scope="module")
def answers(kept):
    """The correct decision's answers with the default draft (shared by the tests that compare)."""
    return sample_answers(kept)


def pvalues(kept: KeptForwards, answers: list):
    """(first-token p-value, pair p-value, answers the champion forbids)."""
    first, pairs = expected_distributions(kept)
    n_forbidden = sum(a not in pairs for a in answers)   # pooled by chi_square_pvalue with the small cells
    return chi_square_pvalue([a[:1] for a in answers], first), chi_square_pvalue(answers, pairs), n_forbidden


def test_the_prompt_gives_a_spread_distribution(kept):
    """The test has something to find: many first tokens, and the draft differs from the champion."""
    q1, p1 = kept.row((), TARGET_POLICY), kept.row((), DRAFT_POLICY)
    overlap = np.minimum(q1, p1).sum()
    assert (q1 > 0).sum() >= 10 and q1.max() < 0.6 and 0.5 < overlap < 0.95


def test_speculative_first_tokens_follow_the_champion(kept, answers):
    p_first, p_pair, n_forbidden = pvalues(kept, answers)
    assert n_forbidden == 0, "sampled a pair the champion forbids"
    print(f"SmolLM2 T=0.8 top-p=0.9, draft T=1.2 top-k=6, {N_SEEDS} seeds: p first {p_first:.3g}, pair {p_pair:.3g}")
    assert p_first > ALPHA and p_pair > ALPHA


def test_broken_residual_is_rejected(kept, monkeypatch):
    monkeypatch.setattr(acceptance, "residual_weights", lambda p_target, p_draft: p_target.copy())
    p_first, p_pair, _ = pvalues(kept, sample_answers(kept))
    print(f"broken residual, {N_SEEDS} seeds: p first {p_first:.3g}, pair {p_pair:.3g}")
    assert p_first < ALPHA and p_pair < ALPHA


def test_broken_acceptance_ratio_is_rejected(kept, monkeypatch):
    """Accepting with min(1, p_draft/p_target): acceptance's only min() is that one, so shadowing it
    in the module inverts the ratio. At the first position the draft's support lies inside the
    champion's, so there the bug emits no forbidden token and only the distribution shows it."""
    assert set(np.flatnonzero(kept.row((), DRAFT_POLICY))) <= set(np.flatnonzero(kept.row((), TARGET_POLICY)))
    monkeypatch.setattr(acceptance, "min", _min_of_inverted_ratio, raising=False)
    p_first, p_pair, n_forbidden = pvalues(kept, sample_answers(kept))
    print(f"inverted acceptance ratio, {N_SEEDS} seeds: p first {p_first:.3g}, pair {p_pair:.3g}, "
          f"{n_forbidden} forbidden pairs")
    assert p_first < ALPHA and p_pair < ALPHA


@pytest.fixture(scope="module")
def smollm2_draft(kept):
    """The draft shipped for this champion (web/models/smollm2-draft/, the float64 reference)."""
    from exactspec.reference.reference_llama import LlamaReference
    return KeptForwards(LlamaReference.from_dir(os.path.join(REPO, "web", "models", "smollm2-draft")), kept.prompt_ids)


def test_with_the_shipped_draft_first_tokens_follow_the_champion(kept, smollm2_draft):
    """The real draft at the product's default draft policy (the champion's: T = 0.8, top-p = 0.9).
    Its proposals often fall outside the champion's nucleus (rejected with certainty)."""
    p1 = smollm2_draft.row((), TARGET_POLICY)
    assert p1[kept.row((), TARGET_POLICY) == 0].sum() > 0.1
    p_first, p_pair, n_forbidden = pvalues(kept, sample_answers(kept, smollm2_draft, TARGET_POLICY))
    print(f"shipped draft, {N_SEEDS} seeds: p first {p_first:.3g}, pair {p_pair:.3g}")
    assert n_forbidden == 0 and p_first > ALPHA and p_pair > ALPHA


def test_with_the_shipped_draft_a_broken_residual_is_rejected(kept, smollm2_draft, monkeypatch):
    monkeypatch.setattr(acceptance, "residual_weights", lambda p_target, p_draft: p_target.copy())
    p_first, p_pair, _ = pvalues(kept, sample_answers(kept, smollm2_draft, TARGET_POLICY))
    print(f"shipped draft, broken residual, {N_SEEDS} seeds: p first {p_first:.3g}, pair {p_pair:.3g}")
    assert p_first < ALPHA and p_pair < ALPHA


def test_the_orchestrator_emits_the_same_tokens_seed_for_seed(kept, answers):
    """The full request loop (Orchestrator, RunnerChampion and RunnerDraft over the real logits, the
    draft paired at its own policy) gives, for each of N_ORCHESTRATOR_SEEDS seeds, exactly the two
    tokens the direct decision above gives: the sampled process is the product's."""
    from exactspec.core.backends import RunnerChampion, RunnerDraft
    from exactspec.core.orchestrator import GenerationConfig, Orchestrator
    orchestrator = Orchestrator(RunnerChampion(KeptForwardsRunner(kept)), RunnerDraft(KeptForwardsRunner(kept)))
    n_first_rejected = 0
    for seed in range(N_ORCHESTRATOR_SEEDS):
        config = GenerationConfig(max_new_tokens=N_TOKENS, policy=TARGET_POLICY, draft_policy=DRAFT_POLICY,
                                  speculate="draft", k=K, seed=seed)
        result = orchestrator.generate(list(kept.prompt_ids), config)
        assert result.finish_reason == "length" and result.stats["fallback_code"] is None, result.error
        assert tuple(result.token_ids) == answers[seed], seed
        n_first_rejected += result.stats["rounds"] > 1   # a second round only after the first proposal's rejection
    assert 0 < n_first_rejected < N_ORCHESTRATOR_SEEDS


def _min_of_inverted_ratio(one, ratio):
    """min(1, 1/ratio): the acceptance probability with p_draft and p_target swapped."""
    return one if ratio == 0 else min(one, 1 / ratio)


def test_the_wasm_champion_decides_the_same_first_tokens(kept, answers):
    """The WASM champion's C decision (champion_decide, in Node) on the same real rows, given as f32
    logits: one round per seed on the draft's first proposal. Its first token is the one the
    float64 decide_round loop above gives, seed for seed (measured: all 1000; one flip inside the
    float64 margins of the tolerance table is allowed, as in test_wasm_champion.py), so its first
    tokens pass the same chi-square."""
    from test_gpu_accept import js_policy
    from synthetic_models import vocab_q8
    from test_wasm_champion import b64, run_node
    V = kept.model.vocab_size
    p_draft = kept.row((), DRAFT_POLICY).astype(np.float32).reshape(1, V)
    set_of_proposal, sets, jobs = {}, [], []
    for seed in range(N_SEEDS):
        proposal = RngDecider(seed).categorical(p_draft[0].astype(np.float64), DRAFT_SAMPLE, 0, 0)
        if proposal not in set_of_proposal:
            logits = np.stack([kept.logits(kept.prompt_ids), kept.logits(kept.prompt_ids + (proposal,))])
            set_of_proposal[proposal] = len(sets)
            sets.append({"logits": b64(logits.astype(np.float32)), "p_draft": b64(p_draft)})
        jobs.append({"set": set_of_proposal[proposal], "proposals": [proposal], "policy": js_policy(TARGET_POLICY),
                     "contextIds": list(kept.prompt_ids), "seed": [seed & 0xFFFFFFFF, seed >> 32], "roundId": 0,
                     "stopTokenIds": [], "remaining": N_TOKENS, "greedy": False})
    results = run_node(vocab_q8(V), {"decide": {"sets": sets, "jobs": jobs}})["decide"]["results"]
    assert not any(r.get("error_code") for r in results), results[0]
    first = [(job["proposals"][0] if r["n_accepted"] else r["next_token"],) for r, job in zip(results, jobs)]
    n_diff = sum(f != answer[:1] for f, answer in zip(first, answers))
    expected, _ = expected_distributions(kept)
    p_first = chi_square_pvalue(first, expected)
    print(f"WASM decide on SmolLM2 rows, {N_SEEDS} seeds: {n_diff} first tokens differ from decide_round's, "
          f"p first {p_first:.3g}")
    assert n_diff <= 1 and all(f in expected for f in first) and p_first > ALPHA
