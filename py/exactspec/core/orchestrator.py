"""The speculative round loop: one request = begin a backend session, then rounds, each one call.

A request begins a session on the champion backend (`champion.begin(SessionRequest, draft)`: the
policy, stop ids, seed and context cross once; both models prefill). Each round is then ONE call,
`session.round(k, round_id, remaining, committed, proposals)`, which proposes (the draft, or
prompt lookup's `proposals` computed here), verifies, decides and returns a RoundOutcome (the
round record, protocol.json). This module's LogicalCache is authoritative: it passes its committed
length, the backend's mirror must agree. A baseline step is a round with k = 0. Until EOS / stop
string / max length / cancel / error. docs/round.md draws the path.
Failure rules (spec): before the first emitted token a speculation failure silently falls back
to champion-alone; after it, the answer ends visibly with a coded error; nothing is re-emitted.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from .auto_policy import K_LIMIT, AutoPolicy
from .backends import LookupProposer
from .caches import LogicalCache
from .deciders import RngDecider
from .errors import (E_BAD_ARGUMENT, E_CACHE_STATE, E_CONTEXT_OVERFLOW, E_DEVICE_LOST, E_DRAFT_LOST, E_INTERNAL,
                     E_RESIDUAL_INVARIANT, ExactSpecError, coded_error)
from .constraints import constraint_of
from .policy import SamplingPolicy
from .protocol import CODE_DESCRIPTIONS, make_envelope
from .receipts import build_receipt
from .round_record import NumericsTally
from .scheduler import SCHEDULERS, make_scheduler
from .textstream import TextAssembler

MODES = ("none", "draft", "lookup", "auto")   # auto: auto_policy.AutoPolicy picks none/draft/lookup and k per round
# Where each emitted token came from (the "tokens" event's `sources`, one per token id).
SOURCES = ("accepted", "correction", "extra", "baseline", "forced")   # forced: the only id a response_format allowed
MAX_K = 64
# A chain of baseline steps (session.chain: one call into the backend for several k = 0 rounds, where
# the backend's limits declare "max_chain") lasts about this long at most, from the last step's
# champion time: a 60 Hz frame, what streaming and a cancel wait at worst; a model whose step takes
# half of it or more runs one step a call, as before. Each step is still a round of its own (its
# round id, its record). Dev split, toy pair, WASM (tools/bench/auto_ab.py): 8 ms cut the time
# outside the champion from ~0.25 to ~0.16 ms a token, 16 ms to ~0.10.
CHAIN_BUDGET_MS = 16.0


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 64
    policy: SamplingPolicy = field(default_factory=SamplingPolicy)
    draft_policy: Optional[SamplingPolicy] = None   # None: the champion's policy (best acceptance)
    speculate: str = "auto"
    k: int = 4                  # draft / lookup proposals per round (adaptive: at most); ignored by auto
    seed: int = 0
    stop_token_ids: tuple = ()
    stop_strings: tuple = ()
    scheduler: str = "static"   # scheduler.SCHEDULERS: static k, or adaptive (k <= config.k per round)
    prefix_reuse: bool = True   # start from the K/V the models hold for the previous request's ids
                                # (the longest common prefix; exact: docs/core.md "Prefix reuse")
    forced_batching: bool = True  # a response_format's forced ids open a round and go to the champion in
                                  # its block (False: each is a decided row; the same tokens, for measuring)
    chain_steps: bool = True    # a run of baseline steps (none, auto's held none) goes to a backend that
                                # chains them as one call, up to CHAIN_BUDGET_MS of steps (False: one
                                # call a step; the same tokens, for measuring)

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
        if not isinstance(self.prefix_reuse, bool):
            bad("prefix_reuse", f"must be true or false, got {self.prefix_reuse!r}")
        if not isinstance(self.forced_batching, bool):
            bad("forced_batching", f"must be true or false, got {self.forced_batching!r}")
        if not isinstance(self.chain_steps, bool):
            bad("chain_steps", f"must be true or false, got {self.chain_steps!r}")
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
        if self.speculate not in ("none", "auto") and "max_k" in limits and self.k > limits["max_k"]:
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


@dataclass(frozen=True)
class SessionRequest:
    """What a backend session gets once, at begin: the request's constant state."""
    context_ids: tuple
    policy: SamplingPolicy
    draft_policy: SamplingPolicy
    stop_token_ids: tuple
    seed: int
    max_new_tokens: int
    mode: str                      # none | draft | lookup (lookup's proposals come with each round) |
                                   # auto (the draft, when given, is not prefilled: it catches up in its
                                   # first round, so a request auto never drafts pays nothing for it)
    decider: object                # RngDecider(seed), or a test's decider (CPython reference only)
    prefix_reuse: bool = True      # the session may start each model from the K/V it holds for these ids
    constraint: object = None      # the compiled response_format (the orchestrator's `constraints`
                                   # compiled it: the session binds a matcher to it), or None
    forced_batching: bool = True   # GenerationConfig.forced_batching

    @property
    def greedy(self) -> bool:
        return self.policy.temperature == 0


