"""Prefix reuse across requests (GenerationConfig.prefix_reuse; docs/core.md "Prefix reuse"): a
request whose prompt extends the previous request's ids starts each model from the K/V it holds,
and its tokens equal a fresh request's bitwise, greedy and sampled with the same seed, in every
speculation mode: on the CPython reference over the toy runner (batch-invariant by construction),
and in headless Chromium on both champion backends (WASM, and WebGPU on SwiftShader) with the toy
pair. An over-claimed prefix (one position too many) is shown to change answers, so the equality
checks have the power to catch a wrong reuse."""
import os

import pytest

from browser_fixture import chromium_browser  # noqa: F401
from engine_loads import FAST_RUNTIME
from exactspec.core import backends
from exactspec.core.orchestrator import GenerationConfig
from exactspec.host.browser_run import BrowserRuntime
from exactspec.reference.models import default_models_dir
from exactspec.reference.processors import SamplingPolicy
from toy_helpers import make_orchestrator

GREEDY, SAMPLED = SamplingPolicy(temperature=0.0), SamplingPolicy(temperature=1.0)
MODES = ("none", "draft", "lookup", "auto")


def _turns(orch, prompt, mode, policy, reuse=True):
    """Two requests: `prompt`, then `prompt` + its answer + three new ids -> (second result, its prompt)."""
    first = orch.generate(prompt, GenerationConfig(max_new_tokens=12, policy=policy, speculate=mode, seed=3))
    follow = list(prompt) + first.token_ids + [7, 8, 9]
    return orch.generate(follow, GenerationConfig(max_new_tokens=16, policy=policy, speculate=mode, seed=11,
                                                  prefix_reuse=reuse)), follow


CASES = [(mode, GREEDY) for mode in MODES] + [(mode, SAMPLED) for mode in MODES if mode != "auto"]


@pytest.mark.parametrize("mode,policy", CASES, ids=[f"{m}-T{p.temperature:g}" for m, p in CASES])
def test_a_follow_up_reuses_the_prefix_and_equals_a_fresh_request(mode, policy):
    """Greedy in every mode; sampled with the same seed in the fixed modes. auto's choices follow
    timings (the reuse shortens the prefill), and a different choice draws different, equally
    distributed tokens: its sampled answers are not comparable bit for bit."""
    prompt = [3, 4, 5, 6, 7, 8]
    second, follow = _turns(make_orchestrator(40, 4), prompt, mode, policy)
    fresh = make_orchestrator(40, 4).generate(follow, GenerationConfig(max_new_tokens=16, policy=policy,
                                                                      speculate=mode, seed=11, prefix_reuse=False))
    assert second.token_ids == fresh.token_ids and second.finish_reason == fresh.finish_reason
    reused = second.stats["prompt_reused"]
    assert len(prompt) <= reused["champion"] <= len(follow) - 1
    assert fresh.stats["prompt_reused"]["champion"] == 0
    assert second.receipt["prompt_reused"]["champion"] == reused["champion"]
    uses_draft = mode in ("draft", "auto")
    assert (reused["draft"] is not None) == uses_draft and ("draft" in second.receipt["prompt_reused"]) == uses_draft
    if mode == "draft":          # the draft prefilled the first prompt and drafted: it holds it too
        assert reused["draft"] >= len(prompt)


def test_prefix_reuse_off_prefills_everything():
    second, _ = _turns(make_orchestrator(40, 4), [3, 4, 5, 6], "draft", GREEDY, reuse=False)
    assert second.stats["prompt_reused"] == {"champion": 0, "draft": 0}


def test_whatever_else_ran_the_runner_is_not_reused():
    """The calibration runs the champion over its own probe ids ((7 i + 3) % 40) between the two
    requests: the runner no longer holds the first request's ids, and nothing is reused (the held
    ids follow the runner)."""
    orch = make_orchestrator(40, 4)
    prompt = [4, 5, 6, 7, 8, 9]
    first = orch.generate(prompt, GenerationConfig(max_new_tokens=8, policy=GREEDY, speculate="none"))
    backends.calibrate_reference(orch.champion, orch.draft)
    follow = prompt + first.token_ids + [9]
    again = orch.generate(follow, GenerationConfig(max_new_tokens=8, policy=GREEDY, speculate="none"))
    fresh = make_orchestrator(40, 4).generate(follow, GenerationConfig(max_new_tokens=8, policy=GREEDY,
                                                                       speculate="none"))
    assert again.stats["prompt_reused"]["champion"] == 0 and again.token_ids == fresh.token_ids


def test_a_runner_that_is_not_batch_invariant_is_never_reused(monkeypatch):
    orch = make_orchestrator(40, 4)
    monkeypatch.setattr(type(orch.champion.runner), "batch_invariant", False)
    second, _ = _turns(orch, [3, 4, 5, 6], "none", GREEDY)
    assert second.stats["prompt_reused"]["champion"] == 0


