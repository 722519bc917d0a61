"""The round contract's backends, and the CPython reference of it over a logits "runner".

A champion backend has begin(request, draft) -> a session (orchestrator.SessionRequest: the
request's constant state, once); a session has round(k, round_id, remaining, committed,
proposals) -> RoundOutcome (round_record.py: the same record the browser's JS session returns),
last_failure(), pause() and end(reason). docs/round.md draws it.
The reference: RunnerChampion (prefill, verify_linear: m + 1 processed rows) and RunnerDraft
(prefill, propose -> Proposal) over runners, composed by ReferenceSession, which decides with
acceptance.decide_round. A runner is any model with forward(token_ids, start_pos) -> (n, V)
logits that writes its K/V at [start_pos, start_pos + n) and forgets anything beyond (NumPy
reference Llama, toy models). LookupProposer (prompt lookup) runs in the orchestrator, whichever
backend: its proposals cross with the round.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional

from .acceptance import argmax_tie_low, decide_round
from .auto_policy import _interpolate
from .caches import LogicalCache
from .errors import E_CACHE_STATE, E_DRAFT_LOST, E_PROCESSOR_INVALID, ExactSpecError, coded_error
from .rng import DRAFT_SAMPLE
from .round_record import FIXED_WORDS, RoundOutcome, decode, encode


@dataclass
class Proposal:
    tokens: list = field(default_factory=list)        # (m,) proposed ids
    p_draft_rows: list = field(default_factory=list)  # m rows (V,): the distributions they were drawn from
    error: Optional[ExactSpecError] = None            # draft distribution invalid: fall back for this round


def _materialize(runner, cache, upto: int):
    """Run the model over tokens[n_materialized:upto]; returns their logits (n, V). The runner
    then holds the K/V of tokens[:upto] (`_held`: what prefix reuse may start from)."""
    start = cache.n_materialized
    feed = cache.tokens[start:upto]
    if not feed:
        raise ExactSpecError(E_CACHE_STATE, "nothing to feed: no pending token")
    held = _held(runner)
    # known after it only if the runner held this cache's tokens[:start] (nothing else ran it since)
    known = start == 0 or (held is not None and held[:start] == cache.tokens[:start])
    runner._exactspec_held = None            # unknown while the forward runs (it may fail half-way)
    logits = runner.forward(feed, start)
    runner._exactspec_held = list(cache.tokens[:upto]) if known else None
    cache.mark_materialized(upto)
    return logits


def _held(runner):
    """The ids whose K/V the runner holds at positions 0.. (as far as the backends know), or None."""
    return getattr(runner, "_exactspec_held", None)


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def given_after_forced(proposals, forced) -> list:
    """Given proposals (prompt lookup's, searched on the committed ids) in a round that starts with
    grammar-forced ids: the part after the forced ids when the proposals begin with them, else none
    (a deterministic function of the context, so the round stays exact). web/orchestrator/
    session.mjs does the same."""
    proposals, forced = list(proposals), list(forced)
    return proposals[len(forced):] if proposals[:len(forced)] == forced else []


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

    def reuse(self, cache) -> int:
        """Prefix reuse: start a fresh `cache` from the K/V the runner holds, the longest common
        prefix of its ids and the context's all but the pending token (marked materialized) ->
        how many ids. Only for a runner that declares `batch_invariant` (a position's K/V does not
        depend on how the positions were grouped into forwards): the reuse is then bitwise a
        fresh prefill. 0 for any other."""
        held = _held(self.runner)
        if not getattr(self.runner, "batch_invariant", False) or not held or cache.n_materialized:
            return 0
        n = common_prefix(held, cache.tokens[:cache.n_committed - 1])
        if n:
            cache.mark_materialized(n)
        return n


class ReferenceChampion:
    """The CPython reference champion's round contract over any verify_linear(cache, policy) -> m + 1
    processed rows (a subclass provides it, and vocab_size, max_context, identity, prefill):
    `begin(request, draft)` opens a ReferenceSession."""

    limits: dict = {}               # what this backend cannot run (GenerationConfig.check_limits): nothing

    def begin(self, request, draft=None) -> "ReferenceSession":
        return ReferenceSession(self, draft, request)

    def calibration(self, draft) -> Optional[dict]:
        """speculate="auto"'s calibration: calibrate_reference, measured once per draft."""
        cached = getattr(self, "_calibrations", None)
        if cached is None:
            cached = self._calibrations = {}
        key = getattr(draft, "identity", "none")
        if key not in cached:
            cached[key] = calibrate_reference(self, draft)
        return cached[key]

    def decide(self, rows, p_draft_rows, proposals, decider, round_id, stop_token_ids, remaining, greedy):
        """The round's decision on verify_linear's rows: acceptance.decide_round (a device decides
        on its own rows; this is the reference every decider is checked against)."""
        return decide_round(rows, p_draft_rows, proposals, decider, round_id, stop_token_ids, remaining, greedy)

    def take_counters(self) -> dict:
        """Stale-message drops since the previous call: none here (no workers)."""
        return {}

    def environment(self) -> None:
        """Receipt environment: none for the CPython reference."""
        return None


class RunnerChampion(_RunnerBackend, ReferenceChampion):
    """Champion backend over a logits runner, with the declared processors applied on the host."""

    def verify_linear(self, cache, policy):
        m = len(cache.provisional_ids)
        self.n_calls += 1
        logits = _materialize(self.runner, cache, len(cache.tokens))  # (n_pending + m, V)
        rows = logits[-(m + 1):]                                       # (m + 1, V)
        base = cache.n_committed
        return [_process(rows[i], cache.tokens[:base + i], policy) for i in range(m + 1)]


class ReferenceSession:
    """One request on the CPython reference: the round contract (web/orchestrator/session.mjs is the
    browser's) built from the runner backends' pieces. Each model keeps its own LogicalCache mirror
    of the committed tokens; round() checks the caller's committed length against it, proposes
    (the draft, or the given proposals with one-hot rows), verifies, decides with decide_round and
    returns the decoded round record, exactly as the browser's record decodes."""

    def __init__(self, champion: ReferenceChampion, draft, request):
        self.champion, self.draft, self.request = champion, draft, request
        # a response_format: one matcher for this request, the champion's and the draft's policy
        self.bound = request.constraint.bind(len(request.context_ids)) if request.constraint is not None else None
        self.policy, self.draft_policy = request.policy, request.draft_policy
        if self.bound is not None:
            self.policy = replace(request.policy, grammar=self.bound)
            self.draft_policy = replace(request.draft_policy, grammar=self.bound)
        self.round_bytes = 0
        self.draft_failure: Optional[ExactSpecError] = None
        self._last_failure: Optional[ExactSpecError] = None
        self.champion_cache = LogicalCache(champion.identity, request.context_ids)
        reuse = lambda backend, cache: (backend.reuse(cache) if request.prefix_reuse and hasattr(backend, "reuse")
                                        else 0)
        self.reused = {"champion": reuse(champion, self.champion_cache), "draft": None}
        champion.prefill(self.champion_cache)
        self.draft_cache = LogicalCache(draft.identity, request.context_ids) if draft is not None else None
        if draft is not None:
            self.reused["draft"] = reuse(draft, self.draft_cache)
        if draft is not None and request.mode != "auto":    # auto: the draft catches up on its first round
            try:
                draft.prefill(self.draft_cache)
            except Exception as exc:    # draft backend failure of any kind: the request falls back
                self.draft_failure = coded_error(exc, E_DRAFT_LOST, "draft backend failed")
                self.draft_cache = None

    def pause(self):
        return None                     # rounds run to completion synchronously: nothing to let run

    def last_failure(self) -> Optional[ExactSpecError]:
        return self._last_failure

    def end(self, reason) -> dict:
        for cache in (self.champion_cache, self.draft_cache):
            if cache is not None and cache.terminal is None:
                cache.finalize(reason or "error")
        return {}                       # every round here is the composition of the pieces

    def chain(self, h: int, round_id: int, remaining: int, committed: int) -> list:
        """Up to h baseline steps (the browser's session.chain is one call into the CPU module;
        here, its rounds one after another) -> [RoundOutcome, ...]: step i is round round_id + i
        with remaining - i left; it stops after a step that ended the answer (its next token a stop
        id; the length at i = remaining - 1) or failed. A response_format's rounds are not chained
        (one step)."""
        steps = 1 if self.bound is not None else max(1, min(h, remaining))
        stop_ids = frozenset(self.request.stop_token_ids)
        out = []
        for i in range(steps):
            o = self.round(0, round_id + i, remaining - i, committed + i)
            out.append(o)
            if (o.status != "verified" or o.error_code or o.ended_by or o.next_token is None
                    or o.next_token in stop_ids):
                break
        self.round_bytes = 16 + 4 * FIXED_WORDS * len(out)
        return out

    def round(self, k: int, round_id: int, remaining: int, committed: int, proposals=None) -> RoundOutcome:
        """k = 0: a baseline step; `proposals` (prompt lookup's) instead of the draft's."""
        req, caches = self.request, [self.champion_cache, self.draft_cache]
        if committed != self.champion_cache.n_committed:
            raise ExactSpecError(E_CACHE_STATE, f"the caller has {committed} committed tokens, the session "
                                                f"{self.champion_cache.n_committed}")
        self.round_bytes = 4 * (5 + len(proposals or ()))
        t0 = time.perf_counter()
        status, tokens, p_draft_rows, forced = "verified", [], [], []
        capacity = None
        if self.bound is not None:      # grammar-forced ids open the round; the decided rows follow them
            committed_ids = self.champion_cache.committed_ids
            room = self.champion.limits.get("max_k", remaining)      # ids after the pending one in a block
            forced = self.bound.forced_after(committed_ids, self.policy.suppress_token_ids, frozenset(req.stop_token_ids),
                                             min(remaining - 1, room) if req.forced_batching else 0)
            round_id, remaining = round_id + len(forced), remaining - len(forced)
            capacity = max(0, min(remaining - 1, room - len(forced)))
            k = min(k, capacity)
            if proposals is not None:
                proposals = self.bound.valid_prefix(committed_ids + forced, given_after_forced(proposals, forced)[:k],
                                                    self.policy.suppress_token_ids)
        if proposals is not None:
            tokens = list(proposals)
            p_draft_rows = [_one_hot(self.champion.vocab_size, y) for y in tokens]
        elif k > 0:
            self.draft_cache.begin()
            self.draft_cache.append_provisional(forced)
            try:
                proposal = (self._propose_steps(k, capacity, round_id) if self.bound is not None else
                            self.draft.propose(self.draft_cache, k, self.draft_policy, req.decider, round_id,
                                               frozenset(req.stop_token_ids)))
            except Exception as exc:    # the draft failed: the champion does not run
                self.draft_cache.abort()
                self._last_failure = coded_error(exc, E_DRAFT_LOST, "draft backend failed")
                return self._record("draft_failed", [], None, _ms(t0), 0.0)
            if proposal.error is not None or not proposal.tokens:
                self.draft_cache.rollback()
                status = "draft_invalid" if proposal.error is not None else status
            else:
                tokens, p_draft_rows = proposal.tokens, proposal.p_draft_rows
        t1 = time.perf_counter()
        self.champion_cache.begin()
        self.champion_cache.append_provisional(forced + list(tokens))
        try:
            rows = self.champion.verify_linear(self.champion_cache, self.policy)[len(forced):]
        except Exception:
            for cache in caches:
                if cache is not None:
                    cache.abort()
            raise
        if getattr(req.decider, "last_accept", None) is not None:
            req.decider.last_accept = None     # RngDecider records this round's accept tests (the record's diag u, a)
        decision = self.champion.decide(rows, p_draft_rows, tokens, req.decider, round_id, req.stop_token_ids,
                                        remaining, req.greedy)
        for cache in caches:
            if cache is None:
                continue
            if decision.error is not None:
                cache.abort()
                continue
            if cache.in_transaction:
                cache.commit_prefix(len(forced) + decision.n_accepted)
            else:       # the draft sat out the round (lookup's proposals, or none): it catches up lazily
                for t in forced + list(tokens[:decision.n_accepted]):
                    cache.append_authoritative(t)
            if decision.next_token is not None:
                cache.append_authoritative(decision.next_token)
        return self._record(status, tokens, decision, t1 - t0, time.perf_counter() - t1,
                            getattr(req.decider, "last_accept", None), forced)

    def _propose_steps(self, k: int, capacity: int, round_id: int) -> Proposal:
        """A response_format's draft proposals (web/orchestrator/grammar_round.mjs draftSteps): one
        step at a time (k = 1 calls, step counters 0, 1, ...), each under its own mask through the
        bound policy; a step whose mask leaves one valid id does not count against k; at most
        `capacity` in all; an invalid step ends them (at step 0: the round's draft_invalid)."""
        out, counted, stops = Proposal(), 0, frozenset(self.request.stop_token_ids)
        while counted < k and len(out.tokens) < capacity:
            context = self.draft_cache.tokens
            single = int(self.bound.valid_after(context, self.draft_policy.suppress_token_ids).sum()) == 1
            step = self.draft.propose(self.draft_cache, 1, self.draft_policy, self.request.decider, round_id, stops,
                                      first_step=len(out.tokens))
            if step.error is not None or not step.tokens:
                if not out.tokens:
                    out.error = step.error
                break
            out.tokens += step.tokens
            out.p_draft_rows += step.p_draft_rows
            counted += not single
            if step.tokens[-1] in stops:
                break
        return out

    def _record(self, status, tokens, decision, draft_s: float, verify_s: float, accept_test=None,
                forced=()) -> RoundOutcome:
        words = encode(status, tokens, decision, draft_s * 1000.0, verify_s * 1000.0, accept_test, forced)
        self.round_bytes += 4 * len(words)
        return decode(words)


def calibrate_reference(champion, draft=None, budget_ms: float = 300.0) -> dict:
    """The calibration (common.md §1) of a CPython reference pair, on a synthetic 8-token context:
    the champion's verify of n rows (greedy decide included) for n = 1 and 9 always (V's shape needs
    two points), then n = 5 and second timings (the minimum is kept) while within budget_ms; linear
    between the timed n; the draft's cost per proposal (a proposal of 4) and per caught-up token (a
    feed of 9 ids), timed once always, twice within budget. measured_n says which n were timed."""
    import hashlib
    import platform
    from .deciders import RngDecider
    from .policy import SamplingPolicy
    t_start = time.perf_counter()
    greedy = SamplingPolicy(temperature=0.0)
    vocab = champion.vocab_size
    context = [(7 * i + 3) % vocab for i in range(8)]
    within = lambda: _ms(t_start) < budget_ms
    probe = LogicalCache(champion.identity, context)
    champion.prefill(probe)          # once: each verify below feeds the pending token + n - 1 more

    def verify_once(n):
        probe.begin()
        probe.append_provisional([(5 * j + 1) % vocab for j in range(n - 1)])
        t0 = time.perf_counter()
        rows = champion.verify_linear(probe, greedy)
        for row in rows:
            argmax_tie_low(row)
        ms = _ms(t0)
        probe.abort()                # rolled back; the pending token is fed again next time
        return ms
    timed = {1: verify_once(1), 9: verify_once(9)}
    for n in (1, 9, 5, 5):
        if within():
            timed[n] = min(timed.get(n, float("inf")), verify_once(n))
    pts = sorted(timed.items())
    verify = [None] + [_interpolate(pts, n) for n in range(1, 10)]   # n = 1 and 9 timed: no extrapolation
    d = c = None
    if draft is not None:
        cache = LogicalCache(draft.identity, context)
        draft.prefill(cache)

        def propose_ms(k):
            cache.begin()
            t0 = time.perf_counter()
            draft.propose(cache, k, greedy, RngDecider(0), 0, frozenset())
            ms = _ms(t0)
            cache.abort()            # the pending token is fed again next time
            return ms
        d = propose_ms(4) / 4.0
        if within():
            d = min(d, propose_ms(4) / 4.0)
        for t in context:            # 8 committed ids the draft has not seen: a catch-up of 9 ids
            cache.append_authoritative(t)
        c = max(propose_ms(1) - d, 0.0) / 8.0
    identity = "|".join([champion.identity, getattr(draft, "identity", "none"), "reference-numpy",
                         f"{platform.system()}-{platform.machine()}"])
    return {"version": 1, "key": hashlib.sha256(identity.encode()).hexdigest(), "source": "measured",
            "measured_at": None, "ms": round(_ms(t_start), 3), "backend": "reference",
            "verify_ms": verify, "verify_sampled_extra_ms_per_row": 0.0, "measured_n": sorted(timed),
            "draft_ms_per_proposal": d, "draft_catchup_ms_per_token": c, "lookup_ms": None}


def _one_hot(vocab_size: int, y: int) -> list:
    row = [0] * vocab_size
    row[y] = 1
    return row


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


class RunnerDraft(_RunnerBackend):
    """Draft backend over a logits runner: samples proposals by the draft_sample address."""

    def propose(self, cache, k, policy, decider, round_id, stop_token_ids, first_step=0) -> Proposal:
        """first_step: proposal i draws at step counter first_step + i (k = 1 calls with first_step
        0, 1, ... draw what one k-call draws)."""
        out = Proposal()
        logits = _materialize(self.runner, cache, len(cache.tokens))[-1]  # (V,)
        self.n_calls += 1
        greedy = policy.temperature == 0
        for i in range(k):
            p_draft = _process(logits, cache.tokens, policy)
            if isinstance(p_draft, ExactSpecError):
                out.error = p_draft
                return out
            y = (argmax_tie_low(p_draft) if greedy
                 else decider.categorical(p_draft, DRAFT_SAMPLE, round_id, first_step + i))
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
        self._index = None      # _NgramIndex of the token list searched last (one request's committed ids)

    def prefill(self, cache):
        pass

    def find_continuation(self, tokens, k):
        """Tokens following the most recent earlier occurrence of the longest matching suffix n-gram.
        The same answer as `find_continuation_scan` (the definition), from an index of the n-grams
        that grows with the list: O(new tokens) a round instead of O(context) (a scan of 300 ids
        cost ~0.15 ms in CPython, several times that in Pyodide: a third of a toy champion step)."""
        index = self._index
        if index is None or not index.extends(tokens):
            index = self._index = _NgramIndex(self.min_ngram, self.max_ngram)
        index.add(tokens)
        n_tokens = len(tokens)
        for n in range(min(self.max_ngram, n_tokens - 1), self.min_ngram - 1, -1):
            start = index.lookup(n, tokens)
            if start is not None:
                return tokens[start + n:start + n + k]
        return []

    def find_continuation_scan(self, tokens, k):
        """The definition find_continuation computes (tests compare the two)."""
        n_tokens = len(tokens)
        for n in range(min(self.max_ngram, n_tokens - 1), self.min_ngram - 1, -1):
            suffix = tokens[n_tokens - n:]
            for start in range(n_tokens - n - 1, -1, -1):
                if tokens[start:start + n] == suffix:
                    cont = tokens[start + n:start + n + k]
                    if cont:
                        return cont
        return []

    def forget(self) -> None:
        """Drop the n-gram index (a request ended: nothing of it is kept for the next)."""
        self._index = None

    def proposals(self, tokens, k: int, stop_token_ids) -> list:
        """Up to k proposals for the committed `tokens`: the continuation, cut after a stop token."""
        self.n_calls += 1
        out = []
        for y in self.find_continuation(tokens, k):
            out.append(y)
            if y in stop_token_ids:
                break
        return out


class _NgramIndex:
    """For n in [min_n, max_n]: the most recent start of each n-gram that ends before the indexed
    list's last id (`latest[n]`: n = 1 keyed by the id, n >= 2 by the tuple). That is the suffix
    n-gram's most recent earlier occurrence (the scan's answer: an occurrence with at least one id
    after it), read by `lookup`. Valid while the list only grows (a request's committed ids);
    `extends` checks that it is the same list, not shorter, with the same last indexed id. `add`
    indexes the new n-grams with dict.update over zipped slices (no Python loop a token: the
    prompt's ~100-300 ids are indexed at the first search, ~6x faster than a loop in CPython)."""

    def __init__(self, min_n: int, max_n: int):
        self.ns = range(min_n, max_n + 1)
        self.latest = {n: {} for n in self.ns}
        self.tokens, self.seen, self.last = None, 0, None

    def extends(self, tokens) -> bool:
        return (tokens is self.tokens and len(tokens) >= self.seen
                and (self.seen == 0 or tokens[self.seen - 1] == self.last))

    def add(self, tokens) -> None:
        # n-grams ending at positions seen - 1 .. len - 2 (those ending at seen - 1 were left out
        # when it was the last id); an n-gram ending at e starts at e - n + 1
        first_end, last_end = max(self.seen - 1, 0), len(tokens) - 2
        for n in self.ns:
            lo, hi = max(first_end - n + 1, 0), last_end - n + 1       # starts lo..hi
            if hi < lo:
                continue
            if n == 1:
                keys = tokens[lo:hi + 1]
            else:
                keys = zip(*[tokens[lo + j:hi + 1 + j] for j in range(n)])
            self.latest[n].update(zip(keys, range(lo, hi + 1)))    # later starts overwrite: the latest
        self.tokens, self.seen = tokens, len(tokens)
        self.last = tokens[-1] if tokens else None

    def lookup(self, n: int, tokens):
        """The most recent earlier start of `tokens`' suffix n-gram (tokens: the indexed list), or None."""
        key = tokens[-1] if n == 1 else tuple(tokens[len(tokens) - n:])
        return self.latest[n].get(key)
