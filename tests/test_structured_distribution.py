"""Sampling under a regex constraint follows the champion's masked distribution q_G (spec: "Grammar and
deterministic opportunities"), with forced ids batched and the draft proposing under the same masks.

The toy pair's real tokenizer and xgrammar's masks. The exact distribution over whole answers is
enumerated: every token path the constraint allows, each step's probability from the champion's
processed, masked row (float64). Speculative answers (the draft at k = 4, and prompt lookup) are
compared with it by a chi-square test at a stated false-alarm rate; a deliberately broken round
(the draft's reported p_draft rows unmasked while its proposals are drawn under the mask: an
acceptance test against the wrong p) must be rejected at the same level, so a pass means something.
"""
import os
from dataclasses import replace

import numpy as np
import pytest

from exactspec.core.backends import RunnerDraft
from exactspec.core.constraints import ConstraintGrammar, parse_response_format
from exactspec.core.orchestrator import GenerationConfig
from exactspec.core.policy import SamplingPolicy
from exactspec.reference.models import default_models_dir, load_pair
from exactspec.reference.processors import process_logits
from test_statistical import chi_square_pvalue

REGEX = r"(yes|no|maybe), (the|a) (king|lord|man)\."
PROMPT = "And he answered and said,"
N_SAMPLES = 500
N_TESTS = 3                                  # two correct variants, one broken
ALPHA = 1e-3 / N_TESTS                       # family-wise false alarm 1e-3, Bonferroni


@pytest.fixture(scope="module")
def setup():
    base = default_models_dir()
    pair = load_pair(os.path.join(base, "champion"), os.path.join(base, "draft"), champion_weights="q8")
    spec = parse_response_format({"type": "regex", "pattern": REGEX})
    policy = SamplingPolicy(temperature=1.0, grammar=ConstraintGrammar(spec))
    ids = pair.tokenizer.encode(PROMPT, add_special_tokens=True)
    return pair, spec, policy, ids


def exact_answers(pair, spec, policy, ids) -> dict:
    """{answer token path (with its stop id): probability} over every path the constraint allows."""
    orch = pair.orchestrator
    bound = orch.constraints.compile(spec, pair.stop_token_ids).bind(len(ids))
    runner = orch.champion.runner
    stops = set(pair.stop_token_ids)
    bound_policy = replace(policy, grammar=bound)
    out = {}

    def walk(path, logits, p):
        # depth first: the runner holds the K/V of ids + path (a child writes only past it)
        context = list(ids) + path
        q = process_logits(logits, context, bound_policy)                            # (V,) masked q_G
        for y in np.flatnonzero(q):
            if y in stops:
                out[tuple(path + [int(y)])] = p * q[y]
            else:
                walk(path + [int(y)], runner.forward([int(y)], len(context))[-1], p * q[y])
    walk([], runner.forward(list(ids), 0)[-1], 1.0)
    assert abs(sum(out.values()) - 1.0) < 1e-9
    return out


def sample_answers(pair, policy, ids, mode, n=N_SAMPLES):
    out = []
    for seed in range(n):
        cfg = GenerationConfig(max_new_tokens=24, policy=policy, speculate=mode, k=4, seed=seed,
                               stop_token_ids=pair.stop_token_ids, prefix_reuse=False)
        res = pair.orchestrator.generate(ids, cfg)
        assert res.error is None and res.finish_reason == "eos", (res.finish_reason, res.error)
        out.append(tuple(res.token_ids))
    return out


@pytest.fixture(scope="module")
def expected(setup):
    pair, spec, policy, ids = setup
    return exact_answers(pair, spec, policy, ids)


@pytest.mark.parametrize("mode", ["draft", "lookup"])
def test_speculative_answers_follow_the_masked_champion(setup, expected, mode):
    pair, _spec, policy, ids = setup
    samples = sample_answers(pair, policy, ids, mode)
    assert all(s in expected for s in samples), "an answer outside the constraint"
    assert len(expected) > 10                      # many paths: the test has cells to compare
    assert chi_square_pvalue(samples, expected) > ALPHA


def test_a_draft_reporting_unmasked_rows_is_rejected(setup, expected, monkeypatch):
    """The broken variant: proposals drawn under the mask, p_draft reported without it."""
    pair, _spec, policy, ids = setup
    real = RunnerDraft.propose

    def broken(self, cache, k, draft_policy, decider, round_id, stop_token_ids, first_step=0):
        out = real(self, cache, k, draft_policy, decider, round_id, stop_token_ids, first_step)
        unmasked = replace(draft_policy, grammar=None)
        n = len(cache.tokens) - len(out.tokens)
        for i in range(len(out.tokens)):
            context = cache.tokens[:n + i]
            out.p_draft_rows[i] = process_logits(self.runner.forward(context, 0)[-1], context, unmasked)
        return out
    monkeypatch.setattr(RunnerDraft, "propose", broken)
    samples = sample_answers(pair, policy, ids, "draft")
    assert chi_square_pvalue(samples, expected) < ALPHA
