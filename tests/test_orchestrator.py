"""Greedy equality, cache rollback at every rejection position, failure rules, events, receipts."""
import json

import numpy as np
import pytest

from exactspec.core.backends import Proposal, RunnerChampion, RunnerDraft
from exactspec.core.caches import LogicalCache
from exactspec.core.errors import (E_BAD_ARGUMENT, E_CACHE_STATE, E_CONTEXT_OVERFLOW, E_DEVICE_LOST,
                              E_DRAFT_LOST, E_TARGET_NUMERIC_OR_MASK, ExactSpecError)
from exactspec.core.orchestrator import CancelToken, GenerationConfig, Orchestrator
from exactspec.reference.processors import SamplingPolicy
from exactspec.core.protocol import Inbox
from exactspec.core.receipts import ALLOWED_FIELDS
from exactspec.reference.toy import ToyRunner, toy_draft
from toy_helpers import make_orchestrator, toy_decode

GREEDY = SamplingPolicy(temperature=0)
SAMPLE = SamplingPolicy(temperature=1.0)


def run(orch, prompt, **kw):
    events = []
    cfg = GenerationConfig(**kw)
    result = orch.generate(prompt, cfg, on_event=events.append)
    return result, events


def prompts(seed):
    rs = np.random.default_rng(seed)
    base = [int(x) for x in rs.integers(1, 40, 6)]
    return [base, base + base[:3], [int(rs.integers(1, 40))]]


# --- greedy: speculative == champion-alone, token for token --------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_greedy_speculative_equals_champion_alone(seed):
    overlap = (0.2, 0.7, 1.0)[seed % 3]
    orch = make_orchestrator(40, seed, overlap=overlap)
    n_checked = 0
    for prompt in prompts(seed):
        free, _ = run(orch, prompt, max_new_tokens=24, policy=GREEDY, speculate="none")
        text = free.text
        # endings: max length, EOS (a token that occurs mid-answer), a stop string spanning tokens
        endings = [dict(), dict(stop_token_ids=(free.token_ids[9],))]
        if len(text) > 12:
            endings.append(dict(stop_strings=(text[8:11],)))
        for ending in endings:
            alone, _ = run(orch, prompt, max_new_tokens=24, policy=GREEDY, speculate="none", **ending)
            for mode, k in [("draft", 1), ("draft", 3), ("draft", 6), ("lookup", 2), ("lookup", 5)]:
                spec, events = run(orch, prompt, max_new_tokens=24, policy=GREEDY, speculate=mode, k=k, **ending)
                assert spec.token_ids == alone.token_ids, (mode, k, ending)
                assert spec.finish_reason == alone.finish_reason
                assert spec.text == alone.text
                assert "".join(e["payload"]["text"] for e in events if e["kind"] == "tokens") == spec.text
                n_checked += 1
        ends = {run(orch, prompt, max_new_tokens=24, policy=GREEDY, speculate="none", **e)[0].finish_reason
                for e in endings}
        assert {"length", "eos"} <= ends
    assert n_checked >= 30


def test_stop_string_spanning_tokens_cuts_text_and_keeps_completing_token():
    orch = make_orchestrator(40, 5)
    free, _ = run(orch, [3, 4, 5], max_new_tokens=20, policy=GREEDY, speculate="none")
    pieces = [toy_decode([t]) for t in free.token_ids]
    starts = np.cumsum([0] + [len(p) for p in pieces])
    i = next(i for i in range(2, len(pieces)) if len(pieces[i]) >= 2)  # a boundary inside the text
    stop = free.text[starts[i] - 1:starts[i] + 1]                        # straddles tokens i-1 and i
    first = free.text.find(stop)
    res, _ = run(orch, [3, 4, 5], max_new_tokens=20, policy=GREEDY, speculate="draft", k=4, stop_strings=(stop,))
    assert res.finish_reason == "stop"
    assert res.text == free.text[:first]
    completing = int(np.searchsorted(starts, first + len(stop), side="left")) - 1
    assert res.token_ids == free.token_ids[:completing + 1]