def test_an_overclaimed_prefix_changes_answers(monkeypatch):
    """The power check: a follow-up that keeps the first answer's first 4 ids and then differs (an
    edited turn). Reuse claiming one position more than the common prefix (the runner's state there
    belongs to the old id) changes the answers; the true prefix gives a fresh request's."""
    real = backends.common_prefix
    changed = 0
    for seed in range(6):
        prompt = [3 + seed, 4, 5, 6]
        orch = make_orchestrator(40, seed)
        first = orch.generate(prompt, GenerationConfig(max_new_tokens=8, policy=GREEDY, speculate="none"))
        edited = prompt + first.token_ids[:4] + [(first.token_ids[4] + 1) % 40, 9]
        cfg = GenerationConfig(max_new_tokens=16, policy=GREEDY, speculate="none")
        fresh = make_orchestrator(40, seed).generate(edited, cfg)
        monkeypatch.setattr(backends, "common_prefix", lambda a, b: min(real(a, b) + 1, len(b)))
        broken = orch.generate(edited, cfg)
        monkeypatch.setattr(backends, "common_prefix", real)
        assert broken.stats["prompt_reused"]["champion"] == len(prompt) + 5
        changed += broken.token_ids != fresh.token_ids
        orch = make_orchestrator(40, seed)           # and the true prefix: a fresh request's answer
        orch.generate(prompt, GenerationConfig(max_new_tokens=8, policy=GREEDY, speculate="none"))
        right = orch.generate(edited, cfg)
        assert right.stats["prompt_reused"]["champion"] == len(prompt) + 4 and right.token_ids == fresh.token_ids
    assert changed >= 3, changed


# ------------------------------------------------------------------------------- the browser
MODELS = default_models_dir()
CHAMPION, DRAFT = os.path.join(MODELS, "champion"), os.path.join(MODELS, "draft")


@pytest.fixture(scope="module", params=["wasm", "webgpu"])
def runtime(request, chromium_browser):
    rt = BrowserRuntime(CHAMPION, DRAFT, browser=chromium_browser, timeout_s=600, champion_backend=request.param,
                        faults=True, **FAST_RUNTIME)
    assert rt.ready["info"]["champion"]["backend"] == request.param
    yield rt
    rt.close()


def _generate(rt, ids, **config):
    out = rt.generate({"prompt_ids": list(ids), "config": dict(config)})["result"]
    assert out["error"] is None, out["error"]
    return out


def test_the_browser_reuses_the_prefix_exactly(runtime):
    """Greedy in every mode; sampled (same seed) in the fixed modes: auto's choices follow this
    machine's timings, which the reuse changes (a shorter prefill), and a different choice draws
    different (equally distributed) tokens, so its sampled answers are not comparable bit for bit."""
    prompt = [1, 450, 3303, 310, 278, 3186, 2989, 322]
    for mode in ("none", "auto", "draft", "lookup"):
        for t in ((0.0,) if mode == "auto" else (0.0, 1.0)):
            first = _generate(runtime, prompt, speculate=mode, temperature=t, max_new_tokens=24, seed=5)
            follow = prompt + first["token_ids"] + [13, 450, 3303]
            second = _generate(runtime, follow, speculate=mode, temperature=t, max_new_tokens=24, seed=6)
            cold = _generate(runtime, follow, speculate=mode, temperature=t, max_new_tokens=24, seed=6,
                             prefix_reuse=False)
            assert second["token_ids"] == cold["token_ids"], (mode, t)
            reused = second["stats"]["prompt_reused"]
            assert len(prompt) <= reused["champion"] <= len(follow) - 1, (mode, t, reused)
            assert cold["stats"]["prompt_reused"]["champion"] == 0
            assert second["receipt"]["prompt_reused"]["champion"] == reused["champion"]
            assert (reused["draft"] is not None) == (mode in ("draft", "auto"))
            if mode == "none":           # it held every id it consumed: all but the answer's last
                assert reused["champion"] == len(prompt) + len(first["token_ids"]) - 1


def test_an_edited_history_reuses_up_to_the_edit_only(runtime):
    """The follow-up keeps the first answer's first 6 ids and then differs (an edited turn): exactly
    the common prefix is reused, never the position where the ids part (its K/V belongs to the
    old id), and the answer equals a cold request's."""
    for prompt in ([1, 450, 3303, 310, 278], [1, 2989, 322, 13], [1, 3186, 29, 450, 7]):
        first = _generate(runtime, prompt, speculate="none", temperature=0.0, max_new_tokens=16)
        cut = first["token_ids"][:6]
        edited = prompt + cut + [(first["token_ids"][6] + 1) % 4096, 13, 450]
        second = _generate(runtime, edited, speculate="none", temperature=0.0, max_new_tokens=16)
        cold = _generate(runtime, edited, speculate="none", temperature=0.0, max_new_tokens=16, prefix_reuse=False)
        assert second["stats"]["prompt_reused"]["champion"] == len(prompt) + 6
        assert second["token_ids"] == cold["token_ids"]


def test_a_fault_during_a_request_forgets_what_the_models_hold(runtime):
    """An armed fault (a stall) hits inside the second request: what the models hold afterwards is
    unknown to the bridge, so the third request reuses nothing, and still answers exactly."""
    prompt = [1, 450, 3303, 310, 278]
    first = _generate(runtime, prompt, speculate="none", temperature=0.0, max_new_tokens=8)
    follow = prompt + first["token_ids"] + [13]
    runtime.page.evaluate("() => window.exactspecRunner.fault({action: 'stall', at: 'championRound', ms: 1})")
    second = _generate(runtime, follow, speculate="none", temperature=0.0, max_new_tokens=8)
    assert second["stats"]["prompt_reused"]["champion"] >= len(prompt)
    third_ids = follow + second["token_ids"] + [13]
    third = _generate(runtime, third_ids, speculate="none", temperature=0.0, max_new_tokens=8)
    cold = _generate(runtime, third_ids, speculate="none", temperature=0.0, max_new_tokens=8, prefix_reuse=False)
    assert third["stats"]["prompt_reused"]["champion"] == 0 and third["token_ids"] == cold["token_ids"]
