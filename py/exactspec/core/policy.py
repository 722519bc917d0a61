"""Sampling policy and the grammar hook: pure Python (also runs in Pyodide); hashed into receipts."""
from __future__ import annotations

import hashlib
import json
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence, runtime_checkable

from .errors import E_BAD_ARGUMENT, ExactSpecError

# The step order below is part of the contract (docs/processors.md); changing it bumps the version.
PROCESSORS_VERSION = "processors-v1"

# What the f32 GPU/WASM maths can run without overflow (logits up to ~1e30 in magnitude stay
# finite after dividing by the temperature or applying the penalty). The browser's champions
# declare these limits and the command line applies them too, so both refuse the same values
# before any output.
F32_MIN_TEMPERATURE = 1e-6
F32_PENALTY_RANGE = (1e-6, 1e6)
F32_LIMITS = {"min_temperature": F32_MIN_TEMPERATURE, "repetition_penalty_range": F32_PENALTY_RANGE}


@runtime_checkable
class Grammar(Protocol):
    identity: str                                   # stable id hashed into receipts

    def allowed_token_ids(self, context_ids: Sequence[int]) -> Iterable[int]: ...


@dataclass(frozen=True)
class AllowedSetGrammar:
    """The simplest grammar: the same fixed set of token ids is allowed after every context."""
    allowed: frozenset[int]

    def __init__(self, allowed: Iterable[int]):
        object.__setattr__(self, "allowed", frozenset(operator.index(i) for i in allowed))

    @property
    def identity(self) -> str:
        digest = hashlib.sha256(",".join(map(str, sorted(self.allowed))).encode()).hexdigest()
        return f"allowed-set:sha256:{digest}"

    def allowed_token_ids(self, context_ids: Sequence[int]) -> Iterable[int]:
        return sorted(self.allowed)


def _bad(field: str, message: str) -> ExactSpecError:
    return ExactSpecError(E_BAD_ARGUMENT, f"{field}: {message}", field=field)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


@dataclass(frozen=True)
class SamplingPolicy:
    temperature: float = 1.0                        # 0 = greedy (one-hot argmax, ties -> lowest id)
    top_k: int = 0                                  # 0 = off
    top_p: float = 1.0                              # 1.0 = off
    repetition_penalty: float = 1.0                 # 1.0 = off; HF convention (logit > 0: divide, else multiply)
    suppress_token_ids: tuple[int, ...] = ()
    grammar: Grammar | None = None                  # allowed-token mask hook

    def __post_init__(self):
        if not isinstance(self.suppress_token_ids, tuple):
            object.__setattr__(self, "suppress_token_ids", tuple(self.suppress_token_ids))

    def canonical(self) -> dict:
        """JSON-able identity of the policy (hash input for receipts)."""
        return {
            "processors_version": PROCESSORS_VERSION,
            "temperature": float(self.temperature),
            "top_k": int(self.top_k),
            "top_p": float(self.top_p),
            "repetition_penalty": float(self.repetition_penalty),
            "suppress_token_ids": sorted({int(i) for i in self.suppress_token_ids}),
            "grammar": None if self.grammar is None else self.grammar.identity,
        }

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    def validate(self, vocab_size: int) -> None:
        """Raise ExactSpecError(E_BAD_ARGUMENT) naming the first bad field."""
        if not _is_int(vocab_size) or vocab_size <= 0:
            raise _bad("vocab_size", f"must be a positive integer, got {vocab_size!r}")
        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or t < 0:
            raise _bad("temperature", f"must be finite and >= 0 (0 = greedy), got {t!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise _bad("top_k", f"must be an integer >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if not _is_real(p) or not (0.0 < p <= 1.0):                 # also rejects NaN
            raise _bad("top_p", f"must be in (0, 1] (1 = off), got {p!r}")
        r = self.repetition_penalty
        if not _is_real(r) or not math.isfinite(r) or r <= 0:
            raise _bad("repetition_penalty", f"must be finite and > 0 (1 = off), got {r!r}")
        for i in self.suppress_token_ids:
            if not _is_int(i) or not 0 <= i < vocab_size:
                raise _bad("suppress_token_ids", f"id {i!r} not in [0, {vocab_size})")
        g = self.grammar
        if g is not None and not (isinstance(g, Grammar) and isinstance(g.identity, str)):
            raise _bad("grammar", "must have a str `identity` and an `allowed_token_ids(context_ids)` method")
