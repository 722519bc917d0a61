"""Coded errors: every failure the engine reports carries a stable code and a message."""
from __future__ import annotations

# Stable codes. Never renumber or rename: receipts, the worker protocol and the CLI use them.
E_BAD_ARGUMENT = "E_BAD_ARGUMENT"                    # caller passed an invalid option or value
E_PROCESSOR_INVALID = "E_PROCESSOR_INVALID"          # processed distribution has NaN or no valid token
E_TARGET_NUMERIC_OR_MASK = "E_TARGET_NUMERIC_OR_MASK"  # champion row invalid inside a round (fatal)
E_RESIDUAL_INVARIANT = "E_RESIDUAL_INVARIANT"        # residual mass not finite or <= floor (fatal)
E_DRAFT_LOST = "E_DRAFT_LOST"                        # draft worker / backend failed
E_DEVICE_LOST = "E_DEVICE_LOST"                      # GPU device lost
E_STALE_EPOCH = "E_STALE_EPOCH"                      # message from an old epoch
E_CANCELLED = "E_CANCELLED"                          # request cancelled by the caller
E_MODEL_LOAD = "E_MODEL_LOAD"                        # model or tokenizer file missing / malformed
E_MANIFEST_MISMATCH = "E_MANIFEST_MISMATCH"          # champion/draft pair incompatible
E_CONTEXT_OVERFLOW = "E_CONTEXT_OVERFLOW"            # prompt + generation exceeds context limit
E_CACHE_STATE = "E_CACHE_STATE"                      # cache transaction misuse (a bug, never user input)
E_PROTOCOL = "E_PROTOCOL"                            # malformed worker message

ALL_CODES = frozenset(v for k, v in dict(globals()).items() if k.startswith("E_"))


class ExactSpecError(Exception):
    """An error with a stable `code` (one of ALL_CODES) and a one-line human message."""

    def __init__(self, code: str, message: str, **detail):
        if code not in ALL_CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message}
