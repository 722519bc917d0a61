"""response_format parsing: canonical specs, identities, and hostile constraints refused with a code and a sentence."""
import json

import pytest

from exactspec.core.constraints import (MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, ConstraintGrammar, check_regex,
                                        constraint_of, parse_response_format)
from exactspec.core.errors import E_BAD_ARGUMENT, ExactSpecError
from exactspec.core.policy import SamplingPolicy
from exactspec.pyodide.browser_backend import config_from_json

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}


def refused(value, *words):
    with pytest.raises(ExactSpecError) as e:
        parse_response_format(value)
    assert e.value.code == E_BAD_ARGUMENT and e.value.message.startswith("response_format: ")
    for w in words:
        assert w in e.value.message, e.value.message
    return e.value.message


def test_each_type_parses_to_its_wire_form():
    spec = parse_response_format({"type": "json_schema", "schema": SCHEMA})
    assert spec.wire == {"type": "json_schema", "schema": json.dumps(SCHEMA, separators=(",", ":"))}
    assert parse_response_format({"type": "regex", "pattern": r"\d{4}-\d{2}"}).wire == {"type": "regex", "pattern": r"\d{4}-\d{2}"}
    assert parse_response_format({"type": "grammar", "ebnf": 'root ::= "a"'}).wire["root"] == "root"
    assert parse_response_format({"type": "json_object"}).wire == {"type": "json_object"}
    assert parse_response_format(None) is None


def test_identity_is_canonical_and_binds_the_constraint():
    a = parse_response_format({"type": "json_schema", "schema": SCHEMA})
    b = parse_response_format({"type": "json_schema", "schema": json.dumps(SCHEMA, indent=3)})   # its text, spaced
    assert a.identity == b.identity and a.identity.startswith("constraint-v1:json_schema:sha256:")
    # property order is kept (xgrammar writes the properties in it), so it is part of the identity
    reordered = {**SCHEMA, "properties": dict(reversed(list(SCHEMA["properties"].items())))}
    assert parse_response_format({"type": "json_schema", "schema": reordered}).identity != a.identity
    other = parse_response_format({"type": "json_schema", "schema": {**SCHEMA, "required": ["a", "b"]}})
    assert other.identity != a.identity
    # the identity joins the sampling policy's hash (and so the receipt's grammar_hash)
    p1 = SamplingPolicy(grammar=ConstraintGrammar(a)).canonical_json()
    p2 = SamplingPolicy(grammar=ConstraintGrammar(other)).canonical_json()
    assert p1 != p2 and a.identity in p1
    assert constraint_of(SamplingPolicy(grammar=ConstraintGrammar(a))) == a


def test_hostile_schemas_are_refused_naming_the_problem():
    deep = {"type": "object"}
    for _ in range(MAX_SCHEMA_DEPTH + 2):
        deep = {"type": "object", "properties": {"x": deep}}
    refused({"type": "json_schema", "schema": deep}, "nested deeper than")
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 200} for i in range(400)}}
    assert len(json.dumps(big)) > MAX_SCHEMA_BYTES
    refused({"type": "json_schema", "schema": big}, "over the limit")
    refused({"type": "json_schema", "schema": "{not json"}, "not valid JSON")
    refused({"type": "json_schema", "schema": [1, 2]}, "a JSON object")
    refused({"type": "json_schema", "schema": {"a": float("nan")}}, "cannot be written as JSON")


def test_hostile_regexes_are_refused_naming_the_problem():
    for pattern in ("(a+)+$", "(a*)*b", "(x|y+)*z", "((ab)*c)+"):
        refused({"type": "regex", "pattern": pattern}, "nests one quantifier inside an unbounded one")
    refused({"type": "regex", "pattern": r"(a)\1"}, "backreference")
    refused({"type": "regex", "pattern": r"a(?=b)"}, "lookahead")
    refused({"type": "regex", "pattern": "a{1000}"}, "repeats something 1000 times")
    refused({"type": "regex", "pattern": "(unclosed"}, "does not parse")
    refused({"type": "regex", "pattern": ""}, "non-empty")
    refused({"type": "regex", "pattern": "a" * 5000}, "over the limit")
    # what is fine: one level of repetition, alternation, bounded counts, optional groups
    refused({"type": "regex", "pattern": "(a{1,5})+"}, "nests one quantifier")
    for ok in (r"\d{4}-\d{2}-\d{2}", "(yes|no), because [a-z ]{3,60}\\.", "(ab)?c+", "[A-Z][a-z]*( [A-Z][a-z]*){0,3}"):
        check_regex(ok)


def test_other_malformed_formats_are_refused():
    refused({"type": "grammar", "ebnf": 'start ::= "a"'}, "no `root ::=")
    refused({"type": "grammar", "ebnf": "  "}, "non-empty")
    refused({"type": "xml"}, "`type` must be one of")
    refused({"type": "regex", "pattern": "a", "flags": "i"}, "unknown field 'flags'")
    refused({"type": "json_schema"}, "needs `schema`")
    refused("json", "must be an object")


def test_a_request_cannot_combine_allowed_ids_and_a_format():
    with pytest.raises(ExactSpecError) as e:
        config_from_json({"config": {"allowed_token_ids": [1, 2], "response_format": {"type": "json_object"}}}, [2])
    assert e.value.code == E_BAD_ARGUMENT and "cannot be combined" in e.value.message
    config = config_from_json({"config": {"response_format": {"type": "json_object"}}}, [2])
    assert constraint_of(config.policy).type == "json_object"
