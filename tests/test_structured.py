"""Structured output in the CPython reference: xgrammar masks on the toy pair's real tokenizer.

Greedy constrained output equals constrained champion alone in every mode; the answers fit their
constraint; forced ids open rounds and are verified in the champion's block (fewer champion calls,
the same tokens, bitwise the same samples in champion-alone mode at T = 1); lookup proposals the
constraint forbids are never offered; a dead end ends the answer with E_GRAMMAR_DEAD_END.
"""
import json
import os
import re

import jsonschema
import pytest

from exactspec.core.constraints import ConstraintGrammar, parse_response_format
from exactspec.core.errors import E_BAD_ARGUMENT, E_GRAMMAR_DEAD_END, ExactSpecError
from exactspec.core.orchestrator import GenerationConfig
from exactspec.core.policy import SamplingPolicy
from exactspec.reference.models import default_models_dir, load_pair

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "kind": {"enum": ["king", "prophet", "shepherd"]}},
          "required": ["name", "age", "kind"], "additionalProperties": False}
FORMATS = {
    "json_schema": {"type": "json_schema", "schema": SCHEMA},
    "regex": {"type": "regex", "pattern": r"(yes|no), the (king|lord) [a-z]{2,8}\."},
    "grammar": {"type": "grammar", "ebnf": 'root ::= "And " name " said, " ("Yea" | "Nay") "."\nname ::= [A-Z] [a-z]{1,8}'},
}


@pytest.fixture(scope="module")
def pair():
    base = default_models_dir()
    return load_pair(os.path.join(base, "champion"), os.path.join(base, "draft"), champion_weights="q8")


def config(pair, fmt, **kw):
    spec = parse_response_format(fmt)
    kw.setdefault("max_new_tokens", 64)
    policy = SamplingPolicy(temperature=kw.pop("temperature", 0.0), grammar=ConstraintGrammar(spec))
    return GenerationConfig(policy=policy, stop_token_ids=pair.stop_token_ids, prefix_reuse=False, **kw)


def prompt_ids(pair, text="And the king said unto the prophet"):
    return pair.tokenizer.encode(text, add_special_tokens=True)


def fits(fmt, text: str) -> bool:
    if fmt["type"] == "json_schema":
        jsonschema.validate(json.loads(text), fmt["schema"])
        return True
    if fmt["type"] == "regex":
        return re.fullmatch(fmt["pattern"], text) is not None
    return re.fullmatch(r"And [A-Z][a-z]{1,8} said, (Yea|Nay)\.", text) is not None


@pytest.mark.parametrize("name", list(FORMATS))
def test_greedy_constrained_output_equals_champion_alone_and_fits(pair, name):
    fmt, ids = FORMATS[name], prompt_ids(pair)
    alone = pair.orchestrator.generate(ids, config(pair, fmt, speculate="none"))
    assert alone.error is None and alone.finish_reason == "eos", (alone.finish_reason, alone.error, alone.text)
    assert fits(fmt, alone.text), alone.text
    assert alone.stats["forced"] > 0 and alone.stats["structured"]["type"] == name
    for mode in ("draft", "lookup", "auto"):
        res = pair.orchestrator.generate(ids, config(pair, fmt, speculate=mode, k=4))
        assert res.token_ids == alone.token_ids, mode
        assert res.receipt["grammar_hash"] == alone.receipt["grammar_hash"] != "none"
        assert res.receipt["forced_token_count"] == res.stats["forced"] > 0
        if mode == "auto":   # masked rows are not evidence that the device drifted: the engine is not told
            assert res.stats["auto"]["drift"] is None


def test_forced_ids_are_batched_into_the_champion_block(pair):
    fmt, ids = FORMATS["json_schema"], prompt_ids(pair)
    batched = pair.orchestrator.generate(ids, config(pair, fmt, speculate="none"))
    single = pair.orchestrator.generate(ids, config(pair, fmt, speculate="none", forced_batching=False))
    assert batched.token_ids == single.token_ids
    assert single.stats["forced"] == 0 and batched.stats["forced"] >= 10
    # every forced id saved one champion call
    assert batched.stats["target_calls"] == single.stats["target_calls"] - batched.stats["forced"]


def test_sampled_answers_are_bitwise_the_same_with_and_without_batching(pair):
    """Forced ids draw no randomness, and the decided rows keep their position's round id, so a
    sampled champion-alone answer is the same with forced batching on and off."""
    fmt, ids = FORMATS["regex"], prompt_ids(pair)
    for seed in range(6):
        on = pair.orchestrator.generate(ids, config(pair, fmt, speculate="none", temperature=1.0, seed=seed))
        off = pair.orchestrator.generate(ids, config(pair, fmt, speculate="none", temperature=1.0, seed=seed,
                                                     forced_batching=False))
        assert on.token_ids == off.token_ids and on.error is None
        if on.finish_reason == "eos":
            assert fits(fmt, on.text), on.text


def test_sampled_speculative_answers_fit_their_constraint(pair):
    for name, fmt in FORMATS.items():
        for seed in range(3):
            res = pair.orchestrator.generate(prompt_ids(pair), config(pair, fmt, speculate="draft", k=4,
                                                                      temperature=1.0, seed=seed, max_new_tokens=48))
            assert res.error is None, res.error
            if res.finish_reason == "eos":
                assert fits(fmt, res.text), (name, res.text)


