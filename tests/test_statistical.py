"""Monte Carlo tests: sampled outputs follow the champion's processed distribution.

Fixed seeds make every test deterministic. Each goodness-of-fit test uses a chi-square test on
the joint of the first two tokens; the family-wise false-alarm rate is ALPHA_FAMILY, split by
Bonferroni over the N_TESTS correct-variant tests (a correct implementation fails any one of
them with probability < ALPHA_FAMILY / N_TESTS). Broken variants must be rejected at that level.

That the speculative rounds are exact, and that broken rounds (a residual from p_target, a greedy
draft that reports its sampled row, no rejection test) change the distribution, is proved exactly
in test_exact_enumeration.py. What only this file checks: the float64 processing path (temperature,
top-k, top-p, penalty, masks) on NumPy runners, and, once, that this chi-square harness has the
power to reject a broken round at ALPHA (test_broken_residual_is_rejected), so that its passes
mean something.
"""
import numpy as np
import pytest
from scipy import stats

from exactspec.core import acceptance
from exactspec.core.orchestrator import GenerationConfig
from exactspec.reference.processors import AllowedSetGrammar, SamplingPolicy
from toy_helpers import champion_first_two, make_orchestrator

V, SEED, HIDDEN, SCALE = 12, 3, 8, 2.5
N_SAMPLES = 2000
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]

POLICIES = {
    "plain": SamplingPolicy(temperature=1.0),
    "temperature": SamplingPolicy(temperature=0.6),
    "top_k": SamplingPolicy(temperature=1.0, top_k=4),
    "top_p": SamplingPolicy(temperature=1.0, top_p=0.7),
    "penalty": SamplingPolicy(temperature=1.0, repetition_penalty=1.5),
    "mask": SamplingPolicy(temperature=1.0, grammar=AllowedSetGrammar(range(8)), suppress_token_ids=(3,)),
    "combined": SamplingPolicy(temperature=0.8, top_k=6, top_p=0.9, repetition_penalty=1.2),
}
MODES = [("draft", 3), ("lookup", 3)]
N_TESTS = len(POLICIES) * len(MODES) + 1
ALPHA_FAMILY = 1e-3
ALPHA = ALPHA_FAMILY / N_TESTS


def chi_square_pvalue(samples, expected_probs):
    """Chi-square GOF; cells with expected count < 5 are pooled into one."""
    n = len(samples)
    counts = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for cell, p in expected_probs.items():
        if p * n >= 5:
            observed.append(counts.pop(cell, 0))
            expected.append(p * n)
        else:
            pooled_o += counts.pop(cell, 0)
            pooled_e += p * n
    pooled_o += sum(counts.values())  # outcomes the champion gives probability 0
    if pooled_e > 0 or pooled_o > 0:
        if pooled_e == 0:
            return 0.0
        observed.append(pooled_o)
        expected.append(pooled_e)
    expected = np.array(expected) * (n / sum(expected))
    return stats.chisquare(observed, expected).pvalue


def sample_first_two(mode, k, policy, draft_policy=None, n=N_SAMPLES):
    orch = make_orchestrator(V, SEED, overlap=0.5, hidden=HIDDEN, scale=SCALE)
    out = []
    for seed in range(n):
        cfg = GenerationConfig(max_new_tokens=2, policy=policy, draft_policy=draft_policy,
                               speculate=mode, k=k, seed=seed)
        out.append(tuple(orch.generate(PROMPT, cfg).token_ids))
    return out


@pytest.mark.parametrize("mode,k", MODES)
@pytest.mark.parametrize("name", list(POLICIES))
def test_speculative_samples_follow_champion(name, mode, k):
    policy = POLICIES[name]
    expected = champion_first_two(V, SEED, HIDDEN, SCALE, PROMPT, policy)
    samples = sample_first_two(mode, k, policy)
    assert all(s in expected for s in samples), "sampled a token the champion forbids"
    assert chi_square_pvalue(samples, expected) > ALPHA


def test_draft_with_its_own_policy_is_still_exact():
    policy = POLICIES["temperature"]
    expected = champion_first_two(V, SEED, HIDDEN, SCALE, PROMPT, policy)
    samples = sample_first_two("draft", 3, policy, draft_policy=SamplingPolicy(temperature=1.5, top_k=5))
    assert chi_square_pvalue(samples, expected) > ALPHA


def test_broken_residual_is_rejected(monkeypatch):
    monkeypatch.setattr(acceptance, "residual_weights", lambda p_target, p_draft: p_target.copy())
    policy = POLICIES["plain"]
    expected = champion_first_two(V, SEED, HIDDEN, SCALE, PROMPT, policy)
    assert chi_square_pvalue(sample_first_two("draft", 3, policy), expected) < ALPHA
