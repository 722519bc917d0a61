"""speculate "auto": per round, none, prompt lookup or the draft (and k), by expected cost per token.

Pure (no clock, no I/O, no NumPy): the orchestrator times rounds and tells `observe`; `choose`
runs every round in Pyodide, O(k_max). docs/core.md ("The auto policy") states the model:
  cost of a round    none: V(1) + o;  draft k: c*behind + k*d + V(k+1) + o;  lookup j: V(j+1) + o
                     (+ l, lookup's search, on every round that searched: all methods pay it;
                     c*behind, the draft's catch-up of the committed ids it has not consumed, is
                     paid by the round that drafts: the request's prompt too, since the draft is
                     not prefilled, so a request that never drafts never runs it)
  tokens of a round  E[G(k)] = 1 + S_1 + ... + S_k, S_i = a_1 ... a_i (per-position acceptance,
                     decayed counters with a prior, as scheduler.AdaptiveK)
V(n), d, c, l come from the calibration (measured at load, common.md §1), scaled by a drift
factor (observed / calibrated, median of the last `window` rounds); o (per-round overhead) is
learnt online. A speculative method is chosen only when its cost per token is below none's by
`margin`. Exploration is bounded: the draft is trusted after `probes_first` probe rounds, and every
probe's worst-case extra cost must fit `probe_fraction` of the request's time so far plus a start
allowance (`start_fraction` of min(the request's tokens, `start_horizon`) steps); each probe is
charged what it really cost.
Version 2: each V(n) and each method's overhead get their own estimates once measured; the engine
keeps the draft's acceptance across requests (`memory`, export_memory); a none that wins clearly is
held a few rounds without weighing the options again. Version 3: the draft starts unprefilled and
its catch-up is charged in full to the round that drafts (version 2 spread it over 32 tokens, as if
the draft then stayed in step; auto returns to none, and every return made it catch up again).
Lookup's acceptance is learnt from every round where it had a match (observe_lookup): the
committed tokens are champion-distributed whatever method ran, so comparing lookup's proposals
with them is an unbiased observation of its acceptance, for free. Version 4: a lookup match during
a hold of none ends the hold only when lookup alone would beat none by the margin (version 3 weighed
every round with a match in full: on the toy pair in the browser ~0.1 ms a round, 5-7% of its step),
and a hold that began with lookup known not to win even at k_max searches every
`lookup_search_every` rounds only. Version 5: a backend that chains baseline steps runs a held none
as one call (held_rounds, observe_chain; orchestrator.CHAIN_BUDGET_MS): lookup is searched and a
match weighed at the chain's start only, and the chain's time enters the estimates once, per step.
Version 6: a hold counts calls, not steps: each held none is a chain as long as the chain budget
allows (version 5 cut a chain where the hold's rounds ran out and weighed again: one more call and
event each time, ~0.5 ms on the toy pair's 1 ms step); where no chain runs, a round's choices are
version 4's. Version 7: above the largest n the calibration timed, V(n) grows at least
`min_slope_fraction` x V(1) a row (a slow device times only small n; a flat line there made every k
look as cheap as k = 1).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

METHODS = ("none", "draft", "lookup")
K_LIMIT = 8            # auto's k is at most min(8, the backend's max_k)
HELD_CHAIN = 1 << 16   # held_rounds() of a chaining backend's held none: its chain budget decides
DEFAULT_PARAMS = {
    "margin": 0.05,                    # a speculative method must beat none's cost per token by this
    "prior_accept_draft": 0.5, "prior_accept_lookup": 0.5, "prior_weight": 1.0,
    "decay": 0.95, "fast_decay": 0.8,  # acceptance counters: a_i = min(slow, fast) estimate
    "probe_fraction": 0.02,            # probes' budget: this fraction of the request's time so far,
    "start_fraction": 0.03, "start_horizon": 64,   # plus this fraction of min(tokens, horizon) steps
    "probe_k": 1, "probes_first": 5, "probe_gap": 8, "probe_min_remaining": 8,
    "lookup_evidence": 2.0,            # lookup is trusted after this many (decayed) observations
    "window": 9,                       # robust running estimates: median of the last `window` rounds
    "lookup_search_fraction": 0.1, "lookup_search_every": 8,
    "memory_weight": 4.0,              # the draft's acceptance carried into the engine's next request (rounds)
    "hold_rounds": 3, "hold_max": 16,  # none that wins by hold_margin: repeated this many rounds unweighed,
    "hold_margin": 0.1,                # doubling (to hold_max) while it keeps winning when weighed again
    "own_evidence": 3,                 # rounds after which a method's own overhead and V(n)'s own drift are used
    "min_slope_fraction": 0.125,       # above the largest n the calibration timed, V grows at least V(1) x this a row
}


@dataclass(frozen=True)
class Choice:
    method: str            # none | draft | lookup
    k: int                 # proposals this round (0 for none)
    info: dict             # the tokens event's round["auto"] object (common.md §2)


class _Recent:
    """A robust running estimate: the median of the last `window` values, computed when read
    (observe adds to several every round; choose reads them only on the rounds it weighs)."""

    def __init__(self, window: int):
        self.values, self._median, self._stale = deque(maxlen=window), None, False

    def add(self, x: float) -> None:
        self.values.append(float(x))
        self._stale = True

    def value(self):
        if self._stale:
            v = sorted(self.values)
            n = len(v)
            self._median = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
            self._stale = False
        return self._median


class _Acceptance:
    """Per-position decayed counters -> conditional acceptance a_i (unreached positions borrow
    a_{i-1}), at two speeds: a_i is the lower of the slow (`decay`) and fast (`fast_decay`)
    estimates, so a drop in acceptance is followed within a few rounds and a rise more slowly."""

    def __init__(self, k_max: int, prior: float, weight: float, decay: float, fast_decay: float):
        self.k_max, self.prior, self.weight = k_max, prior, weight
        self.decays = (decay, fast_decay)
        self.reached = [[0.0] * (k_max + 2) for _ in self.decays]
        self.taken = [[0.0] * (k_max + 2) for _ in self.decays]
        self._gains = None                  # (gains for k = 0..max(k_max, 1), a_1), until the next add

    def add(self, proposed: int, accepted: int) -> None:
        """A round that proposed `proposed` tokens and accepted the first `accepted` of them."""
        self._gains = None
        top = self.k_max + 1
        for reached, taken, d in zip(self.reached, self.taken, self.decays):
            reached[1:top] = [x * d for x in reached[1:top]]      # positions 1..k_max decay
            taken[1:top] = [x * d for x in taken[1:top]]
            for i in range(1, min(proposed, accepted + 1, self.k_max) + 1):
                reached[i] += 1.0
                taken[i] += 1.0 if i <= accepted else 0.0

    def evidence(self) -> float:
        return self.reached[0][1]

    def export(self, weight: float) -> dict:
        """The slow counters scaled to at most `weight` rounds of evidence: the prior of the
        engine's next request (AutoPolicy's memory)."""
        reached, taken = self.reached[0], self.taken[0]
        scale = min(1.0, weight / reached[1]) if reached[1] > 0 else 0.0
        return {"reached": [round(x * scale, 6) for x in reached], "taken": [round(x * scale, 6) for x in taken]}

    def seed(self, memory: dict) -> None:
        """Start both speeds' counters from an export() (positions beyond this k_max dropped)."""
        self._gains = None
        n = self.k_max + 2
        for j in (0, 1):
            self.reached[j] = (list(memory["reached"][:n]) + [0.0] * n)[:n]
            self.taken[j] = (list(memory["taken"][:n]) + [0.0] * n)[:n]

    def gains(self, k_top: int):
        """(E[G(k)] for k = 0..k_top (and beyond), a_1)."""
        if self._gains is None:
            self._gains = self._compute(max(self.k_max, 1))
        return self._gains

    def _compute(self, k_top: int):
        out, s, total, a1 = [1.0], 1.0, 1.0, None
        p0 = p1 = self.prior                  # the slow and the fast estimate of a_i, chained over i
        (r0, r1), (t0, t1), w = self.reached, self.taken, self.weight
        for i in range(1, k_top + 1):
            p0 = (t0[i] + w * p0) / (r0[i] + w)
            p1 = (t1[i] + w * p1) / (r1[i] + w)
            a = p1 if p1 < p0 else p0         # the lower of the two (the first on a tie, as min())
            a1 = a if a1 is None else a1
            s *= a
            total += s
            out.append(total)
        return out, a1


