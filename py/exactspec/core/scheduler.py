"""How many tokens the draft proposes each round: the scheduler policy, bound into the receipt.

A scheduler is asked `next_k(remaining)` before each speculative round and told what happened
after it (`observe`; a champion-alone round of a speculative request reports proposed = 0);
`describe()` is the canonical policy the receipt hashes. Pure: no I/O, no clock of its own,
importable in Pyodide. The choice of k changes speed only, never the output distribution.
"""
from __future__ import annotations

SCHEDULERS = ("static", "adaptive")


class StaticK:
    """The same k every round (capped by the tokens still allowed)."""

    name, version = "static-k", 1

    def __init__(self, k: int):
        self.k = k

    def next_k(self, remaining: int) -> int:
        return min(self.k, remaining)

    def observe(self, *, proposed: int, accepted: int, draft_ms: float, verify_ms: float,
                round_ms: float | None = None) -> None:
        """Static: nothing to learn."""

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version, "k": self.k}


class AdaptiveK:
    """k in [0, k_max] maximising expected tokens per unit of round cost, from local counters.

    Counters: per proposal position i the rounds that reached it and those that accepted it
    (decayed per speculative round, so the policy follows the request), giving the conditional
    acceptance a_i (a position never reached borrows a_{i-1}: prior strength `prior_weight`), the
    survival S_i = a_1...a_i and E[G(k)] = 1 + S_1 + ... + S_k; and the wall time of the last
    `cost_window` rounds at each k (their median, or their minimum while fewer than 3), fitted as
    R(0) (champion alone) and R(k) = alpha + beta k for k >= 1. It picks argmax E[G(k)] / R(k),
    k = 0 included (speculation off); after `probe_every` rounds in a row at k = 0 it proposes
    once more at the best k >= 1, so that a stratum can win speculation back. The first two
    rounds use `k_start` and `k_second` (two points measure the cost's slope in k); the first
    round's time is not a round cost (a backend may run deferred prompt work in it: the WebGPU
    champion's first verification carries the prompt's prefill). Nothing but
    these counters is read: no text, no token ids. Frozen during a run: every parameter is in
    describe().
    """

    name, version = "adaptive-k", 3

    def __init__(self, k_max: int, *, k_start: int = 1, k_second: int = 3, decay: float = 0.9, prior_accept: float = 0.5,
                 prior_weight: float = 2.0, slope_prior: float = 0.25, probe_every: int = 4, cost_window: int = 5):
        self.k_max = k_max
        self.params = {"k_start": k_start, "k_second": k_second, "decay": decay, "prior_accept": prior_accept,
                       "prior_weight": prior_weight, "slope_prior": slope_prior, "probe_every": probe_every,
                       "cost_window": cost_window}
        self.reached = [0.0] * (k_max + 1)      # index i >= 1: rounds that proposed position i and reached it
        self.taken = [0.0] * (k_max + 1)        # ... and accepted it
        self.costs = [[] for _ in range(k_max + 1)]   # the last cost_window round_ms by k
        self.rounds = 0
        self.zero_streak = 0

    # ---- estimates (pure functions of the counters) ----
    def acceptance(self) -> list:
        """Conditional acceptance a_1..a_k_max (index 0 unused, 1.0)."""
        p = self.params
        a, prev = [1.0], p["prior_accept"]
        for i in range(1, self.k_max + 1):
            w = p["prior_weight"]
            ai = (self.taken[i] + w * prev) / (self.reached[i] + w)
            a.append(ai)
            prev = ai
        return a

    def expected_tokens(self) -> list:
        """E[G(k)] for k = 0..k_max from the survival S_i = prod a_j."""
        out, s, total = [], 1.0, 1.0
        a = self.acceptance()
        out.append(1.0)
        for i in range(1, self.k_max + 1):
            s *= a[i]
            total += s
            out.append(total)
        return out

    @staticmethod
    def robust(values: list) -> float:
        """A k's round cost from its recent times: the median of 3 or more, else the minimum (a
        first round at a new k may carry one-time costs, e.g. a pipeline built on first use)."""
        v = sorted(values)
        return v[len(v) // 2] if len(v) >= 3 else v[0]

    def round_costs(self):
        """R(k) for k = 0..k_max in ms, or None before any round was timed."""
        seen = [(k, self.robust(c), len(c)) for k, c in enumerate(self.costs) if c]
        spec = [(k, r, n) for k, r, n in seen if k >= 1]
        if not seen:
            return None
        base = next((r for k, r, _ in seen if k == 0), None)
        if not spec:            # only champion-alone rounds timed: prior slope
            alpha, beta = base, self.params["slope_prior"] * base
        elif len({k for k, _, _ in spec}) == 1:
            k0, r0, _ = spec[0]
            beta = r0 * self.params["slope_prior"] / (1 + self.params["slope_prior"] * k0)
            alpha = r0 - beta * k0
        else:                   # weighted least squares over the k >= 1 timed so far
            sw = sum(n for _, _, n in spec)
            mk = sum(n * k for k, _, n in spec) / sw
            mr = sum(n * r for _, r, n in spec) / sw
            beta = sum(n * (k - mk) * (r - mr) for k, r, n in spec) / sum(n * (k - mk) ** 2 for k, _, n in spec)
            beta = max(beta, 0.0)
            alpha = mr - beta * mk
        if base is None:        # never measured alone: one step costs at least the fitted intercept
            base = max(alpha, 1e-9)
        return [base] + [max(alpha + beta * k, 1e-9) for k in range(1, self.k_max + 1)]

    def best_k(self, cap: int, allow_zero: bool = True) -> int:
        costs = self.round_costs()
        if costs is None:
            return min(self.params["k_start"], cap)
        gain = self.expected_tokens()
        lo = 0 if allow_zero else min(1, cap)
        return max(range(lo, cap + 1), key=lambda k: (gain[k] / costs[k], -k))

    # ---- the scheduler interface ----
    def next_k(self, remaining: int) -> int:
        cap = max(0, min(self.k_max, remaining - 1))   # a round emits at most k + 1 tokens
        if cap == 0:
            return 0
        if self.rounds == 0:
            return min(self.params["k_start"], cap)
        if self.rounds == 1:    # a second k at once, so the cost's slope in k is measured, not assumed
            return min(self.params["k_second"], cap)
        if self.zero_streak >= self.params["probe_every"]:
            return self.best_k(cap, allow_zero=False)
        return self.best_k(cap)

    def observe(self, *, proposed: int, accepted: int, draft_ms: float, verify_ms: float,
                round_ms: float | None = None) -> None:
        d = self.params["decay"]
        self.rounds += 1
        self.zero_streak = self.zero_streak + 1 if proposed == 0 else 0
        if proposed > 0:
            for i in range(1, self.k_max + 1):
                self.reached[i] *= d
                self.taken[i] *= d
            for i in range(1, min(proposed, accepted + 1) + 1):   # positions 1..accepted+1 were judged
                self.reached[i] += 1
                self.taken[i] += i <= accepted
        if self.rounds == 1:    # the request's first round: not a cost sample (see the class doc)
            return
        window = self.costs[min(proposed, self.k_max)]
        window.append(round_ms if round_ms is not None else draft_ms + verify_ms)
        del window[:-self.params["cost_window"]]

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version, "k_max": self.k_max, **self.params}


def make_scheduler(config):
    """The scheduler a GenerationConfig asks for: `scheduler` "static" (k every round, the default)
    or "adaptive" (AdaptiveK with k_max = config.k)."""
    if getattr(config, "scheduler", "static") == "adaptive":
        return AdaptiveK(config.k)
    return StaticK(config.k)
