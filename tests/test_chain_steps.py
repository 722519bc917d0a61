"""Chains of baseline steps (orchestrator._chain, session.chain): the same tokens as one call a step, on the CPython reference.

A backend that declares "max_chain" runs a run of k = 0 rounds (speculate none, auto's held none)
as one call; each step keeps its round id (the RNG contract's target_baseline key), so greedy and
sampled answers are bit for bit those of one call a step. The browser's CPU module (wasm/cpu.c
cpu_chain) is held to the same in tests/test_chain_browser.py.
"""
import random

import pytest

from exactspec.core import orchestrator as orch_mod
from exactspec.core.auto_policy import HELD_CHAIN, AutoPolicy
from exactspec.core.backends import ReferenceSession, RunnerChampion, RunnerDraft
from exactspec.core.errors import E_TARGET_NUMERIC_OR_MASK
from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.core.round_record import FIXED_WORDS, decode_many, encode
from exactspec.core.acceptance import RoundDecision
from exactspec.reference.processors import SamplingPolicy
from exactspec.reference.toy import ToyRunner, toy_draft
from toy_helpers import toy_decode

PROMPT = [4, 5, 6, 7]


class Chaining(RunnerChampion):
    """The reference champion, declaring chains of up to `max_chain` steps."""

    def __init__(self, runner, max_chain=8):
        super().__init__(runner)
        self.limits = {"max_chain": max_chain}


def orchestrator(champion_cls=Chaining, seed=3, **kw):
    runner = ToyRunner(40, seed)
    return Orchestrator(champion_cls(runner, **kw), RunnerDraft(toy_draft(runner, 0.7, seed + 1000)), decode=toy_decode)


def run(orch, **kw):
    events = []
    res = orch.generate(PROMPT, GenerationConfig(**kw), on_event=events.append)
    tokens = [e["payload"] for e in events if e["kind"] == "tokens"]
    assert [t for p in tokens for t in p["token_ids"]] == res.token_ids      # no gap, no token twice
    return res, tokens


def chained_and_not(**kw):
    a, a_events = run(orchestrator(), chain_steps=True, **kw)
    b, b_events = run(orchestrator(), chain_steps=False, **kw)
    return a, a_events, b, b_events


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_chained_answer_is_bit_for_bit_the_one_call_a_step_answer(temperature, seed):
    a, a_events, b, b_events = chained_and_not(max_new_tokens=60, speculate="none", seed=seed,
                                               policy=SamplingPolicy(temperature=temperature, top_k=12))
    assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
    assert a.stats["baseline_steps"] == b.stats["baseline_steps"] == len(a.token_ids)
    assert a.stats["target_calls"] == b.stats["target_calls"]
    # the chained answer came in fewer events, each saying how many steps it ran
    assert len(a_events) < len(b_events) / 2, (len(a_events), len(b_events))
    assert sum(e["round"].get("steps", 1) for e in a_events) == len(a.token_ids)
    assert max(e["round"].get("steps", 1) for e in a_events) > 1
    assert all("steps" not in e["round"] for e in b_events)


@pytest.mark.parametrize("stop", [{"stop_strings": ("e",)}, {"stop_token_ids": (11, 17, 23)}, {}])
def test_a_chain_ends_where_one_call_a_step_ends(stop):
    """A stop string, a stop id or the length inside a chain: the same tokens, the same ending; the
    chain runs no step past a stop id or the length (a stop string is found in the text after the
    call, so steps past it are counted, never emitted)."""
    endings = set()
    for seed in range(6):
        a, _, b, _ = chained_and_not(max_new_tokens=37, speculate="none", seed=seed,
                                     policy=SamplingPolicy(temperature=1.0), **stop)
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason), seed
        assert b.stats["baseline_steps"] == len(b.token_ids)
        if "stop_strings" in stop:
            assert a.stats["baseline_steps"] >= len(a.token_ids)
        else:
            assert a.stats["baseline_steps"] == len(a.token_ids), (seed, a.finish_reason)
        endings.add(a.finish_reason)
    want = "stop" if "stop_strings" in stop else "eos" if stop else "length"
    assert want in endings, endings          # the ending under test happened


def test_auto_chains_its_held_none_and_gives_the_champions_greedy_answer():
    alone, _ = run(orchestrator(), max_new_tokens=80, speculate="none", chain_steps=False,
                   policy=SamplingPolicy(temperature=0))
    auto, events = run(orchestrator(), max_new_tokens=80, speculate="auto", policy=SamplingPolicy(temperature=0))
    assert auto.token_ids == alone.token_ids
    by = auto.stats["auto"]["rounds_by_method"]
    assert sum(by.values()) == auto.stats["rounds"] + auto.stats["baseline_steps"]
    chained = [e for e in events if e["round"].get("steps", 1) > 1]
    assert chained and all(e["round"]["auto"]["method"] == "none" for e in chained)


def test_a_chain_is_never_longer_than_the_budget_allows():
    """A step of ~CHAIN_BUDGET_MS or more: one step a call (a large model streams as before)."""
    orch = orchestrator()
    orig = orch_mod.CHAIN_BUDGET_MS
    try:
        orch_mod.CHAIN_BUDGET_MS = 1e-6
        res, events = run(orch, max_new_tokens=20, speculate="none")
    finally:
        orch_mod.CHAIN_BUDGET_MS = orig
    assert all("steps" not in e["round"] for e in events) and len(res.token_ids) == 20
    res, events = run(orchestrator(max_chain=3), max_new_tokens=20, speculate="none")
    assert max(e["round"].get("steps", 1) for e in events) == 3