def test_lookup_never_offers_what_the_constraint_forbids(pair):
    """The prompt holds text the constraint forbids after its own answer's start, so prompt lookup
    finds continuations that break it: every proposal a round offered is checked, in turn, against
    a fresh matcher of the same constraint."""
    fmt = FORMATS["json_schema"]
    ids = prompt_ids(pair, 'And the king said {"name": "Saul", "age": 40, "kind": "king", "wife": "Ahinoam"} and said {"name": "')
    orch = pair.orchestrator
    rounds = []
    begin = orch.champion.begin

    def spied(request, draft=None):
        session = begin(request, draft)
        real = session.round

        def round_(k, round_id, remaining, committed, proposals=None):
            before = list(session.champion_cache.committed_ids)
            out = real(k, round_id, remaining, committed, proposals)
            rounds.append((before, proposals, out))
            return out
        session.round = round_
        return session
    orch.champion.begin = spied
    try:
        res = orch.generate(ids, config(pair, fmt, speculate="lookup", k=6))
    finally:
        orch.champion.begin = begin
    assert res.error is None and res.stats["proposed"] > 0
    check = orch.constraints.compile(parse_response_format(fmt), pair.stop_token_ids).bind(len(ids))
    searched = offered = 0
    for before, given, out in rounds:
        context = before + list(out.forced)
        for y in out.proposals:
            assert check.accepts(context, y), (context[len(ids):], y)
            context.append(y)
        searched += len(given or ())
        offered += len(out.proposals)
    assert searched > offered      # lookup found continuations the constraint cut
    if res.finish_reason == "eos":
        assert fits(fmt, res.text), res.text


def test_a_dead_end_ends_the_answer_with_its_code(pair):
    """Suppress every id that could continue after the first word: the answer ends coded, with
    nothing outside the constraint."""
    fmt = {"type": "regex", "pattern": "(yes|no) [0-9]"}
    tok = pair.tokenizer
    digits = [i for i in range(tok.vocab_size) if any(c.isdigit() for c in tok.decode([i]))]
    spec = parse_response_format(fmt)
    policy = SamplingPolicy(temperature=0.0, grammar=ConstraintGrammar(spec), suppress_token_ids=tuple(digits))
    res = pair.orchestrator.generate(prompt_ids(pair), GenerationConfig(policy=policy, stop_token_ids=pair.stop_token_ids,
                                                                        speculate="none", max_new_tokens=10))
    assert res.finish_reason == "error" and res.error["code"] == E_GRAMMAR_DEAD_END, res.error
    assert re.fullmatch("(yes|no) ?", res.text) or res.text in ("", "y", "n", "ye"), res.text


def test_bad_constraints_are_refused_before_any_output(pair):
    ids = prompt_ids(pair)
    for fmt, words in (({"type": "grammar", "ebnf": 'root ::= missing_rule'}, "response_format"),
                       ({"type": "json_schema", "schema": {"type": "nonsense"}}, "response_format")):
        events = []
        with pytest.raises(ExactSpecError) as e:
            pair.orchestrator.generate(ids, config(pair, fmt), on_event=events.append)
        assert e.value.code == E_BAD_ARGUMENT and words in e.value.message and not events
    # no stop id: a constrained answer could not end
    policy = SamplingPolicy(temperature=0.0, grammar=ConstraintGrammar(parse_response_format(FORMATS["regex"])))
    with pytest.raises(ExactSpecError) as e:
        pair.orchestrator.generate(ids, GenerationConfig(policy=policy, stop_token_ids=()))
    assert "no stop token id" in e.value.message


def test_compiles_are_cached_per_constraint(pair):
    fmt = {"type": "json_schema", "schema": {**SCHEMA, "title": "cache probe"}}
    first = pair.orchestrator.generate(prompt_ids(pair), config(pair, fmt, max_new_tokens=4))
    second = pair.orchestrator.generate(prompt_ids(pair), config(pair, fmt, max_new_tokens=4))
    assert first.stats["structured"]["cached"] is False and second.stats["structured"]["cached"] is True
    assert first.stats["structured"]["compile_ms"] >= 0


def test_special_tokens_are_never_allowed_inside_a_constrained_answer(pair):
    """xgrammar reads `<|user|>` and its kind as plain text, so a JSON string could hold one (and a
    decode that skips special tokens would drop it): every position's mask excludes the special
    added tokens other than the stop ids, which stay allowed where the answer may end."""
    fmt = FORMATS["json_schema"]
    ids = prompt_ids(pair)
    res = pair.orchestrator.generate(ids, config(pair, fmt, speculate="none"))
    with open(os.path.join(default_models_dir(), "champion", "tokenizer.json")) as f:
        specials = [a["id"] for a in json.load(f)["added_tokens"] if a["special"]]
    stops = set(pair.stop_token_ids)
    bound = pair.orchestrator.constraints.compile(parse_response_format(fmt), pair.stop_token_ids).bind(len(ids))
    raw = pair.orchestrator.constraints.compile(parse_response_format(fmt), pair.stop_token_ids).matcher()
    inside = False
    for i in range(len(res.token_ids)):
        mask = bound.allowed_mask(ids + res.token_ids[:i], len(bound.allowed_mask(ids, 4096)))
        assert not any(mask[t] for t in specials if t not in stops), i
        raw_mask = raw.mask()
        inside |= any((int(raw_mask[t >> 5]) >> (t & 31)) & 1 for t in specials if t not in stops)
        raw.accept(res.token_ids[i])
    assert inside            # xgrammar alone would have allowed one somewhere: the exclusion is doing work
    assert any(bound.allowed_mask(ids + res.token_ids[:-1], 4096)[t] for t in stops)