class AutoPolicy:
    """The auto policy of one request (see the module doc). `calibration`: common.md §1's dict,
    or None (no measurement: speculation only after probes have timed it)."""

    name, version = "auto", 7

    def __init__(self, calibration, k_max: int, has_draft: bool, greedy: bool, memory=None, **params):
        unknown = set(params) - set(DEFAULT_PARAMS)
        if unknown:
            raise ValueError(f"unknown auto policy parameters: {sorted(unknown)}")
        self.params = {**DEFAULT_PARAMS, **params}
        p = self.params
        self.k_max = max(0, min(K_LIMIT, int(k_max)))
        self.has_draft, self.greedy = bool(has_draft), bool(greedy)
        self.calibration = calibration or None
        self.acc = {m: _Acceptance(self.k_max, p[f"prior_accept_{m}"], p["prior_weight"], p["decay"], p["fast_decay"])
                    for m in ("draft", "lookup")}
        w = p["window"]
        self.v_ratio, self.d_ratio, self.overhead, self.lookup_cost = _Recent(w), _Recent(w), _Recent(w), _Recent(w)
        self.v_seen = {}                      # n -> _Recent(verify_ms) (used when there is no calibration)
        self.v_ratio_n = {}                   # n -> _Recent(observed / calibrated V(n)): each n's own drift
        self.overhead_m = {m: _Recent(w) for m in METHODS}   # each method's own per-round overhead
        self.d_seen = _Recent(w)              # draft ms per (proposal + caught-up token), no calibration
        self.elapsed_ms = 0.0                 # the request's round time so far
        self.probe_spent_ms = 0.0
        self.start_remaining = None           # the tokens the request could still emit at its first choice
        self.rounds = 0
        self.rounds_since_search = 0
        self.rounds_since_draft = 1 << 30     # rounds since the last draft round (none yet: many)
        self.last_method = None
        self.rounds_by_method = {m: 0 for m in METHODS}
        self.switches = 0
        self._chosen = None                   # (method, k, reason) of the last choice
        self._probe_worst = 0.0               # the last probe's estimated worst-case extra (ms)
        self._hold, self._held = 0, None      # rounds left to repeat the held none choice, and it
        self._hold_len = self.params["hold_rounds"]   # the next hold's length (doubles while none keeps winning)
        self._holding = False                 # the none just chosen is held, or starts a hold
        self._hold_quiet = False              # the hold began with lookup known not to win: it searches less
        self.v_cal = self._calibrated_v()
        self.memory = memory if (memory and self.has_draft) else None
        self.memory_rounds = 0                # draft rounds the memory stands for (capped at probes_first)
        if self.memory is not None:
            self.acc["draft"].seed(self.memory["draft"])
            self.memory_rounds = min(int(self.memory["rounds"]), p["probes_first"])
            self.rounds_since_draft = 0       # the memory is the recent evidence: no probe at once

    # ---- costs ---------------------------------------------------------------------------
    def _calibrated_v(self):
        """V(n) for n = 0..k_max+1 from the calibration (sampled extra included), or None."""
        cal = self.calibration
        if not cal or not cal.get("verify_ms"):
            return None
        raw = list(cal["verify_ms"])
        timed = cal.get("measured_n")   # the n the device timed; the calibration fills the others in
        pts = [(n, float(v)) for n, v in enumerate(raw)
               if n >= 1 and v is not None and v > 0 and (timed is None or n in timed)]
        if not pts:
            return None
        extra = 0.0 if self.greedy else float(cal.get("verify_sampled_extra_ms_per_row") or 0.0)
        if len(pts) == 1:               # one point says nothing of V's slope: the other n are learnt
            return [None] + [pts[0][1] + extra * n if n == pts[0][0] else None for n in range(1, self.k_max + 2)]
        # above the largest timed n the line through the two largest, but never flatter than
        # min_slope_fraction x V(1) a row (version 7): a slow device times only small n (SwiftShader,
        # test-split run #10: V(1) and V(2), both 118 ms under contention), and a flat line there made
        # k = 8 look as cheap as k = 1 (auto drafted k = 8 at acceptance 0: 1.28x against k = 4's 1.63x)
        (n_top, v_top), floor = pts[-1], self.params["min_slope_fraction"] * pts[0][1]
        slope = max((v_top - pts[-2][1]) / (n_top - pts[-2][0]), floor)
        return [None] + [(_interpolate(pts, n) if n <= n_top else v_top + slope * (n - n_top)) + extra * n
                         for n in range(1, self.k_max + 2)]

    def _verify(self, n: int):
        """Estimated champion time for n verified rows, or None when unknown. The calibrated V(n)
        is scaled by its own drift once `own_evidence` rounds verified n rows, else by the median drift."""
        ratio = self.v_ratio.value() or 1.0
        if self.v_cal is not None and self.v_cal[n] is not None:
            own = self.v_ratio_n.get(n)
            if own is not None and len(own.values) >= self.params["own_evidence"]:
                ratio = own.value()
            return self.v_cal[n] * ratio
        pts = [(m, r.value()) for m, r in sorted(self.v_seen.items())]
        if self.v_cal is not None:      # calibrated points (drift-scaled) beside the observed ones
            seen = {m for m, _ in pts}
            pts = sorted(pts + [(m, v * ratio) for m, v in enumerate(self.v_cal) if v is not None and m not in seen])
        if not pts or (len(pts) == 1 and pts[0][0] != n):
            return None
        return _interpolate(pts, n)

    def _verify_upto(self, top: int, v1):
        """[None, V(1), ..., V(top)] as _verify gives them (v1: V(1), already estimated): the
        calibrated points' loop inlined, since choose needs them every round it weighs."""
        out = [None, v1]
        if self.v_cal is None:
            return out + [self._verify(n) for n in range(2, top + 1)]
        ratio = self.v_ratio.value() or 1.0
        own_n, evidence, v_cal = self.v_ratio_n, self.params["own_evidence"], self.v_cal
        for n in range(2, top + 1):
            if v_cal[n] is None:
                out.append(self._verify(n))
                continue
            own = own_n.get(n)
            out.append(v_cal[n] * (own.value() if own is not None and len(own.values) >= evidence else ratio))
        return out

    def _draft_cost(self, k: int, behind: int):
        cal = self.calibration or {}
        d, c = cal.get("draft_ms_per_proposal"), cal.get("draft_catchup_ms_per_token")
        if d is not None:
            c = d if c is None else c
            return (c * behind + d * k) * (self.d_ratio.value() or 1.0)
        per = self.d_seen.value()
        return None if per is None else per * (k + behind)

    def _overhead(self, method: str) -> float:
        """Per-round time outside the champion, the draft and the search: the method's own median
        once it ran `own_evidence` rounds (a speculative round costs more than its V and d), else
        the median of all rounds."""
        own = self.overhead_m[method]
        if len(own.values) >= self.params["own_evidence"]:
            return own.value()
        return self.overhead.value() or 0.0

    def _lookup_ms(self) -> float:
        l = (self.calibration or {}).get("lookup_ms")
        return float(l) if l is not None else (self.lookup_cost.value() or 0.0)

    def wants_lookup(self) -> bool:
        """Should the orchestrator search for lookup's proposals this round? Yes while the search
        is cheap (<= lookup_search_fraction of a step) or lookup won the last round, else every
        lookup_search_every rounds (its acceptance stays observed); during a hold of none that began
        with lookup known not to win even with a match of k_max, every lookup_search_every rounds too."""
        due = self.rounds_since_search >= self.params["lookup_search_every"]
        if self._hold and self._hold_quiet:
            return due
        if due or self.last_method == "lookup":     # yes whatever the costs say: not estimated
            return True
        v1 = self._verify(1)
        if v1 is None or not self.lookup_cost.values and (self.calibration or {}).get("lookup_ms") is None:
            return True
        return self._lookup_ms() <= self.params["lookup_search_fraction"] * v1

    # ---- the choice --------------------------------------------------------------------------
    def choose(self, remaining: int, lookup_len: int, draft_behind: int, searched: bool = True) -> Choice:
        """This round's method and k. lookup_len: how many proposals lookup has now (0: no
        match); draft_behind: committed tokens the draft has not consumed; searched: whether
        lookup searched this round (its cost is then paid whatever runs)."""
        p = self.params
        if self.start_remaining is None:
            self.start_remaining = remaining
        # none by a wide margin: not weighed again yet, unless lookup has a match that beats none alone
        if self._hold and remaining > 1 and not (lookup_len and self._lookup_wins(remaining, lookup_len, searched)):
            self._hold -= 1
            if not self._hold:
                self._hold_len = min(2 * self._hold_len, p["hold_max"])
            held = self._held
            reason = held.info["reason"]
            if reason in ("no_match", "no_draft"):     # which: whether lookup searched, matched now
                reason = "cheapest" if lookup_len else "no_match" if searched else "no_draft"
                if reason != held.info["reason"]:
                    return self._pick("none", 0, reason, held.info, holding=True)
            self._chosen = ("none", 0, reason)      # the held choice itself (a Choice is immutable)
            self._holding = True
            return held
        if self._hold:                  # lookup's match beats none during a hold: weigh all, from a short hold again
            self._hold, self._hold_len = 0, p["hold_rounds"]
        cap = max(0, min(self.k_max, remaining - 1))       # a round emits at most k + 1 tokens
        o = self.overhead.value() or 0.0
        sunk = self._lookup_ms() if searched else 0.0
        v1 = self._verify(1)
        none_cost = None if v1 is None else v1 + self._overhead("none") + sunk
        cpt = {"none": none_cost, "draft": None, "lookup": None}
        gain = {"draft": None, "lookup": None}
        best_k = {"draft": 0, "lookup": 0}
        a1 = {}
        verify = self._verify_upto(cap + 1, v1)     # V(n), n <= cap + 1
        per_proposal = self._draft_cost(1, 0) if self.has_draft else None   # the draft's cost is linear in k
        for method, top in (("draft", cap if self.has_draft else 0), ("lookup", min(cap, lookup_len))):
            g, a1[method] = self.acc[method].gains(max(top, 1))
            if top < 1 or none_cost is None:
                continue
            # the draft's catch-up (the ids it has not consumed) is paid by the round that drafts
            catchup = (self._draft_cost(0, draft_behind) if method == "draft" else 0.0)
            if catchup is None or (method == "draft" and per_proposal is None):
                continue
            oh = self._overhead(method)
            for k in range(1, top + 1):
                v = verify[k + 1]
                if v is None:
                    continue
                extra = per_proposal * k if method == "draft" else 0.0
                per = (v + extra + catchup + oh + sunk) / g[k]
                if cpt[method] is None or per < cpt[method]:
                    cpt[method], gain[method], best_k[method] = per, g[k], k
        info = {"cost_per_token_ms": {m: _r(v) for m, v in cpt.items()},
                "expected_tokens": {m: _r(v) for m, v in gain.items()},
                "acceptance": {m: _r(a1.get(m)) if (m == "lookup" and lookup_len) or (m == "draft" and self.has_draft)
                               else None for m in ("draft", "lookup")}}
        if cap < 1:
            return self._pick("none", 0, "last_token", info)
        # a draft observed in fewer than probes_first rounds of this request is explored by
        # (budgeted) probes, not chosen on its prior
        # lookup, whose acceptance is observed for free, once it was observed twice
        known = {"draft": self._draft_rounds() >= p["probes_first"],
                 "lookup": self.acc["lookup"].evidence() >= p["lookup_evidence"]}
        spec = [(cpt[m], m) for m in ("draft", "lookup") if cpt[m] is not None and known[m]]
        if spec and none_cost is not None:
            per, method = min(spec)
            if per < none_cost * (1.0 - p["margin"]):
                return self._pick(method, best_k[method], "cheapest", info)
            reason = "margin" if per < none_cost else "cheapest"
        elif self.has_draft or lookup_len:
            reason = "cheapest"          # a method exists, its costs or evidence do not yet
        else:
            reason = "no_match" if searched else "no_draft"
        probe = self._probe(cap, lookup_len, draft_behind, none_cost, o, sunk, best_k["draft"], verify)
        if probe is not None:
            return self._pick(probe[0], probe[1], "probe", info)
        held = self._pick("none", 0, reason, info)
        if none_cost is not None and reason != "margin" and (not spec or min(spec)[0] >= none_cost * (1.0 + p["hold_margin"])):
            self._hold, self._held = self._hold_len, held      # the next rounds repeat it unless lookup matches
            self._holding = True
            # and lookup searches only every lookup_search_every rounds if not even a match of k_max could win
            self._hold_quiet = (self.acc["lookup"].evidence() >= p["lookup_evidence"]
                                and not self._lookup_wins(remaining, self.k_max, searched))
        else:
            self._hold_len = p["hold_rounds"]
        return held

    def _lookup_wins(self, remaining: int, lookup_len: int, searched: bool) -> bool:
        """During a hold: would lookup's match, once its acceptance is known, beat none by the
        margin at some k <= its length (the costs choose would give it)? Only then is the round
        weighed in full; a match that cannot win leaves the hold running."""
        p = self.params
        top = min(self.k_max, remaining - 1, lookup_len)
        if top < 1 or self.acc["lookup"].evidence() < p["lookup_evidence"]:
            return False
        v1 = self._verify(1)
        if v1 is None:
            return True
        sunk = self._lookup_ms() if searched else 0.0
        bar = (v1 + self._overhead("none") + sunk) * (1.0 - p["margin"])
        g, oh = self.acc["lookup"].gains(top)[0], self._overhead("lookup")
        for k in range(1, top + 1):
            v = self._verify(k + 1)
            if v is None or (v + oh + sunk) / g[k] < bar:
                return True
        return False

    def _probe(self, cap, lookup_len, behind, none_cost, o, sunk, draft_k=0, verify=None):
        """(method, k) of a probe that fits the budget, or None. A probe is a draft round while the
        draft has fewer than probes_first rounds in this request (they ramp up: probe_k, 2x, 4x, ...
        as far as the estimate's best k and the budget allow), a draft round at probe_k once it has
        not run for probe_gap rounds (acceptance may have changed), or a lookup round whose verify
        cost was never timed. Every probe's worst case must fit the budget: probe_fraction of the
        time so far, plus a start allowance of start_fraction of min(the request's tokens,
        start_horizon) steps; each is charged what it really cost. verify: this choice's V(n) for
        n <= cap + 1 (choose computes them once; None: computed here)."""
        p = self.params
        if verify is None:
            verify = [None] + [self._verify(n) for n in range(1, cap + 2)]
        if none_cost is None or cap + 1 < p["probe_min_remaining"]:   # no step timed yet, or too late
            return None
        first = (self._draft_rounds() if self.has_draft else self.rounds_by_method["lookup"]) < p["probes_first"]
        if self.has_draft:
            if not first and self.rounds_since_draft < p["probe_gap"]:
                return None                     # the draft's evidence is recent: no probe needed
            method, top = "draft", min(p["probe_k"], cap)
            if first:
                top = min(cap, max(top, min(draft_k, p["probe_k"] << self._draft_rounds())))
        elif lookup_len and verify[min(p["probe_k"], cap, lookup_len) + 1] is None:
            method, top = "lookup", min(p["probe_k"], cap, lookup_len)
        else:
            return None
        if not self._could_pay(method, cap, none_cost, o, sunk, verify):
            return None                         # not even with every proposal accepted
        # the start allowance funds the first probes; once the engine's memory has them, only
        # probe_fraction of the time so far funds re-probes, unless the calibration left V's slope
        # unknown (one timed n): the memory holds acceptance, not costs, and a request that never
        # probes never learns what a draft round costs (test-split run #3, SwiftShader's WebGPU)
        start = p["start_fraction"] * min(self.start_remaining, p["start_horizon"]) * none_cost
        if self.memory_rounds >= p["probes_first"] and self._slope_calibrated():
            start = 0.0
        budget = p["probe_fraction"] * self.elapsed_ms - self.probe_spent_ms + start
        for k in range(top, 0, -1):
            worst = self._worst_extra(method, k, behind, none_cost, o, sunk, verify)
            if worst <= budget:
                self._probe_worst = worst
                return method, k
        return None

    def _slope_calibrated(self) -> bool:
        """Whether the calibration timed V at two n or more (its slope is measured)."""
        return self.v_cal is not None and sum(v is not None for v in self.v_cal[1:]) >= 2

    def _draft_rounds(self) -> int:
        """Draft rounds behind the draft's acceptance estimate: this request's and the memory's."""
        return self.rounds_by_method["draft"] + self.memory_rounds

    def _could_pay(self, method, cap, none_cost, o, sunk, verify) -> bool:
        """Whether some k would beat none by the margin if every proposal were accepted (costs
        unknown: yes, probing is how they are learnt). verify: V(n) for n <= cap + 1."""
        bar = none_cost * (1.0 - self.params["margin"])
        for k in range(1, cap + 1):
            v = verify[k + 1]
            extra = self._draft_cost(k, 0) if method == "draft" else 0.0
            if v is None or extra is None:
                return True
            if (v + extra + o + sunk) / (k + 1) < bar:
                return True
        return False

    def _worst_extra(self, method, k, behind, none_cost, o, sunk, verify) -> float:
        """A probe's extra cost over a champion-alone step if nothing is accepted (estimated;
        unknown costs: a step's worth per proposal). verify: V(n) for n <= k + 1."""
        base = none_cost if none_cost is not None else (self.overhead.value() or 0.0)
        v = verify[k + 1]
        v1 = verify[1]
        if v is None or v1 is None:
            step = v1 if v1 is not None else 0.0
            v = step * (1.0 + 0.5 * k)
        extra = self._draft_cost(k, behind) if method == "draft" else 0.0
        if extra is None:
            extra = (v1 or 0.0) * 0.25 * (k + behind)
        return max(0.0, v + extra + o + sunk - base)

    def _pick(self, method, k, reason, info, holding=False) -> Choice:
        if method != "none":
            self._hold_len = self.params["hold_rounds"]
        self._chosen = (method, k, reason)
        self._holding = holding
        return Choice(method, k, {"method": method, "k": k, **info, "reason": reason})

    def held_rounds(self) -> int:
        """Rounds the none just chosen is still held for after this one (0: weighed again next
        round): the orchestrator may run them with this one as a chain of baseline steps. Since
        version 6 a hold counts calls: a held none's chain is as long as the orchestrator's budget
        allows (HELD_CHAIN), and it is one round of the hold (a backend that does not chain runs
        one step a call: the same rounds)."""
        chosen = self._chosen
        return HELD_CHAIN if chosen is not None and chosen[0] == "none" and self._holding else 0

    # ---- what happened -------------------------------------------------------------------------
    def observe_chain(self, steps: int, round_ms: float, verify_ms: float, *, lookup_ms=None) -> None:
        """`steps` baseline steps run as one call for the none just chosen and the hold's next
        rounds (held_rounds): counted as that many none rounds; the hold counts the call as one of
        its rounds, which choose counted (version 5 consumed a hold round a step);
        their time enters the running estimates once, per step (round_ms, verify_ms: the chain's
        totals; lookup_ms: the search before it, or None)."""
        if steps == 1:
            return self.observe("none", 0, 0, 0, round_ms, 0.0, verify_ms, lookup_ms=lookup_ms)
        first = self.rounds == 0
        self.rounds += steps
        self.rounds_by_method["none"] += steps
        if self.last_method is not None and self.last_method != "none":
            self.switches += 1
        self.last_method = "none"
        self.rounds_since_search = steps - 1 if lookup_ms is not None else self.rounds_since_search + steps
        self.rounds_since_draft += steps
        self._chosen = None
        self.elapsed_ms += round_ms
        if first:                             # the request's first round times nothing (observe)
            return
        if lookup_ms is not None:
            self.lookup_cost.add(lookup_ms)
        outside = max(0.0, round_ms - verify_ms - (lookup_ms or 0.0)) / steps
        self.overhead.add(outside)
        self.overhead_m["none"].add(outside)
        step = verify_ms / steps
        if self.v_cal is not None and len(self.v_cal) > 1 and self.v_cal[1]:
            self.v_ratio.add(step / self.v_cal[1])
            own = self.v_ratio_n.get(1)
            if own is None:
                own = self.v_ratio_n[1] = _Recent(self.params["window"])
            own.add(step / self.v_cal[1])
        else:
            self.v_seen.setdefault(1, _Recent(self.params["window"])).add(step)

    def observe(self, method: str, k: int, proposed: int, accepted: int, round_ms: float, draft_ms: float,
                verify_ms: float, *, lookup_ms=None, draft_behind: int = 0, emitted: int = 1,
                block_rows=None) -> None:
        """A round that ran `method` with k: its proposals, acceptance and times (ms). lookup_ms:
        the orchestrator's lookup search time this round (None: no search); emitted: tokens it
        committed; block_rows: the rows the champion's block held when not proposed + 1 (a
        response_format's forced ids ride in it: its time is V(block_rows)'s). The request's first
        round times nothing (a backend may run deferred prompt work in it)."""
        self.rounds += 1
        self.rounds_by_method[method] += 1
        if self.last_method is not None and method != self.last_method:
            self.switches += 1
        self.last_method = method
        self.rounds_since_search = 0 if lookup_ms is not None else self.rounds_since_search + 1
        self.rounds_since_draft = 0 if method == "draft" else self.rounds_since_draft + 1
        if method == "draft" and proposed > 0:
            self.acc["draft"].add(proposed, accepted)
        chosen = self._chosen
        if chosen is not None and chosen[2] == "probe":
            none_cost = self._verify(1)
            # realised extra over champion alone for the tokens it gave (a winning probe costs nothing)
            if none_cost is not None and self.rounds > 1:
                self.probe_spent_ms += max(0.0, round_ms - emitted * (none_cost + (self.overhead.value() or 0.0)))
            else:
                self.probe_spent_ms += self._probe_worst
        self._chosen = None
        self.elapsed_ms += round_ms
        if self.rounds == 1:
            return
        n = block_rows if block_rows is not None else proposed + 1
        if lookup_ms is not None:
            self.lookup_cost.add(lookup_ms)
        outside = max(0.0, round_ms - draft_ms - verify_ms - (lookup_ms or 0.0))
        self.overhead.add(outside)
        self.overhead_m[method].add(outside)
        if self.v_cal is not None and n < len(self.v_cal) and self.v_cal[n]:
            self.v_ratio.add(verify_ms / self.v_cal[n])
            own = self.v_ratio_n.get(n)
            if own is None:
                own = self.v_ratio_n[n] = _Recent(self.params["window"])
            own.add(verify_ms / self.v_cal[n])
        else:
            self.v_seen.setdefault(n, _Recent(self.params["window"])).add(verify_ms)
        if method == "draft" and proposed > 0:
            cal = self.calibration or {}
            d, c = cal.get("draft_ms_per_proposal"), cal.get("draft_catchup_ms_per_token")
            if d is not None:
                model = (d if c is None else c) * draft_behind + d * proposed
                if model > 0:
                    self.d_ratio.add(draft_ms / model)
            else:
                self.d_seen.add(draft_ms / (proposed + draft_behind))

    def observe_lookup(self, proposals, emitted) -> None:
        """Lookup's proposals for a round (computed before it) against the tokens the round
        committed: position i was reached if the earlier ones matched and the round committed an
        i-th token; it was accepted if it matched."""
        if not proposals:
            return
        reached, accepted = 0, 0
        for y, t in zip(proposals, emitted):
            reached += 1
            if y != t:
                break
            accepted += 1
        if reached:
            self.acc["lookup"].add(reached, accepted)

    # ---- reports -----------------------------------------------------------------------------
    def drift(self):
        """Observed / calibrated champion step time (median of recent rounds), or None."""
        v = self.v_ratio.value()
        return None if v is None else round(v, 4)

    def stats(self) -> dict:
        """The result's stats.auto (common.md §2)."""
        return {"policy": self.name, "version": self.version, "rounds_by_method": dict(self.rounds_by_method),
                "switches": self.switches, "drift": self.drift(),
                "calibration_key": (self.calibration or {}).get("key"), "memory_rounds": self.memory_rounds}

    def export_memory(self):
        """What the engine's next request with the same sampling policy starts from: the draft's
        acceptance (at most `memory_weight` rounds of evidence) and how many draft rounds stand
        behind it; when this request ran no draft round, the memory it started from (or None)."""
        rounds = self._draft_rounds()
        if not self.has_draft or rounds == 0:
            return self.memory
        return {"draft": self.acc["draft"].export(self.params["memory_weight"]), "rounds": rounds}

    def describe(self) -> dict:
        """The canonical policy the receipt hashes: name, version, parameters, and the
        calibration's key and values (not when or how long it was measured)."""
        cal = self.calibration
        bound = None
        if cal:
            bound = {f: cal.get(f) for f in ("key", "backend", "verify_ms", "verify_sampled_extra_ms_per_row",
                                             "measured_n", "draft_ms_per_proposal", "draft_catchup_ms_per_token",
                                             "lookup_ms")}
        return {"name": self.name, "version": self.version, "k_max": self.k_max, "has_draft": self.has_draft,
                "greedy": self.greedy, **self.params, "calibration": bound, "memory": self.memory}


def _interpolate(points, n):
    """Linear through the (n, value) points, sorted by n; extrapolated from the nearest two."""
    points = sorted(points)
    if len(points) == 1:
        return points[0][1]
    for (n0, v0), (n1, v1) in zip(points, points[1:]):
        if n <= n1:
            break
    if n < n0:
        (n0, v0), (n1, v1) = points[0], points[1]
    return max(v0 + (v1 - v0) * (n - n0) / (n1 - n0), 1e-9)


def _r(x):
    return None if x is None else round(x, 4)
