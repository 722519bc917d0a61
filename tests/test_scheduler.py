"""The k schedulers: static k, the adaptive policy's estimates and choices, and exactness with it on."""
import pytest

from exactspec.core import orchestrator as orch_module
from exactspec.pyodide.browser_backend import config_from_json
from exactspec.core.deciders import enumerate_outcomes
from exactspec.core.errors import E_BAD_ARGUMENT, ExactSpecError
from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.reference.processors import SamplingPolicy
from exactspec.core.scheduler import AdaptiveK, StaticK, make_scheduler
from exactspec.reference.toy import ExactChampion, ExactDraft
from exact_models import distinct_rows, table_dist
from test_exact_enumeration import champion_sequence_distribution
from toy_helpers import make_orchestrator


def test_static_k_is_capped_by_remaining():
    s = StaticK(4)
    assert [s.next_k(r) for r in (10, 4, 2)] == [4, 4, 2]
    assert s.describe() == {"name": "static-k", "version": 1, "k": 4}


def test_make_scheduler_follows_the_config():
    assert isinstance(make_scheduler(GenerationConfig(k=5)), StaticK)
    adaptive = make_scheduler(GenerationConfig(k=8, scheduler="adaptive"))
    assert isinstance(adaptive, AdaptiveK) and adaptive.k_max == 8
    assert adaptive.describe()["name"] == "adaptive-k" and adaptive.describe()["version"] == 3
    assert (adaptive.describe()["k_start"], adaptive.describe()["k_second"]) == (1, 3)


def test_acceptance_survival_and_expected_tokens_exact():
    s = AdaptiveK(3, decay=1.0, prior_accept=0.5, prior_weight=1.0)
    s.observe(proposed=2, accepted=1, draft_ms=1, verify_ms=1, round_ms=5)
    # a1 = (1 + 0.5)/2, a2 = (0 + a1)/2 (rejected there), a3 never reached: (0 + a2)/1
    assert s.acceptance() == [1.0, 0.75, 0.375, 0.375]
    assert s.expected_tokens() == [1.0, 1.75, 2.03125, 2.13671875]


def test_round_costs_fit_a_line_over_k_and_keep_k0_measured():
    s = AdaptiveK(4, decay=1.0)
    # the first round carries deferred prompt work on some backends: never a cost sample
    for k, ms in [(1, 500.0), (0, 10.0), (2, 14.0), (4, 18.0), (2, 14.0)]:
        s.observe(proposed=k, accepted=0, draft_ms=0, verify_ms=0, round_ms=ms)
    assert s.round_costs() == [10.0, 12.0, 14.0, 16.0, 18.0]


def test_round_cost_of_a_k_is_robust_to_a_first_use_spike():
    assert AdaptiveK.robust([700.0]) == 700.0
    assert AdaptiveK.robust([700.0, 80.0]) == 80.0               # fewer than 3: the minimum
    assert AdaptiveK.robust([700.0, 80.0, 82.0, 81.0]) == 82.0   # else the median
    s = AdaptiveK(2, cost_window=3)
    for ms in (5000.0, 700.0, 80.0, 82.0, 81.0, 90.0):          # 5000: the request's first round, left out
        s.observe(proposed=2, accepted=0, draft_ms=0, verify_ms=0, round_ms=ms)
    assert s.costs[2] == [82.0, 81.0, 90.0]                      # the last cost_window only
    first = AdaptiveK(2)
    first.observe(proposed=1, accepted=1, draft_ms=0, verify_ms=0, round_ms=500.0)
    assert first.costs == [[], [], []] and first.round_costs() is None and first.acceptance()[1] > 0.5


def _drive(s, rounds, accept, cost, remaining=100):
    """Run the scheduler against a synthetic world: accept(k) accepted, cost(k) ms a round."""
    ks = []
    for _ in range(rounds):
        k = s.next_k(remaining)
        ks.append(k)
        s.observe(proposed=k, accepted=accept(k), draft_ms=0, verify_ms=0, round_ms=cost(k))
    return ks


