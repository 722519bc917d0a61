"""Backend interfaces the orchestrator drives, and adapters from a logits "runner" to them.

ChampionBackend
  prefill(cache)                    materialise committed tokens except the last (it stays pending)
  verify_linear(cache, policy)      feed pending + provisional tail; return m+1 processed rows
                                    (m = len(cache.provisional_ids)); row i predicts proposal i,
                                    row m the extra token; an invalid row is an ExactSpecError
DraftBackend
  prefill(cache)
  propose(cache, k, policy, decider, round_id, stop_token_ids) -> Proposal
                                    appends proposals to the open transaction as it goes
A runner is any model with forward(token_ids, start_pos) -> (n, V) logits that writes its K/V at
[start_pos, start_pos + n) and forgets anything beyond (NumPy reference Llama, toy models).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .errors import E_CACHE_STATE, E_PROCESSOR_INVALID, ExactSpecError
from .rng import DRAFT_SAMPLE
from .acceptance import argmax_tie_low


@dataclass
class Proposal:
    tokens: list = field(default_factory=list)        # (m,) proposed ids
    p_draft_rows: list = field(default_factory=list)  # m rows (V,): the distributions they were drawn from
    error: Optional[ExactSpecError] = None            # draft distribution invalid: fall back for this round


def _materialize(runner, cache, upto: int):
    """Run the model over tokens[n_materialized:upto]; returns their logits (n, V)."""
    start = cache.n_materialized
    feed = cache.tokens[start:upto]
    if not feed:
        raise ExactSpecError(E_CACHE_STATE, "nothing to feed: no pending token")
    logits = runner.forward(feed, start)
    cache.mark_materialized(upto)
    return logits


def _process(row, context_ids, policy):
    from ..reference.processors import process_logits  # NumPy: host-side processors run on CPython only
    try:
        return process_logits(row, context_ids, policy)
    except ExactSpecError as err:
        if err.code != E_PROCESSOR_INVALID:
            raise
        return err


class _RunnerBackend:
    """A model backend over a logits runner; prefill materialises all but the pending token."""

    def __init__(self, runner):
        self.runner = runner
        self.vocab_size = runner.vocab_size
        self.max_context = runner.max_context
        self.identity = runner.identity
        self.n_calls = 0

    def prefill(self, cache):
        upto = cache.n_committed - 1
        if upto > cache.n_materialized:
            _materialize(self.runner, cache, upto)


class RunnerChampion(_RunnerBackend):
    """Champion backend over a logits runner, with the declared processors applied on the host."""

    def verify_linear(self, cache, policy):
        m = len(cache.provisional_ids)
        self.n_calls += 1
        logits = _materialize(self.runner, cache, len(cache.tokens))  # (n_pending + m, V)
        rows = logits[-(m + 1):]                                       # (m + 1, V)
        base = cache.n_committed
        return [_process(rows[i], cache.tokens[:base + i], policy) for i in range(m + 1)]


class FusedRunnerChampion(RunnerChampion):
    """Reference of the device contract: verification and decision in one call, from the seed.

    The GPU backend implements the same method; this twin lets CPython tests check that the
    orchestrator's fused path gives exactly what the host-side path gives."""

    def verify_and_decide(self, cache, policy, p_draft_rows, seed, round_id, stop_token_ids, remaining, greedy):
        from .acceptance import decide_round
        from .deciders import RngDecider
        rows = self.verify_linear(cache, policy)
        return decide_round(rows, p_draft_rows, cache.provisional_ids, RngDecider(seed), round_id, stop_token_ids,
                            remaining, greedy)


class RunnerDraft(_RunnerBackend):
    """Draft backend over a logits runner: samples proposals by the draft_sample address."""

    def propose(self, cache, k, policy, decider, round_id, stop_token_ids) -> Proposal:
        out = Proposal()
        logits = _materialize(self.runner, cache, len(cache.tokens))[-1]  # (V,)
        self.n_calls += 1
        greedy = policy.temperature == 0
        for i in range(k):
            p_draft = _process(logits, cache.tokens, policy)
            if isinstance(p_draft, ExactSpecError):
                out.error = p_draft
                return out
            y = argmax_tie_low(p_draft) if greedy else decider.categorical(p_draft, DRAFT_SAMPLE, round_id, i)
            if not p_draft[y] > 0:
                out.error = ExactSpecError(E_PROCESSOR_INVALID, f"draft proposed token {y} with zero probability")
                return out
            out.tokens.append(y)
            out.p_draft_rows.append(p_draft)
            cache.append_provisional([y])
            if y in stop_token_ids or i == k - 1:
                break
            logits = _materialize(self.runner, cache, len(cache.tokens))[-1]
            self.n_calls += 1
        return out


class FusedRunnerDraft(RunnerDraft):
    """Reference of the inline-draft contract (the browser's WorkerDraft when the draft runs in the
    orchestrator's thread): proposal, verification and decision in one call. CPython tests check
    that the orchestrator's fused round gives exactly what the two-call round gives."""

    def __init__(self, runner, champion: FusedRunnerChampion):
        super().__init__(runner)
        self.fused_with = champion

    def propose_verify_decide(self, draft_cache, champion_cache, k, draft_policy, policy, seed, round_id,
                              stop_token_ids, remaining, greedy):
        """-> (proposal, decision | None, draft_failure | None, draft_ms, verify_ms)"""
        from .deciders import RngDecider
        from .errors import E_DRAFT_LOST, coded_error
        try:
            proposal = self.propose(draft_cache, k, draft_policy, RngDecider(seed), round_id, stop_token_ids)
        except Exception as exc:   # the draft failed: the champion does not run
            return Proposal(), None, coded_error(exc, E_DRAFT_LOST, "draft"), 0.0, 0.0
        if proposal.error is not None or not proposal.tokens:
            return proposal, None, None, 0.0, 0.0
        champion_cache.append_provisional(proposal.tokens)
        decision = self.fused_with.verify_and_decide(champion_cache, policy, proposal.p_draft_rows, seed, round_id,
                                                     stop_token_ids, remaining, greedy)
        return proposal, decision, None, 0.0, 0.0


class LookupProposer:
    """Prompt lookup: propose the continuation of the most recent earlier match of the last n-gram.

    Deterministic, so p_draft is one-hot at the proposal and the round stays exact.
    """

    identity = "prompt-lookup-v1"

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1):
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.n_calls = 0

    def prefill(self, cache):
        pass

    def find_continuation(self, tokens, k):
        """Tokens following the most recent earlier occurrence of the longest matching suffix n-gram."""
        n_tokens = len(tokens)
        for n in range(min(self.max_ngram, n_tokens - 1), self.min_ngram - 1, -1):
            suffix = tokens[n_tokens - n:]
            for start in range(n_tokens - n - 1, -1, -1):
                if tokens[start:start + n] == suffix:
                    cont = tokens[start + n:start + n + k]
                    if cont:
                        return cont
        return []

    def propose(self, cache, k, policy, decider, round_id, stop_token_ids) -> Proposal:
        out = Proposal()
        self.n_calls += 1
        for y in self.find_continuation(cache.tokens, k):
            row = [0] * self.vocab_size
            row[y] = 1
            out.tokens.append(y)
            out.p_draft_rows.append(row)
            cache.append_provisional([y])
            if y in stop_token_ids:
                break
        return out
