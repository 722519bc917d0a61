"""Tests for exactspec.reference.processors: each declared step, the order, errors, HF equivalence, properties."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tolerances import within

from exactspec.core.errors import E_BAD_ARGUMENT, E_PROCESSOR_INVALID, ExactSpecError
from exactspec.reference.processors import (PROCESSORS_VERSION, AllowedSetGrammar, Grammar, SamplingPolicy, argmax_tie_low,
                                  process_logits, process_logits_batch)

NEG_INF = -math.inf


def run(logits, context=(), **policy):
    return process_logits(np.array(logits, dtype=np.float64), list(context), SamplingPolicy(**policy))


def softmax(xs):
    m = max(x for x in xs if x != NEG_INF)
    e = [math.exp(x - m) if x != NEG_INF else 0.0 for x in xs]
    return [v / sum(e) for v in e]


def log(probs):
    with np.errstate(divide="ignore"):
        return np.log(probs)


def coded(code, fn, *args, **kwargs) -> ExactSpecError:
    with pytest.raises(ExactSpecError) as e:
        fn(*args, **kwargs)
    assert e.value.code == code
    return e.value


# ---------------------------------------------------------------- each step on hand-computed vectors
def test_plain_softmax_and_neg_inf_input():
    assert within(run([0.0, math.log(3.0)]), [0.25, 0.75], "processors_f64")
    assert np.array_equal(run([0.0, 0.0, NEG_INF, 0.0, 0.0]), [0.25, 0.25, 0.0, 0.25, 0.25])


def test_step1_nan_or_pos_inf_is_coded():
    coded(E_PROCESSOR_INVALID, run, [0.0, math.nan])
    coded(E_PROCESSOR_INVALID, run, [0.0, math.inf])
    coded(E_PROCESSOR_INVALID, run, [NEG_INF, NEG_INF])


def test_step2_suppression():
    assert within(run([0.0, 9.0, 0.0, 0.0], suppress_token_ids=(1,)), [1 / 3, 0, 1 / 3, 1 / 3], "processors_f64")
    coded(E_PROCESSOR_INVALID, run, [1.0, 2.0], suppress_token_ids=(0, 1))


def test_step3_grammar_mask():
    g = AllowedSetGrammar({0, 2})
    assert within(run([0.0, 5.0, math.log(3.0), 1.0], grammar=g), [0.25, 0, 0.75, 0], "processors_f64")
    e = coded(E_PROCESSOR_INVALID, run, [0.0, 5.0, NEG_INF], grammar=AllowedSetGrammar({2}))
    assert "no valid token" in e.message
    coded(E_PROCESSOR_INVALID, run, [0.0, 1.0, 2.0], grammar=AllowedSetGrammar(()))


def test_step4_repetition_penalty_hf_convention():
    # ids 0 (logit 2 > 0: divide) and 1 (logit -1 <= 0: multiply) are in context; repeats count once.
    got = run([2.0, -1.0, 0.5, 3.0], context=[0, 1, 1, 0], repetition_penalty=2.0)
    assert within(got, softmax([1.0, -2.0, 0.5, 3.0]), "processors_f64")
    assert np.array_equal(run([0.0, 0.0], context=[0], repetition_penalty=3.0), [0.5, 0.5])   # 0 stays 0


def test_step5_greedy_and_ties():
    assert np.array_equal(run([1.0, 3.0, 3.0, 2.0], temperature=0.0), [0, 1, 0, 0])
    assert np.array_equal(run([1.0, 3.0, 3.0, 2.0], temperature=0.0, suppress_token_ids=(1,)), [0, 0, 1, 0])
    assert np.array_equal(run([NEG_INF, -5.0, NEG_INF], temperature=0.0), [0, 1, 0])
    # greedy stops: top-k / top-p are not applied afterwards
    assert np.array_equal(run([5.0, 1.0], temperature=0.0, top_k=1, top_p=0.1), [1, 0])


def test_step5_temperature():
    assert within(run([0.0, math.log(2.0)], temperature=0.5), [0.2, 0.8], "processors_f64")
    assert within(run([0.0, math.log(4.0)], temperature=2.0), [1 / 3, 2 / 3], "processors_f64")


def test_step6_top_k_exactly_k_with_ties():
    assert np.array_equal(run([1.0, 3.0, 3.0, 2.0, 3.0], top_k=2), [0, 0.5, 0.5, 0, 0])
    assert np.array_equal(run([1.0, 3.0, 3.0, 2.0, 3.0], top_k=1), [0, 1, 0, 0, 0])
    assert within(run([0.0, 1.0, 2.0], top_k=3), softmax([0.0, 1.0, 2.0]), "processors_f64")   # k >= V: off
    assert within(run([0.0, 1.0, NEG_INF], top_k=5), softmax([0.0, 1.0, NEG_INF]), "processors_f64")


def test_step8_top_p():
    halves = [math.log(p) for p in (0.5, 0.25, 0.125, 0.125)]
    assert within(run(halves, top_p=0.4), [1, 0, 0, 0], "processors_f64")
    assert within(run(halves, top_p=0.7), [2 / 3, 1 / 3, 0, 0], "processors_f64")
    assert within(run(halves, top_p=0.8), [4 / 7, 2 / 7, 1 / 7, 0], "processors_f64")
    # exact boundary: uniform probs are exact (1/4), cumulative 0.25, 0.5 -> 0.5 >= 0.5 stops at 2; ties -> low ids
    assert np.array_equal(run([0.0] * 4, top_p=0.5), [0.5, 0.5, 0, 0])
    assert np.array_equal(run([0.0] * 4, top_p=0.5000001), [1 / 3, 1 / 3, 1 / 3, 0])
    assert np.array_equal(run([0.0, 0.0, 0.0, 0.0], top_p=1e-9), [1, 0, 0, 0])             # at least one


# ---------------------------------------------------------------- the declared order matters
def test_order_top_k_before_top_p():
    logits = [math.log(p) for p in (0.5, 0.3, 0.2)]
    ours = run(logits, top_k=2, top_p=0.6)                          # top-k renormalises to (.625, .375)
    assert np.array_equal(ours, [1, 0, 0])
    other = run(log(run(logits, top_p=0.6)), top_k=2)             # top-p first would keep two
    assert within(other, [0.625, 0.375, 0], "processors_f64")


def test_order_penalty_before_top_k_and_greedy():
    assert np.array_equal(run([2.0, 1.9, 0.0], context=[0], repetition_penalty=2.0, top_k=1), [0, 1, 0])
    assert np.array_equal(run([2.0, 1.9, 0.0], top_k=1), [1, 0, 0])   # top-k first would then keep id 0
    assert np.array_equal(run([2.0, 1.9], context=[0], repetition_penalty=2.0, temperature=0.0), [0, 1])


def test_order_suppression_before_top_k():
    assert np.array_equal(run([3.0, 2.0, 1.0], suppress_token_ids=(0,), top_k=1), [0, 1, 0])


def test_order_temperature_before_top_p():
    logits = [math.log(p) for p in (0.5, 0.3, 0.2)]
    ours = run(logits, temperature=2.0, top_p=0.75)                 # flattened: cum .416, .737 < .75 -> keep 3
    assert np.count_nonzero(ours) == 3
    other = run(log(run(logits, top_p=0.75)), temperature=2.0)    # top-p first keeps 2
    assert np.count_nonzero(other) == 2


# ---------------------------------------------------------------- overflow and validation
def test_overflow_is_coded_not_silent():
    coded(E_PROCESSOR_INVALID, run, [1e300, 0.0], temperature=1e-10)
    coded(E_PROCESSOR_INVALID, run, [1e300, 0.0], context=[0], repetition_penalty=1e-10)


@pytest.mark.parametrize("field,policy", [
    ("temperature", dict(temperature=-1.0)), ("temperature", dict(temperature=math.nan)),
    ("temperature", dict(temperature=math.inf)), ("temperature", dict(temperature="1")),
    ("top_k", dict(top_k=-1)), ("top_k", dict(top_k=1.5)), ("top_k", dict(top_k=True)),
    ("top_p", dict(top_p=0.0)), ("top_p", dict(top_p=1.5)), ("top_p", dict(top_p=math.nan)),
    ("repetition_penalty", dict(repetition_penalty=0.0)), ("repetition_penalty", dict(repetition_penalty=-2.0)),
    ("repetition_penalty", dict(repetition_penalty=math.nan)),
    ("suppress_token_ids", dict(suppress_token_ids=(3,))), ("suppress_token_ids", dict(suppress_token_ids=(-1,))),
    ("grammar", dict(grammar=object())),
])
def test_validation_names_the_field(field, policy):
    e = coded(E_BAD_ARGUMENT, SamplingPolicy(**policy).validate, 3)
    assert e.detail["field"] == field and field in e.message
    coded(E_BAD_ARGUMENT, run, [0.0, 1.0, 2.0], **policy)


def test_bad_inputs_name_the_field():
    assert coded(E_BAD_ARGUMENT, run, [0.0, 1.0], context=[2]).detail["field"] == "context_ids"
    assert coded(E_BAD_ARGUMENT, run, [[0.0, 1.0]]).detail["field"] == "logits"
    assert coded(E_BAD_ARGUMENT, run, [0.0, 1.0], grammar=AllowedSetGrammar({5})).detail["field"] == "grammar"
    assert coded(E_BAD_ARGUMENT, SamplingPolicy().validate, 0).detail["field"] == "vocab_size"


# ---------------------------------------------------------------- canonical form, batch, argmax
def test_canonical_is_json_and_identifies_policy():
    a = SamplingPolicy(temperature=1, suppress_token_ids=[5, 2, 5], grammar=AllowedSetGrammar([3, 1]))
    b = SamplingPolicy(temperature=1.0, suppress_token_ids=(2, 5), grammar=AllowedSetGrammar({1, 3}))
    assert a.canonical() == b.canonical() and a.canonical_json() == b.canonical_json()
    c = a.canonical()
    assert c["processors_version"] == PROCESSORS_VERSION == "processors-v1"
    assert c["grammar"].startswith("allowed-set:sha256:") and c["suppress_token_ids"] == [2, 5]
    assert json.loads(json.dumps(c)) == c
    assert SamplingPolicy(grammar=AllowedSetGrammar([1, 2])).canonical() != a.canonical()
    assert isinstance(AllowedSetGrammar([1]), Grammar)


def test_batch_and_argmax():
    logits = np.array([[0.0, 1.0, 2.0], [2.0, 2.0, 0.0]])                    # (2, 3)
    policy = SamplingPolicy(top_k=2, repetition_penalty=1.5)
    out = process_logits_batch(logits, [[2], []], policy)                   # (2, 3)
    assert out.shape == (2, 3)
    assert np.array_equal(out[0], process_logits(logits[0], [2], policy))
    coded(E_BAD_ARGUMENT, process_logits_batch, logits, [[]], policy)
    assert argmax_tie_low([0.2, 0.4, 0.4]) == 1
    coded(E_PROCESSOR_INVALID, argmax_tie_low, [0.2, math.nan])


# ---------------------------------------------------------------- equivalence with Hugging Face warpers
def hf_probs(logits, context, temperature, top_k, top_p, penalty):
    import torch
    from transformers.generation import logits_process as hf
    scores = torch.tensor(logits, dtype=torch.float64)[None, :]             # (1, V)
    ids = torch.tensor([list(context)], dtype=torch.long)                   # (1, L)
    chain = [hf.RepetitionPenaltyLogitsProcessor(penalty=float(penalty))]
    if temperature != 1.0:
        chain.append(hf.TemperatureLogitsWarper(float(temperature)))
    if top_k:
        chain.append(hf.TopKLogitsWarper(top_k))
    if top_p < 1.0:
        chain.append(hf.TopPLogitsWarper(top_p))
    for proc in chain:
        scores = proc(ids, scores)
    return torch.softmax(scores, dim=-1)[0].numpy()


def _top_p_margin(probs_before_top_p, top_p):
    c = np.cumsum(np.sort(probs_before_top_p)[::-1])
    return np.min(np.abs(c - top_p))


def test_matches_hf_warpers_on_random_logits_without_ties():
    r = np.random.default_rng(7)
    checked = 0
    for trial in range(300):
        v = int(r.integers(2, 60))
        logits = r.normal(0, 3, v)                                          # continuous: no ties
        context = r.integers(0, v, int(r.integers(1, 8))).tolist()
        temperature = float(r.choice([1.0, r.uniform(0.2, 3.0)]))
        top_k = int(r.choice([0, r.integers(1, v + 1)]))
        top_p = float(r.choice([1.0, r.uniform(0.05, 0.999)]))
        penalty = float(r.choice([1.0, r.uniform(0.5, 2.5)]))
        pre = process_logits(logits, context, SamplingPolicy(temperature, top_k, 1.0, penalty))
        if top_p < 1.0 and _top_p_margin(pre, top_p) < 1e-9:
            continue                                                        # boundary: see docs/processors.md
        ours = process_logits(logits, context, SamplingPolicy(temperature, top_k, top_p, penalty))
        theirs = hf_probs(logits.tolist(), context, temperature, top_k, top_p, penalty)
        assert np.array_equal(ours > 0, theirs > 0), trial
        assert within(ours, theirs, "processors_vs_hf"), trial
        checked += 1
    assert checked > 280


def test_documented_difference_top_k_ties_vs_hf():
    logits = [1.0, 2.0, 2.0, 0.0]
    assert np.array_equal(run(logits, top_k=1), [0, 1, 0, 0])                # exactly k, lowest id wins
    assert within(hf_probs(logits, [0], 1.0, 1, 1.0, 1.0), [0, 0.5, 0.5, 0], "processors_vs_hf")   # HF keeps every tie


# ---------------------------------------------------------------- properties
@st.composite
def cases(draw):
    v = draw(st.integers(1, 24))
    logits = draw(st.lists(st.one_of(st.floats(-40, 40), st.just(NEG_INF)), min_size=v, max_size=v))
    ids = st.integers(0, v - 1)
    policy = SamplingPolicy(
        temperature=draw(st.one_of(st.just(0.0), st.just(1.0), st.floats(0.05, 5.0))),
        top_k=draw(st.integers(0, v + 2)),
        top_p=draw(st.one_of(st.just(1.0), st.floats(0.01, 1.0))),
        repetition_penalty=draw(st.one_of(st.just(1.0), st.floats(0.25, 4.0))),
        suppress_token_ids=tuple(draw(st.lists(ids, max_size=3))),
        grammar=draw(st.one_of(st.none(), st.builds(AllowedSetGrammar, st.sets(ids, max_size=v)))),
    )
    return np.array(logits), draw(st.lists(ids, max_size=6)), policy


@settings(max_examples=400, deadline=None)
@given(cases())
def test_properties(case):
    logits, context, policy = case
    candidates = np.isfinite(logits)
    candidates[list(policy.suppress_token_ids)] = False
    if policy.grammar is not None:
        allowed = np.zeros(logits.size, dtype=bool)
        allowed[list(policy.grammar.allowed)] = True
        candidates &= allowed
    if not candidates.any():
        coded(E_PROCESSOR_INVALID, process_logits, logits, context, policy)
        return
    probs = process_logits(logits, context, policy)
    assert probs.dtype == np.float64 and probs.shape == logits.shape
    assert np.all(probs >= 0) and abs(probs.sum() - 1.0) <= 1e-12
    assert not np.any(probs[~candidates] > 0)                                # support within allowed ids
    assert np.array_equal(probs, process_logits(logits.copy(), list(context), policy))   # deterministic
    if policy.temperature == 0:
        assert np.count_nonzero(probs) == 1
    if policy.top_k:
        assert np.count_nonzero(probs) <= policy.top_k
