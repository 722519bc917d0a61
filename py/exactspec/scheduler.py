"""How many tokens the draft proposes each round: the scheduler policy, bound into the receipt.

A scheduler is asked `next_k(remaining)` before each speculative round and told what happened
after it (`observe`); `describe()` is the canonical policy the receipt hashes. Pure: no I/O.
"""
from __future__ import annotations


class StaticK:
    """The same k every round (capped by the tokens still allowed)."""

    name, version = "static-k", 1

    def __init__(self, k: int):
        self.k = k

    def next_k(self, remaining: int) -> int:
        return min(self.k, remaining)

    def observe(self, *, proposed: int, accepted: int, draft_ms: float, verify_ms: float) -> None:
        """Static: nothing to learn."""

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version, "k": self.k}


def make_scheduler(config) -> StaticK:
    """The scheduler a GenerationConfig asks for (today: static k)."""
    return StaticK(config.k)
