"""exactspec generate --json-schema / --regex / --grammar / --json-object on the CPython reference (toy pair):
answers that fit, and bad constraints refused in one coded line before any output."""
import json
import re

import jsonschema
import pytest

from test_cli import cli

SCHEMA = {"type": "object", "properties": {"who": {"type": "string", "maxLength": 10},
                                           "said": {"enum": ["yea", "nay"]}},
          "required": ["who", "said"], "additionalProperties": False}


def test_json_schema_file_gives_an_answer_that_fits(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    r = cli("generate", "--prompt", "And the king said", "--json-schema", str(path), "--temperature", "0",
            "--max-new-tokens", "48", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "eos" and out["stats"]["structured"]["type"] == "json_schema"
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    assert out["stats"]["forced"] > 0 and out["receipt"]["grammar_hash"] != "none"


def test_regex_and_grammar_and_json_object(tmp_path):
    r = cli("generate", "--prompt", "Is it so?", "--regex", "(yes|no)\\.", "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"(yes|no)\.", json.loads(r.stdout)["text"])
    g = tmp_path / "g.ebnf"
    g.write_text('root ::= "Amen" ("." | "!")\n')
    r = cli("generate", "--prompt", "Pray:", "--grammar", str(g), "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"Amen[.!]", json.loads(r.stdout)["text"])
    r = cli("generate", "--prompt", "Data:", "--json-object", "--temperature", "0", "--max-new-tokens", "64", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    if out["finish_reason"] == "eos":
        assert isinstance(json.loads(out["text"]), dict)


@pytest.mark.parametrize("args,words", [
    (["--regex", "(a+)+b"], "nests one quantifier"),
    (["--regex", "(a)\\1"], "backreference"),
    (["--json-schema", "/nonexistent/schema.json"], "/nonexistent/schema.json"),
    (["--regex", "a", "--json-object"], "not allowed with"),
])
def test_bad_constraints_are_one_coded_line(args, words):
    r = cli("generate", "--prompt", "x", *args)
    assert r.returncode == 2 if "not allowed with" in words else r.returncode != 0
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("exactspec: E_") and words in r.stderr, r.stderr


def test_schema_file_that_is_not_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{nope")
    r = cli("generate", "--prompt", "x", "--json-schema", str(path))
    assert r.returncode != 0 and "E_BAD_ARGUMENT" in r.stderr and "not JSON" in r.stderr and r.stdout == ""
