"""Pyodide adapter: champion and draft backends over the JS bridge, and the worker's entry points.

This is the only module that touches Pyodide's FFI; the core stays pure. Bulk data never
crosses into Python: logits stay on the GPU and the draft's p_draft rows stay a JS Float32Array
that Python only hands back to the GPU acceptor. Each round step is one await.
"""
from __future__ import annotations

import hashlib
import json

from ..core.acceptance import RoundDecision
from ..core.backends import Proposal
from ..core.errors import E_CACHE_STATE, E_INTERNAL, ExactSpecError, coded_error
from ..core.orchestrator import CancelToken, GenerationConfig, Orchestrator
from ..core.policy import F32_MIN_TEMPERATURE, F32_PENALTY_RANGE, AllowedSetGrammar, SamplingPolicy
from ..core.protocol import CODE_DESCRIPTIONS, checked_config, checked_request


def _js_ints(values):
    from pyodide.ffi import to_js  # Pyodide only
    return to_js(list(values))


def _policy_json(policy: SamplingPolicy) -> str:
    allowed = None
    if policy.grammar is not None:
        allowed = sorted(policy.grammar.allowed_token_ids([]))
    return json.dumps({"temperature": policy.temperature, "top_k": policy.top_k, "top_p": policy.top_p,
                       "repetition_penalty": policy.repetition_penalty,
                       "suppress_token_ids": list(policy.suppress_token_ids), "allowed_token_ids": allowed})


def _seed_words(seed: int):
    return seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF


def _p_draft_for_js(rows, proposals, vocab_size: int):
    """The draft worker's rows are already a JS Float32Array (m*V); prompt lookup's are Python
    one-hot lists, sent as a Float32Array with a 1 at each proposal (m writes, not m*V)."""
    if not isinstance(rows, list):
        return rows
    from js import Float32Array  # Pyodide only
    flat = Float32Array.new(len(rows) * vocab_size)
    for i, (row, y) in enumerate(zip(rows, proposals)):
        if row[y] != 1:
            raise ExactSpecError(E_CACHE_STATE, "host-side p_draft rows must be one-hot (prompt lookup)")
        flat[i * vocab_size + y] = 1.0
    return flat


def _coded(code: str, message: str, default: str = "E_DEVICE_LOST") -> ExactSpecError:
    return coded_error(RuntimeError(f"{code}: {message}"), default)


async def _answer(value):
    """A bridge call's answer: a string at once (a CPU round, run synchronously: no event-loop
    hop) or a JS promise of one."""
    return value if isinstance(value, str) else await value


class BrowserChampion:
    """Champion on WebGPU: forward + processors + acceptance in one bridge call per round."""

    def __init__(self, bridge, vocab_size: int, max_context: int, identity: str, max_block: int):
        self.bridge, self.vocab_size, self.max_context = bridge, vocab_size, max_context
        self.identity, self.max_block = identity, max_block
        self.n_calls = 0
        self.limits = {"max_k": max_block - 1, "min_temperature": F32_MIN_TEMPERATURE,
                       "repetition_penalty_range": F32_PENALTY_RANGE}

    def pause(self):
        """None, or an awaitable that lets the worker's event loop run (a queued cancel is seen):
        rounds that run synchronously would otherwise never yield to it."""
        return self.bridge.pause()

    def take_counters(self) -> dict:
        """Stale-epoch drops per receiver (orchestrator worker, draft client, draft worker) since
        the previous call."""
        return json.loads(self.bridge.takeCounters())

    def environment(self) -> dict:
        """hardware_class, browser_version, runtime_version and peak_resident_bytes (by category),
        from the engine's own accounting on the JS side."""
        return json.loads(self.bridge.environment())

    async def prefill(self, cache):
        upto = cache.n_committed - 1
        start = cache.n_materialized
        while start < upto:   # chunks of at most max_block positions
            end = min(upto, start + self.max_block)
            await self.bridge.championForward(_js_ints(cache.tokens[start:end]), start)
            cache.mark_materialized(end)
            start = end

    async def verify_and_decide(self, cache, policy, p_draft_rows, seed, round_id, stop_token_ids, remaining, greedy):
        self.n_calls += 1
        start = cache.n_materialized
        feed = cache.tokens[start:]
        m = len(cache.provisional_ids)
        lo, hi = _seed_words(seed)
        p_draft = _p_draft_for_js(p_draft_rows, cache.provisional_ids, self.vocab_size) if m and not greedy else None
        raw = await _answer(self.bridge.championRound(
            _js_ints(feed), start, m, p_draft,
            _js_ints(cache.tokens[:cache.n_committed]), _js_ints(cache.provisional_ids), _policy_json(policy),
            lo, hi, round_id, _js_ints(sorted(stop_token_ids)), remaining, bool(greedy)))
        cache.mark_materialized(len(cache.tokens))
        return _decision(json.loads(raw))


