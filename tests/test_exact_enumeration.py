"""Exhaustive enumeration with exact Fractions: speculative output distribution == champion's."""
from fractions import Fraction as F
import itertools

import pytest

from exactspec.core import acceptance
from exactspec.core.deciders import enumerate_outcomes
from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.reference.processors import SamplingPolicy
from exactspec.core.rng import DRAFT_SAMPLE
from exactspec.reference.toy import ExactChampion, ExactDraft
from exact_models import distinct_rows, edge_case_rows, generic_rows, table_dist

EOS = 0


def all_distributions(V, denominator):
    """Every distribution over V tokens with probabilities in multiples of 1/denominator."""
    for parts in itertools.product(range(denominator + 1), repeat=V):
        if sum(parts) == denominator:
            yield [F(x, denominator) for x in parts]


def one_round(p_target_rows, p_draft_rows, k, stop=frozenset(), remaining=None):
    """Draft k tokens i.i.d. per position from p_draft_rows[i], then the exact stochastic round."""
    remaining = remaining or 10 ** 6

    def run(decider):
        proposals = []
        for i in range(k):
            y = decider.categorical(p_draft_rows[i], DRAFT_SAMPLE, 0, i)
            proposals.append(y)
            if y in stop:
                break
        m = len(proposals)
        d = acceptance.stochastic_round(p_target_rows[:m + 1], p_draft_rows[:m], proposals, decider, 0,
                                        stop, remaining)
        emitted = tuple(proposals[:d.n_accepted]) + ((d.next_token,) if d.next_token is not None else ())
        return emitted, d.rejected_at, d.ended_by
    return enumerate_outcomes(run)


def overlap(p, q):
    return sum(min(a, b) for a, b in zip(p, q))


# --- one position, every pair of small distributions ------------------------------------------
@pytest.mark.parametrize("V,denominator", [(2, 6), (3, 4)])
def test_single_position_all_pairs(V, denominator):
    dists = list(all_distributions(V, denominator))
    n_pairs = 0
    for q in dists:
        for p in dists:
            outcomes = one_round([q, q], [p], 1)
            first = [F(0)] * V
            for (emitted, _, _), prob in outcomes.items():
                first[emitted[0]] += prob
            assert first == q, (q, p, first)
            reject = sum(prob for (_, rej, _), prob in outcomes.items() if rej == 0)
            assert reject == 1 - overlap(p, q)
            n_pairs += 1
    assert n_pairs == len(dists) ** 2


