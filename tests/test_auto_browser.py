"""speculate="auto" in headless Chromium (Pyodide orchestrator; the WASM champion with the draft in
its instance, and the WebGPU champion with the draft in its worker; the calibration measured at
load): greedy auto answers equal champion alone's while auto moves between lookup, none and the
draft within one answer. A draft round after lookup or none rounds makes the JS session feed the
draft the ids it has not seen (mirror.draftAt); how often auto does that depends on this machine's
costs, so it is printed, not asserted (runs of 2026-12-02, WASM: 1-3 per 10 answers). That the
caught-up draft holds exactly the committed tokens is asserted on the reference session
(test_auto_policy.py); a draft out of step would change speed only, never these tokens."""
import os

import pytest

from browser_fixture import chromium_browser  # noqa: F401
from exactspec.host.browser_run import BrowserRuntime
from exactspec.reference.models import default_models_dir

MODELS = default_models_dir()
CHAMPION, DRAFT = os.path.join(MODELS, "champion"), os.path.join(MODELS, "draft")
PROMPTS = ["In the beginning", "To be, or not to be,", "And the LORD said unto Moses,", "O Romeo, Romeo,",
           "The LORD is my shepherd;", "Friends, Romans, countrymen,", "Now the serpent", "All the world's a stage,",
           "Blessed are the meek:", "Thus saith the LORD, Thus saith the LORD,"]


@pytest.fixture(scope="module", params=["wasm", "webgpu"])
def runtime(request, chromium_browser):
    rt = BrowserRuntime(CHAMPION, DRAFT, browser=chromium_browser, timeout_s=600, champion_backend=request.param,
                        calibrate="force")
    assert rt.ready["info"]["champion"]["backend"] == request.param
    yield rt
    rt.close()


def test_auto_greedy_equals_champion_alone_in_the_browser(runtime):
    cal = runtime.ready["info"].get("calibration")
    assert cal and cal["version"] == 1 and cal["verify_ms"][1] > 0
    methods, after_other, keys = set(), 0, set()
    # WebGPU (SwiftShader, ~4x WASM's time a token here): five prompts, the repetitive last one kept
    prompts = PROMPTS if runtime.ready["info"]["champion"]["backend"] == "wasm" else PROMPTS[:4] + PROMPTS[-1:]
    for prompt in prompts:
        config = dict(max_new_tokens=64, temperature=0)
        alone = runtime.generate({"prompt": prompt, "config": dict(config, speculate="none")})["result"]
        out = runtime.generate({"prompt": prompt, "config": dict(config, speculate="auto")})
        auto = out["result"]
        assert auto["error"] is None and auto["token_ids"] == alone["token_ids"], prompt
        assert auto["finish_reason"] == alone["finish_reason"] and auto["text"] == alone["text"]
        rounds = [e["payload"]["round"] for e in out["events"] if e["kind"] == "tokens"]
        seq = [r["auto"]["method"] for r in rounds]
        methods |= set(seq)
        # a draft round after lookup or champion-alone rounds: the draft caught up on ids it had not seen
        after_other += sum(1 for a, b in zip(seq, seq[1:]) if a != "draft" and b == "draft")
        st = auto["stats"]["auto"]
        # a tokens event of a chain of baseline steps (auto's held none) stands for its steps
        assert st["rounds_by_method"] == {m: sum(r.get("steps", 1) for r in rounds if r["auto"]["method"] == m)
                                          for m in ("none", "draft", "lookup")}
        keys.add(st["calibration_key"])
        assert auto["receipt"]["scheduler_decisions"]["rounds_by_method"] == st["rounds_by_method"]
    print(f"[measure] auto methods {sorted(methods)}, draft rounds after other rounds: {after_other}")
    assert keys == {cal["key"]}
    assert "draft" in methods and len(methods) >= 2