# --- caches: rollback at every rejection position ------------------------------------------------
class ForcedDraft(RunnerDraft):
    """Proposes the champion's greedy continuation but makes proposal `wrong_at` wrong."""

    def __init__(self, runner, champion_runner_factory, wrong_at):
        super().__init__(runner)
        self.factory, self.wrong_at = champion_runner_factory, wrong_at

    def propose(self, cache, k, policy, decider, round_id, stop_token_ids):
        inner = super().propose(cache, k, policy, decider, round_id, stop_token_ids)
        cache.rollback_to(cache.n_committed)
        out = Proposal()
        context = list(cache.tokens)
        for i in range(len(inner.tokens)):
            ref = self.factory().forward(context, 0)[-1]
            y = int(np.argmax(ref))
            if i == self.wrong_at:
                y = (y + 1) % self.vocab_size
            row = np.zeros(self.vocab_size)
            row[y] = 1.0
            out.tokens.append(y)
            out.p_draft_rows.append(row)
            context.append(y)
        cache.append_provisional(out.tokens)
        return out


@pytest.mark.parametrize("k", [1, 3, 5])
def test_rollback_at_every_rejection_position(k):
    V, seed = 30, 7
    factory = lambda: ToyRunner(V, seed)
    prompt = [1, 2, 3]
    alone, _ = run(Orchestrator(RunnerChampion(factory())), prompt, max_new_tokens=12, policy=GREEDY, speculate="none")
    for wrong_at in list(range(k)) + [None]:
        champion_runner, draft_runner = factory(), toy_draft(factory(), 0.5)
        draft = ForcedDraft(draft_runner, factory, k + 1 if wrong_at is None else wrong_at)
        orch = Orchestrator(RunnerChampion(champion_runner), draft)
        res, _ = run(orch, prompt, max_new_tokens=12, policy=GREEDY, speculate="draft", k=k)
        assert res.token_ids == alone.token_ids
        hist = res.stats["rejection_position_histogram"]
        if wrong_at is None:
            assert sum(hist) == 0 and res.stats["accepted"] == res.stats["proposed"]
        else:
            # every round rejects at wrong_at, except a last round clipped short by max length
            assert sum(hist) == hist[wrong_at] >= res.stats["rounds"] - 1 >= 1
        # the champion's K/V after all the rollbacks equals a fresh prefill of the same sequence
        seq = prompt + res.token_ids[:-1]
        assert np.array_equal(champion_runner.states[:len(seq)], _states(factory, seq))


def _states(factory, seq):
    r = factory()
    r.forward(seq, 0)
    return r.states


def test_cache_transaction_states_and_misuse():
    c = LogicalCache("id", [5, 6, 7])
    assert c.pending_ids == [5, 6, 7] and c.provisional_ids == []
    c.mark_materialized(2)
    assert c.pending_ids == [7]
    assert c.begin() == 3
    c.append_provisional([8, 9, 10])
    c.mark_materialized(6)
    assert c.provisional_ids == [8, 9, 10]
    c.commit_prefix(1)                      # accept 8, roll back 9, 10
    assert c.committed_ids == [5, 6, 7, 8] and c.n_materialized == 4 and c.provisional_ids == []
    c.append_authoritative(11)              # the correction token: pending
    assert c.pending_ids == [11]
    with pytest.raises(ExactSpecError) as e:
        c.rollback_to(2)                    # committed tokens cannot be rolled back
    assert e.value.code == E_CACHE_STATE
    c.begin()
    with pytest.raises(ExactSpecError):
        c.begin()
    c.finalize("eos")
    assert c.terminal == "eos" and c.provisional_ids == []
    with pytest.raises(ExactSpecError):
        c.begin()


# --- failure rules --------------------------------------------------------------------------------
class FlakyDraft(RunnerDraft):
    def __init__(self, runner, fail_on_call):
        super().__init__(runner)
        self.fail_on_call = fail_on_call

    def propose(self, *args):
        if self.n_calls + 1 >= self.fail_on_call:
            raise RuntimeError("worker terminated")
        return super().propose(*args)


def _flaky(fail_on_call, seed=2):
    champion = ToyRunner(40, seed)
    return Orchestrator(RunnerChampion(champion), FlakyDraft(toy_draft(ToyRunner(40, seed), 0.7), fail_on_call),
                        decode=toy_decode)


