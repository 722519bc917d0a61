"""Chains of baseline steps in the browser: wasm/cpu.c cpu_chain runs several k = 0 rounds in one call.

On the WASM champion a run of baseline steps (speculate none, auto's held none) is one call into
the CPU module, as long as the steps fit the orchestrator's CHAIN_BUDGET_MS: the shipped toy
champion's ~1 ms step chains, and each step keeps its round id, so the answer is bit for bit the
one-call-a-step answer, greedy and sampled, whatever ends it (length, a stop id, a stop string;
a stop string is found in the text after the call, so a chain may have run a few steps past it,
never past a stop id or the length).
"""
import os

import pytest

from browser_fixture import chromium_browser  # noqa: F401
from engine_loads import browser_runtime
from exactspec.reference.models import default_models_dir

MODELS = default_models_dir()
CHAMPION, DRAFT = os.path.join(MODELS, "champion"), os.path.join(MODELS, "draft")
PROMPTS = ["In the beginning", "To be, or not to be,", "And the LORD said unto Moses,", "O Romeo, Romeo,"]


@pytest.fixture(scope="module")
def wasm_runtime(chromium_browser):
    rt = browser_runtime(CHAMPION, DRAFT, browser=chromium_browser, timeout_s=600, champion_backend="wasm")
    yield rt
    rt.close()


def answer(rt, prompt, **config):
    out = rt.generate({"prompt": prompt, "config": {"prefix_reuse": False, **config}})
    r = out["result"]
    assert r["error"] is None, r["error"]
    return r


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_chained_answer_is_bit_for_bit_the_one_call_a_step_answer(wasm_runtime, temperature):
    chained_calls = 0
    for seed, prompt in enumerate(PROMPTS):
        plain = answer(wasm_runtime, prompt, chain_steps=False, max_new_tokens=48, temperature=temperature, seed=seed,
                       speculate="none")
        # a stop id the answer meets (its 7th token): the chain must end on it, not run on
        for ending in ({}, {"stop_strings": ["e"]}, {"stop_token_ids": [plain["token_ids"][6]]}):
            config = dict(max_new_tokens=48, temperature=temperature, seed=seed, speculate="none", **ending)
            a = answer(wasm_runtime, prompt, chain_steps=True, **config)
            b = answer(wasm_runtime, prompt, chain_steps=False, **config)
            assert (a["token_ids"], a["text"], a["finish_reason"]) == (b["token_ids"], b["text"], b["finish_reason"]), \
                (prompt, ending)
            assert b["stats"]["baseline_steps"] == len(b["token_ids"]) and b["stats"]["session"]["chain_calls"] == 0
            # a chain runs on past a stop string (text: found after the call), never past a stop id or the length
            steps, s = a["stats"]["baseline_steps"], a["stats"]["session"]
            assert steps == s["one_call_rounds"] == a["stats"]["target_calls"] and s["separate_call_rounds"] == 0
            assert steps == len(a["token_ids"]) if "stop_strings" not in ending else steps >= len(a["token_ids"])
            if "stop_token_ids" in ending:
                assert a["finish_reason"] == "eos" and len(a["token_ids"]) <= 7
            chained_calls += s["chain_calls"]
    assert chained_calls > 0            # the toy's step fits the budget many times over


def test_auto_chains_its_held_none_and_keeps_the_greedy_answer(wasm_runtime):
    for prompt in PROMPTS:
        alone = answer(wasm_runtime, prompt, max_new_tokens=64, temperature=0, speculate="none", chain_steps=False)
        auto = answer(wasm_runtime, prompt, max_new_tokens=64, temperature=0, speculate="auto")
        assert auto["token_ids"] == alone["token_ids"], prompt
        by = auto["stats"]["auto"]["rounds_by_method"]
        assert sum(by.values()) == auto["stats"]["rounds"] + auto["stats"]["baseline_steps"]
