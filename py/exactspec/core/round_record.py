"""The round record: one round's outcome as int32 words (protocol.json round_record), and its one Python reader.

Every backend session's round() returns it: the browser's as an Int32Array written by the WGSL or
C decider and the JS session (web/orchestrator/session.mjs), the CPython reference's from encode().
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Optional

from .protocol import SCHEMA

LAYOUT = SCHEMA["round_record"]
AT = {name: i for i, (name, _kind) in enumerate(LAYOUT["words"])}
FIXED_WORDS = len(LAYOUT["words"])
DECISION_WORDS = LAYOUT["decision_words"]
STATUS = dict(LAYOUT["status"])                  # name -> value
_STATUS_NAMES = {v: k for k, v in STATUS.items()}


@dataclass(frozen=True)
class RoundOutcome:
    """One round, decoded. status: "verified" (the champion ran on `proposals`; none: a baseline
    step), "draft_invalid" (a draft row was invalid: no proposal kept, a baseline step ran) or
    "draft_failed" (the champion did not run; the session's last_failure() says why)."""
    status: str
    proposals: tuple = ()
    forced: tuple = ()                            # grammar-forced ids committed before the proposals
    n_accepted: int = 0
    next_token: Optional[int] = None
    rejected_at: Optional[int] = None
    ended_by: Optional[str] = None                # None | "stop" | "length"
    error_code: Optional[str] = None              # None | E_TARGET_NUMERIC_OR_MASK | E_RESIDUAL_INVARIANT
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    diagnostics: dict = field(default_factory=dict)


def _f32_word(x: Optional[float]) -> int:
    return struct.unpack("<i", struct.pack("<f", float("nan") if x is None else x))[0]


def _protocol_error(message: str):
    from .errors import E_PROTOCOL, ExactSpecError
    return ExactSpecError(E_PROTOCOL, message)


# decode's word positions and tables, looked up once (it runs every round, in Pyodide)
_N_FORCED, _N_PROPOSED, _STATUS, _ERROR = AT["n_forced"], AT["n_proposed"], AT["status"], AT["decision_error"]
_ENDED, _ACCEPTED, _NEXT, _REJECTED = AT["ended_by"], AT["n_accepted"], AT["next_token"], AT["rejected_at"]
_DRAFT_US, _VERIFY_US, _DIAG = AT["draft_us"], AT["verify_us"], AT["diag_score"]
assert (AT["diag_u"], AT["diag_a"]) == (_DIAG + 1, _DIAG + 2)      # score, u, a: three f32 words in a row
_ENDED_BY, _ENDED_MASK, _NEAR_TOP_P = LAYOUT["ended_by"], LAYOUT["ended_by_mask"], LAYOUT["near_top_p_flag"]
_DECISION_ERRORS = LAYOUT["decision_errors"]
_DIAG_WORDS, _DIAG_FLOATS = struct.Struct("<3i"), struct.Struct("<3f")


def decode(words) -> RoundOutcome:
    """A record (a sequence of int32 words) -> RoundOutcome; a malformed one is E_PROTOCOL."""
    w = [int(x) for x in words]
    if (len(w) < FIXED_WORDS or w[_N_FORCED] < 0 or w[_N_PROPOSED] < 0
            or len(w) != FIXED_WORDS + w[_N_FORCED] + w[_N_PROPOSED]):
        raise _protocol_error(f"a round record needs {FIXED_WORDS} words + n_forced + n_proposed ids, got {len(w)}")
    n_forced = w[_N_FORCED]
    status = _STATUS_NAMES.get(w[_STATUS])
    error_index = w[_ERROR]
    if status is None or not 0 <= error_index < len(_DECISION_ERRORS):
        raise _protocol_error(f"round record: status {w[_STATUS]}, decision error {error_index}")
    ended = w[_ENDED]
    next_token, rejected_at = w[_NEXT], w[_REJECTED]
    score, u, a = _DIAG_FLOATS.unpack(_DIAG_WORDS.pack(w[_DIAG], w[_DIAG + 1], w[_DIAG + 2]))
    return RoundOutcome(
        status=status, proposals=tuple(w[FIXED_WORDS + n_forced:]), forced=tuple(w[FIXED_WORDS:FIXED_WORDS + n_forced]),
        n_accepted=w[_ACCEPTED],
        next_token=None if next_token < 0 else next_token, rejected_at=None if rejected_at < 0 else rejected_at,
        ended_by=_ENDED_BY[ended & _ENDED_MASK] or None,
        error_code=_DECISION_ERRORS[error_index] or None,
        draft_ms=w[_DRAFT_US] / 1000.0, verify_ms=w[_VERIFY_US] / 1000.0,
        diagnostics={"score": score, "u": u, "a": a, "near_top_p": bool(ended & _NEAR_TOP_P)})


def decode_many(words) -> list:
    """Records one after another (a chain of baseline steps, session.chain) -> [RoundOutcome, ...],
    each as decode() reads it; a malformed run (a record cut short, none at all) is E_PROTOCOL."""
    w = [int(x) for x in words]
    out, at = [], 0
    while at < len(w):
        if len(w) - at < FIXED_WORDS:
            raise _protocol_error(f"a chain's record at word {at} has {len(w) - at} words, under {FIXED_WORDS}")
        size = FIXED_WORDS + max(0, w[at + _N_FORCED]) + max(0, w[at + _N_PROPOSED])
        out.append(decode(w[at:at + size]))
        at += size
    if not out:
        raise _protocol_error("a chain returned no record")
    return out


def encode(status: str, proposals=(), decision=None, draft_ms: float = 0.0, verify_ms: float = 0.0,
           accept_test=None, forced=()) -> list:
    """The record of a round decided in Python (acceptance.RoundDecision, or None when the champion
    did not run), as the WGSL/C deciders and the JS session write it; `forced`: the grammar-forced
    ids committed before the proposals. accept_test: (u, a) of the
    round's last accept test (the uniform and min(1, p_target / p_draft)), or None: diag_u, diag_a."""
    w = [0] * (FIXED_WORDS + len(forced) + len(proposals))
    w[AT["next_token"]] = w[AT["rejected_at"]] = -1
    if decision is not None:
        w[AT["n_accepted"]] = decision.n_accepted
        w[AT["next_token"]] = -1 if decision.next_token is None else decision.next_token
        w[AT["rejected_at"]] = -1 if decision.rejected_at is None else decision.rejected_at
        w[AT["ended_by"]] = LAYOUT["ended_by"].index(decision.ended_by or "")
        w[AT["decision_error"]] = LAYOUT["decision_errors"].index(decision.error.code) if decision.error else 0
    for name in ("diag_score", "diag_u", "diag_a"):
        w[AT[name]] = _f32_word(None)
    if accept_test is not None:
        w[AT["diag_u"]], w[AT["diag_a"]] = (_f32_word(float(x)) for x in accept_test)
    w[AT["status"]] = STATUS[status]
    w[AT["draft_us"]] = round(draft_ms * 1000)
    w[AT["verify_us"]] = round(verify_ms * 1000)
    w[AT["n_proposed"]] = len(proposals)
    w[AT["n_forced"]] = len(forced)
    w[FIXED_WORDS:] = list(forced) + list(proposals)
    return w


# |u - a| below this: float32 and float64 arithmetic could decide the accept test differently
CLOSE_MARGIN = 1e-6


class NumericsTally:
    """The decider's numerical diagnostics over one request, for the receipt's `numerics` (a few
    counts, not per-round values). Each record carries the round's near_top_p flag (the WGSL
    decider: a row it used was near its top-p boundary in float32) and the u, a of its last accept
    test (the one that decided the round), filled by the C decider, the WGSL one and the CPython
    reference (RngDecider); only WGSL sets near_top_p (the float64 reference is the yardstick)."""

    def __init__(self):
        self.decided_rounds = 0       # rounds the champion ran and decided (not draft_failed)
        self.near_top_p_rounds = 0
        self.judged_rounds = 0        # rounds with an accept test (sampled, with proposals): finite u and a
        self.close_rounds = 0         # ... whose |u - a| < CLOSE_MARGIN
        self.min_margin: Optional[float] = None

    def add(self, outcome: RoundOutcome) -> None:
        if outcome.status == "draft_failed":
            return
        self.decided_rounds += 1
        d = outcome.diagnostics
        self.near_top_p_rounds += bool(d.get("near_top_p"))
        u, a = d.get("u"), d.get("a")
        # no accept test: NaN (the C decider, encode) or 0 (the WGSL decider); a real u is in (0, 1]
        if u is None or a is None or not (math.isfinite(u) and math.isfinite(a)) or u <= 0:
            return
        margin = abs(u - a)
        self.judged_rounds += 1
        self.close_rounds += margin < CLOSE_MARGIN
        self.min_margin = margin if self.min_margin is None else min(self.min_margin, margin)

    def summary(self) -> dict:
        """-> the receipt's numerics: counts, and the smallest |u - a| (None: no accept test ran)."""
        return {"decided_rounds": self.decided_rounds, "near_top_p_rounds": self.near_top_p_rounds,
                "judged_rounds": self.judged_rounds, "min_acceptance_margin": self.min_margin,
                "close_margin_rounds": self.close_rounds, "close_margin": CLOSE_MARGIN}
