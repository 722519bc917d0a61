"""Pyodide adapter: the champion backend over the JS bridge, and the worker's entry points.

This is the only module that touches Pyodide's FFI; the core stays pure. A request is one
bridge.begin() (its constant state, once), then one bridge.round() per round, which returns the
round record (protocol.json) that round_record.decode reads: bulk data (logits, p_draft rows)
never crosses into Python, and per-round traffic is O(k) (docs/round.md).
"""
from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import dataclass

from ..core.constraints import ConstraintGrammar, constraint_of, parse_response_format
from ..core.deciders import RngDecider
from ..core.errors import E_BAD_ARGUMENT, E_INTERNAL, ExactSpecError, coded_error
from ..core.orchestrator import CancelToken, GenerationConfig, Orchestrator
from ..core.policy import F32_MIN_TEMPERATURE, F32_PENALTY_RANGE, AllowedSetGrammar, SamplingPolicy
from ..core.protocol import checked_config, checked_request
from ..core.round_record import RoundOutcome, decode, decode_many


MAX_CHAIN = 32          # the most baseline steps one bridge.chain() runs (web/champion_wasm/cpu_session.mjs MAX_CHAIN)


def _policy_dict(policy: SamplingPolicy) -> dict:
    allowed = None
    if policy.grammar is not None and constraint_of(policy) is None:   # a response_format: the session's masks
        allowed = sorted(policy.grammar.allowed_token_ids([]))
    return {"temperature": policy.temperature, "top_k": policy.top_k, "top_p": policy.top_p,
            "repetition_penalty": policy.repetition_penalty,
            "suppress_token_ids": list(policy.suppress_token_ids), "allowed_token_ids": allowed}


def _coded(code: str, message: str, default: str = "E_DEVICE_LOST") -> ExactSpecError:
    return coded_error(RuntimeError(f"{code}: {message}"), default)


class BrowserChampion:
    """The champion behind the JS bridge (WebGPU or WASM; the draft too, in its worker or inline):
    begin() crosses once per request, then each round is one bridge.round() call."""

    def __init__(self, bridge, vocab_size: int, max_context: int, identity: str, max_block: int):
        self.bridge, self.vocab_size, self.max_context = bridge, vocab_size, max_context
        self.identity, self.max_block = identity, max_block
        self.limits = {"max_k": max_block - 1, "max_chain": MAX_CHAIN, "min_temperature": F32_MIN_TEMPERATURE,
                       "repetition_penalty_range": F32_PENALTY_RANGE}

    async def begin(self, request, draft=None) -> "BrowserSession":
        """Prefill both models on the JS side; the request's constant state crosses here, once."""
        if not isinstance(request.decider, RngDecider):
            raise ExactSpecError(E_BAD_ARGUMENT, "the browser backend decides from the seed: no custom decider")
        seed = request.seed
        state = {"policy": _policy_dict(request.policy), "draft_policy": _policy_dict(request.draft_policy),
                 "stop_token_ids": list(request.stop_token_ids), "seed": [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF],
                 "context_ids": list(request.context_ids), "greedy": request.greedy,
                 "mode": request.mode, "prefix_reuse": request.prefix_reuse, "max_new_tokens": request.max_new_tokens,
                 "constraint": {"key": request.constraint["key"]} if request.constraint is not None else None,
                 "forced_batching": request.forced_batching}
        began = json.loads(await self.bridge.begin(json.dumps(state)))
        failure = began["draft_failure"]
        return BrowserSession(self.bridge, _coded(failure["code"], failure["message"], "E_DRAFT_LOST") if failure else None,
                              began.get("reused"))

    def calibration(self, draft=None):
        """speculate="auto"'s calibration (docs/core.md; measured at load on the JS side, cached per
        device): the bridge's JSON, read at each auto request (a refresh after drift shows up at
        the next one); None when the bridge has none or gives "" (calibrate "off", or an older
        bridge): auto then keeps speculation off until it has timed rounds itself."""
        read = getattr(self.bridge, "calibration", None)
        if read is None:
            return None
        text = read()
        if not isinstance(text, str) or not text:
            return None
        try:
            cal = json.loads(text)
        except ValueError:
            return None
        return cal if isinstance(cal, dict) and cal.get("version") == 1 else None

    def take_counters(self) -> dict:
        """Stale-epoch drops per receiver (orchestrator worker, draft client, draft worker) since
        the previous call."""
        return json.loads(self.bridge.takeCounters())

    def environment(self) -> dict:
        """hardware_class, browser_version, runtime_version and peak_resident_bytes (by category),
        from the engine's own accounting on the JS side."""
        return json.loads(self.bridge.environment())


class BrowserConstraints:
    """Compiles a request's response_format on the JS side (the bridge's xgrammar context for this
    engine's tokenizer, web/grammar/): xgrammar has no Pyodide build, so the matcher lives beside
    the models, and each round's session computes the masks (forced ids, draft steps, champion
    rows). Python still decides nothing less: it commits what each round record says."""

    def __init__(self, bridge):
        self.bridge = bridge

    async def compile(self, spec, stop_token_ids) -> dict:
        """-> {type, sha256, compile_ms, cached, key} (key: the bridge's handle of the compiled grammar)."""
        try:
            info = json.loads(await self.bridge.compileConstraint(spec.canonical_json,
                                                                  json.dumps(sorted(set(stop_token_ids)))))
        except Exception as exc:   # a JS error with its code (E_BAD_ARGUMENT for a refused constraint)
            raise coded_error(exc, E_BAD_ARGUMENT, "response_format") from None
        return {"type": spec.type, "sha256": spec.sha256, "compile_ms": info["compile_ms"], "cached": info["cached"],
                "key": info["key"]}


