"""The speculative round loop over abstract champion and draft backends.

One request: prefill both caches, then rounds until EOS / stop string / max length / cancel /
error. Each round: draft proposes (draft transaction), champion verifies the block in one call
(champion transaction), the pure acceptance function decides, both caches commit the accepted
prefix and take the next authoritative token as pending, and the tokens are emitted once.
Failure rules (spec): before the first emitted token a speculation failure silently falls back
to champion-alone; after it, the answer ends visibly with a coded error; nothing is re-emitted.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

from .acceptance import decide_round
from .backends import LookupProposer, Proposal
from .caches import LogicalCache
from .deciders import RngDecider
from .errors import (E_BAD_ARGUMENT, E_CACHE_STATE, E_CONTEXT_OVERFLOW, E_DEVICE_LOST, E_DRAFT_LOST, E_INTERNAL,
                     E_RESIDUAL_INVARIANT, ExactSpecError, coded_error)
from .policy import SamplingPolicy
from .protocol import make_envelope
from .receipts import build_receipt
from .scheduler import SCHEDULERS, make_scheduler
from .textstream import TextAssembler

MODES = ("none", "draft", "lookup")
# Where each emitted token came from (the "tokens" event's `sources`, one per token id).
SOURCES = ("accepted", "correction", "extra", "baseline")
MAX_K = 64


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 64
    policy: SamplingPolicy = field(default_factory=SamplingPolicy)
    draft_policy: Optional[SamplingPolicy] = None   # None: the champion's policy (best acceptance)
    speculate: str = "draft"
    k: int = 4
    seed: int = 0
    stop_token_ids: tuple = ()
    stop_strings: tuple = ()
    scheduler: str = "static"   # scheduler.SCHEDULERS: static k, or adaptive (k <= config.k per round)

    def validate(self, vocab_size: int) -> None:
        def bad(name, why):
            raise ExactSpecError(E_BAD_ARGUMENT, f"{name} {why}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            bad("max_new_tokens", f"must be a positive integer, got {self.max_new_tokens!r}")
        if self.speculate not in MODES:
            bad("speculate", f"must be one of {', '.join(MODES)}, got {self.speculate!r}")
        if not isinstance(self.k, int) or not 0 <= self.k <= MAX_K:
            bad("k", f"must be an integer in [0, {MAX_K}], got {self.k!r}")
        if self.scheduler not in SCHEDULERS:
            bad("scheduler", f"must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 64:
            bad("seed", f"must be an integer in [0, 2^64), got {self.seed!r}")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
                bad("stop_token_ids", f"contains {t!r}, outside [0, {vocab_size})")
        if not isinstance(self.stop_strings, (tuple, list)):   # a bare str would stop on every character
            bad("stop_strings", f"must be a list of strings, got {type(self.stop_strings).__name__}")
        for s in self.stop_strings:
            if not isinstance(s, str) or not s:
                bad("stop_strings", f"must hold non-empty strings, got {s!r}")
        for policy in filter(None, (self.policy, self.draft_policy)):
            policy.validate(vocab_size)
            allowed = getattr(policy.grammar, "allowed", None)
            for t in sorted(allowed or ()):
                if not 0 <= t < vocab_size:
                    bad("allowed_token_ids", f"contains {t!r}, outside [0, {vocab_size})")

    def check_limits(self, limits: dict) -> None:
        """Refuse, before any output, what a backend declares it cannot run (`limits`: "max_k",
        "min_temperature", "repetition_penalty_range"): a block longer than its verify buffer, a
        temperature or penalty whose f32 arithmetic would overflow."""
        def bad(name, why):
            raise ExactSpecError(E_BAD_ARGUMENT, f"{name} {why}")
        if self.speculate != "none" and "max_k" in limits and self.k > limits["max_k"]:
            bad("k", f"is {self.k}: this champion backend verifies at most {limits['max_k']} proposals per round")
        for policy in filter(None, (self.policy, self.draft_policy)):
            t, r = policy.temperature, policy.repetition_penalty
            if t != 0 and t < limits.get("min_temperature", 0):
                bad("temperature", f"is {t!r}: below this backend's limit {limits['min_temperature']} (f32 overflow)")
            lo, hi = limits.get("repetition_penalty_range", (0, float("inf")))
            if not lo <= r <= hi:
                bad("repetition_penalty", f"is {r!r}: outside this backend's range [{lo}, {hi}] (f32 overflow)")


class CancelToken:
    """Cancellation epoch: cancel() bumps it; a request notices at its next round boundary."""

    def __init__(self):
        self.epoch = 0

    def cancel(self):
        self.epoch += 1

    def advance(self, epoch: int):
        """Adopt a newer epoch set elsewhere (the worker's cancel message); never goes back."""
        self.epoch = max(self.epoch, int(epoch))


@dataclass
class GenerationResult:
    request_id: str
    prompt_ids: list
    token_ids: list
    text: str
    finish_reason: str              # eos | stop | length | cancelled | error
    stats: dict
    timing_ms: dict
    error: Optional[dict]
    receipt: dict
    events: int = 0

    seed_opening: Optional[str] = None   # opens receipt["seed_commitment"]; local, never in the receipt

    def to_dict(self) -> dict:
        return {"request_id": self.request_id, "text": self.text, "token_ids": self.token_ids,
                "prompt_ids": self.prompt_ids, "finish_reason": self.finish_reason,
                "stats": self.stats, "timing_ms": self.timing_ms, "error": self.error,
                "receipt": self.receipt, "seed_opening": self.seed_opening}


def _new_stats(k: int) -> dict:
    return {"rounds": 0, "proposed": 0, "accepted": 0, "baseline_steps": 0, "draft_invalid": 0,
            "target_calls": 0, "draft_calls": 0, "numeric_errors": 0,
            "accepted_count_histogram": [0] * (k + 1), "rejection_position_histogram": [0] * k}


class _Run:
    """Mutable state of one request."""

    def __init__(self, config, prompt_ids, decode, request_id, epoch, on_event, cancel=None, stream=None):
        self.config = config
        self.greedy = config.policy.temperature == 0
        self.draft_policy = config.draft_policy or config.policy
        self.stop_ids = frozenset(config.stop_token_ids)
        self.request_id, self.epoch, self.on_event, self.cancel = request_id, epoch, on_event, cancel
        self.token_ids: list[int] = []
        self.text = TextAssembler(decode, config.stop_strings, stream)
        self.finish: Optional[str] = None
        self.error: Optional[ExactSpecError] = None
        self.fallback_code: Optional[str] = None
        self.seq = 0
        self.stats = _new_stats(config.k)
        self.timing = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "accept": 0.0, "first_token": None, "total": 0.0}
        self.mode = config.speculate
        self.scheduler = make_scheduler(config)
        self.round_t0 = time.perf_counter()     # start of the current round (the scheduler's cost)
        self.champion_cache: Optional[LogicalCache] = None
        self.draft_cache: Optional[LogicalCache] = None
        self.t_start = time.perf_counter()

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.epoch != self.epoch

    def send(self, kind, payload):
        if self.on_event is not None:
            self.on_event(make_envelope(kind, self.request_id, self.seq, self.epoch, payload))
        self.seq += 1


