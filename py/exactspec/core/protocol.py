"""The one message envelope {kind, request_id, seq, epoch, payload}, checked against protocol.json,
and the types of a generate request's fields and options (the same table and sentences as
web/protocol.mjs).

An Inbox takes one request's envelopes (the orchestrator's stream, as CPython callers and the tests
read it) and drops (and counts) those from another epoch, a foreign request or a duplicate/out-of-order
seq. Pure Python; the JS side reads the same protocol.json.
"""
from __future__ import annotations

import decimal
import json
import math
import os

from .errors import E_BAD_ARGUMENT, E_PROTOCOL, ExactSpecError

with open(os.path.join(os.path.dirname(__file__), "protocol.json"), encoding="utf-8") as _f:
    SCHEMA = json.load(_f)
KINDS = SCHEMA["kinds"]
CODE_DESCRIPTIONS = SCHEMA["errors"]             # code -> what it means (a message when a device gives none)
_REQUEST_TABLE = {k: v for k, v in SCHEMA["generate_request"].items() if not k.startswith("_")}
PROMPT_FIELDS = {k: v for k, v in _REQUEST_TABLE.items() if "prompt" in v}       # exactly one per request
REQUEST_FIELDS = {k: v for k, v in _REQUEST_TABLE.items() if "prompt" not in v}  # flags, with defaults
MESSAGE_ROLES = tuple(PROMPT_FIELDS["messages"]["roles"])
CONFIG_OPTIONS = {k: v for k, v in SCHEMA["generate_config"].items() if not k.startswith("_")}
_ENVELOPE_FIELDS = frozenset(SCHEMA["envelope"])


def make_envelope(kind: str, request_id: str, seq: int, epoch: int, payload: dict) -> dict:
    env = {"kind": kind, "request_id": request_id, "seq": seq, "epoch": epoch, "payload": payload}
    validate_envelope(env)
    return env


def validate_envelope(env) -> None:
    if not isinstance(env, dict) or env.keys() != _ENVELOPE_FIELDS:
        raise ExactSpecError(E_PROTOCOL, f"envelope fields must be {SCHEMA['envelope']}")
    if not isinstance(env["kind"], str) or env["kind"] not in KINDS:   # a list or dict is unhashable
        raise ExactSpecError(E_PROTOCOL, f"unknown message kind {env['kind']!r}")
    for key in ("seq", "epoch"):
        if not isinstance(env[key], int) or isinstance(env[key], bool) or env[key] < 0:
            raise ExactSpecError(E_PROTOCOL, f"{key} must be a non-negative integer")
    if not isinstance(env["request_id"], str) or not isinstance(env["payload"], dict):
        raise ExactSpecError(E_PROTOCOL, "request_id must be a string and payload an object")
    missing = [f for f in KINDS[env["kind"]] if f not in env["payload"]]
    if missing:
        raise ExactSpecError(E_PROTOCOL, f"{env['kind']} payload lacks {missing}")


class Inbox:
    """One request's receiver: accepts only its request id and current epoch, in seq order.
    Stricter than the browser's receivers (web/orchestrator/engine.mjs, orchestrator/handler.mjs, the draft
    worker), which drop and count by request and epoch alone: it also refuses a repeated or
    out-of-order seq, which the orchestrator's own stream never sends (tests read it with this)."""

    def __init__(self, request_id: str, epoch: int = 0):
        self.request_id = request_id
        self.epoch = epoch
        self.next_seq = 0
        self.accepted: list[dict] = []
        self.dropped_stale = 0

    def advance_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def offer(self, env: dict) -> bool:
        validate_envelope(env)
        if env["request_id"] != self.request_id or env["epoch"] != self.epoch or env["seq"] < self.next_seq:
            self.dropped_stale += 1
            return False
        self.next_seq = env["seq"] + 1
        self.accepted.append(env)
        return True


# ------------------------------------------------------------------ generate requests
TYPE_WORDS = {"boolean": "true or false", "integer": "an integer", "number": "a finite number", "string": "a string",
              "strings": "a list of strings", "token_ids": "a list of integer token ids",
              "object": "an object or null"}


def _shown(v) -> str:
    """A value as the JS side names it (web/protocol.mjs shown()), so both say the same sentence."""
    if v is None or isinstance(v, (bool, str)):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity") if math.isinf(v) else _js_number(v)
    if isinstance(v, int):
        return str(v)
    return "a list" if isinstance(v, list) else "an object" if isinstance(v, dict) else f"a {type(v).__name__}"