@pytest.mark.parametrize("policy", [GREEDY, SAMPLE])
def test_draft_failure_before_output_falls_back_silently(policy):
    alone, _ = run(make_orchestrator(40, 2), [4, 5, 6], max_new_tokens=16, policy=policy, speculate="none", seed=9)
    res, events = run(_flaky(1), [4, 5, 6], max_new_tokens=16, policy=policy, speculate="draft", k=3, seed=9)
    assert res.finish_reason == "length" and res.error is None
    assert res.token_ids == alone.token_ids          # identical even when sampling: same baseline draws
    assert res.receipt["fallback_code"] == E_DRAFT_LOST
    assert [e["kind"] for e in events].count("error") == 0


def test_draft_failure_after_output_ends_visibly_without_duplicates():
    res, events = run(_flaky(3), [4, 5, 6], max_new_tokens=40, policy=SAMPLE, speculate="draft", k=3, seed=1)
    assert res.finish_reason == "error" and res.error["code"] == E_DRAFT_LOST
    streamed = [t for e in events if e["kind"] == "tokens" for t in e["payload"]["token_ids"]]
    assert streamed == res.token_ids and 0 < len(res.token_ids) < 40
    assert "".join(e["payload"]["text"] for e in events if e["kind"] == "tokens") == res.text
    kinds = [e["kind"] for e in events]
    assert kinds[-2:] == ["error", "result"]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert res.receipt["failure_code"] == E_DRAFT_LOST


class NaNRunner(ToyRunner):
    def __init__(self, *a, nan_after=0, **kw):
        super().__init__(*a, **kw)
        self.nan_after = nan_after

    def forward(self, token_ids, start_pos):
        out = super().forward(token_ids, start_pos)
        if start_pos + len(token_ids) > self.nan_after:
            out[-1, :] = np.nan
        return out


def test_champion_nan_is_a_coded_fatal_error():
    orch = Orchestrator(RunnerChampion(NaNRunner(40, 1, nan_after=8)), RunnerDraft(ToyRunner(40, 1)), decode=toy_decode)
    res, events = run(orch, [1, 2, 3], max_new_tokens=20, policy=SAMPLE, speculate="draft", k=2)
    assert res.finish_reason == "error" and res.error["code"] == E_TARGET_NUMERIC_OR_MASK
    streamed = [t for e in events if e["kind"] == "tokens" for t in e["payload"]["token_ids"]]
    assert streamed == res.token_ids


def test_draft_nan_falls_back_to_baseline_round_and_stays_exact_greedy():
    champion = ToyRunner(40, 4)
    orch = Orchestrator(RunnerChampion(champion), RunnerDraft(NaNRunner(40, 4, nan_after=6)), decode=toy_decode)
    alone, _ = run(Orchestrator(RunnerChampion(ToyRunner(40, 4))), [1, 2, 3], max_new_tokens=10, policy=GREEDY, speculate="none")
    res, _ = run(orch, [1, 2, 3], max_new_tokens=10, policy=GREEDY, speculate="draft", k=3)
    assert res.token_ids == alone.token_ids and res.stats["draft_invalid"] > 0


class DeadChampion(RunnerChampion):
    def verify_linear(self, cache, policy):
        if cache.n_committed > 6:
            raise RuntimeError("GPU device lost")
        return super().verify_linear(cache, policy)


def test_champion_device_loss_is_visible():
    orch = Orchestrator(DeadChampion(ToyRunner(40, 1)), decode=toy_decode)
    res, _ = run(orch, [1, 2, 3], max_new_tokens=10, policy=GREEDY, speculate="none")
    assert res.finish_reason == "error" and res.error["code"] == E_DEVICE_LOST and len(res.token_ids) == 4


def test_cancellation_stops_at_the_next_round():
    orch = make_orchestrator(40, 3)
    cancel = CancelToken()
    events = []

    def on_event(env):
        events.append(env)
        if env["kind"] == "tokens":
            cancel.cancel()
    res = orch.generate([1, 2], GenerationConfig(max_new_tokens=30, policy=SAMPLE, k=3), on_event=on_event, cancel=cancel)
    assert res.finish_reason == "cancelled"
    assert sum(e["kind"] == "tokens" for e in events) == 1
    inbox = Inbox(res.request_id, epoch=0)
    for env in events:
        inbox.offer(env)
    inbox.advance_epoch(1)
    assert not inbox.offer(events[0]) and inbox.dropped_stale == 1


