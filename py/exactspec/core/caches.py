"""Transactional logical KV cache of one model (spec: "Cache transaction model").

The cache is logical: it tracks token ids and lengths; the model backend owns the K/V tensors
and is told where to write (`n_materialized`). State, in the spec's terms:
  committed tokens   tokens[:n_committed]                      authoritative
  pending tokens     tokens[n_materialized:n_committed]        authoritative, not yet through the model
  provisional tail   tokens[n_committed:]                      proposed in the open transaction
  terminal marker    None | "eos" | "stop" | "length" | "cancelled" | "error"
  content identity   the model/tokenizer/policy identity this cache belongs to
Rollback only moves lengths; K/V beyond n_materialized is unreachable and gets overwritten.
"""
from __future__ import annotations

from typing import Iterable, Optional

from .errors import E_CACHE_STATE, ExactSpecError


def _fail(msg: str):
    raise ExactSpecError(E_CACHE_STATE, msg)


class LogicalCache:
    def __init__(self, identity: str, prompt_ids: Iterable[int]):
        self.identity = identity
        self.tokens: list[int] = list(prompt_ids)
        self.n_committed = len(self.tokens)
        self.n_materialized = 0
        self.terminal: Optional[str] = None
        self.in_transaction = False

    # --- views -----------------------------------------------------------------------------
    @property
    def committed_ids(self) -> list[int]:
        return self.tokens[:self.n_committed]

    @property
    def pending_ids(self) -> list[int]:
        return self.tokens[self.n_materialized:self.n_committed]

    @property
    def provisional_ids(self) -> list[int]:
        return self.tokens[self.n_committed:]

    def unmaterialized(self) -> list[int]:
        return self.tokens[self.n_materialized:]

    # --- transaction -----------------------------------------------------------------------
    def begin(self) -> int:
        """Open a transaction; returns the checkpoint (committed length)."""
        if self.terminal is not None:
            _fail(f"begin on a finalized cache ({self.terminal})")
        if self.in_transaction:
            _fail("begin while a transaction is open")
        self.in_transaction = True
        return self.n_committed

    def append_provisional(self, token_ids: Iterable[int]) -> None:
        if not self.in_transaction:
            _fail("append_provisional outside a transaction")
        self.tokens.extend(token_ids)

    def mark_materialized(self, length: int) -> None:
        """The backend has written K/V for tokens[:length]."""
        if not (self.n_materialized <= length <= len(self.tokens)):
            _fail(f"materialized length {length} outside [{self.n_materialized}, {len(self.tokens)}]")
        self.n_materialized = length

    def commit_prefix(self, n_tokens: int) -> None:
        """Commit the first n_tokens of the provisional tail, roll back the rest, close the transaction."""
        if not self.in_transaction:
            _fail("commit_prefix outside a transaction")
        if not (0 <= n_tokens <= len(self.tokens) - self.n_committed):
            _fail(f"commit_prefix({n_tokens}) with a tail of {len(self.tokens) - self.n_committed}")
        self.n_committed += n_tokens
        self.rollback_to(self.n_committed)
        self.in_transaction = False

    def rollback(self) -> None:
        """Abort the open transaction: drop the whole provisional tail."""
        self.commit_prefix(0)

    def abort(self) -> None:
        """Abort a round whose result was not used (device error, invalid row, cancellation).

        Like rollback(), and the last committed token becomes pending again: the model may have
        consumed it in the aborted call, but its logits were not kept, so the next call must
        feed it again (its K/V is rewritten at the same position, bit for bit)."""
        if self.in_transaction:
            self.rollback()
        self.n_materialized = min(self.n_materialized, max(self.n_committed - 1, 0))

    def rollback_to(self, logical_length: int) -> None:
        """Make tokens beyond logical_length unreachable; committed tokens cannot be rolled back."""
        if not (self.n_committed <= logical_length <= len(self.tokens)):
            _fail(f"rollback_to({logical_length}) outside [{self.n_committed}, {len(self.tokens)}]")
        del self.tokens[logical_length:]
        self.n_materialized = min(self.n_materialized, logical_length)

    def append_authoritative(self, token_id: int) -> None:
        """Record an emitted token (e.g. a correction) that the model has not consumed yet."""
        if self.in_transaction or self.terminal is not None:
            _fail("append_authoritative inside a transaction or after finalize")
        self.tokens.append(token_id)
        self.n_committed += 1

    def finalize(self, marker: str) -> None:
        if self.in_transaction:
            self.rollback()
        self.terminal = marker

    def state(self) -> dict:
        return {"identity": self.identity, "n_committed": self.n_committed,
                "n_materialized": self.n_materialized, "pending": self.pending_ids,
                "provisional": self.provisional_ids, "terminal": self.terminal}