def test_always_accepted_and_cheap_proposals_go_to_k_max():
    ks = _drive(AdaptiveK(8), 30, accept=lambda k: k, cost=lambda k: 10 + 1.0 * k)
    assert ks[:2] == [1, 3] and ks[-5:] == [8] * 5


def test_never_accepted_turns_speculation_off_and_probes():
    s = AdaptiveK(8, k_start=4, k_second=2, prior_accept=0.6, prior_weight=1.0, probe_every=8)
    ks = _drive(s, 40, accept=lambda k: 0, cost=lambda k: 10 + 3.0 * k)
    assert ks[0] == 4
    tail = ks[2:]
    # off, with one probe at k = 1 after every 8 rounds at k = 0 (so a stratum can win speculation back)
    assert tail == ([0] * 8 + [1]) * 4 + [0, 0]


@pytest.mark.parametrize("per_proposal_ms,on", [(6.0, False), (1.0, True)])
def test_cost_of_proposals_decides_whether_to_speculate(per_proposal_ms, on):
    """a_1 = 3/4, a_2 = 2/3, a_3 = 1/2, a_4 = 1 at k = 4; a step alone costs 10 ms."""
    s = AdaptiveK(8, decay=1.0)
    for _ in range(50):
        for n in (0, 1, 2, 4):
            s.observe(proposed=4, accepted=n, draft_ms=0, verify_ms=0, round_ms=10 + per_proposal_ms * 4)
        s.observe(proposed=0, accepted=0, draft_ms=0, verify_ms=0, round_ms=10.0)
    gain, cost = s.expected_tokens(), s.round_costs()
    k = s.next_k(100)
    assert k == max(range(9), key=lambda j: (gain[j] / cost[j], -j))
    assert (k > 0) == on


def test_cap_leaves_room_for_the_round_token():
    s = AdaptiveK(8, k_start=4)
    assert s.next_k(1) == 0 and s.next_k(3) == 2