class BrowserSession:
    """One request's rounds over the bridge: round() is ONE bridge call that returns the round
    record (an Int32Array, or a JS promise of one when something under it is asynchronous)."""

    def __init__(self, bridge, draft_failure, reused=None):
        self.bridge, self.draft_failure = bridge, draft_failure
        self.reused = reused or {"champion": 0, "draft": None}   # prefix reuse at begin (session.mjs)
        self.round_bytes = 0

    def pause(self):
        """None, or an awaitable that lets the worker's event loop run (a queued cancel is seen):
        rounds that run synchronously would otherwise never yield to it."""
        pending = self.bridge.pause()           # a JS promise, or JS null (not Python's None)
        return pending if hasattr(pending, "__await__") else None

    def round(self, k: int, round_id: int, remaining: int, committed: int, proposals=None):
        args = (k, round_id, remaining, committed, None if proposals is None else list(proposals))
        self.round_bytes = sum(_crossing_bytes(a) for a in args)   # what this call hands to JS
        if proposals is not None:
            from pyodide.ffi import to_js  # Pyodide only
            args = args[:-1] + (to_js(args[-1]),)
        return self._read(self.bridge.round(*args), decode)

    def chain(self, h: int, round_id: int, remaining: int, committed: int):
        """Up to h baseline steps as one bridge call (session.mjs chain) -> [RoundOutcome, ...]
        (one, where the JS side cannot chain: a WebGPU champion, a fault armed), or an awaitable of it."""
        self.round_bytes = 16                     # four numbers cross
        return self._read(self.bridge.chain(h, round_id, remaining, committed), decode_many)

    def _read(self, answer, reader):
        """reader(the record words) of a JS answer: at once, or an awaitable of it for a JS promise."""
        if hasattr(answer, "__await__"):
            return self._read_later(answer, reader)
        return reader(self._words(answer))

    async def _read_later(self, answer, reader):
        return reader(self._words(await answer))

    def _words(self, records) -> array:
        raw = bytes(records.to_bytes())
        self.round_bytes += len(raw)
        words = array("i")
        words.frombytes(raw)
        return words

    def last_failure(self) -> ExactSpecError:
        f = json.loads(self.bridge.lastFailure())
        return _coded(f["code"], f["message"], "E_DRAFT_LOST")

    def end(self, reason) -> dict:
        """-> how the rounds ran: {one_call_rounds, separate_call_rounds, chain_calls} (session.mjs)."""
        return json.loads(self.bridge.end())


def _crossing_bytes(value) -> int:
    """Bytes a value passed to the bridge carries: 4 a number (int32 on the JS side), 4 an id of a
    list, UTF-8 bytes of a string, 0 for None."""
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(_crossing_bytes(v) for v in value)
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    return 4


@dataclass(frozen=True)
class BrowserDraft:
    """What Python knows of the draft the JS side runs (in its worker or inline): the orchestrator
    checks its context and names it in receipts; the proposals happen behind bridge.round()."""
    vocab_size: int
    max_context: int
    identity: str


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
        orch.draft = _worker_draft(json.loads(draft_info_json))
        orch.draft_error = None

    def set_draft_error(self, message: str) -> None:
        """The late draft failed to load or was refused: speculate="draft" is refused saying why."""
        self.orchestrator.draft = None
        self.orchestrator.draft_error = message


def _worker_draft(d: dict) -> BrowserDraft:
    """The draft the bridge loaded (its info), in its worker or inline: rounds go through the bridge."""
    return BrowserDraft(d["vocab_size"], d["max_context"], d["identity"])


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
    draft = _worker_draft(json.loads(draft_info_json)) if draft_info_json else None
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)
    identities = {"tokenizer": hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(),
                  "chat_template": hashlib.sha256(tok_config.get("chat_template", "").encode("utf-8")).hexdigest()}
    orch = Orchestrator(champion, draft, decode=decode, identities=identities, draft_error=draft_error or None,
                        stream_decoder=lambda: tok.streaming_decoder(skip_special_tokens=True), n_token_ids=tok.vocab_size,
                        constraints=BrowserConstraints(bridge))
    return Session(orch, tok, tok_config, eos if isinstance(eos, list) else [eos])


def config_from_json(payload: dict, stop_token_ids) -> GenerationConfig:
    """A generate request's {config: {...}} as a GenerationConfig: every option's type checked
    (protocol.checked_config: E_BAD_ARGUMENT); the values' ranges are checked when it starts."""
    return _generation_config(checked_config(payload.get("config", {})), stop_token_ids)


def _generation_config(config: dict, stop_token_ids) -> GenerationConfig:
    allowed = config["allowed_token_ids"]
    spec = parse_response_format(config.get("response_format"))
    if spec is not None and allowed is not None:
        raise ExactSpecError(E_BAD_ARGUMENT, "allowed_token_ids and response_format cannot be combined: give one "
                             "constraint", field="response_format")
    grammar = ConstraintGrammar(spec) if spec is not None else AllowedSetGrammar(allowed) if allowed is not None else None
    policy = SamplingPolicy(temperature=config["temperature"], top_k=config["top_k"], top_p=config["top_p"],
                            repetition_penalty=config["repetition_penalty"],
                            suppress_token_ids=config["suppress_token_ids"], grammar=grammar)
    return GenerationConfig(max_new_tokens=config["max_new_tokens"], policy=policy, speculate=config["speculate"],
                            scheduler=config["scheduler"], k=config["k"], seed=config["seed"],
                            stop_token_ids=tuple(stop_token_ids) + tuple(config["stop_token_ids"]),
                            stop_strings=config["stop_strings"], prefix_reuse=config["prefix_reuse"],
                            forced_batching=config["forced_batching"], chain_steps=config["chain_steps"])


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