def _js_number(x: float) -> str:
    """A finite float as JS's Number.prototype.toString writes it (ECMAScript Number::toString:
    the shortest round-trip digits, exponent form below 1e-6 and from 1e21)."""
    if x == 0:
        return "0"
    sign, digit_tuple, exp = decimal.Decimal(repr(x)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    k, n = len(digits), exp + len(digits)           # x = 0.<digits> * 10^n
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * -n + digits
    else:
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + f"e{'+' if n > 0 else '-'}{abs(n - 1)}"
    return ("-" if sign else "") + out


def _integer(v):
    """v as an int when it is one (JS numbers: 4 may arrive as 4.0), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    return int(v) if isinstance(v, float) and math.isfinite(v) and v.is_integer() else None


def _typed(kind: str, v):
    """(ok, value) for one value of a table type; JS's rules are web/protocol.mjs typed()."""
    if kind == "boolean":
        return isinstance(v, bool), v
    if kind == "integer":
        i = _integer(v)
        return i is not None, i
    if kind == "number":
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return ok, float(v) if ok else v
    if kind == "string":
        return isinstance(v, str), v
    if kind == "strings":
        return isinstance(v, list) and all(isinstance(x, str) for x in v), tuple(v) if isinstance(v, list) else v
    if kind == "token_ids":
        ids = [_integer(x) for x in v] if isinstance(v, list) else None
        return ids is not None and None not in ids, tuple(ids) if ids is not None else v
    if kind == "object":
        return v is None or isinstance(v, dict), v
    raise ValueError(f"protocol.json: unknown option type {kind}")


def checked_option(table: dict, key: str, v, where: str = ""):
    """The value of option `key` in `table` (REQUEST_FIELDS or CONFIG_OPTIONS), refused with
    E_BAD_ARGUMENT when it is not of the table's type (one sentence naming the value)."""
    rule = table[key]
    ok, value = _typed(rule["type"], v)
    if not ok:
        raise ExactSpecError(E_BAD_ARGUMENT, f"{where}{key} must be {TYPE_WORDS[rule['type']]}, got {_shown(v)}",
                             field=key)
    if rule.get("non_empty") and not value:
        raise ExactSpecError(E_BAD_ARGUMENT, f"{where}{key} is empty: no token could be generated "
                             "(leave the option out to allow every token)", field=key)
    return value


def checked_messages(messages) -> list:
    """A conversation [{role, content}, ...] with each message's type checked (web/protocol.mjs
    checkMessages says the same sentences)."""
    if not isinstance(messages, list) or not messages:
        raise ExactSpecError(E_BAD_ARGUMENT, f"messages must be a non-empty list of {{role, content}} objects, "
                             f"got {_shown(messages)}", field="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ExactSpecError(E_BAD_ARGUMENT, f"messages[{i}] must be a {{role, content}} object, got {_shown(m)}",
                                 field="messages")
        if set(m) != {"role", "content"}:
            raise ExactSpecError(E_BAD_ARGUMENT, f"messages[{i}] must hold exactly role and content, "
                                 f"got {', '.join(sorted(m)) or 'no field'}", field="messages")
        if not isinstance(m["role"], str) or m["role"] not in MESSAGE_ROLES:
            raise ExactSpecError(E_BAD_ARGUMENT, f"messages[{i}].role must be one of {', '.join(MESSAGE_ROLES)}, "
                                 f"got {_shown(m['role'])}", field="messages")
        if not isinstance(m["content"], str):
            raise ExactSpecError(E_BAD_ARGUMENT, f"messages[{i}].content must be a string, got {_shown(m['content'])}",
                                 field="messages")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def checked_request(payload) -> dict:
    """A generate payload's prompt, fields and config with their types checked and defaults
    filled: {"prompt" | "prompt_ids" | "messages", "chat", "raw_text", "config": {option: value}}."""
    if not isinstance(payload, dict):
        raise ExactSpecError(E_BAD_ARGUMENT, "a generate request must be an object")
    known = {"config", *PROMPT_FIELDS, *REQUEST_FIELDS}
    unknown = sorted(k for k in payload if k not in known)
    if unknown:
        raise ExactSpecError(E_BAD_ARGUMENT, f"{unknown[0]} is not a field of a generate request "
                             f"(known: {', '.join(sorted(known))})")
    out = {k: checked_option(REQUEST_FIELDS, k, payload[k]) if k in payload else rule["default"]
           for k, rule in REQUEST_FIELDS.items()}
    if sum(k in payload for k in PROMPT_FIELDS) != 1:
        raise ExactSpecError(E_BAD_ARGUMENT, _one_prompt_sentence())
    if "prompt" in payload:
        if not isinstance(payload["prompt"], str):
            raise ExactSpecError(E_BAD_ARGUMENT, f"prompt must be a string, got {_shown(payload['prompt'])}")
        out["prompt"] = payload["prompt"]
    elif "prompt_ids" in payload:
        ids = payload["prompt_ids"]
        ok, ids = _typed("token_ids", ids)
        if not ok or not ids:
            raise ExactSpecError(E_BAD_ARGUMENT, f"prompt_ids must be a non-empty list of integer token ids, "
                                 f"got {_shown(payload['prompt_ids'])}")
        out["prompt_ids"] = list(ids)
    else:
        out["messages"] = checked_messages(payload["messages"])
    if "prompt" not in payload and (out["chat"] or out["raw_text"]):
        prompt_field = "prompt_ids" if "prompt_ids" in payload else "messages"
        raise ExactSpecError(E_BAD_ARGUMENT, f"chat and raw_text apply to a text prompt, not to {prompt_field}")
    out["config"] = checked_config(payload.get("config", {}))
    return out


def _one_prompt_sentence() -> str:
    """"a generate request needs a prompt: text (prompt), token ids (prompt_ids) or ..., exactly one of them"."""
    kinds = [f"{rule['prompt']} ({key})" for key, rule in PROMPT_FIELDS.items()]
    return f"a generate request needs a prompt: {', '.join(kinds[:-1])} or {kinds[-1]}, exactly one of them"


def checked_config(config) -> dict:
    """A generate request's config with every option's type checked and the defaults filled."""
    if not isinstance(config, dict):
        raise ExactSpecError(E_BAD_ARGUMENT, f"config must be an object, got {_shown(config)}")
    unknown = sorted(k for k in config if k not in CONFIG_OPTIONS)
    if unknown:
        raise ExactSpecError(E_BAD_ARGUMENT, f"config.{unknown[0]} is not a known option "
                             f"(known: {', '.join(CONFIG_OPTIONS)})", field=unknown[0])
    return {k: checked_option(CONFIG_OPTIONS, k, config[k], "config.") if k in config else rule["default"]
            for k, rule in CONFIG_OPTIONS.items()}
