"""Toy models for running the orchestrator end to end before real models exist.

ToyRunner: a small recurrent LM in NumPy, h_t = tanh(A h_{t-1} + E[x_t]), logits_t = scale * W h_t.
Its output depends on the whole history and position, so a cache that forgets to roll back or
re-feeds a token gives different logits (the tests rely on that). `toy_draft` mixes the
champion's output weights with noise: overlap 1.0 gives an identical model, 0.0 an unrelated one.
ExactChampion / ExactDraft: distributions given directly as exact Fractions per context, for
exhaustive enumeration.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..core.backends import Proposal, ReferenceChampion
from ..core.rng import DRAFT_SAMPLE


class ToyRunner:
    batch_invariant = True   # a position's state is computed alone (the recurrence below): prefix reuse is exact

    def __init__(self, vocab_size: int = 32, seed: int = 0, hidden: int = 16, scale: float = 3.0,
                 max_context: int = 4096):
        rs = np.random.default_rng(seed)
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.A = rs.normal(0, 1.0 / np.sqrt(hidden), (hidden, hidden))   # (H, H)
        self.E = rs.normal(0, 1.0, (vocab_size, hidden))                  # (V, H)
        self.W = rs.normal(0, 1.0 / np.sqrt(hidden), (vocab_size, hidden)) * scale  # (V, H)
        self.states = np.zeros((0, hidden))                                # (n_materialized, H)
        self._set_identity(f"toy:{vocab_size}:{seed}:{hidden}:{scale}")

    def _set_identity(self, text):
        self.identity = hashlib.sha256(text.encode()).hexdigest()

    def forward(self, token_ids, start_pos: int) -> np.ndarray:
        assert 0 <= start_pos <= len(self.states), (start_pos, len(self.states))
        h = self.states[start_pos - 1] if start_pos > 0 else np.zeros(self.A.shape[0])
        new = []
        for x in token_ids:
            h = np.tanh(self.A @ h + self.E[x])
            new.append(h)
        self.states = np.concatenate([self.states[:start_pos], np.array(new).reshape(-1, self.A.shape[0])])
        return np.array(new) @ self.W.T                                    # (n, V)

    def reset(self):
        self.states = self.states[:0]


def toy_draft(champion: ToyRunner, overlap: float, seed: int = 1) -> ToyRunner:
    """A draft sharing the champion's dynamics, with output weights mixed toward noise."""
    draft = ToyRunner(champion.vocab_size, seed, champion.A.shape[0], 1.0, champion.max_context)
    draft.A, draft.E = champion.A, champion.E
    draft.W = overlap * champion.W + (1 - overlap) * draft.W * np.linalg.norm(champion.W) / np.linalg.norm(draft.W)
    draft._set_identity(f"toydraft:{champion.identity}:{overlap}:{seed}")
    return draft


class ExactChampion(ReferenceChampion):
    """Champion whose processed distribution is dist_fn(context_ids) -> list of Fractions (V,)."""

    max_context = 1 << 30

    def __init__(self, vocab_size, dist_fn, identity="exact-champion"):
        self.vocab_size, self.dist_fn, self.identity = vocab_size, dist_fn, identity
        self.n_calls = 0

    def prefill(self, cache):
        cache.mark_materialized(cache.n_committed - 1)

    def verify_linear(self, cache, policy):
        self.n_calls += 1
        m = len(cache.provisional_ids)
        base = cache.n_committed
        assert cache.n_materialized < base, "verify without a pending token"
        cache.mark_materialized(len(cache.tokens))
        return [self.dist_fn(tuple(cache.tokens[:base + i])) for i in range(m + 1)]


class ExactDraft:
    """Draft proposing from dist_fn(context_ids) exactly (the p_draft rows are those Fractions)."""

    max_context = 1 << 30

    def __init__(self, vocab_size, dist_fn, identity="exact-draft"):
        self.vocab_size, self.dist_fn, self.identity = vocab_size, dist_fn, identity
        self.n_calls = 0

    def prefill(self, cache):
        cache.mark_materialized(cache.n_committed - 1)

    def propose(self, cache, k, policy, decider, round_id, stop_token_ids) -> Proposal:
        self.n_calls += 1
        out = Proposal()
        for i in range(k):
            p_draft = self.dist_fn(tuple(cache.tokens))
            y = decider.categorical(p_draft, DRAFT_SAMPLE, round_id, i)
            out.tokens.append(y)
            out.p_draft_rows.append(p_draft)
            cache.append_provisional([y])
            if y in stop_token_ids:
                break
        cache.mark_materialized(len(cache.tokens) - 1)
        return out
