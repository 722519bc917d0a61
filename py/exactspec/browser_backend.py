"""Pyodide adapter: champion and draft backends over the JS bridge, and the worker's entry points.

This is the only module that touches Pyodide's FFI; the core stays pure. Bulk data never
crosses into Python: logits stay on the GPU and the draft's p_draft rows stay a JS Float32Array
that Python only hands back to the GPU acceptor. Each round step is one await.
"""
from __future__ import annotations

import hashlib
import json

from .acceptance import RoundDecision
from .backends import Proposal
from .errors import ALL_CODES, E_BAD_ARGUMENT, ExactSpecError
from .orchestrator import CancelToken, GenerationConfig, Orchestrator
from .policy import AllowedSetGrammar, SamplingPolicy


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
            raise ExactSpecError("E_CACHE_STATE", "host-side p_draft rows must be one-hot (prompt lookup)")
        flat[i * vocab_size + y] = 1.0
    return flat


def _coded(code: str, message: str) -> ExactSpecError:
    return ExactSpecError(code if code in ALL_CODES else "E_DEVICE_LOST", message)


class BrowserChampion:
    """Champion on WebGPU: forward + processors + acceptance in one bridge call per round."""

    def __init__(self, bridge, vocab_size: int, max_context: int, identity: str, max_block: int):
        self.bridge, self.vocab_size, self.max_context = bridge, vocab_size, max_context
        self.identity, self.max_block = identity, max_block
        self.n_calls = 0

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
        raw = await self.bridge.championRound(
            _js_ints(feed), start, m, p_draft,
            _js_ints(cache.tokens[:cache.n_committed]), _js_ints(cache.provisional_ids), _policy_json(policy),
            lo, hi, round_id, _js_ints(sorted(stop_token_ids)), remaining, bool(greedy))
        cache.mark_materialized(len(cache.tokens))
        r = json.loads(raw)
        error = _coded(r["error_code"], r.get("error_message", r["error_code"])) if r["error_code"] else None
        return RoundDecision(int(r["n_accepted"]), None if r["next_token"] < 0 else int(r["next_token"]),
                             None if r["rejected_at"] < 0 else int(r["rejected_at"]), r["ended_by"] or None, error)


class WorkerDraft:
    """Draft in its WASM worker; mirrors RunnerDraft's cache bookkeeping exactly."""

    def __init__(self, bridge, vocab_size: int, max_context: int, identity: str):
        self.bridge, self.vocab_size, self.max_context, self.identity = bridge, vocab_size, max_context, identity
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


# ------------------------------------------------------------------ worker entry points
class Session:
    """What the orchestrator worker holds after `load`: the orchestrator and the tokenizer."""

    def __init__(self, orchestrator, tokenizer, tokenizer_config: dict, stop_token_ids):
        self.orchestrator, self.tokenizer = orchestrator, tokenizer
        self.tokenizer_config, self.stop_token_ids = tokenizer_config, tuple(stop_token_ids)
        self.cancel = CancelToken()


def make_session(bridge, tokenizer_json: str, tokenizer_config_json: str, generation_config_json: str,
                 champion_info_json: str, draft_info_json: str) -> Session:
    from .tokenizer import Tokenizer
    tok = Tokenizer.from_json_str(tokenizer_json)
    tok_config = json.loads(tokenizer_config_json)
    eos = json.loads(generation_config_json).get("eos_token_id", [])
    champion_info = json.loads(champion_info_json)
    champion = BrowserChampion(bridge, champion_info["vocab_size"], champion_info["max_context"],
                               champion_info["identity"], champion_info["max_block"])
    draft = None
    if draft_info_json:
        d = json.loads(draft_info_json)
        draft = WorkerDraft(bridge, d["vocab_size"], d["max_context"], d["identity"])
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)
    identities = {"tokenizer": hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(),
                  "chat_template": hashlib.sha256(tok_config.get("chat_template", "").encode("utf-8")).hexdigest()}
    orch = Orchestrator(champion, draft, decode=decode, identities=identities)
    return Session(orch, tok, tok_config, eos if isinstance(eos, list) else [eos])


def config_from_json(payload: dict, stop_token_ids) -> GenerationConfig:
    c = payload.get("config", {})
    try:
        policy = SamplingPolicy(temperature=float(c.get("temperature", 1.0)), top_k=int(c.get("top_k", 0)),
                                top_p=float(c.get("top_p", 1.0)),
                                repetition_penalty=float(c.get("repetition_penalty", 1.0)),
                                suppress_token_ids=tuple(c.get("suppress_token_ids", ())),
                                grammar=AllowedSetGrammar(c["allowed_token_ids"]) if c.get("allowed_token_ids") else None)
        return GenerationConfig(max_new_tokens=int(c.get("max_new_tokens", 64)), policy=policy,
                                speculate=str(c.get("speculate", "draft")), k=int(c.get("k", 4)),
                                seed=int(c.get("seed", 0)),
                                stop_token_ids=tuple(stop_token_ids) + tuple(int(t) for t in c.get("stop_token_ids", ())),
                                stop_strings=tuple(c.get("stop_strings", ())))
    except (TypeError, ValueError) as exc:
        raise ExactSpecError(E_BAD_ARGUMENT, f"bad generation config: {exc}") from None


def prompt_ids(session: Session, payload: dict) -> list:
    if "prompt_ids" in payload:
        return [int(t) for t in payload["prompt_ids"]]
    text = payload["prompt"]
    if payload.get("chat"):
        from .chat import check_template, render_chat
        check_template(session.tokenizer_config.get("chat_template", ""))
        rendered = render_chat([{"role": "user", "content": text}], session.tokenizer_config.get("bos_token", ""))
        return session.tokenizer.encode(rendered, add_special_tokens=False)
    return session.tokenizer.encode(text, add_special_tokens=True)


async def generate(session: Session, request_json: str, post) -> str:
    """Run one request; `post(json_str)` receives every event envelope. Returns the result JSON."""
    request = json.loads(request_json)
    payload = request["payload"]
    try:
        ids = prompt_ids(session, payload)
        config = config_from_json(payload, session.stop_token_ids)
        result = await session.orchestrator.agenerate(
            ids, config, on_event=lambda env: post(json.dumps(env)), cancel=session.cancel,
            request_id=request["request_id"])
    except ExactSpecError as err:
        return json.dumps({"error": err.to_dict()})
    return json.dumps(result.to_dict())
