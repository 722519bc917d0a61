"""Structured-output constraints (response_format): parsed, bounded and hashed in pure Python.

A request's `response_format` is one of
  {"type": "json_schema", "schema": <object, or its JSON text>}
  {"type": "regex", "pattern": <str>}
  {"type": "grammar", "ebnf": <str>}            (xgrammar EBNF, a `root` rule)
  {"type": "json_object"}
It becomes a ConstraintSpec: the canonical `wire` dict that both xgrammar builds compile verbatim
(web/grammar/xgrammar_masks.mjs, reference/xgrammar_masks.py; docs/grammar.md), with the compile
options fixed here, and an identity that joins the sampling policy's hash and the receipt.
Hostile input is refused here, before any compile or output, with E_BAD_ARGUMENT naming the
problem: too large, too deep, a regex with nested quantifiers (catastrophic backtracking in a
backtracking engine, an automaton blow-up in ours), backreferences or lookaround, huge counted
repeats, a grammar without a root rule. A constraint that compiles but allows no token at its
start is refused by the backend at compile time (the same code). This module runs in Pyodide.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Optional

from .errors import E_BAD_ARGUMENT, ExactSpecError

CONSTRAINT_VERSION = "constraint-v1"
XGRAMMAR_VERSION = "0.1.27"                 # the same release on both sides (npm and PyPI)
TYPES = ("json_schema", "regex", "grammar", "json_object")
# json_schema compile options, passed explicitly on both sides (part of the identity)
JSON_SCHEMA_OPTIONS = {"any_whitespace": False, "indent": None, "separators": [", ", ": "], "strict_mode": True}

MAX_SCHEMA_BYTES = 32 * 1024                # canonical JSON text of a schema
MAX_SCHEMA_DEPTH = 24                       # nesting of objects and arrays in the schema document
MAX_REGEX_CHARS = 2048
MAX_REGEX_REPEAT = 256                      # the largest counted repeat {n,m} a pattern may ask for
MAX_EBNF_BYTES = 32 * 1024


def _bad(message: str) -> ExactSpecError:
    return ExactSpecError(E_BAD_ARGUMENT, f"response_format: {message}", field="response_format")


@dataclass(frozen=True)
class ConstraintSpec:
    """A parsed response_format. `wire`: what the xgrammar builds compile (strings verbatim)."""
    type: str
    wire: dict

    @property
    def canonical_json(self) -> str:
        return json.dumps(self.wire, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def sha256(self) -> str:
        body = json.dumps({"version": CONSTRAINT_VERSION, "xgrammar": XGRAMMAR_VERSION,
                           "json_schema_options": JSON_SCHEMA_OPTIONS, "wire": self.wire},
                          sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(body.encode("utf-8")).hexdigest()

    @property
    def identity(self) -> str:
        return f"{CONSTRAINT_VERSION}:{self.type}:sha256:{self.sha256}"

    def receipt(self) -> dict:
        """The receipt's `constraint`: the type and the hash (never the schema text itself)."""
        return {"type": self.type, "sha256": self.sha256, "version": CONSTRAINT_VERSION}


def _depth(value, limit: int, level: int = 1) -> int:
    """Nesting depth of a JSON document, stopping once it passes `limit` (no deep recursion)."""
    if level > limit:
        return level
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return max([level] + [_depth(c, limit, level + 1) for c in children if isinstance(c, (dict, list))])


def _parse_schema(schema) -> str:
    if isinstance(schema, str):
        if len(schema.encode("utf-8")) > MAX_SCHEMA_BYTES * 4:
            raise _bad(f"the schema text is over {MAX_SCHEMA_BYTES * 4} bytes")
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as exc:
            raise _bad(f"the schema is not valid JSON ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(schema, dict):
        raise _bad(f"json_schema needs `schema`, a JSON object, got {type(schema).__name__}")
    depth = _depth(schema, MAX_SCHEMA_DEPTH)
    if depth > MAX_SCHEMA_DEPTH:
        raise _bad(f"the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels")
    try:
        # the schema's own key order (xgrammar writes properties in it), compact
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError) as exc:
        raise _bad(f"the schema cannot be written as JSON ({exc})") from None
    if len(text.encode("utf-8")) > MAX_SCHEMA_BYTES:
        raise _bad(f"the schema is {len(text.encode('utf-8'))} bytes, over the limit of {MAX_SCHEMA_BYTES}")
    return text


def _regex_tree(pattern: str):
    try:
        import re._parser as sre_parse          # Python >= 3.11
    except ImportError:                          # pragma: no cover (older Pythons)
        import sre_parse
    try:
        return sre_parse, sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise _bad(f"the regex does not parse ({exc})") from None