@pytest.mark.parametrize("V", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_round_edge_cases_first_rejection_closed_form(V, k):
    """Per-position fixed rows: P(first rejection at j) = S_{j-1}(1 - A_j), P(all) = S_k, and the
    first emitted token is distributed exactly as p_target_1."""
    cases = list(edge_case_rows(V).values())
    for combo in itertools.islice(itertools.product(cases, repeat=k), 40):
        q_rows = [c[0] for c in combo] + [combo[-1][0]]
        p_rows = [c[1] for c in combo]
        outcomes = one_round(q_rows, p_rows, k)
        assert sum(outcomes.values()) == 1
        survival = F(1)
        for j in range(k):
            a_j = overlap(p_rows[j], q_rows[j])
            got = sum(pr for (_, rej, _), pr in outcomes.items() if rej == j)
            assert got == survival * (1 - a_j)
            survival *= a_j
        assert sum(pr for (_, rej, _), pr in outcomes.items() if rej is None) == survival
        first = [F(0)] * V
        for (emitted, _, _), prob in outcomes.items():
            first[emitted[0]] += prob
        assert first == q_rows[0]


def test_emitted_prefix_is_champion_distributed_per_position():
    """With position-wise fixed rows the champion's joint is a product; each emitted prefix of
    length L has probability prod q_i(t_i) times P(round emits >= L | prefix) — check by summing
    the exact joint of rounds continued until 2 tokens exist (second round uses row q_1 again)."""
    V = 3
    q = [F(1, 2), F(1, 3), F(1, 6)]
    p = [F(1, 6), F(1, 2), F(1, 3)]
    outcomes = one_round([q, q, q], [p, p], 2)
    # P(first two tokens = (a, b)) where a second round (fresh, row q) fills in when only 1 emitted
    joint = {}
    for (emitted, _, _), prob in outcomes.items():
        if len(emitted) >= 2:
            joint[emitted[:2]] = joint.get(emitted[:2], F(0)) + prob
        else:
            for b in range(V):
                key = (emitted[0], b)
                joint[key] = joint.get(key, F(0)) + prob * q[b]
    for a in range(V):
        for b in range(V):
            assert joint.get((a, b), F(0)) == q[a] * q[b]


# --- the whole orchestrator: every output sequence, exactly ------------------------------------
def champion_sequence_distribution(dist, prompt, n_tokens, stop):
    """Exact champion-alone distribution over (token_ids, finish_reason), computed directly."""
    out = {}

    def walk(context, emitted, prob):
        if len(emitted) == n_tokens:
            out[(tuple(emitted), "length")] = out.get((tuple(emitted), "length"), F(0)) + prob
            return
        for x, px in enumerate(dist(tuple(context))):
            if px == 0:
                continue
            if x in stop:
                key = (tuple(emitted + [x]), "eos")
                out[key] = out.get(key, F(0)) + prob * px
            else:
                walk(context + [x], emitted + [x], prob * px)
    walk(list(prompt), [], F(1))
    return out


def orchestrated_distribution(orch, prompt, config):
    def run(decider):
        r = orch.generate(prompt, config, decider=decider)
        return tuple(r.token_ids), r.finish_reason
    return enumerate_outcomes(run)


MATRIX = [(V, k, n) for V, n in [(2, 4), (3, 3), (4, 3), (5, 2), (6, 2)] for k in (1, 2, 3)]


@pytest.mark.parametrize("V,k,n_tokens", MATRIX)
def test_orchestrator_draft_mode_exact(V, k, n_tokens):
    rows = distinct_rows(V)
    champion_dist = table_dist(V, rows, salt=11)
    draft_dist = table_dist(V, rows[::-1], salt=29)
    stop = (EOS,) if V > 2 else ()
    orch = Orchestrator(ExactChampion(V, champion_dist), ExactDraft(V, draft_dist))
    prompt = [1 % V, (V - 1)]
    policy = SamplingPolicy(temperature=1.0)
    cfg = GenerationConfig(max_new_tokens=n_tokens, policy=policy, speculate="draft", k=k, stop_token_ids=stop)
    expected = champion_sequence_distribution(champion_dist, prompt, n_tokens, set(stop))
    got = orchestrated_distribution(orch, prompt, cfg)
    assert sum(got.values()) == 1
    assert len(expected) >= V  # a non-degenerate champion: many possible answers
    assert got == expected
    alone = orchestrated_distribution(orch, prompt, GenerationConfig(
        max_new_tokens=n_tokens, policy=policy, speculate="none", stop_token_ids=stop))
    assert alone == expected


@pytest.mark.parametrize("V,k", [(3, 1), (3, 3), (4, 2), (5, 3)])
def test_orchestrator_lookup_mode_exact(V, k):
    champion_dist = table_dist(V, distinct_rows(V), salt=5)
    orch = Orchestrator(ExactChampion(V, champion_dist))
    prompt = [1, 2, 1, 2, 1] if V > 2 else [1, 0, 1]
    n_tokens = 3
    cfg = GenerationConfig(max_new_tokens=n_tokens, policy=SamplingPolicy(), speculate="lookup", k=k,
                           stop_token_ids=(EOS,))
    got = orchestrated_distribution(orch, prompt, cfg)
    assert got == champion_sequence_distribution(champion_dist, prompt, n_tokens, {EOS})


# --- deliberately wrong variants must be caught ------------------------------------------------
def _draft_mode_distribution(V=4, k=2, n_tokens=2):
    rows = distinct_rows(V)
    champion_dist = table_dist(V, rows, salt=11)
    draft_dist = table_dist(V, rows[::-1], salt=29)
    orch = Orchestrator(ExactChampion(V, champion_dist), ExactDraft(V, draft_dist))
    cfg = GenerationConfig(max_new_tokens=n_tokens, policy=SamplingPolicy(), speculate="draft", k=k)
    return orchestrated_distribution(orch, [1, 2], cfg), champion_sequence_distribution(champion_dist, [1, 2], n_tokens, set())


def test_broken_residual_from_p_target_is_detected(monkeypatch):
    got, expected = _draft_mode_distribution()
    assert got == expected
    monkeypatch.setattr(acceptance, "residual_weights", lambda p_target, p_draft: list(p_target))
    got, expected = _draft_mode_distribution()
    assert got != expected
    worst = max(abs(got.get(key, 0) - expected.get(key, 0)) for key in set(got) | set(expected))
    assert worst > F(1, 100)


def test_broken_greedy_draft_while_sampling_is_detected(monkeypatch):
    """The draft proposes its argmax but reports its sampled distribution as p_draft."""
    def greedy_propose(self, cache, k, policy, decider, round_id, stop_token_ids):
        from exactspec.core.backends import Proposal
        out = Proposal()
        for i in range(k):
            p_draft = self.dist_fn(tuple(cache.tokens))
            y = max(range(len(p_draft)), key=lambda x: (p_draft[x], -x))
            out.tokens.append(y)
            out.p_draft_rows.append(p_draft)
            cache.append_provisional([y])
        cache.mark_materialized(len(cache.tokens) - 1)
        return out
    monkeypatch.setattr(ExactDraft, "propose", greedy_propose)
    got, expected = _draft_mode_distribution()
    assert got != expected


def test_broken_skip_rejection_is_detected(monkeypatch):
    """Accepting every proposal (no min(1, q/p) test) is caught."""
    real = acceptance.stochastic_round

    def always_accept(p_target_rows, p_draft_rows, proposals, decider, *args):
        class Yes:
            def bernoulli(self, *a):
                return True

            def categorical(self, *a):
                return decider.categorical(*a)
        return real(p_target_rows, p_draft_rows, proposals, Yes(), *args)
    monkeypatch.setattr(acceptance, "stochastic_round", always_accept)
    got, expected = _draft_mode_distribution()
    assert got != expected
