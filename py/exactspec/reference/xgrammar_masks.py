"""Token masks of a response_format constraint from xgrammar, in CPython: the twin of
web/grammar/xgrammar_masks.mjs (docs/grammar.md, "Masks").

Both sides use xgrammar 0.1.27 (PyPI `xgrammar` here, npm `@mlc-ai/web-xgrammar` in the browser)
and build everything the same way, so a spec's masks are equal word for word at every position
(tests/test_grammar_masks.py walks both):

  - one TokenizerInfo per tokenizer: the encoded vocabulary (model.vocab and added_tokens of a
    tokenizer.json, in id order, "" for an id neither names, "" up to vocab_size: what
    TokenizerInfo.from_huggingface builds), vocab type byte_level, add_prefix_space false,
    vocab_size = the model's vocabulary rows, the given stop ids;
  - a spec is parsed into a Grammar first (Grammar.from_json_schema / from_structural_tag /
    from_ebnf / builtin_json_grammar) and then compiled with GrammarCompiler.compile_grammar
    (one thread, xgrammar's own cache off: the context caches per spec);
  - a regex is the structural tag {"type": "structural_tag", "format": {"type": "regex",
    "pattern": ...}} (the npm build has no compile_regex).

xgrammar is imported lazily, inside GrammarContext: the core package imports without it.
"""
from __future__ import annotations

import json
import re
import time

import numpy as np

from ..core.errors import E_BAD_ARGUMENT, ExactSpecError

XGRAMMAR_VERSION = "0.1.27"
JSON_SCHEMA_ANY_WHITESPACE = False
JSON_SCHEMA_INDENT = None
JSON_SCHEMA_SEPARATORS = (", ", ": ")
JSON_SCHEMA_STRICT_MODE = True
SPEC_FIELDS = {"json_schema": ("schema",), "regex": ("pattern",), "grammar": ("ebnf", "root"),
               "json_object": ()}
MAX_MESSAGE_CHARS = 200

_XGR_PREFIX = re.compile(r"^(?:\[FATAL\]\s*|\[[0-9:]+\]\s*)?(?:\S+\.(?:cc|h|cpp):\d+:\s*)?"
                         r"(?:Check failed: .*? is false:\s*)?")
_SENTENCE = re.compile(r"^(.*?[.!?])(?=\s|$)", re.S)


def xgrammar_sentence(text: str) -> str:
    """xgrammar's message as one sentence: the log prefix ([time] or [FATAL], source file:line,
    "Check failed: ... is false:") dropped, the first line, cut after its first sentence, at most
    MAX_MESSAGE_CHARS characters. The JS twin (xgrammarSentence) does the same, so both sides
    name a bad constraint in the same words."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = next((ln for ln in lines if "[FATAL]" in ln), lines[0] if lines else "")
    line = line[line.index("[FATAL]"):] if "[FATAL]" in line else line
    line = _XGR_PREFIX.sub("", line, count=1).strip()
    m = _SENTENCE.match(line)
    sentence = m.group(1) if m else line
    if len(sentence) > MAX_MESSAGE_CHARS:
        sentence = sentence[:MAX_MESSAGE_CHARS - 3] + "..."
    return sentence or "xgrammar refused it"


def canonical_spec_json(spec: dict) -> str:
    """The cache key of a spec: its JSON with sorted keys (the same text core/constraints.py's
    ConstraintSpec.canonical_json gives)."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def regex_structural_tag(pattern: str) -> str:
    """The structural tag a regex spec compiles as (JSON text; the JS twin writes the same)."""
    return json.dumps({"type": "structural_tag", "format": {"type": "regex", "pattern": pattern}},
                      separators=(",", ":"), ensure_ascii=False)


def check_spec(spec) -> str:
    """The spec's type, after checking its shape (the fields of its type, strings)."""
    if not isinstance(spec, dict) or spec.get("type") not in SPEC_FIELDS:
        try:
            shown = json.dumps(spec, separators=(",", ":"), ensure_ascii=False)[:80]
        except (TypeError, ValueError):
            shown = repr(spec)[:80]
        raise ExactSpecError(E_BAD_ARGUMENT, f"a constraint spec must be an object with type one of "
                                             f"{', '.join(SPEC_FIELDS)}, got {shown}")
    kind = spec["type"]
    fields = SPEC_FIELDS[kind]
    extra = sorted(set(spec) - {"type", *fields})
    missing = [f for f in fields if f not in spec and not (kind == "grammar" and f == "root")]
    if extra or missing:
        raise ExactSpecError(E_BAD_ARGUMENT, f"a {kind} spec has the fields {', '.join(('type',) + fields)}"
                                             f"{'; unknown: ' + ', '.join(extra) if extra else ''}"
                                             f"{'; missing: ' + ', '.join(missing) if missing else ''}")
    for f in fields:
        if f in spec and not isinstance(spec[f], str):
            raise ExactSpecError(E_BAD_ARGUMENT, f"a {kind} spec's {f} must be a string")
    return kind


