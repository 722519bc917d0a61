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