class WorkerDraft:
    """The WASM draft, in its own worker or inline in the orchestrator's; mirrors RunnerDraft's
    cache bookkeeping exactly. Inline (`fused_with` = the champion), a round is one bridge call."""

    def __init__(self, bridge, vocab_size: int, max_context: int, identity: str, fused_with=None):
        self.bridge, self.vocab_size, self.max_context, self.identity = bridge, vocab_size, max_context, identity
        self.fused_with = fused_with
        self.n_calls = 0

    async def prefill(self, cache):
        upto = cache.n_committed - 1
        if upto > cache.n_materialized:
            await self.bridge.draftForward(_js_ints(cache.tokens[cache.n_materialized:upto]), cache.n_materialized)
            cache.mark_materialized(upto)

    async def propose(self, cache, k, policy, decider, round_id, stop_token_ids) -> Proposal:
        self.n_calls += 1
        start = cache.n_materialized
        lo, hi = _seed_words(decider.seed)
        res = await self.bridge.draftPropose(_js_ints(cache.tokens[start:]), start, k, _policy_json(policy), lo, hi,
                                             round_id, _js_ints(sorted(stop_token_ids)), _js_ints(cache.tokens))
        tokens = [int(t) for t in json.loads(res.tokens_json)]
        out = Proposal(tokens=tokens, p_draft_rows=res.pDraft)
        cache.mark_materialized(len(cache.tokens))
        if res.error_code:
            out.error = _coded(res.error_code, "draft distribution invalid")
            out.tokens, out.p_draft_rows = [], []
            return out
        cache.append_provisional(tokens)
        if tokens:
            cache.mark_materialized(len(cache.tokens) - 1)
        return out


    async def propose_verify_decide(self, draft_cache, champion_cache, k, draft_policy, policy, seed, round_id,
                                    stop_token_ids, remaining, greedy):
        """One bridge call for a whole round when the draft runs inline, next to the champion
        (`fused_with` is that champion). Does both caches' bookkeeping as propose() and
        BrowserChampion.verify_and_decide() do. -> (proposal, decision | None, draft_failure |
        None, draft_ms, verify_ms), as Orchestrator._fused_round expects."""
        self.n_calls += 1
        champion = self.fused_with
        champion.n_calls += 1
        d_start, c_start = draft_cache.n_materialized, champion_cache.n_materialized
        lo, hi = _seed_words(seed)
        raw = await _answer(self.bridge.speculativeRound(
            _js_ints(draft_cache.tokens[d_start:]), d_start, k, _policy_json(draft_policy),
            _js_ints(champion_cache.tokens[c_start:]), c_start, _js_ints(champion_cache.tokens[:champion_cache.n_committed]),
            _policy_json(policy), lo, hi, round_id, _js_ints(sorted(stop_token_ids)), remaining, bool(greedy)))
        r = json.loads(raw)
        draft_ms, verify_ms = float(r["draft_ms"]), float(r["verify_ms"])
        tokens = [int(t) for t in r["tokens"]]
        proposal = Proposal(tokens=tokens, p_draft_rows=None)
        if r["draft_failure"]:
            f = r["draft_failure"]
            return proposal, None, _coded(f["code"], f["message"], "E_DRAFT_LOST"), draft_ms, 0.0
        draft_cache.mark_materialized(len(draft_cache.tokens))     # the draft consumed its pending ids
        if r["draft_error_code"]:
            proposal.error = _coded(r["draft_error_code"], "draft distribution invalid")
            proposal.tokens = []
            return proposal, None, None, draft_ms, 0.0
        if not tokens:
            return proposal, None, None, draft_ms, 0.0
        draft_cache.append_provisional(tokens)
        draft_cache.mark_materialized(len(draft_cache.tokens) - 1)
        champion_cache.append_provisional(tokens)
        champion_cache.mark_materialized(len(champion_cache.tokens))
        return proposal, _decision(r["decision"]), None, draft_ms, verify_ms


def _decision(r: dict) -> RoundDecision:
    """championRound's JSON object as a RoundDecision (a coded error when the device reported one)."""
    code = r["error_code"]
    error = _coded(code, r.get("error_message") or CODE_DESCRIPTIONS.get(code, "the device reported it")) if code else None
    return RoundDecision(int(r["n_accepted"]), None if r["next_token"] < 0 else int(r["next_token"]),
                         None if r["rejected_at"] < 0 else int(r["rejected_at"]), r["ended_by"] or None, error)


# ------------------------------------------------------------------ worker entry points
class Session:
    """What the orchestrator worker holds after `load`: the orchestrator and the tokenizer."""

    def __init__(self, orchestrator, tokenizer, tokenizer_config: dict, stop_token_ids):
        self.orchestrator, self.tokenizer = orchestrator, tokenizer
        self.tokenizer_config, self.stop_token_ids = tokenizer_config, tuple(stop_token_ids)
        self.cancel = CancelToken()

    def cancel_epoch(self, epoch: int) -> None:
        """The worker's cancel message: the running request (an older epoch) ends at its next round."""
        self.cancel.advance(epoch)

    def attach_draft(self, draft_info_json: str) -> None:
        """A draft that finished loading after the engine was ready (draftInBackground): requests
        from now on may speculate with it; a running one keeps the proposer it started with."""
        orch = self.orchestrator
        orch.draft = _worker_draft(orch.champion, json.loads(draft_info_json))
        orch.draft_error = None

    def set_draft_error(self, message: str) -> None:
        """The late draft failed to load or was refused: speculate="draft" is refused saying why."""
        self.orchestrator.draft = None
        self.orchestrator.draft_error = message


