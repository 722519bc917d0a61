"""A response_format bound to one request in CPython: xgrammar's matcher followed along any context.

ReferenceConstraints compiles ConstraintSpecs for one tokenizer (cached per spec: xgrammar_masks.py)
and checks that a constraint allows some token at its start. A request's BoundConstraint is the
policy's grammar hook for that request: `allowed_mask(context_ids)` -> (V,) bool, for the prompt's
context plus any generated continuation, the champion's rows and the draft's steps alike. The
matcher follows the asked context by rolling back to the common prefix and accepting the rest, so
a round's sequential rows cost one accept each (docs/grammar.md).
"""
from __future__ import annotations

import numpy as np

from ..core.constraints import ConstraintGrammar, ConstraintSpec, special_ids_excluded
from ..core.errors import E_BAD_ARGUMENT, E_GRAMMAR_DEAD_END, ExactSpecError

MAX_ROLLBACK = 64            # beyond it the matcher is rebuilt and replays the answer


class CompiledConstraint:
    """One compiled spec for one tokenizer: new matchers, and what the compile cost."""

    def __init__(self, context, spec: ConstraintSpec, compiled, compile_ms: float, cached: bool, stop_token_ids,
                 vocab_size: int, excluded=()):
        self.context, self.spec, self.compiled, self.vocab_size = context, spec, compiled, vocab_size
        self.excluded = tuple(excluded)     # special ids never allowed (constraints.special_ids_excluded)
        self.compile_ms, self.cached = compile_ms, cached
        self.stop_token_ids = tuple(stop_token_ids)

    def matcher(self):
        return self.context.matcher(self.compiled, list(self.stop_token_ids))

    def bind(self, n_prompt: int) -> "BoundConstraint":
        """The grammar hook of one request whose prompt is `n_prompt` ids long."""
        return BoundConstraint(self, n_prompt)

    def info(self) -> dict:
        return {"type": self.spec.type, "sha256": self.spec.sha256, "compile_ms": round(self.compile_ms, 3),
                "cached": bool(self.cached)}


class ReferenceConstraints:
    """Compiles response_formats for one tokenizer (tokenizer.json as a dict) and model vocabulary."""

    def __init__(self, tokenizer_json: dict, vocab_size: int):
        self.tokenizer_json, self.vocab_size = tokenizer_json, vocab_size
        self._contexts = {}           # stop ids -> xgrammar_masks.GrammarContext

    def compile(self, spec: ConstraintSpec, stop_token_ids) -> CompiledConstraint:
        """-> CompiledConstraint; E_BAD_ARGUMENT for a spec xgrammar refuses, or one that allows
        no token at its start."""
        from .xgrammar_masks import GrammarContext, count_allowed
        stops = tuple(sorted(set(int(t) for t in stop_token_ids)))
        context = self._contexts.get(stops)
        if context is None:
            context = self._contexts[stops] = GrammarContext(self.tokenizer_json, self.vocab_size, list(stops))
        try:
            compiled, ms, cached = context.compile(spec.wire)
        except ExactSpecError as err:      # xgrammar's sentence, named as the request's field
            raise ExactSpecError(err.code, f"response_format: {err.message}", field="response_format") from None
        out = CompiledConstraint(context, spec, compiled, ms, cached, stops, self.vocab_size,
                                 special_ids_excluded(self.tokenizer_json, stops))
        if count_allowed(out.matcher().mask()) == 0:
            raise ExactSpecError(E_BAD_ARGUMENT, "response_format: the constraint allows no token at its start "
                                 "(no text this tokenizer can write satisfies it)", field="response_format")
        return out


class BoundConstraint(ConstraintGrammar):
    """The grammar hook of one request: masks after any context that starts with its prompt."""

    def __init__(self, compiled: CompiledConstraint, n_prompt: int):
        object.__setattr__(self, "spec", compiled.spec)
        object.__setattr__(self, "_compiled", compiled)
        object.__setattr__(self, "_n_prompt", int(n_prompt))
        object.__setattr__(self, "_matcher", compiled.matcher())
        object.__setattr__(self, "_history", [])

    def _follow(self, answer) -> None:
        """Bring the matcher to the state after `answer` (the generated ids)."""
        history = self._history
        n = 0
        for a, b in zip(history, answer):
            if a != b:
                break
            n += 1
        if len(history) - n > MAX_ROLLBACK:
            object.__setattr__(self, "_matcher", self._compiled.matcher())
            history.clear()
            n = 0
        elif len(history) > n:
            self._matcher.rollback(len(history) - n)
            del history[n:]
        for t in answer[n:]:
            if not self._matcher.accept(int(t)):
                raise ExactSpecError(E_GRAMMAR_DEAD_END, f"token {int(t)} is outside the response_format "
                                     f"at answer position {len(history)}")
            history.append(int(t))

    def mask_after(self, context_ids) -> np.ndarray:
        """(n_words,) uint32: the ids allowed after `context_ids` (the prompt, then the answer)."""
        answer = list(context_ids[self._n_prompt:])
        self._follow(answer)
        words = self._matcher.mask()
        for t in self._compiled.excluded:         # special tokens: never inside a constrained answer
            words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        return words

    def allowed_mask(self, context_ids, vocab_size: int) -> np.ndarray:
        """(V,) bool for processors.process_logits' step 3."""
        words = self.mask_after(context_ids).astype(np.uint32)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size]
        return bits.astype(bool)

    def allowed_token_ids(self, context_ids):
        return np.flatnonzero(self.allowed_mask(context_ids, self._compiled.vocab_size)).tolist()

    def accepts(self, context_ids, token: int) -> bool:
        """Whether `token` is allowed after `context_ids`."""
        words = self.mask_after(context_ids)
        return bool((int(words[token >> 5]) >> (token & 31)) & 1)

    def valid_after(self, context_ids, suppress_token_ids) -> np.ndarray:
        """(V,) bool: the ids a decoder may produce after `context_ids` (allowed, not suppressed)."""
        valid = self.allowed_mask(context_ids, self._compiled.vocab_size)
        if suppress_token_ids:
            valid[list(suppress_token_ids)] = False
        return valid



    def forced_after(self, context_ids, suppress_token_ids, stop_token_ids, limit: int) -> list:
        """The run of forced ids after `context_ids`: while exactly one id is valid (and it is not
        a stop id, which the round decides as usual), at most `limit` of them. No valid id at all
        is E_GRAMMAR_DEAD_END (the request ends with it, never with text outside the constraint)."""
        context, forced = list(context_ids), []
        while True:
            valid = self.valid_after(context + forced, suppress_token_ids)
            ids = np.flatnonzero(valid)
            if ids.size == 0:
                raise ExactSpecError(E_GRAMMAR_DEAD_END, f"the response_format allows no token after "
                                     f"{len(context) + len(forced) - self._n_prompt} answer tokens")
            if ids.size > 1 or len(forced) >= limit or int(ids[0]) in stop_token_ids:
                return forced
            forced.append(int(ids[0]))

    def valid_prefix(self, context_ids, proposals, suppress_token_ids) -> list:
        """The longest prefix of `proposals` valid in turn after `context_ids` (a proposal the
        constraint forbids is never offered)."""
        context, out = list(context_ids), []
        for y in proposals:
            if not self.valid_after(context + out, suppress_token_ids)[y]:
                break
            out.append(int(y))
        return out
