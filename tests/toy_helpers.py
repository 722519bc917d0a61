"""Shared toy set-ups for orchestrator tests (NumPy toy runners, a char-level decode)."""
import numpy as np

from exactspec.core.backends import RunnerChampion, RunnerDraft
from exactspec.core.orchestrator import Orchestrator
from exactspec.reference.processors import process_logits
from exactspec.reference.toy import ToyRunner, toy_draft

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,;!?"


def toy_piece(token_id):
    """Token i decodes to 1-3 characters, so strings span token boundaries."""
    if token_id == 0:
        return ""
    n = 1 + token_id % 3
    return "".join(ALPHABET[(token_id * 7 + j * 5) % len(ALPHABET)] for j in range(n))


def toy_decode(ids):
    return "".join(toy_piece(t) for t in ids)


def make_orchestrator(vocab_size=40, seed=0, overlap=0.7, hidden=16, scale=3.0):
    champion = ToyRunner(vocab_size, seed, hidden, scale)
    draft = toy_draft(champion, overlap, seed + 1000)
    return Orchestrator(RunnerChampion(champion), RunnerDraft(draft), decode=toy_decode)


def champion_first_two(vocab_size, seed, hidden, scale, prompt, policy):
    """Exact (float64) champion joint of the first two tokens, straight from runner + processors."""
    joint = {}
    q1 = process_logits(ToyRunner(vocab_size, seed, hidden, scale).forward(prompt, 0)[-1], prompt, policy)
    for a in np.flatnonzero(q1):
        ctx = list(prompt) + [int(a)]
        q2 = process_logits(ToyRunner(vocab_size, seed, hidden, scale).forward(ctx, 0)[-1], ctx, policy)
        for b in np.flatnonzero(q2):
            joint[(int(a), int(b))] = q1[a] * q2[b]
    return joint