def _worker_draft(champion: BrowserChampion, d: dict) -> WorkerDraft:
    """The draft adapter for the bridge's draft info; inline next to the champion, rounds fuse."""
    return WorkerDraft(champion.bridge, d["vocab_size"], d["max_context"], d["identity"],
                       fused_with=champion if d.get("placement") == "inline" else None)


def make_session(bridge, tokenizer_json: str, tokenizer_config_json: str, generation_config_json: str,
                 champion_info_json: str, draft_info_json: str, draft_error: str = "",
                 chat_template_jinja: str | None = None) -> Session:
    """chat_template_jinja: the champion folder's chat_template.jinja text, or None/"" when it has
    none; it wins over tokenizer_config.json's chat_template (manifest.chat_template_of, as the CLI)."""
    from ..formats.manifest import chat_template_of
    from ..formats.tokenizer import Tokenizer
    tok = Tokenizer.from_json_str(tokenizer_json)
    tok_config = json.loads(tokenizer_config_json)
    if chat_template_jinja:
        tok_config["chat_template"] = chat_template_of(tok_config, chat_template_jinja.encode("utf-8"))
    eos = json.loads(generation_config_json).get("eos_token_id", [])
    champion_info = json.loads(champion_info_json)
    champion = BrowserChampion(bridge, champion_info["vocab_size"], champion_info["max_context"],
                               champion_info["identity"], champion_info["max_block"])
    draft = _worker_draft(champion, json.loads(draft_info_json)) if draft_info_json else None
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)
    identities = {"tokenizer": hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(),
                  "chat_template": hashlib.sha256(tok_config.get("chat_template", "").encode("utf-8")).hexdigest()}
    orch = Orchestrator(champion, draft, decode=decode, identities=identities, draft_error=draft_error or None,
                        stream_decoder=lambda: tok.streaming_decoder(skip_special_tokens=True))
    return Session(orch, tok, tok_config, eos if isinstance(eos, list) else [eos])


def config_from_json(payload: dict, stop_token_ids) -> GenerationConfig:
    """A generate request's {config: {...}} as a GenerationConfig: every option's type checked
    (protocol.checked_config: E_BAD_ARGUMENT); the values' ranges are checked when it starts."""
    return _generation_config(checked_config(payload.get("config", {})), stop_token_ids)


def _generation_config(config: dict, stop_token_ids) -> GenerationConfig:
    allowed = config["allowed_token_ids"]
    policy = SamplingPolicy(temperature=config["temperature"], top_k=config["top_k"], top_p=config["top_p"],
                            repetition_penalty=config["repetition_penalty"],
                            suppress_token_ids=config["suppress_token_ids"],
                            grammar=AllowedSetGrammar(allowed) if allowed is not None else None)
    return GenerationConfig(max_new_tokens=config["max_new_tokens"], policy=policy, speculate=config["speculate"],
                            scheduler=config["scheduler"], k=config["k"], seed=config["seed"],
                            stop_token_ids=tuple(stop_token_ids) + tuple(config["stop_token_ids"]),
                            stop_strings=config["stop_strings"])


def prompt_ids(session: Session, request: dict) -> list:
    """The token ids of a checked request: its prompt_ids; its messages, or its text as one user
    message, in the chat template (message text never parsed for special tokens); with raw_text,
    its text with no special token parsed; else its text as transformers encodes it (special
    tokens written in it are parsed)."""
    if "prompt_ids" in request:
        return request["prompt_ids"]
    if "messages" in request or request["chat"]:
        from ..formats.chat import encode_chat_prompt
        messages = request.get("messages") or [{"role": "user", "content": request["prompt"]}]
        return encode_chat_prompt(session.tokenizer, session.tokenizer_config, messages)
    text = request["prompt"]
    return session.tokenizer.encode(text, add_special_tokens=True, split_special_tokens=request["raw_text"])


async def generate(session: Session, request_json: str, post) -> str:
    """Run one request; `post(json_str)` receives every event envelope. Returns the result JSON:
    the whole result, or {"error": {code, message}} for a request refused before it started.
    Never raises: whatever goes wrong crosses the boundary as a code and a sentence."""
    try:
        request = json.loads(request_json)
        checked = checked_request(request["payload"])
        ids = prompt_ids(session, checked)
        config = _generation_config(checked["config"], session.stop_token_ids)
        result = await session.orchestrator.agenerate(
            ids, config, on_event=lambda env: post(json.dumps(env)), cancel=session.cancel,
            request_id=request["request_id"], epoch=request["epoch"])
    except Exception as exc:   # ExactSpecError (refused before start), or a bug: coded either way
        return json.dumps({"error": coded_error(exc, E_INTERNAL, "generate").to_dict()})
    return json.dumps(result.to_dict())