def test_bad_arguments_are_coded():
    orch = make_orchestrator(40, 3)
    for kw, code in [(dict(max_new_tokens=0), E_BAD_ARGUMENT), (dict(k=-1), E_BAD_ARGUMENT),
                     (dict(speculate="tree"), E_BAD_ARGUMENT), (dict(stop_token_ids=(99,)), E_BAD_ARGUMENT),
                     (dict(max_new_tokens=5000), E_CONTEXT_OVERFLOW),
                     (dict(policy=SamplingPolicy(temperature=-1)), E_BAD_ARGUMENT)]:
        with pytest.raises(ExactSpecError) as e:
            orch.generate([1, 2], GenerationConfig(**kw))
        assert e.value.code == code, kw
    with pytest.raises(ExactSpecError):
        orch.generate([], GenerationConfig())
    with pytest.raises(ExactSpecError):
        orch.generate([400], GenerationConfig())


# --- receipts ---------------------------------------------------------------------------------------
def test_receipt_is_privacy_safe_and_complete():
    orch = make_orchestrator(40, 3)
    prompt = [17, 23, 29, 31, 37, 19]
    res, _ = run(orch, prompt, max_new_tokens=12, policy=SAMPLE, speculate="draft", k=3, seed=1234567)
    receipt = res.receipt
    assert tuple(receipt) == ALLOWED_FIELDS
    blob = json.dumps(receipt)
    assert res.text not in blob or res.text == ""
    for ids in (prompt, res.token_ids):
        assert json.dumps(ids)[1:-1] not in blob
    assert "1234567" not in blob
    assert sum(receipt["accepted_count_histogram"]) == res.stats["rounds"]
    assert receipt["proposal_count"] == res.stats["proposed"]


class FlakyDraft(RunnerDraft):
    """A draft that fails on its n-th round, or proposes NaN rows on some rounds."""

    def __init__(self, runner, fail_on_call=None, nan_calls=()):
        super().__init__(runner)
        self.fail_on_call, self.nan_calls, self.n_rounds = fail_on_call, set(nan_calls), 0

    def propose(self, cache, k, policy, decider, round_id, stop_token_ids):
        self.n_rounds += 1
        if self.fail_on_call is not None and self.n_rounds >= self.fail_on_call:
            raise RuntimeError("E_DRAFT_LOST: inline draft was killed")
        out = super().propose(cache, k, policy, decider, round_id, stop_token_ids)
        if self.n_rounds in self.nan_calls:
            out.error = ExactSpecError("E_PROCESSOR_INVALID", "draft row is NaN")
        return out


def _flaky_pair(seed, overlap=0.6, **flaky):
    return Orchestrator(RunnerChampion(ToyRunner(40, seed)), FlakyDraft(toy_draft(ToyRunner(40, seed), overlap, seed + 1000), **flaky),
                        decode=toy_decode)


@pytest.mark.parametrize("policy", [GREEDY, SAMPLE])
def test_draft_failure_rules_in_the_round(policy):
    alone, _ = run(make_orchestrator(40, 2), [4, 5, 6], max_new_tokens=16, policy=policy, speculate="none", seed=9)
    kw = dict(max_new_tokens=16, policy=policy, speculate="draft", k=3, seed=9)
    # the inline draft fails before any output: silent champion-alone fallback, same tokens
    res, events = run(_flaky_pair(2, fail_on_call=1), [4, 5, 6], **kw)
    assert res.token_ids == alone.token_ids and res.error is None and res.receipt["fallback_code"] == E_DRAFT_LOST
    # ... after output: ends visibly, nothing emitted twice
    res, events = run(_flaky_pair(2, fail_on_call=3), [4, 5, 6], **{**kw, "max_new_tokens": 40})
    assert res.finish_reason == "error" and res.error["code"] == E_DRAFT_LOST
    assert [t for e in events if e["kind"] == "tokens" for t in e["payload"]["token_ids"]] == res.token_ids
    # an invalid draft row: that round is a baseline step, the answer stays the champion's (greedy)
    res, _ = run(_flaky_pair(2, nan_calls=(1, 2)), [4, 5, 6], **kw)
    assert res.error is None and res.stats["draft_invalid"] == 2 and res.stats["baseline_steps"] >= 2
    if policy is GREEDY:
        assert res.token_ids == alone.token_ids