def test_same_observations_same_decisions():
    a, b = AdaptiveK(6), AdaptiveK(6)
    world = dict(accept=lambda k: k // 2, cost=lambda k: 7 + 2.5 * k)
    assert _drive(a, 25, **world) == _drive(b, 25, **world)


def test_scheduler_option_is_validated_everywhere():
    with pytest.raises(ExactSpecError) as e:
        GenerationConfig(scheduler="fastest").validate(40)
    assert e.value.code == E_BAD_ARGUMENT and "scheduler" in e.value.message
    assert config_from_json({"config": {"scheduler": "adaptive", "k": 8}}, [1]).scheduler == "adaptive"
    with pytest.raises(ExactSpecError):
        config_from_json({"config": {"scheduler": 3}}, [1])


# --- exactness with the adaptive scheduler on -----------------------------------------------------
class _TimedByModel(AdaptiveK):
    """AdaptiveK fed a cost model instead of the wall clock, so that enumeration replays are
    deterministic; its k still follows the acceptance history of each branch."""
    used: set = set()

    def next_k(self, remaining):
        k = super().next_k(remaining)
        _TimedByModel.used.add(k)
        return k

    def observe(self, *, proposed, accepted, draft_ms, verify_ms, round_ms=None):
        super().observe(proposed=proposed, accepted=accepted, draft_ms=0, verify_ms=0, round_ms=1.0 + 0.45 * proposed)


@pytest.mark.parametrize("V,n_tokens", [(3, 4), (4, 3)])
def test_adaptive_scheduler_keeps_the_exact_distribution(monkeypatch, V, n_tokens):
    monkeypatch.setattr(orch_module, "make_scheduler", lambda cfg: _TimedByModel(cfg.k, k_start=2, probe_every=1))
    _TimedByModel.used = set()
    rows = distinct_rows(V)
    champion_dist, draft_dist = table_dist(V, rows, salt=11), table_dist(V, rows[::-1], salt=29)
    orch = Orchestrator(ExactChampion(V, champion_dist), ExactDraft(V, draft_dist))
    prompt, stop = [1 % V, V - 1], (0,)
    cfg = GenerationConfig(max_new_tokens=n_tokens, policy=SamplingPolicy(temperature=1.0), speculate="draft", k=3,
                           stop_token_ids=stop, scheduler="adaptive")

    def run(decider):
        r = orch.generate(prompt, cfg, decider=decider)
        return tuple(r.token_ids), r.finish_reason
    got = enumerate_outcomes(run)
    assert got == champion_sequence_distribution(champion_dist, prompt, n_tokens, set(stop))
    assert len(_TimedByModel.used) >= 2    # k really varied across branches


@pytest.mark.parametrize("mode", ["draft", "lookup"])
def test_adaptive_greedy_equals_champion_alone(mode):
    greedy = SamplingPolicy(temperature=0)
    for seed in range(4):
        orch = make_orchestrator(40, seed, overlap=(0.2, 0.9)[seed % 2])
        prompt = [3, 4, 5, 3, 4, 5, 3][: 3 + seed]
        alone = orch.generate(prompt, GenerationConfig(max_new_tokens=30, policy=greedy, speculate="none"))
        events = []
        spec = orch.generate(prompt, GenerationConfig(max_new_tokens=30, policy=greedy, speculate=mode, k=8,
                                                      scheduler="adaptive"), on_event=events.append)
        assert spec.token_ids == alone.token_ids and spec.finish_reason == alone.finish_reason
        assert spec.receipt["scheduler_policy_hash"] != alone.receipt["scheduler_policy_hash"]
        assert max(e["payload"]["round"]["proposed"] for e in events if e["kind"] == "tokens") <= 8


# --- exactness with speculate="auto": method and k chosen per branch ----------------------------
from exactspec.core import backends as backends_module
from exactspec.core.auto_policy import AutoPolicy
from exactspec.core.backends import LookupProposer, ReferenceChampion

AUTO_CAL = {"version": 1, "key": "enumeration", "verify_ms": [None] + [1.0 + 0.1 * (n - 1) for n in range(1, 10)],
            "verify_sampled_extra_ms_per_row": 0.0, "measured_n": [1, 9], "draft_ms_per_proposal": 0.2,
            "draft_catchup_ms_per_token": 0.02, "lookup_ms": 0.0}


class _ModelTimedAuto(AutoPolicy):
    """AutoPolicy fed the calibration's own cost model instead of the wall clock, so that enumeration
    replays are deterministic; its choices still follow each branch's acceptance history."""
    used: set = set()

    def choose(self, remaining, lookup_len, draft_behind, searched=True):
        c = super().choose(remaining, lookup_len, draft_behind, searched)
        _ModelTimedAuto.used.add((c.method, c.k))
        return c

    def observe(self, method, k, proposed, accepted, round_ms, draft_ms, verify_ms, *, lookup_ms=None,
                draft_behind=0, emitted=1, block_rows=None):
        draft = 0.2 * proposed + 0.02 * draft_behind if method == "draft" else 0.0
        verify = 1.0 + 0.1 * proposed
        super().observe(method, k, proposed, accepted, draft + verify + 0.05, draft, verify,
                        lookup_ms=None if lookup_ms is None else 0.0, draft_behind=draft_behind, emitted=emitted,
                        block_rows=block_rows)


class _RotatingAuto(_ModelTimedAuto):
    """Forces every method, k and switch the branches allow: the method and k follow a hash of the
    branch's acceptance history (lookup when it has proposals, the draft, champion alone)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.history = 0

    def choose(self, remaining, lookup_len, draft_behind, searched=True):
        cap = min(self.k_max, remaining - 1)
        method = ("draft", "lookup", "none")[(self.rounds + self.history + 1) % 3] if cap >= 1 else "none"
        if method == "lookup" and not lookup_len:
            method = "draft"
        top = min(cap, lookup_len) if method == "lookup" else cap
        k = 0 if method == "none" else min(top, 2) if self.rounds == 0 else 1 + self.history % top
        _ModelTimedAuto.used.add((method, k))
        return self._pick(method, k, "probe", {})

    def observe(self, method, k, proposed, accepted, *args, **kw):
        self.history = self.history * 3 + accepted + 1
        super().observe(method, k, proposed, accepted, *args, **kw)


class _WrongLookup(LookupProposer):
    """Prompt lookup whose proposals are deliberately wrong where it has a match (+1 mod V), and
    which always proposes something, so lookup rounds happen on every branch that chooses them."""

    def proposals(self, tokens, k, stop_token_ids):
        real = super().proposals(tokens, k, stop_token_ids)
        return [(t + 1) % self.vocab_size for t in real] or [tokens[-1]]


def _auto_distribution(monkeypatch, policy_cls, V, n_tokens, wrong_lookup, **params):
    monkeypatch.setattr(orch_module, "make_auto_policy",
                        lambda cal, k_max, has_draft, greedy, memory=None: policy_cls(AUTO_CAL, k_max, has_draft, greedy, **params))
    rows = distinct_rows(V)
    champion_dist, draft_dist = table_dist(V, rows, salt=11), table_dist(V, rows[::-1], salt=29)
    orch = Orchestrator(ExactChampion(V, champion_dist), ExactDraft(V, draft_dist))
    if wrong_lookup:
        orch.lookup = _WrongLookup(V)
    prompt, stop = [1 % V, V - 1, 1 % V], (0,)
    cfg = GenerationConfig(max_new_tokens=n_tokens, policy=SamplingPolicy(temperature=1.0), speculate="auto",
                           stop_token_ids=stop)
    switches = []

    def run(decider):
        r = orch.generate(prompt, cfg, decider=decider)
        switches.append(r.stats["auto"]["switches"])
        return tuple(r.token_ids), r.finish_reason
    return enumerate_outcomes(run), champion_sequence_distribution(champion_dist, prompt, n_tokens, set(stop)), switches


@pytest.mark.parametrize("V,n_tokens", [(3, 4), (4, 4)])
@pytest.mark.parametrize("wrong_lookup", [False, True])
def test_auto_rotating_methods_keep_the_exact_distribution(monkeypatch, V, n_tokens, wrong_lookup):
    """Every branch switches among lookup (right or deliberately wrong proposals), the draft and
    champion alone with k varying: the answer's distribution is the champion's, exactly."""
    _ModelTimedAuto.used = set()
    got, expected, switches = _auto_distribution(monkeypatch, _RotatingAuto, V, n_tokens, wrong_lookup)
    assert sum(got.values()) == 1 and got == expected
    assert {m for m, _ in _ModelTimedAuto.used} == {"none", "draft", "lookup"}
    assert max(k for _, k in _ModelTimedAuto.used) >= 2 and max(switches) >= 2


@pytest.mark.parametrize("V,n_tokens", [(3, 4), (4, 3)])
def test_auto_policy_choices_keep_the_exact_distribution(monkeypatch, V, n_tokens):
    """The auto policy's own choices (probes, then its cost model; lookup trusted after one
    observation), deliberately wrong lookup proposals included."""
    _ModelTimedAuto.used = set()
    got, expected, switches = _auto_distribution(monkeypatch, _ModelTimedAuto, V, n_tokens, True,
                                                 probes_first=1, probe_min_remaining=0, lookup_evidence=1.0)
    assert got == expected
    assert len({m for m, _ in _ModelTimedAuto.used}) >= 2 and max(switches) >= 1


def test_auto_broken_variant_is_caught(monkeypatch):
    """A plausible bug of a session that mixes methods: deciding lookup's one-hot rounds greedily
    (accept iff the proposal is the champion's argmax) while sampling. Enumeration catches it."""
    real = ReferenceChampion.decide

    def greedy_for_one_hot(self, rows, p_draft_rows, proposals, decider, round_id, stop, remaining, greedy):
        one_hot = bool(p_draft_rows) and all(max(r) == 1 for r in p_draft_rows)
        return real(self, rows, p_draft_rows, proposals, decider, round_id, stop, remaining, greedy or one_hot)
    got, expected, _ = _auto_distribution(monkeypatch, _RotatingAuto, 3, 4, True)
    assert got == expected
    monkeypatch.setattr(ReferenceChampion, "decide", greedy_for_one_hot)
    got, expected, _ = _auto_distribution(monkeypatch, _RotatingAuto, 3, 4, True)
    assert got != expected
