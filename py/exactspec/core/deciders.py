"""Deciders: where a round's randomness comes from. The acceptance maths only sees this interface.

  bernoulli(probability, domain, round_id, position) -> bool
  categorical(weights, domain, round_id, position) -> int      (weights >= 0, unnormalised)

RngDecider draws by the Threefry address contract (docs/rng.md). EnumeratingDecider explores
every branch with exact probabilities, so tests can compute the exact distribution of outcomes.
"""
from __future__ import annotations

from fractions import Fraction

from . import rng


class RngDecider:
    """Production decider: addressed Threefry draws for one seed."""

    def __init__(self, seed: int):
        self.seed = seed
        self.last_accept = None     # (u, probability) of the last bernoulli: the round record's diag_u, diag_a

    def bernoulli(self, probability, domain, round_id, position) -> bool:
        bits = rng.draw_bits(self.seed, domain, round_id, position, 0)
        u = rng.uniform_open_closed(bits)
        self.last_accept = (u, probability)
        return u <= probability

    def categorical(self, weights, domain, round_id, position) -> int:
        if hasattr(weights, "dtype"):
            return rng.sample_gumbel_max_np(weights, self.seed, domain, round_id, position)
        return rng.sample_gumbel_max([float(w) for w in weights], self.seed, domain, round_id, position)


class _Replay:
    """One run of an exhaustive enumeration: replays `script`, branches on new choice points."""

    def __init__(self, script):
        self.script = script
        self.taken = []
        self.prob = Fraction(1)
        self.new_scripts = []

    def _choose(self, options):
        # options: list of (value, exact probability > 0)
        c = len(self.taken)
        if c < len(self.script):
            idx = self.script[c]
        else:
            idx = 0
            for alt in range(1, len(options)):
                self.new_scripts.append(self.taken + [alt])
        self.taken.append(idx)
        value, p = options[idx]
        self.prob *= p
        return value

    def bernoulli(self, probability, domain, round_id, position) -> bool:
        probability = Fraction(probability)
        options = [(v, p) for v, p in ((True, probability), (False, 1 - probability)) if p > 0]
        return self._choose(options)

    def categorical(self, weights, domain, round_id, position) -> int:
        mass = sum(Fraction(w) for w in weights)
        options = [(x, Fraction(w) / mass) for x, w in enumerate(weights) if w > 0]
        return self._choose(options)


def enumerate_outcomes(run):
    """Exact distribution of run(decider) over all random branches: {outcome: Fraction}."""
    outcomes = {}
    scripts = [[]]
    while scripts:
        replay = _Replay(scripts.pop())
        out = run(replay)
        outcomes[out] = outcomes.get(out, Fraction(0)) + replay.prob
        scripts.extend(replay.new_scripts)
    return outcomes