def test_token_sources_say_where_each_token_came_from():
    res, events = run(make_orchestrator(40, 3, overlap=0.6), [1, 2, 3], max_new_tokens=30, policy=SAMPLE,
                      speculate="draft", k=3, seed=4)
    toks = [e["payload"] for e in events if e["kind"] == "tokens"]
    assert all(len(p["sources"]) == len(p["token_ids"]) and set(p["round"]) == {"proposed", "accepted", "forced",
                                                                                 "draft_ms", "verify_ms"} for p in toks)
    flat = [s for p in toks for s in p["sources"]]
    assert flat.count("accepted") == res.stats["accepted"]
    assert flat.count("correction") == sum(res.stats["rejection_position_histogram"])
    assert flat.count("baseline") == res.stats["baseline_steps"]
    assert set(flat) <= {"accepted", "correction", "extra", "baseline"} and "correction" in flat
    assert sum(p["round"]["accepted"] for p in toks) == res.stats["accepted"]
    alone, ev = run(make_orchestrator(40, 3), [1, 2, 3], max_new_tokens=5, policy=GREEDY, speculate="none")
    assert [s for e in ev if e["kind"] == "tokens" for s in e["payload"]["sources"]] == ["baseline"] * 5


def test_async_backends_give_the_same_answer():
    """agenerate() with backends returning awaitables (as JS promises are in Pyodide)."""
    import asyncio

    class AsyncChampion(RunnerChampion):
        """begin() and every round() return awaitables, as the bridge's promises do."""
        async def begin(self, request, draft=None):
            await asyncio.sleep(0)
            session = RunnerChampion.begin(self, request, draft)
            sync_round = session.round

            async def later(*args):
                await asyncio.sleep(0)
                return sync_round(*args)
            session.round = later
            return session

    AsyncDraft = RunnerDraft

    cfg = GenerationConfig(max_new_tokens=16, policy=SAMPLE, speculate="draft", k=3, seed=5)
    sync = make_orchestrator(40, 8, overlap=0.6).generate([1, 2, 3], cfg)
    champion = ToyRunner(40, 8)
    orch = Orchestrator(AsyncChampion(champion), AsyncDraft(toy_draft(ToyRunner(40, 8), 0.6, 1008)), decode=toy_decode)
    # a fresh loop in its own thread: Playwright's sync API may own this thread's loop
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        res = pool.submit(asyncio.run, orch.agenerate([1, 2, 3], cfg)).result()
    assert res.token_ids == sync.token_ids and res.stats["accepted"] == sync.stats["accepted"]
    with pytest.raises(ExactSpecError) as e:
        orch.generate([1, 2, 3], cfg)   # a truly async backend needs agenerate
    assert e.value.code == E_CACHE_STATE


def test_round_phases_put_each_part_of_a_round_where_it_was_spent():
    """timing_ms.phases: a slow listener's time lands in emit (not in commit, whose timer encloses
    emit's call), the session's call holds the models' own time, and the phases with the prefill
    stay inside the request's total."""
    import time as _time
    orch = make_orchestrator(40, 3)

    def slow_listener(event):
        if event["kind"] == "tokens":
            _time.sleep(0.004)
    for speculate in ("none", "draft", "auto"):
        res = orch.generate([1, 2, 3], GenerationConfig(speculate=speculate, k=2, max_new_tokens=6, policy=SAMPLE, seed=1),
                            on_event=slow_listener)
        t, ph = res.timing_ms, res.timing_ms["phases"]
        n_events = res.stats["rounds"] + res.stats["baseline_steps"]
        assert set(ph) == {"choose", "call", "commit", "emit", "pause"} and min(ph.values()) >= 0.0
        assert ph["emit"] >= 4.0 * n_events and ph["commit"] < 2.0 * n_events
        assert ph["call"] >= t["verify"] + t["draft"] - 0.01
        assert sum(ph.values()) + t["prefill"] <= t["total"] + 0.01
