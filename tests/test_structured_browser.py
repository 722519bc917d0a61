"""Structured output in headless Chromium, on the WASM and the WebGPU champion (the toy pair): xgrammar's
masks on the JS side of the round (grammar_round.mjs), the draft proposing step by step under them,
forced ids in the champion's block. Greedy constrained answers equal constrained champion alone in
every mode and the CPython reference's; answers fit; forced batching saves one champion call per
forced id and changes no token; dead ends and bad constraints end coded."""
import json
import os
import re

import jsonschema
import pytest

from browser_fixture import chromium_browser  # noqa: F401
from engine_loads import FAST_RUNTIME
from exactspec.core.constraints import ConstraintGrammar, parse_response_format
from exactspec.core.orchestrator import GenerationConfig
from exactspec.core.policy import SamplingPolicy
from exactspec.host.browser_run import BrowserRuntime
from exactspec.reference.models import default_models_dir, load_pair
from test_structured import FORMATS, fits

MODELS = default_models_dir()
CHAMPION, DRAFT = os.path.join(MODELS, "champion"), os.path.join(MODELS, "draft")
PROMPTS = ["And the king said unto the prophet", "To be, or not to be,"]


@pytest.fixture(scope="module", params=["wasm", "webgpu"])
def runtime(request, chromium_browser):
    rt = BrowserRuntime(CHAMPION, DRAFT, browser=chromium_browser, timeout_s=600, champion_backend=request.param,
                        **FAST_RUNTIME)
    assert rt.ready["info"]["champion"]["backend"] == request.param
    yield rt
    rt.close()


def answer(rt, prompt, fmt, **config):
    config = {"max_new_tokens": 64, "temperature": 0, "prefix_reuse": False, "response_format": fmt, **config}
    out = rt.generate({"prompt": prompt, "config": config})
    return out["result"], out["events"]


@pytest.mark.parametrize("name", list(FORMATS))
def test_greedy_constrained_answers_equal_champion_alone_in_every_mode(runtime, name):
    fmt = FORMATS[name]
    for prompt in PROMPTS:
        alone, events = answer(runtime, prompt, fmt, speculate="none")
        assert alone["error"] is None and alone["finish_reason"] == "eos", alone
        assert fits(fmt, alone["text"]), alone["text"]
        sources = [s for e in events if e["kind"] == "tokens" for s in e["payload"]["sources"]]
        assert sources.count("forced") == alone["stats"]["forced"] > 0
        assert alone["stats"]["target_calls"] == len(alone["token_ids"]) - alone["stats"]["forced"]
        for mode in ("draft", "lookup", "auto"):
            res, _ = answer(runtime, prompt, fmt, speculate=mode, k=4)
            assert res["error"] is None and res["token_ids"] == alone["token_ids"], (mode, res["text"], alone["text"])
            assert res["receipt"]["grammar_hash"] == alone["receipt"]["grammar_hash"] != "none"


def test_the_browser_answers_as_the_cpython_reference(runtime):
    """The same constraint, the same function (q8act-v1 on WASM, f32 on WebGPU): the same greedy ids."""
    matmul = "q8act" if runtime.ready["info"]["champion"].get("matmul") == "q8act-v1" else "f32"
    pair = load_pair(CHAMPION, DRAFT, champion_weights="q8", champion_matmul=matmul)
    same = 0
    for name, fmt in FORMATS.items():
        ids = pair.tokenizer.encode(PROMPTS[0], add_special_tokens=True)
        policy = SamplingPolicy(temperature=0.0, grammar=ConstraintGrammar(parse_response_format(fmt)))
        want = pair.orchestrator.generate(ids, GenerationConfig(max_new_tokens=64, policy=policy, speculate="none",
                                                                stop_token_ids=pair.stop_token_ids))
        got, _ = answer(runtime, PROMPTS[0], fmt, speculate="none")
        same += got["token_ids"] == want.token_ids
        assert got["receipt"]["grammar_hash"] == want.receipt["grammar_hash"]
        assert got["stats"]["structured"]["sha256"] == want.stats["structured"]["sha256"]
    assert same >= len(FORMATS) - 1, same      # f32 logits may flip one near-tie (test_browser_e2e's margin)


def test_forced_batching_saves_champion_calls_and_no_token_changes(runtime):
    fmt = FORMATS["json_schema"]
    for speculate in ("none", "draft"):
        on, _ = answer(runtime, PROMPTS[0], fmt, speculate=speculate, k=4)
        off, _ = answer(runtime, PROMPTS[0], fmt, speculate=speculate, k=4, forced_batching=False)
        assert on["token_ids"] == off["token_ids"] and off["stats"]["forced"] == 0
        # alone, each forced id saves a champion call; with the draft, forced steps are free proposals
        # (they do not count against k), so batching at the round's start saves less
        assert on["stats"]["target_calls"] < off["stats"]["target_calls"] if speculate == "none" else \
            on["stats"]["target_calls"] <= off["stats"]["target_calls"], speculate
    print(f"[measure] {runtime.ready['info']['champion']['backend']} json_schema: tokens per champion call "
          f"{len(on['token_ids']) / on['stats']['target_calls']:.2f} batched vs "
          f"{len(off['token_ids']) / off['stats']['target_calls']:.2f} (draft k = 4)")


def test_sampled_answers_fit_and_batching_keeps_the_samples(runtime):
    fmt = FORMATS["regex"]
    for seed in range(3):
        on, _ = answer(runtime, PROMPTS[1], fmt, speculate="none", temperature=1.0, seed=seed)
        off, _ = answer(runtime, PROMPTS[1], fmt, speculate="none", temperature=1.0, seed=seed, forced_batching=False)
        assert on["token_ids"] == off["token_ids"]
        spec, _ = answer(runtime, PROMPTS[1], fmt, speculate="draft", k=4, temperature=1.0, seed=seed)
        for r in (on, spec):
            assert r["error"] is None
            if r["finish_reason"] == "eos":
                assert fits(fmt, r["text"]), r["text"]


def test_dead_ends_and_bad_constraints_end_coded(runtime):
    tok_json = json.load(open(os.path.join(CHAMPION, "tokenizer.json")))
    digits = sorted(i for t, i in tok_json["model"]["vocab"].items() if any(c.isdigit() for c in t))
    res, events = answer(runtime, PROMPTS[0], {"type": "regex", "pattern": "(yes|no) [0-9]"}, speculate="none",
                         suppress_token_ids=digits)
    assert res["finish_reason"] == "error" and res["error"]["code"] == "E_GRAMMAR_DEAD_END", res["error"]
    assert re.fullmatch("((yes|no) ?)?", res["text"]) or "yes".startswith(res["text"]) or "no".startswith(res["text"])
    for fmt, words in (({"type": "regex", "pattern": "(a+)+"}, "nests one quantifier"),
                       ({"type": "grammar", "ebnf": "root ::= missing"}, 'Rule "missing" is not defined'),
                       ({"type": "json_schema", "schema": {"type": "nonsense"}}, "response_format: ")):
        with pytest.raises(Exception) as e:
            answer(runtime, PROMPTS[0], fmt)
        assert "E_BAD_ARGUMENT" in str(e.value) and words in str(e.value), str(e.value)
    # the engine is fine afterwards
    ok, _ = answer(runtime, PROMPTS[0], FORMATS["grammar"], speculate="auto")
    assert ok["error"] is None and fits(FORMATS["grammar"], ok["text"])
    jsonschema.validate({"name": "x", "age": 1, "kind": "king"}, FORMATS["json_schema"]["schema"])