def _new_stats(k: int) -> dict:
    return {"rounds": 0, "proposed": 0, "accepted": 0, "baseline_steps": 0, "draft_invalid": 0,
            "target_calls": 0, "draft_calls": 0, "numeric_errors": 0, "forced": 0,
            "prompt_reused": {"champion": 0, "draft": None},   # prompt ids whose K/V came from the last request
            "accepted_count_histogram": [0] * (k + 1), "rejection_position_histogram": [0] * k}


class _Run:
    """Mutable state of one request."""

    def __init__(self, config, prompt_ids, decode, request_id, epoch, on_event, cancel=None, stream=None, auto=None):
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
        self.auto = auto                # AutoPolicy of a speculate="auto" request, else None
        self.constraint = None          # the compiled response_format, else None
        self.stats = _new_stats(auto.k_max if auto is not None else config.k)
        self.draft_behind = 0           # committed tokens the draft has not consumed (auto's catch-up cost)
        self.step_ms = None             # the champion's time for the last baseline step (after the first round)
        self.auto_round = None          # this round's (Choice, lookup proposals, lookup search ms)
        self.timing = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "first_token": None, "total": 0.0}
        # where a decode round's wall time goes, as this side sees it (ms, summed over rounds):
        # choose (auto's policy and lookup's search, or the scheduler), call (the session's round:
        # the draft and the champion, and the crossing to them), commit (the cache and the policy's
        # observation), emit (text, stop checks, the tokens event), pause (yields to the host)
        self.phases = {"choose": 0.0, "call": 0.0, "commit": 0.0, "emit": 0.0, "pause": 0.0}
        self.mode = config.speculate
        self.scheduler = make_scheduler(config)
        self.round_t0 = time.perf_counter()     # start of the current round (the scheduler's cost)
        self.cache: Optional[LogicalCache] = None      # the authoritative committed sequence
        self.session = None                            # the backend's request session (champion.begin)
        self.round_bytes_max = 0                       # the most bytes one round moved across the session
        self.session_counts = {}                       # what session.end() reported (how rounds ran)
        self.numerics = NumericsTally()                # the decider's diagnostics, for the receipt's numerics
        self.t_start = time.perf_counter()

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.epoch != self.epoch

    def send(self, kind, payload):
        if self.on_event is not None:
            self.on_event(make_envelope(kind, self.request_id, self.seq, self.epoch, payload))
        self.seq += 1