class _OffByOne(ReferenceSession):
    """A deliberately broken chain: every step keyed by the chain's first round id."""

    def chain(self, h, round_id, remaining, committed):
        out = []
        for i in range(max(1, min(h, remaining))):
            o = self.round(0, round_id, remaining - i, committed + i)
            out.append(o)
            if o.ended_by or o.next_token is None:
                break
        return out


class BrokenChaining(Chaining):
    def begin(self, request, draft=None):
        return _OffByOne(self, draft, request)


def test_a_chain_that_reuses_one_round_id_is_caught():
    kw = dict(max_new_tokens=60, speculate="none", seed=5, policy=SamplingPolicy(temperature=1.0))
    good, _ = run(orchestrator(), chain_steps=False, **kw)
    broken, _ = run(orchestrator(BrokenChaining), **kw)
    assert broken.token_ids != good.token_ids


class _NanAt(ReferenceSession):
    """The champion's row turns invalid at answer position `at` (E_TARGET_NUMERIC_OR_MASK)."""
    at = 9

    def round(self, k, round_id, remaining, committed, proposals=None):
        if round_id == self.at:
            d = RoundDecision(0, None, None, None, orch_mod.ExactSpecError(E_TARGET_NUMERIC_OR_MASK, "NaN row"))
            return decode_many(encode("verified", (), d))[0]
        return super().round(k, round_id, remaining, committed, proposals)


class NanChaining(Chaining):
    def begin(self, request, draft=None):
        return _NanAt(self, draft, request)


@pytest.mark.parametrize("chain", [True, False])
def test_a_step_that_fails_inside_a_chain_ends_the_answer_after_the_steps_before_it(chain):
    res, events = run(orchestrator(NanChaining), max_new_tokens=40, speculate="none", chain_steps=chain)
    assert res.finish_reason == "error" and res.error["code"] == E_TARGET_NUMERIC_OR_MASK
    assert len(res.token_ids) == _NanAt.at                 # every step before it, once
    alone, _ = run(orchestrator(), max_new_tokens=_NanAt.at, speculate="none", chain_steps=False)
    assert res.token_ids == alone.token_ids


def test_decode_many_reads_records_one_after_another_and_refuses_a_cut_one():
    d = RoundDecision(0, 7, None, None, None)
    words = encode("verified", (), d) + encode("verified", (3, 4), RoundDecision(1, 9, 1, None, None))
    a, b = decode_many(words)
    assert (a.next_token, b.next_token, b.proposals, b.n_accepted) == (7, 9, (3, 4), 1)
    for bad in (words[:FIXED_WORDS - 1], words[:-1], []):
        with pytest.raises(orch_mod.ExactSpecError) as e:
            decode_many(bad)
        assert e.value.code == "E_PROTOCOL"


def test_a_held_chain_runs_to_the_budget_and_counts_as_one_round_of_the_hold():
    """Version 6: a held none's chain is as long as the orchestrator's budget allows (held_rounds is
    HELD_CHAIN, not the hold's rounds left); observe_chain counts its steps as none rounds and the
    hold counts the call as one round, so a hold of n rounds is n chains, and the hold confirmed
    when weighed again is twice as long. Version 5's rule (a chain cut where the hold's rounds
    ran out, the hold consumed a round a step) is caught: its chain would be 1 + hold steps."""
    cal = {"version": 1, "key": "k", "verify_ms": [None, 1.0, 1.9, 2.8], "measured_n": [1, 2, 3],
           "draft_ms_per_proposal": 5.0, "draft_catchup_ms_per_token": 5.0, "lookup_ms": 0.01}
    policy = AutoPolicy(cal, 2, True, True)
    rng = random.Random(0)
    for _ in range(20):                                  # one call a round until a weighed none starts a hold
        c = policy.choose(200, 0, 0)
        held = policy.held_rounds()
        if held and c.info["reason"] != "probe" and policy._hold == policy._hold_len:
            break
        policy.observe(c.method, c.k, c.k, 0, 1.1, 0.0, 1.0 + 0.01 * rng.random())
    hold = policy._hold
    assert c.method == "none" and held == HELD_CHAIN and hold >= 1
    steps = 16                                            # the chain budget's steps, more than the hold
    assert steps > 1 + hold
    before = dict(policy.rounds_by_method)
    policy.observe_chain(steps, 1.1 * steps, 1.0 * steps)
    assert policy.rounds_by_method["none"] == before["none"] + steps
    assert policy.held_rounds() == 0 and policy._hold == hold      # the call, not its steps
    for i in range(hold):                                 # the hold's rounds: one chain each, to the budget
        c = policy.choose(200, 0, 0)
        assert c.method == "none" and policy.held_rounds() == HELD_CHAIN, i
        policy.observe_chain(steps, 1.1 * steps, 1.0 * steps)
    assert policy._hold == 0
    c = policy.choose(200, 0, 0)                          # weighed again, its next hold twice as long
    assert c.method == "none" and policy.held_rounds() == HELD_CHAIN
    assert policy._hold == min(2 * hold, policy.params["hold_max"])