def check_regex(pattern: str) -> None:
    """Refuse what a regex constraint may not ask for (E_BAD_ARGUMENT naming it)."""
    if not isinstance(pattern, str) or not pattern:
        raise _bad("regex needs `pattern`, a non-empty string")
    if len(pattern) > MAX_REGEX_CHARS:
        raise _bad(f"the regex is {len(pattern)} characters, over the limit of {MAX_REGEX_CHARS}")
    sre, tree = _regex_tree(pattern)
    repeats = (sre.MAX_REPEAT, sre.MIN_REPEAT) + ((sre.POSSESSIVE_REPEAT,) if hasattr(sre, "POSSESSIVE_REPEAT") else ())
    maxrepeat = sre.MAXREPEAT

    def walk(items, inside_repeat: bool):   # inside_repeat: inside an unbounded repeat (*, +, {n,})
        for op, arg in items:
            if op in repeats:
                lo, hi, body = arg
                if hi != maxrepeat and hi > MAX_REGEX_REPEAT or lo > MAX_REGEX_REPEAT:
                    raise _bad(f"the regex repeats something {max(lo, hi if hi != maxrepeat else lo)} times "
                               f"(limit {MAX_REGEX_REPEAT})")
                many, unbounded = hi == maxrepeat or hi > 1, hi == maxrepeat
                if many and inside_repeat:
                    raise _bad("the regex nests one quantifier inside an unbounded one (as in (a+)+): catastrophic "
                               "backtracking; write it without the nested repeat")
                walk(body, inside_repeat or unbounded)
            elif op in (sre.GROUPREF, sre.GROUPREF_EXISTS):
                raise _bad("the regex uses a backreference, which a token mask cannot follow")
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                raise _bad("the regex uses a lookahead or lookbehind, which is not supported")
            elif op == sre.SUBPATTERN:
                walk(arg[-1], inside_repeat)
            elif op == sre.BRANCH:
                for branch in arg[1]:
                    walk(branch, inside_repeat)
            elif hasattr(sre, "ATOMIC_GROUP") and op == sre.ATOMIC_GROUP:
                walk(arg, inside_repeat)
    walk(tree, False)


_ROOT_RULE = re.compile(r"(?m)^\s*root\s*::=")


def parse_response_format(value) -> Optional[ConstraintSpec]:
    """A request's response_format (None: no constraint) -> ConstraintSpec, or E_BAD_ARGUMENT."""
    if value is None:
        return None
    if isinstance(value, ConstraintSpec):
        return value
    if not isinstance(value, dict):
        raise _bad(f"must be an object with a `type`, got {type(value).__name__}")
    kind = value.get("type")
    if kind not in TYPES:
        raise _bad(f"`type` must be one of {', '.join(TYPES)}, got {kind!r}")
    fields = {"json_schema": {"schema"}, "regex": {"pattern"}, "grammar": {"ebnf"}, "json_object": set()}[kind]
    unknown = sorted(set(value) - fields - {"type"})
    if unknown:
        raise _bad(f"unknown field {unknown[0]!r} for type {kind}")
    missing = sorted(fields - set(value))
    if missing:
        raise _bad(f"type {kind} needs `{missing[0]}`")
    if kind == "json_schema":
        return ConstraintSpec(kind, {"type": kind, "schema": _parse_schema(value["schema"])})
    if kind == "regex":
        check_regex(value["pattern"])
        return ConstraintSpec(kind, {"type": kind, "pattern": value["pattern"]})
    if kind == "grammar":
        ebnf = value["ebnf"]
        if not isinstance(ebnf, str) or not ebnf.strip():
            raise _bad("grammar needs `ebnf`, a non-empty string")
        if len(ebnf.encode("utf-8")) > MAX_EBNF_BYTES:
            raise _bad(f"the grammar is {len(ebnf.encode('utf-8'))} bytes, over the limit of {MAX_EBNF_BYTES}")
        if not _ROOT_RULE.search(ebnf):
            raise _bad("the grammar has no `root ::= ...` rule to start from")
        return ConstraintSpec(kind, {"type": kind, "ebnf": ebnf, "root": "root"})
    return ConstraintSpec(kind, {"type": kind})


@dataclass(frozen=True)
class ConstraintGrammar:
    """The policy's grammar hook for a response_format: its identity joins the policy hash. The
    masks come from the backend's matcher (a request binds one: reference/xgrammar_masks.py in
    CPython, web/grammar/ in the browser); this object alone cannot compute them."""
    spec: ConstraintSpec

    @property
    def identity(self) -> str:
        return self.spec.identity

    def allowed_token_ids(self, context_ids):
        raise ExactSpecError(E_BAD_ARGUMENT, "a response_format constraint needs a backend that binds its "
                                             "matcher to the request (none is bound here)")


def special_ids_excluded(tokenizer_json: dict, stop_token_ids) -> list:
    """The ids a constrained answer may never produce besides what the grammar forbids: the
    tokenizer's special added tokens (`<|im_start|>`, `<|endoftext|>`, ...) other than the stop ids.
    xgrammar reads their text as plain characters, so a JSON string could hold one, and a decode
    that skips special tokens would drop it from the text the grammar accepted. Sorted."""
    stops = {int(t) for t in stop_token_ids}
    return sorted({int(a["id"]) for a in tokenizer_json.get("added_tokens") or ()
                   if a.get("special") and int(a["id"]) not in stops})


def constraint_of(policy) -> Optional[ConstraintSpec]:
    """The ConstraintSpec a SamplingPolicy carries (None: no response_format)."""
    grammar = getattr(policy, "grammar", None)
    spec = getattr(grammar, "spec", None)
    return spec if isinstance(spec, ConstraintSpec) else None
