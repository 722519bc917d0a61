"""Declared logits processors (NumPy reference): logits + context + SamplingPolicy -> probabilities."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.errors import E_PROCESSOR_INVALID, ExactSpecError
from ..core.policy import (PROCESSORS_VERSION, AllowedSetGrammar, Grammar, SamplingPolicy,  # noqa: F401 (re-exported)
                     _bad, _is_int)


def _ids_array(field: str, ids, vocab_size: int) -> np.ndarray:
    out = []
    for i in ids:
        if not _is_int(i) or not 0 <= i < vocab_size:
            raise _bad(field, f"id {i!r} not in [0, {vocab_size})")
        out.append(int(i))
    return np.unique(np.array(out, dtype=np.int64))                  # (n_distinct,) sorted


def _require_valid(x: np.ndarray, step: str) -> None:
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ExactSpecError(E_PROCESSOR_INVALID, f"NaN or +inf logit after {step}", step=step)
    if not np.isfinite(x).any():
        raise ExactSpecError(E_PROCESSOR_INVALID, f"no valid token after {step}", step=step)


def process_logits(logits, context_ids: Sequence[int], policy: SamplingPolicy) -> np.ndarray:
    """(V,) logits -> (V,) float64 probabilities summing to 1, by the declared steps 1-8."""
    x = np.array(logits, dtype=np.float64)                           # (V,) step 1: float64 copy
    if x.ndim != 1 or x.size == 0:
        raise _bad("logits", f"must be a non-empty 1-D array, got shape {x.shape}")
    vocab_size = x.shape[0]
    policy.validate(vocab_size)
    context = _ids_array("context_ids", context_ids, vocab_size)      # (n_distinct,)
    _require_valid(x, "input")
    ids = np.arange(vocab_size)                                      # (V,) tie-break key

    if policy.suppress_token_ids:                                    # step 2: suppression
        x[list(policy.suppress_token_ids)] = -np.inf
        _require_valid(x, "suppression")
    if policy.grammar is not None:                                   # step 3: grammar mask
        allowed_mask = getattr(policy.grammar, "allowed_mask", None)  # a response_format: (V,) bool at once
        if allowed_mask is not None:
            masked = ~np.asarray(allowed_mask(list(context_ids), vocab_size), dtype=bool)
        else:
            allowed = _ids_array("grammar", policy.grammar.allowed_token_ids(list(context_ids)), vocab_size)
            masked = np.ones(vocab_size, dtype=bool)
            masked[allowed] = False
        x[masked] = -np.inf
        _require_valid(x, "grammar mask")
    if policy.repetition_penalty != 1.0 and context.size:            # step 4: repetition penalty
        v = x[context]
        with np.errstate(over="ignore"):                             # overflow -> +inf, caught just below
            x[context] = np.where(v > 0, v / policy.repetition_penalty, v * policy.repetition_penalty)
        _require_valid(x, "repetition penalty")
    if policy.temperature == 0:                                      # step 5: greedy stops here
        probs = np.zeros(vocab_size)
        probs[int(np.argmax(x))] = 1.0                               # first max = lowest id; -inf never wins
        return probs
    if policy.temperature != 1.0:
        with np.errstate(over="ignore"):
            x = x / policy.temperature
        _require_valid(x, "temperature")
    n_finite = int(np.isfinite(x).sum())
    if 0 < policy.top_k < n_finite:                                  # step 6: top-k, exactly k survive
        order = np.lexsort((ids, -x))                                # logit desc, id asc
        x[order[policy.top_k:]] = -np.inf
    probs = np.exp(x - x.max())                                      # step 7: softmax in float64
    probs /= probs.sum()
    if policy.top_p < 1.0:                                           # step 8: top-p (nucleus)
        order = np.lexsort((ids, -probs))                            # prob desc, id asc
        cumulative = np.cumsum(probs[order])                         # sequential float64 sum
        n_keep = int(np.searchsorted(cumulative, policy.top_p, side="left")) + 1
        n_keep = min(n_keep, int((probs > 0).sum()))                 # >= 1: the max has prob > 0
        kept = np.zeros(vocab_size)
        kept[order[:n_keep]] = probs[order[:n_keep]]
        probs = kept / kept.sum()
    return probs


def process_logits_batch(logits, contexts: list, policy: SamplingPolicy) -> np.ndarray:
    """(n, V) logits, n contexts -> (n, V) float64 probabilities, row by row."""
    rows = np.asarray(logits)
    if rows.ndim != 2 or len(contexts) != rows.shape[0]:
        raise _bad("logits", f"need shape (n, V) with n == len(contexts) = {len(contexts)}, got {rows.shape}")
    return np.stack([process_logits(row, ctx, policy) for row, ctx in zip(rows, contexts)])


def argmax_tie_low(probs) -> int:
    """Index of the largest entry of a 1-D array; ties -> lowest index; NaN is an error."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise _bad("probs", f"must be a non-empty 1-D array, got shape {p.shape}")
    if np.isnan(p).any():
        raise ExactSpecError(E_PROCESSOR_INVALID, "NaN in distribution")
    return int(np.argmax(p))
