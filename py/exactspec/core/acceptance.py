"""Pure acceptance maths for one speculative round: distributions and a decider in, a decision out.

Nothing here touches caches, models, RNG state or I/O. Randomness arrives through a `Decider`
(see deciders.py) whose draws are addressed by (domain, round_id, position), so the same code
runs with the Threefry contract (production), with exact branch enumeration over Fractions
(tests), and with any numeric type that supports +, -, /, comparisons (float, numpy, Fraction).

Positional contract (spec "Minimum target API"):
  p_target_rows[i] (i < m) predicts proposals[i]; p_target_rows[m] predicts the extra token.
  p_draft_rows[i] is the distribution proposals[i] was drawn from.
A row may be an ExactSpecError instead of a distribution: the champion's processors rejected it.
It only matters if the round reaches it (the spec checks q_i lazily, in proposal order).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .errors import (E_RESIDUAL_INVARIANT, E_TARGET_NUMERIC_OR_MASK, ExactSpecError)
from .rng import ACCEPT_UNIFORM, CORRECTION_SAMPLE, TARGET_BASELINE, TARGET_EXTRA

# Residual mass at or below this is an invariant violation. Zero: any positive finite mass is a
# valid distribution to sample from; only an empty or non-finite residual is refused.
RESIDUAL_FLOOR = 0


@dataclass(frozen=True)
class RoundDecision:
    """Outcome of one round. Tokens to emit: proposals[:n_accepted] then next_token (if any)."""
    n_accepted: int
    next_token: Optional[int]          # correction, extra or baseline token; None if the round ended on a proposal
    rejected_at: Optional[int]         # proposal index of the first rejection, None if none
    ended_by: Optional[str] = None     # "stop" or "length" when the round ended on an accepted proposal
    error: Optional[ExactSpecError] = None  # fatal: nothing from this round may be emitted


def _is_finite(x) -> bool:
    try:
        return x == x and x not in (float("inf"), float("-inf"))
    except TypeError:
        return True


def residual_weights(p_target, p_draft):
    """[p_target - p_draft]_+ elementwise (unnormalised). (V,) -> (V,)"""
    if hasattr(p_target, "dtype"):  # numpy
        import numpy as np
        return np.maximum(p_target - p_draft, 0.0)
    return [max(q - p, 0) for q, p in zip(p_target, p_draft)]


def total(weights):
    """Sum of a row; numpy rows use a pairwise (stable) sum."""
    return weights.sum() if hasattr(weights, "dtype") else sum(weights)


def argmax_tie_low(row) -> int:
    """Index of the largest entry; ties go to the lowest index (the declared tie-break)."""
    if hasattr(row, "dtype"):
        import numpy as np
        return int(np.argmax(row))
    best = 0
    for i in range(1, len(row)):
        if row[i] > row[best]:
            best = i
    return best


def _row_or_error(row):
    if isinstance(row, ExactSpecError):
        return ExactSpecError(E_TARGET_NUMERIC_OR_MASK, f"champion distribution invalid: {row.message}")
    return None


def stochastic_round(p_target_rows: Sequence, p_draft_rows: Sequence, proposals: Sequence[int],
                     decider, round_id: int, stop_token_ids, remaining: int) -> RoundDecision:
    """The exact stochastic round (spec: exact_speculative_round), after drafting and verification.

    p_target_rows: m+1 processed champion rows (V,), p_draft_rows: m draft rows (V,), m = len(proposals) <= remaining.
    """
    m = len(proposals)
    assert len(p_target_rows) == m + 1 and len(p_draft_rows) == m and 0 < m <= remaining
    n_accepted = 0
    for i in range(m):
        err = _row_or_error(p_target_rows[i])
        if err:
            return RoundDecision(0, None, None, error=err)
        p_target, p_draft, y = p_target_rows[i], p_draft_rows[i], proposals[i]
        # accept y with probability min(1, p_target(y) / p_draft(y)); p_draft(y) > 0 since y ~ p_draft
        accept_probability = min(1, p_target[y] / p_draft[y])
        if decider.bernoulli(accept_probability, ACCEPT_UNIFORM, round_id, i):
            n_accepted += 1
            if y in stop_token_ids:
                return RoundDecision(n_accepted, None, None, ended_by="stop")
            if n_accepted == remaining:
                return RoundDecision(n_accepted, None, None, ended_by="length")
            continue
        residual = residual_weights(p_target, p_draft)
        residual_mass = total(residual)
        if not _is_finite(residual_mass) or residual_mass <= RESIDUAL_FLOOR:
            err = ExactSpecError(E_RESIDUAL_INVARIANT, f"residual mass {float(residual_mass)!r} at position {i}")
            return RoundDecision(0, None, None, error=err)
        z = decider.categorical(residual, CORRECTION_SAMPLE, round_id, i)
        return RoundDecision(n_accepted, z, i)
    err = _row_or_error(p_target_rows[m])
    if err:
        return RoundDecision(0, None, None, error=err)
    z = decider.categorical(p_target_rows[m], TARGET_EXTRA, round_id, 0)
    return RoundDecision(m, z, None)


def greedy_round(p_target_rows: Sequence, proposals: Sequence[int], stop_token_ids,
                 remaining: int) -> RoundDecision:
    """The greedy round (spec: greedy_assisted_round): accept while proposal == argmax(p_target)."""
    m = len(proposals)
    assert len(p_target_rows) == m + 1 and 0 < m <= remaining
    n_accepted = 0
    for i in range(m):
        err = _row_or_error(p_target_rows[i])
        if err:
            return RoundDecision(0, None, None, error=err)
        target_token = argmax_tie_low(p_target_rows[i])
        if proposals[i] != target_token:
            return RoundDecision(n_accepted, target_token, i)
        n_accepted += 1
        if proposals[i] in stop_token_ids:
            return RoundDecision(n_accepted, None, None, ended_by="stop")
        if n_accepted == remaining:
            return RoundDecision(n_accepted, None, None, ended_by="length")
    err = _row_or_error(p_target_rows[m])
    if err:
        return RoundDecision(0, None, None, error=err)
    return RoundDecision(m, argmax_tie_low(p_target_rows[m]), None)


def baseline_step(p_target_row, decider, round_id: int, greedy: bool) -> RoundDecision:
    """Champion-alone: one token from the processed champion row (also the k == 0 round)."""
    err = _row_or_error(p_target_row)
    if err:
        return RoundDecision(0, None, None, error=err)
    if greedy:
        return RoundDecision(0, argmax_tie_low(p_target_row), None)
    return RoundDecision(0, decider.categorical(p_target_row, TARGET_BASELINE, round_id, 0), None)


def decide_round(p_target_rows, p_draft_rows, proposals, decider, round_id: int, stop_token_ids,
                 remaining: int, greedy: bool) -> RoundDecision:
    """The whole decision of a round: champion-alone when there are no proposals, else greedy or
    stochastic. This is the contract of a device's fused verify-and-decide call."""
    if not proposals:
        return baseline_step(p_target_rows[0], decider, round_id, greedy)
    if greedy:
        return greedy_round(p_target_rows, proposals, stop_token_ids, remaining)
    return stochastic_round(p_target_rows, p_draft_rows, proposals, decider, round_id, stop_token_ids, remaining)