class Orchestrator:
    """Runs requests over a champion backend (begin(request, draft) -> session) and an optional
    draft (backends.py: the CPython reference's RunnerChampion/RunnerDraft; pyodide/: the browser's)."""

    def __init__(self, champion, draft=None, decode: Optional[Callable] = None, identities: Optional[dict] = None,
                 draft_error: Optional[str] = None, stream_decoder: Optional[Callable] = None,
                 calibration: Optional[dict] = None, n_token_ids: Optional[int] = None, constraints=None):
        """`decode(ids)` -> text; `stream_decoder()` (optional) -> a fresh streaming decoder for one
        answer (push(id) -> final text, flush()), which makes text O(1) per token. `calibration`
        (common.md §1) fixes what speculate="auto" reads; by default the champion backend's
        `calibration(draft)` gives it (the browser's load-time one; the reference's measured once).
        `n_token_ids`: the tokenizer's ids [0, n) (default: every row of the model's vocabulary);
        rows at or past it are vocabulary padding (Qwen2.5's embedding has 151,936 rows for 151,665
        ids): every request's policies suppress them, declared (in the policy hash and the
        receipt), the champion's and the draft's alike, and a prompt may not hold them.
        `constraints`: compiles a request's response_format (`compile(spec, stop_token_ids)` ->
        the compiled constraint, or an awaitable of it; E_BAD_ARGUMENT for one it refuses): the
        CPython reference's reference/constrained.py, the browser's bridge (web/grammar/);
        None: requests with a response_format are refused."""
        self.champion = champion
        self.stream_decoder = stream_decoder
        self.draft = draft
        self.draft_error = draft_error      # why there is no draft (it failed to load), or None
        self.vocab_size = champion.vocab_size
        n_token_ids = self.vocab_size if n_token_ids is None else n_token_ids
        if not isinstance(n_token_ids, int) or not 1 <= n_token_ids <= self.vocab_size:
            raise ExactSpecError(E_BAD_ARGUMENT, f"the tokenizer's {n_token_ids!r} ids do not fit the model's "
                                 f"{self.vocab_size} vocabulary rows (it may have more rows than ids, not fewer)")
        self.n_token_ids = n_token_ids
        self.padding_ids = tuple(range(n_token_ids, self.vocab_size))   # (V - n,) suppressed in every policy
        self.decode = decode or (lambda ids: "")
        self.identities = dict(identities or {})
        self.identities["champion"] = champion.identity
        self.lookup = LookupProposer(self.vocab_size)
        self.calibration = calibration
        self.constraints = constraints
        # speculate="auto": the draft's acceptance learnt by the last auto request of each sampling
        # policy (canonical JSON -> AutoPolicy.export_memory()), the next one's prior: timing only
        self.auto_memory = {}

    def auto_calibration(self) -> Optional[dict]:
        """The calibration an auto request reads: the one given, else the champion backend's."""
        if self.calibration is not None:
            return self.calibration
        source = getattr(self.champion, "calibration", None)
        return source(self.draft) if source is not None else None

    def with_padding_suppressed(self, config: GenerationConfig) -> GenerationConfig:
        """config with the vocabulary padding rows added to its policies' suppress_token_ids (the
        draft's own policy too, when it has one): the same mask on both sides keeps acceptance exact."""
        if not self.padding_ids:
            return config
        pad = lambda p: replace(p, suppress_token_ids=tuple(sorted(set(p.suppress_token_ids) | set(self.padding_ids))))
        return replace(config, policy=pad(config.policy),
                       draft_policy=pad(config.draft_policy) if config.draft_policy is not None else None)

    def _draft_fits(self, prompt_ids, config) -> bool:
        return self.draft is not None and len(prompt_ids) + config.max_new_tokens <= self.draft.max_context

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
        config = self.with_padding_suppressed(config)
        config.check_limits(self.champion.limits)
        if not prompt_ids or any(not isinstance(t, int) or not 0 <= t < self.n_token_ids for t in prompt_ids):
            padding = f" (rows {self.n_token_ids}..{self.vocab_size - 1} are vocabulary padding)" if self.padding_ids else ""
            raise ExactSpecError(E_BAD_ARGUMENT, f"prompt must be 1+ token ids in [0, {self.n_token_ids}){padding}")
        limit = self.champion.max_context
        if len(prompt_ids) + config.max_new_tokens > limit:
            raise ExactSpecError(E_CONTEXT_OVERFLOW, f"prompt ({len(prompt_ids)} tokens) + max_new_tokens "
                                 f"({config.max_new_tokens}) exceeds the champion's context of {limit}")
        if config.speculate == "draft" and self.draft is None:
            raise ExactSpecError(E_DRAFT_LOST if self.draft_error else E_BAD_ARGUMENT,
                                 f"speculate=draft needs a draft model{': ' + self.draft_error if self.draft_error else ''}")
        config, compiled = await self._compile_constraint(config)
        if epoch is None:
            epoch = cancel.epoch if cancel else 0
        elif cancel is not None:
            cancel.advance(epoch)
        auto, calibration = None, None
        if config.speculate == "auto" or (config.speculate == "none" and self.champion.limits.get("max_chain", 1) > 1):
            calibration = self.auto_calibration()
        if config.speculate == "auto":
            k_max = min(K_LIMIT, self.champion.limits.get("max_k", K_LIMIT))
            auto = make_auto_policy(calibration, k_max, self._draft_fits(prompt_ids, config),
                                    config.policy.temperature == 0,
                                    memory=self.auto_memory.get(config.policy.canonical_json()))
        run = _Run(config, prompt_ids, self.decode, request_id or uuid.uuid4().hex, epoch, on_event, cancel,
                   self.stream_decoder() if self.stream_decoder is not None else None, auto)
        run.constraint = compiled
        run.step_ms = _calibrated_step(calibration)       # until a step of this request is timed
        try:
            await self._run_request(run, prompt_ids, decider or RngDecider(config.seed))
        except Exception as exc:  # a bug or an unforeseen backend failure: end visibly, coded
            if run.finish is None:
                self._fatal(run, coded_error(exc, E_INTERNAL, "orchestrator"))
        finally:
            self.lookup.forget()         # its n-gram index held this request's ids
            if run.session is not None:
                run.session_counts = run.session.end(run.finish)
        run.timing["total"] = _ms(run.t_start)
        return self._result(run, prompt_ids)

    async def _compile_constraint(self, config: GenerationConfig):
        """A response_format: compiled before any output (a refusal raises E_BAD_ARGUMENT), and the
        draft's policy given the same constraint (one mask on both sides keeps acceptance exact).
        -> (config, the compiled constraint or None)."""
        spec = constraint_of(config.policy)
        if spec is None:
            if config.draft_policy is not None and constraint_of(config.draft_policy) is not None:
                raise ExactSpecError(E_BAD_ARGUMENT, "response_format: the draft's policy has a constraint the "
                                     "champion's lacks", field="response_format")
            return config, None
        if self.constraints is None:
            raise ExactSpecError(E_BAD_ARGUMENT, "response_format: this engine's backend cannot apply constraints",
                                 field="response_format")
        if not config.stop_token_ids:
            raise ExactSpecError(E_BAD_ARGUMENT, "response_format: the request has no stop token id, so a "
                                 "constrained answer could not end", field="response_format")
        compiled = await resolve(self.constraints.compile(spec, config.stop_token_ids))
        if config.draft_policy is not None:
            config = replace(config, draft_policy=replace(config.draft_policy, grammar=config.policy.grammar))
        return config, compiled

    async def _run_request(self, run: _Run, prompt_ids, decider):
        config = run.config
        if run.cancelled:            # cancelled before it started (its epoch was already stale)
            return self._finish(run, "cancelled")
        if run.mode == "draft" and len(prompt_ids) + config.max_new_tokens > self.draft.max_context:
            self._speculation_failed(run, ExactSpecError(E_CONTEXT_OVERFLOW, "draft context too short"))
        t0 = time.perf_counter()
        run.cache = LogicalCache(self.champion.identity, prompt_ids)
        session_mode = run.mode
        if run.mode == "auto":       # the draft (when auto may use it) catches up on its first round
            session_mode = "auto" if run.auto.has_draft else "lookup"
        request = SessionRequest(tuple(prompt_ids), config.policy, run.draft_policy, tuple(sorted(run.stop_ids)),
                                 config.seed, config.max_new_tokens, session_mode, decider, config.prefix_reuse,
                                 run.constraint, config.forced_batching)
        try:
            run.session = await resolve(self.champion.begin(request, self.draft if session_mode in ("draft", "auto") else None))
        except Exception as exc:     # the champion's prefill (device or backend) failed
            return self._champion_failed(run, exc)
        reused = getattr(run.session, "reused", None) or {}
        run.stats["prompt_reused"] = {"champion": int(reused.get("champion") or 0),
                                      "draft": None if reused.get("draft") is None else int(reused["draft"])}
        if session_mode == "auto":   # what the draft lacks of the prompt: all but what it reused
            run.draft_behind = len(prompt_ids) - 1 - (run.stats["prompt_reused"]["draft"] or 0)
        if run.session.draft_failure is not None and not run.cancelled:
            self._speculation_failed(run, run.session.draft_failure)
        run.timing["prefill"] += _ms(t0)
        while run.finish is None:
            t_pause = time.perf_counter()
            pause = run.session.pause()     # a backend whose rounds may not suspend lets its host run here
            if pause is not None:
                await pause
            run.phases["pause"] += _ms(t_pause)
            if run.cancelled:
                self._finish(run, "cancelled")
                break
            await self._round(run)

    # ----------------------------------------------------------------------------------------
    async def _round(self, run: _Run):
        """One round: choose k, call the session once, apply its outcome (or its failure)."""
        remaining = run.config.max_new_tokens - len(run.token_ids)
        run.round_t0 = time.perf_counter()
        if run.mode == "auto":
            k, proposals = self._auto_choice(run, remaining)
        else:
            k = run.scheduler.next_k(remaining) if run.mode != "none" else 0
            proposals = self.lookup.proposals(run.cache.tokens, k, run.stop_ids) if run.mode == "lookup" and k else None
        run.stats["draft_calls"] += k > 0
        steps = self._chain_steps(run, remaining) if k == 0 and run.mode in ("none", "auto") else 1
        run.cache.begin()
        t_call = time.perf_counter()
        run.phases["choose"] += (t_call - run.round_t0) * 1000.0
        if steps > 1:
            return await self._chain(run, steps, remaining, t_call)
        try:
            out = await resolve(run.session.round(k, len(run.token_ids), remaining, run.cache.n_committed, proposals))
        except Exception as exc:     # the champion (or the bridge) failed
            run.stats["target_calls"] += 1
            return self._champion_failed(run, exc)
        run.round_bytes_max = max(run.round_bytes_max, run.session.round_bytes)
        run.timing["draft"] += out.draft_ms
        run.timing["verify"] += out.verify_ms
        if out.status == "draft_failed":          # the champion did not run
            run.cache.abort()
            return self._finish(run, "cancelled") if run.cancelled else self._speculation_failed(run, run.session.last_failure())
        run.stats["target_calls"] += 1
        run.stats["draft_invalid"] += out.status == "draft_invalid"
        run.numerics.add(out)
        if out.error_code is not None:
            err = _decision_failed(run, out)
            return self._speculation_failed(run, err) if out.error_code == E_RESIDUAL_INVARIANT else self._fatal(run, err)
        run.phases["call"] += _ms(t_call)
        self._commit(run, out)

    def _chain_steps(self, run: _Run, remaining: int) -> int:
        """How many baseline steps this round may run as one call: as many as fit CHAIN_BUDGET_MS at
        the last step's time (before one was timed: the calibration's V(1)), within the backend's
        max_chain and what is left; auto's held none only as long as its hold. 1 for the first
        token, without a step time, with a response_format, or with chain_steps off."""
        max_chain = self.champion.limits.get("max_chain", 1)
        if (max_chain <= 1 or not run.config.chain_steps or run.constraint is not None or run.step_ms is None
                or not run.token_ids):      # the first token as soon as it is decided
            return 1
        steps = min(max_chain, remaining, int(CHAIN_BUDGET_MS / max(run.step_ms, 1e-3)))
        if run.auto is not None:
            steps = min(steps, 1 + run.auto.held_rounds())
        return max(1, steps)

    async def _chain(self, run: _Run, steps: int, remaining: int, t_call: float):
        """Up to `steps` baseline steps as one call (session.chain): each step's record committed
        as its own round (the cache's transaction, the stats), their tokens emitted as one event. A
        step whose decision failed ends the answer after the steps before it are emitted."""
        try:
            outs = await resolve(run.session.chain(steps, len(run.token_ids), remaining, run.cache.n_committed))
        except Exception as exc:     # the champion (or the bridge) failed
            run.stats["target_calls"] += 1
            return self._champion_failed(run, exc)
        run.round_bytes_max = max(run.round_bytes_max, run.session.round_bytes)
        run.phases["call"] += _ms(t_call)
        t_commit = time.perf_counter()
        st, cache = run.stats, run.cache
        tokens, verify_ms, failed = [], 0.0, None
        for i, out in enumerate(outs):
            if i:
                cache.begin()
            st["target_calls"] += 1
            run.numerics.add(out)
            run.timing["verify"] += out.verify_ms
            if out.status != "verified" or out.proposals or out.forced or (out.next_token is None and out.error_code is None):
                cache.abort()
                failed = ExactSpecError(E_INTERNAL, f"a chain's step {i} is not a baseline step ({out.status})")
                break
            if out.error_code is not None:
                failed = _decision_failed(run, out)
                break
            cache.commit_prefix(0)
            cache.append_authoritative(out.next_token)
            st["baseline_steps"] += 1
            tokens.append(out.next_token)
            verify_ms += out.verify_ms
        if tokens:
            run.step_ms = verify_ms / len(tokens)
            round_info = {"proposed": 0, "accepted": 0, "forced": 0, "draft_ms": 0.0, "verify_ms": round(verify_ms, 3),
                          "steps": len(tokens)}
            if run.mode == "auto":
                choice, found, lookup_ms = run.auto_round
                run.auto.observe_chain(len(tokens), _ms(run.round_t0), verify_ms, lookup_ms=lookup_ms)
                run.auto.observe_lookup(found, tokens)
                run.draft_behind += len(tokens)
                round_info["auto"] = choice.info
            run.phases["commit"] += _ms(t_commit)
            self._emit(run, tokens, ["baseline"] * len(tokens), round_info)
        if failed is not None and run.finish is None:
            self._fatal(run, failed)

    def _auto_choice(self, run: _Run, remaining: int):
        """auto: search lookup's proposals (when the policy wants them), ask the policy, and
        return (k, proposals): lookup's cut to k, None for the draft, k = 0 for none."""
        policy = run.auto
        cap = min(policy.k_max, remaining - 1)
        found, lookup_ms = [], None
        if cap > 0 and policy.wants_lookup():
            t0 = time.perf_counter()
            found = self.lookup.proposals(run.cache.tokens, cap, run.stop_ids)
            lookup_ms = _ms(t0)
        choice = policy.choose(remaining, len(found), run.draft_behind, searched=lookup_ms is not None)
        run.auto_round = (choice, found, lookup_ms)
        if choice.method == "lookup":
            return choice.k, found[:choice.k]
        return (choice.k, None) if choice.method == "draft" else (0, None)

    def _commit(self, run: _Run, out):
        """Commit a decided round to the authoritative cache, count it, tell the scheduler, emit it."""
        t_commit = time.perf_counter()
        m, n_accepted, forced = len(out.proposals), out.n_accepted, list(out.forced)
        run.cache.append_provisional(forced + list(out.proposals))
        run.cache.commit_prefix(len(forced) + n_accepted)
        tokens = forced + list(out.proposals[:n_accepted])
        st = run.stats
        st["forced"] += len(forced)
        if m:
            st["rounds"] += 1
            st["proposed"] += m
            st["accepted"] += n_accepted
            for name, size in (("accepted_count_histogram", m + 1), ("rejection_position_histogram", m)):
                st[name] += [0] * (size - len(st[name]))   # a response_format's free steps may pass k
            st["accepted_count_histogram"][n_accepted] += 1
            if out.rejected_at is not None:
                st["rejection_position_histogram"][out.rejected_at] += 1
            sources = ["accepted"] * n_accepted + ["correction" if out.rejected_at is not None else "extra"]
        else:
            if st["baseline_steps"] + st["rounds"]:         # the first round may run deferred prompt work
                run.step_ms = out.verify_ms
            st["baseline_steps"] += 1
            sources = ["baseline"]
        sources = ["forced"] * len(forced) + sources
        if run.mode not in ("none", "auto"):
            run.scheduler.observe(proposed=m, accepted=n_accepted, draft_ms=out.draft_ms, verify_ms=out.verify_ms,
                                  round_ms=_ms(run.round_t0))
        if out.next_token is not None:
            tokens.append(out.next_token)
            run.cache.append_authoritative(out.next_token)
        round_info = {"proposed": m, "accepted": n_accepted, "forced": len(forced),
                      "draft_ms": round(out.draft_ms, 3), "verify_ms": round(out.verify_ms, 3)}
        if run.mode == "auto":
            round_info["auto"] = self._auto_observe(run, out, m, n_accepted, tokens)
        run.phases["commit"] += _ms(t_commit)
        self._emit(run, tokens, sources, round_info)

    def _auto_observe(self, run: _Run, out, m: int, n_accepted: int, tokens: list) -> dict:
        """Tell the auto policy what its choice gave; keep the draft's catch-up count; -> the
        round's `auto` object for the tokens event."""
        choice, found, lookup_ms = run.auto_round
        run.auto.observe(choice.method, choice.k, m, n_accepted, _ms(run.round_t0), out.draft_ms, out.verify_ms,
                         lookup_ms=lookup_ms, draft_behind=run.draft_behind, emitted=len(tokens),
                         block_rows=m + 1 + len(out.forced))
        run.auto.observe_lookup(found, tokens)
        drafted = choice.method == "draft" and m > 0
        run.draft_behind = 0 if drafted else run.draft_behind + len(tokens)
        return choice.info

    # ----------------------------------------------------------------------------------------
    def _champion_failed(self, run: _Run, exc: Exception):
        if run.cache.in_transaction:
            run.cache.abort()
        if run.cancelled:
            return self._finish(run, "cancelled")
        self._fatal(run, coded_error(exc, E_DEVICE_LOST, "champion backend failed"))

    def _speculation_failed(self, run: _Run, err: ExactSpecError):
        """Silent champion-alone fallback before the first token, visible failure after it."""
        if run.token_ids:
            return self._fatal(run, err)
        run.mode = "none"
        run.fallback_code = err.code

    def _fatal(self, run: _Run, err: ExactSpecError):
        run.error = err
        run.send("error", err.to_dict())
        self._finish(run, "error")

    def _finish(self, run: _Run, reason: str):
        if run.finish is not None:
            return
        run.finish = reason
        if run.cache is not None:
            run.cache.finalize(reason)

    def _emit(self, run: _Run, tokens, sources, round_info: dict):
        """Emit tokens once, in order, applying EOS / stop string / max length per token.
        `sources[i]` says where tokens[i] came from (SOURCES); `round_info` is the round's
        {proposed, accepted, draft_ms, verify_ms}, sent with its tokens for live plots;
        `token_texts[i]` is the text tokens[i] released (held-back bytes come out with a later one)."""
        t_emit = time.perf_counter()
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
        run.phases["emit"] += _ms(t_emit)

    def _result(self, run: _Run, prompt_ids) -> GenerationResult:
        st = dict(run.stats)
        counters = self.champion.take_counters()
        if counters:
            st["stale_dropped"] = counters
        st["tokens_per_round"] = (round((st["accepted"] + st["rounds"]) / st["rounds"], 4) if st["rounds"] else None)
        st["mode"] = run.mode
        if run.constraint is not None:    # {type, sha256, compile_ms, cached}
            info = run.constraint.info() if hasattr(run.constraint, "info") else dict(run.constraint)
            st["structured"] = {**{k: v for k, v in info.items() if k != "key"}, "forced": st["forced"]}
        st["fallback_code"] = run.fallback_code
        st["round_bytes_max"] = run.round_bytes_max
        st["session"] = run.session_counts
        timing = dict(run.timing)
        timing["decode"] = timing["total"] - timing["prefill"]
        n_rounds = st["rounds"] + st["baseline_steps"]
        timing["per_round"] = ({"draft": timing["draft"] / n_rounds, "verify": timing["verify"] / n_rounds}
                               if n_rounds else None)
        timing["phases"] = {k: round(v, 3) for k, v in run.phases.items()}
        identities = dict(self.identities)
        speculate = run.config.speculate
        identities["draft"] = (self.draft.identity if speculate == "draft" else self.lookup.identity
                               if speculate == "lookup" else "none")
        decisions = None
        if run.auto is not None:          # what auto could use: the draft (when it fit) and lookup
            st["auto"] = run.auto.stats()
            if run.constraint is not None:  # its rounds also masked rows: no evidence the device drifted
                st["auto"]["drift"] = None
            memory = run.auto.export_memory()
            if memory is not None:
                self.auto_memory[run.config.policy.canonical_json()] = memory
            decisions = {"rounds_by_method": st["auto"]["rounds_by_method"], "switches": st["auto"]["switches"]}
            identities["draft"] = (f"{self.draft.identity}+{self.lookup.identity}" if run.auto.has_draft
                                   else self.lookup.identity)
        scheduler = run.auto.describe() if run.auto is not None else run.scheduler.describe()
        receipt, seed_opening = build_receipt(
            identities=identities, policy_canonical=run.config.policy.canonical(),
            scheduler={**scheduler, "mode": speculate}, decisions=decisions,
            seed=run.config.seed, stats=st, timing_ms={k: v for k, v in timing.items() if isinstance(v, float)},
            failure_code=run.error.code if run.error else None, fallback_code=run.fallback_code,
            environment=self.champion.environment(), numerics=run.numerics.summary())
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


def make_auto_policy(calibration, k_max: int, has_draft: bool, greedy: bool, memory=None) -> AutoPolicy:
    """The policy of one speculate="auto" request (tests replace it with one fed modelled times);
    `memory`: the engine's last auto request's export_memory() for the same sampling policy."""
    return AutoPolicy(calibration, k_max, has_draft, greedy, memory=memory)


def _calibrated_step(calibration) -> Optional[float]:
    """The calibration's V(1) (ms), a baseline step's time before the request timed one; or None."""
    try:
        v1 = float(((calibration or {}).get("verify_ms") or [None, None])[1])
    except (TypeError, ValueError, IndexError):
        return None
    return v1 if v1 > 0 else None


def run_without_loop(coro):
    """Run a coroutine that never truly suspends (all backends synchronous) to completion."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise ExactSpecError(E_CACHE_STATE, "a backend returned a pending awaitable: use agenerate() in an event loop")


def _decision_failed(run: _Run, out) -> ExactSpecError:
    """A round whose decision failed (out.error_code): its transaction aborted and counted -> the error."""
    run.cache.abort()
    run.stats["numeric_errors"] += 1
    return ExactSpecError(out.error_code, CODE_DESCRIPTIONS.get(out.error_code, "the device reported it"))


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0