class Orchestrator:
    """Runs requests over a champion backend and an optional draft backend (see backends.py)."""

    def __init__(self, champion, draft=None, decode: Optional[Callable] = None, identities: Optional[dict] = None,
                 draft_error: Optional[str] = None, stream_decoder: Optional[Callable] = None):
        """`decode(ids)` -> text; `stream_decoder()` (optional) -> a fresh streaming decoder for one
        answer (push(id) -> final text, flush()), which makes text O(1) per token."""
        self.champion = champion
        self.stream_decoder = stream_decoder
        self.draft = draft
        self.draft_error = draft_error      # why there is no draft (it failed to load), or None
        self.vocab_size = champion.vocab_size
        self.decode = decode or (lambda ids: "")
        self.identities = dict(identities or {})
        self.identities["champion"] = champion.identity
        self.lookup = LookupProposer(self.vocab_size)

    # ----------------------------------------------------------------------------------------
    def generate(self, prompt_ids, config: GenerationConfig, on_event=None,
                 cancel: Optional[CancelToken] = None, request_id: Optional[str] = None,
                 decider=None, epoch: Optional[int] = None) -> GenerationResult:
        """Synchronous entry (CPython backends): drives agenerate() without an event loop."""
        return run_without_loop(self.agenerate(prompt_ids, config, on_event, cancel, request_id, decider, epoch))

    async def agenerate(self, prompt_ids, config: GenerationConfig, on_event=None,
                        cancel: Optional[CancelToken] = None, request_id: Optional[str] = None,
                        decider=None, epoch: Optional[int] = None) -> GenerationResult:
        """The request loop. Backend methods may return values or awaitables (JS promises in
        Pyodide); each is awaited only when it is one, so one code path serves both.

        Raises ExactSpecError only for a request refused before it started (bad arguments,
        context overflow, backend limits); once started, every outcome is a result, and any
        unexpected failure ends it as a coded error (E_INTERNAL when nothing better is known).
        `epoch` is the request's cancellation epoch (default: the cancel token's current one);
        the request ends "cancelled" at the first round boundary after the token moves off it."""
        prompt_ids = list(prompt_ids)
        config.validate(self.vocab_size)
        config.check_limits(getattr(self.champion, "limits", None) or {})
        if not prompt_ids or any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt_ids):
            raise ExactSpecError(E_BAD_ARGUMENT, f"prompt must be 1+ token ids in [0, {self.vocab_size})")
        limit = self.champion.max_context
        if len(prompt_ids) + config.max_new_tokens > limit:
            raise ExactSpecError(E_CONTEXT_OVERFLOW, f"prompt ({len(prompt_ids)} tokens) + max_new_tokens "
                                 f"({config.max_new_tokens}) exceeds the champion's context of {limit}")
        if config.speculate == "draft" and self.draft is None:
            raise ExactSpecError(E_DRAFT_LOST if self.draft_error else E_BAD_ARGUMENT,
                                 f"speculate=draft needs a draft model{': ' + self.draft_error if self.draft_error else ''}")
        if epoch is None:
            epoch = cancel.epoch if cancel else 0
        elif cancel is not None:
            cancel.advance(epoch)
        run = _Run(config, prompt_ids, self.decode, request_id or uuid.uuid4().hex, epoch, on_event, cancel,
                   self.stream_decoder() if self.stream_decoder is not None else None)
        decider = decider or RngDecider(config.seed)
        proposer = self.draft if run.mode == "draft" else self.lookup
        try:
            await self._run_request(run, prompt_ids, proposer, decider)
        except Exception as exc:  # a bug or an unforeseen backend failure: end visibly, coded
            if run.finish is None:
                self._fatal(run, coded_error(exc, E_INTERNAL, "orchestrator"))
        run.timing["total"] = _ms(run.t_start)
        return self._result(run, prompt_ids, proposer)

    async def _run_request(self, run: _Run, prompt_ids, proposer, decider):
        config, limit = run.config, self.champion.max_context
        if run.cancelled:            # cancelled before it started (its epoch was already stale)
            return self._finish(run, "cancelled")
        t0 = time.perf_counter()
        run.champion_cache = LogicalCache(self.champion.identity, prompt_ids)
        await self._champion_call(run, self.champion.prefill, run.champion_cache)
        if run.finish is None and run.mode != "none":
            if len(prompt_ids) + config.max_new_tokens > getattr(proposer, "max_context", limit):
                self._speculation_failed(run, ExactSpecError(E_CONTEXT_OVERFLOW, "draft context too short"))
            else:
                run.draft_cache = LogicalCache(proposer.identity, prompt_ids)
                try:
                    await resolve(proposer.prefill(run.draft_cache))
                except Exception as exc:  # draft worker/backend failure of any kind
                    if not run.cancelled:
                        self._speculation_failed(run, _as_draft_lost(exc))
        run.timing["prefill"] += _ms(t0)

        pause = getattr(self.champion, "pause", None)
        while run.finish is None:
            if pause is not None:   # a backend whose rounds may not suspend lets its host run here
                await resolve(pause())
            if run.cancelled:
                self._finish(run, "cancelled")
                break
            if run.mode == "none":
                await self._baseline_round(run, decider)
            else:
                await self._speculative_round(run, proposer, decider)

    # ----------------------------------------------------------------------------------------
    async def _speculative_round(self, run: _Run, proposer, decider):
        cfg = run.config
        remaining = cfg.max_new_tokens - len(run.token_ids)
        run.round_t0 = time.perf_counter()
        k = run.scheduler.next_k(remaining)
        round_id = len(run.token_ids)
        if k == 0:
            return await self._baseline_round(run, decider)
        fused = getattr(proposer, "propose_verify_decide", None)
        if fused is not None and getattr(proposer, "fused_with", None) is self.champion and isinstance(decider, RngDecider):
            return await self._fused_round(run, fused, decider, k, round_id, remaining)
        t0 = time.perf_counter()
        run.draft_cache.begin()
        run.stats["draft_calls"] += 1
        try:
            proposal = await resolve(proposer.propose(run.draft_cache, k, run.draft_policy, decider, round_id, run.stop_ids))
        except Exception as exc:
            run.draft_cache.abort()
            run.timing["draft"] += _ms(t0)
            if run.cancelled:            # the cancel interrupted the draft call: not a draft failure
                return self._finish(run, "cancelled")
            return self._speculation_failed(run, _as_draft_lost(exc))
        draft_ms = _ms(t0)
        run.timing["draft"] += draft_ms
        if proposal.error is not None or not proposal.tokens:
            run.draft_cache.rollback()
            run.stats["draft_invalid"] += proposal.error is not None
            return await self._baseline_round(run, decider)

        run.champion_cache.begin()
        run.champion_cache.append_provisional(proposal.tokens)
        t0 = time.perf_counter()
        decision = await self._verify_and_decide(run, decider, proposal, round_id, remaining)
        self._settle(run, proposal, decision, draft_ms, _ms(t0))

    async def _fused_round(self, run: _Run, fused, decider, k: int, round_id: int, remaining: int):
        """Draft proposal, champion verification and decision in one backend call (the draft
        runs next to the champion). `fused(...)` -> (proposal, decision, draft_failure, draft_ms,
        verify_ms): decision is None when the champion did not run (draft_failure: the draft
        failed; else its row was invalid or it proposed nothing). The caches end exactly as
        on the two-call path, and every failure takes the same path as there."""
        run.draft_cache.begin()
        run.champion_cache.begin()
        run.stats["draft_calls"] += 1
        try:
            out = await resolve(fused(run.draft_cache, run.champion_cache, k, run.draft_policy, run.config.policy,
                                      decider.seed, round_id, run.stop_ids, remaining, run.greedy))
        except Exception as exc:        # the champion (or the bridge) failed: as _champion_call
            run.stats["target_calls"] += 1
            run.champion_cache.abort()
            run.draft_cache.abort()
            if run.cancelled:
                return self._finish(run, "cancelled")
            return self._fatal(run, coded_error(exc, E_DEVICE_LOST, "champion backend failed"))
        proposal, decision, draft_failure, draft_ms, verify_ms = out
        run.timing["draft"] += draft_ms
        if draft_failure is not None:   # the draft itself failed: the champion did not run
            run.champion_cache.rollback()
            run.draft_cache.abort()
            if run.cancelled:
                return self._finish(run, "cancelled")
            return self._speculation_failed(run, _as_draft_lost(draft_failure))
        if decision is None:            # an invalid draft row, or no proposal: a baseline round
            run.champion_cache.rollback()
            run.draft_cache.rollback()
            run.stats["draft_invalid"] += proposal.error is not None
            return await self._baseline_round(run, decider)
        run.stats["target_calls"] += 1
        run.timing["verify"] += verify_ms
        self._settle(run, proposal, decision, draft_ms, verify_ms)

    def _settle(self, run: _Run, proposal, decision, draft_ms: float, verify_ms: float):
        """Commit a verified round to both caches, count it, tell the scheduler, emit it."""
        if decision is None:
            return
        if decision.error is not None:
            run.champion_cache.abort()
            run.draft_cache.abort()
            run.stats["numeric_errors"] += 1
            if decision.error.code == E_RESIDUAL_INVARIANT:
                return self._speculation_failed(run, decision.error)
            return self._fatal(run, decision.error)

        m, n_accepted = len(proposal.tokens), decision.n_accepted
        run.champion_cache.commit_prefix(n_accepted)
        run.draft_cache.commit_prefix(n_accepted)
        st = run.stats
        st["rounds"] += 1
        st["proposed"] += m
        st["accepted"] += n_accepted
        st["accepted_count_histogram"][n_accepted] += 1
        if decision.rejected_at is not None:
            st["rejection_position_histogram"][decision.rejected_at] += 1
        run.scheduler.observe(proposed=m, accepted=n_accepted, draft_ms=draft_ms, verify_ms=verify_ms,
                              round_ms=_ms(run.round_t0))
        tokens = list(proposal.tokens[:n_accepted])
        sources = ["accepted"] * n_accepted
        if decision.next_token is not None:
            tokens.append(decision.next_token)
            sources.append("correction" if decision.rejected_at is not None else "extra")
            run.champion_cache.append_authoritative(decision.next_token)
            run.draft_cache.append_authoritative(decision.next_token)
        self._emit(run, tokens, sources, {"proposed": m, "accepted": n_accepted,
                                          "draft_ms": round(draft_ms, 3), "verify_ms": round(verify_ms, 3)})

    async def _baseline_round(self, run: _Run, decider):
        """Champion-alone step; also the k == 0 round and the draft-invalid round."""
        round_id = len(run.token_ids)
        run.champion_cache.begin()
        t0 = time.perf_counter()
        decision = await self._verify_and_decide(run, decider, Proposal(), round_id, 1)
        if decision is None:
            return
        if decision.error is not None:
            run.champion_cache.abort()
            run.stats["numeric_errors"] += 1
            return self._fatal(run, decision.error)
        run.champion_cache.commit_prefix(0)
        run.champion_cache.append_authoritative(decision.next_token)
        run.stats["baseline_steps"] += 1
        if run.mode != "none":
            run.draft_cache.append_authoritative(decision.next_token)
            run.scheduler.observe(proposed=0, accepted=0, draft_ms=0.0, verify_ms=_ms(t0), round_ms=_ms(run.round_t0))
        self._emit(run, [decision.next_token], ["baseline"], {"proposed": 0, "accepted": 0, "draft_ms": 0.0,
                                                               "verify_ms": round(_ms(t0), 3)})

    # ----------------------------------------------------------------------------------------
    async def _verify_and_decide(self, run: _Run, decider, proposal, round_id: int, remaining: int):
        """Champion verification of the open transaction plus the round's decision.

        A backend with `verify_and_decide` (the GPU) runs both on the device from the seed; any
        other backend returns rows and the decision is made here, by the same pure function.
        Returns None when the champion call itself failed (already reported)."""
        fused = getattr(self.champion, "verify_and_decide", None)
        t0 = time.perf_counter()
        if fused is not None and isinstance(decider, RngDecider):
            decision = await self._champion_call(run, fused, run.champion_cache, run.config.policy, proposal.p_draft_rows,
                                           decider.seed, round_id, run.stop_ids, remaining, run.greedy)
            run.timing["verify"] += _ms(t0)  # verification and decision, both on the device
            return decision
        rows = await self._champion_call(run, self.champion.verify_linear, run.champion_cache, run.config.policy)
        run.timing["verify"] += _ms(t0)
        if rows is None:
            return None
        t0 = time.perf_counter()
        decision = decide_round(rows, proposal.p_draft_rows, proposal.tokens, decider, round_id, run.stop_ids,
                                remaining, run.greedy)
        run.timing["accept"] += _ms(t0)
        return decision

    async def _champion_call(self, run: _Run, fn, *args):
        run.stats["target_calls"] += fn.__name__ in ("verify_linear", "verify_and_decide")
        try:
            return await resolve(fn(*args))
        except Exception as exc:  # device or backend failure of any kind, coded where JS coded it
            run.champion_cache.abort()
            if run.draft_cache is not None:
                run.draft_cache.abort()
            if run.cancelled:
                self._finish(run, "cancelled")
            else:
                self._fatal(run, coded_error(exc, E_DEVICE_LOST, "champion backend failed"))
        return None

    def _speculation_failed(self, run: _Run, err: ExactSpecError):
        """Silent champion-alone fallback before the first token, visible failure after it."""
        if run.token_ids:
            return self._fatal(run, err)
        run.mode = "none"
        run.fallback_code = err.code
        run.draft_cache = None

    def _fatal(self, run: _Run, err: ExactSpecError):
        run.error = err
        run.send("error", err.to_dict())
        self._finish(run, "error")

    def _finish(self, run: _Run, reason: str):
        if run.finish is not None:
            return
        run.finish = reason
        for cache in (run.champion_cache, run.draft_cache):
            if cache is not None:
                cache.finalize(reason)

    def _emit(self, run: _Run, tokens, sources, round_info: dict):
        """Emit tokens once, in order, applying EOS / stop string / max length per token.
        `sources[i]` says where tokens[i] came from (SOURCES); `round_info` is the round's
        {proposed, accepted, draft_ms, verify_ms}, sent with its tokens for live plots;
        `token_texts[i]` is the text tokens[i] released (held-back bytes come out with a later one)."""
        emitted, text = [], []
        for t in tokens:
            run.token_ids.append(t)
            emitted.append(t)
            if run.timing["first_token"] is None:
                run.timing["first_token"] = _ms(run.t_start)
            if t in run.stop_ids:
                text.append("")
                self._finish(run, "eos")
                break
            text.append(run.text.push(t))
            if run.text.stopped:
                self._finish(run, "stop")
                break
            if len(run.token_ids) == run.config.max_new_tokens:
                self._finish(run, "length")
                break
        if run.finish in ("eos", "length") and text:
            text[-1] += run.text.finish()
        run.send("tokens", {"token_ids": emitted, "text": "".join(text), "token_texts": text,
                            "sources": list(sources[:len(emitted)]), "round": round_info})

    def _take_counters(self) -> dict:
        """The backends' counters since the previous call (the browser's stale-epoch drops, by
        receiver), or {}: taken once per result, so every drop lands in exactly one result."""
        fn = getattr(self.champion, "take_counters", None)
        return dict(fn()) if fn is not None else {}

    def _result(self, run: _Run, prompt_ids, proposer) -> GenerationResult:
        st = dict(run.stats)
        counters = self._take_counters()
        if counters:
            st["stale_dropped"] = counters
        st["tokens_per_round"] = (round((st["accepted"] + st["rounds"]) / st["rounds"], 4) if st["rounds"] else None)
        st["mode"] = run.mode
        st["fallback_code"] = run.fallback_code
        timing = dict(run.timing)
        timing["decode"] = timing["total"] - timing["prefill"]
        n_rounds = st["rounds"] + st["baseline_steps"]
        timing["per_round"] = ({"draft": timing["draft"] / n_rounds, "verify": timing["verify"] / n_rounds,
                                "accept": timing["accept"] / n_rounds} if n_rounds else None)
        identities = dict(self.identities)
        identities["draft"] = proposer.identity if run.config.speculate != "none" else "none"
        environment = getattr(self.champion, "environment", None)
        receipt, seed_opening = build_receipt(
            identities=identities, policy_canonical=run.config.policy.canonical(),
            scheduler={**run.scheduler.describe(), "mode": run.config.speculate},
            seed=run.config.seed, stats=st, timing_ms={k: v for k, v in timing.items() if isinstance(v, float)},
            failure_code=run.error.code if run.error else None, fallback_code=run.fallback_code,
            environment=environment() if environment is not None else None)
        error = run.error.to_dict() if run.error else None
        result = GenerationResult(run.request_id, prompt_ids, list(run.token_ids), run.text.text(), run.finish,
                                  st, timing, error, receipt, run.seq, seed_opening)
        run.send("result", result.to_dict())
        return result


async def resolve(value):
    """Await value if it is awaitable (a coroutine or a JS promise), else return it."""
    if hasattr(value, "__await__"):
        return await value
    return value


def run_without_loop(coro):
    """Run a coroutine that never truly suspends (all backends synchronous) to completion."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise ExactSpecError(E_CACHE_STATE, "a backend returned a pending awaitable: use agenerate() in an event loop")


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _as_draft_lost(exc: Exception) -> ExactSpecError:
    """A draft failure keeps a code the draft side gave it (E_TIMEOUT, E_OUT_OF_MEMORY, ...),
    else it is E_DRAFT_LOST."""
    return coded_error(exc, E_DRAFT_LOST, "draft backend failed")