def encoded_vocab(tokenizer_json: dict) -> list:
    """The token strings of a tokenizer.json in id order: model.vocab, then added_tokens (an added
    token wins its id), "" for an id neither names; length = the largest id + 1."""
    model = tokenizer_json.get("model") or {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise ExactSpecError(E_BAD_ARGUMENT, "the tokenizer.json has no model.vocab object (a BPE tokenizer is needed)")
    by_id = {}
    for token, i in vocab.items():
        by_id[int(i)] = token
    for added in tokenizer_json.get("added_tokens") or ():
        by_id[int(added["id"])] = added["content"]
    if not by_id or min(by_id) < 0:
        raise ExactSpecError(E_BAD_ARGUMENT, "the tokenizer.json's vocabulary is empty or has a negative id")
    out = [""] * (max(by_id) + 1)
    for i, token in by_id.items():
        out[i] = token
    return out


def count_allowed(mask) -> int:
    """How many ids a mask allows."""
    return int(np.unpackbits(np.ascontiguousarray(mask, dtype=np.uint32).view(np.uint8)).sum())


def allowed_ids(mask) -> list:
    """The ids a mask allows, ascending (bit id & 31 of word id >> 5)."""
    bits = np.unpackbits(np.ascontiguousarray(mask, dtype=np.uint32).view(np.uint8), bitorder="little")
    return [int(i) for i in np.flatnonzero(bits)]


def only_allowed(mask) -> int:
    """The one id a mask allows, or -1 when it allows none or several."""
    if count_allowed(mask) != 1:
        return -1
    return allowed_ids(mask)[0]


class GrammarMatcher:
    """One constraint followed along one token sequence (an xgrammar GrammarMatcher; rollback is
    unlimited in 0.1.27, up to the tokens accepted)."""

    def __init__(self, context: "GrammarContext", compiled, stop_token_ids):
        xgr = context._xgr
        self._context = context
        self._matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids),
                                           terminate_without_stop_token=False)
        self._bitmask = np.zeros((1, context.n_words), dtype=np.int32)   # DLPack, like allocate_token_bitmask
        self.steps = 0            # tokens accepted and not rolled back: the most rollback(n) may undo

    def _live(self):
        if self._matcher is None:
            raise ExactSpecError(E_BAD_ARGUMENT, "the grammar matcher was disposed")
        return self._matcher

    def mask(self) -> np.ndarray:
        """The ids allowed at the current state: uint32 (n_words,), bit (id & 31) of word (id >> 5);
        ids at or beyond the tokenizer's own count are never allowed; none once terminated."""
        matcher = self._live()
        if matcher.is_terminated():
            return np.zeros(self._context.n_words, dtype=np.uint32)
        self._bitmask.fill(0)
        matcher.fill_next_token_bitmask(self._bitmask, 0)
        return self._context._clear_beyond(self._bitmask[0].view(np.uint32).copy())

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) when the constraint does not allow it."""
        matcher = self._live()
        token_id = int(token_id)
        if not 0 <= token_id < self._context.tokenizer_count or matcher.is_terminated():
            return False
        ok = bool(matcher.accept_token(token_id))
        self.steps += ok
        return ok

    def rollback(self, n: int) -> None:
        """Undo the last n accepted tokens (0 <= n <= steps)."""
        matcher = self._live()
        n = int(n)
        if not 0 <= n <= self.steps:
            raise ExactSpecError(E_BAD_ARGUMENT, f"rollback({n}): the matcher holds {self.steps} accepted tokens")
        if n:
            matcher.rollback(n)
            self.steps -= n

    def terminated(self) -> bool:
        """True once a stop token was accepted."""
        return bool(self._live().is_terminated())

    def dispose(self) -> None:
        """Drop the matcher (CPython frees it); the JS twin releases its WASM handle here."""
        self._matcher = None


class GrammarContext:
    """One tokenizer's TokenizerInfo and GrammarCompiler, with the compiled specs cached."""

    def __init__(self, tokenizer_json: dict, vocab_size: int, stop_token_ids):
        import xgrammar as xgr   # lazily: the core package imports without xgrammar

        self._xgr = xgr
        self.encoded_vocab = encoded_vocab(tokenizer_json)
        self.tokenizer_count = len(self.encoded_vocab)
        self.vocab_size = int(vocab_size)
        if self.vocab_size < self.tokenizer_count:
            raise ExactSpecError(E_BAD_ARGUMENT, f"vocab_size {self.vocab_size} is below the tokenizer's "
                                                 f"{self.tokenizer_count} ids")
        self.stop_token_ids = [int(i) for i in stop_token_ids]
        if not self.stop_token_ids or not all(0 <= i < self.tokenizer_count for i in self.stop_token_ids):
            raise ExactSpecError(E_BAD_ARGUMENT, f"stop_token_ids must be ids of the tokenizer, got {self.stop_token_ids}")
        self.n_words = (self.vocab_size + 31) // 32
        # padded with "" to vocab_size, as TokenizerInfo.from_huggingface does (the pads are special ids)
        padded = self.encoded_vocab + [""] * (self.vocab_size - self.tokenizer_count)
        self.tokenizer_info = xgr.TokenizerInfo(padded, xgr.VocabType.BYTE_LEVEL,
                                                vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids,
                                                add_prefix_space=False)
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=1, cache_enabled=False)
        self._cache = {}

    def _clear_beyond(self, mask: np.ndarray) -> np.ndarray:
        n = self.tokenizer_count
        if n < self.vocab_size:
            word, bit = divmod(n, 32)
            if bit:
                mask[word] &= np.uint32((1 << bit) - 1)
                word += 1
            mask[word:] = 0
        return mask

    def _grammar(self, spec: dict):
        xgr = self._xgr
        kind = spec["type"]
        if kind == "json_schema":
            return xgr.Grammar.from_json_schema(spec["schema"], any_whitespace=JSON_SCHEMA_ANY_WHITESPACE,
                                                indent=JSON_SCHEMA_INDENT, separators=JSON_SCHEMA_SEPARATORS,
                                                strict_mode=JSON_SCHEMA_STRICT_MODE)
        if kind == "regex":
            return xgr.Grammar.from_structural_tag(regex_structural_tag(spec["pattern"]))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(spec["ebnf"], root_rule_name=spec.get("root", "root"))
        return xgr.Grammar.builtin_json_grammar()

    def compile(self, spec: dict):
        """(compiled, compile_ms, cached): the spec compiled for this tokenizer, cached per spec
        (its canonical JSON). A spec xgrammar refuses raises E_BAD_ARGUMENT naming the problem."""
        if self._cache is None:
            raise ExactSpecError(E_BAD_ARGUMENT, "the grammar context was disposed")
        kind = check_spec(spec)
        key = canonical_spec_json(spec)
        t0 = time.perf_counter()
        hit = self._cache.get(key)
        if hit is not None:
            return hit, (time.perf_counter() - t0) * 1e3, True
        try:
            grammar = self._grammar(spec)
        except (RuntimeError, ValueError, TypeError) as e:
            raise ExactSpecError(E_BAD_ARGUMENT, f"the {kind} constraint does not compile: "
                                                 f"{xgrammar_sentence(str(e))}") from None
        compiled = self.compiler.compile_grammar(grammar)
        self._cache[key] = compiled
        return compiled, (time.perf_counter() - t0) * 1e3, False

    def matcher(self, compiled, stop_token_ids=None) -> GrammarMatcher:
        """A matcher at the start of `compiled` (stop ids: the context's unless given)."""
        if self._cache is None:
            raise ExactSpecError(E_BAD_ARGUMENT, "the grammar context was disposed")
        stops = self.stop_token_ids if stop_token_ids is None else [int(i) for i in stop_token_ids]
        if not stops or not all(0 <= i < self.tokenizer_count for i in stops):
            raise ExactSpecError(E_BAD_ARGUMENT, f"stop_token_ids must be ids of the tokenizer, got {stops}")
        return GrammarMatcher(self, compiled, stops)

    def dispose(self) -> None:
        """Drop the compiled specs (the JS twin releases its WASM handles here)."""
        self._cache = None
