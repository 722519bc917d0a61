"""The load-time batch-invariance check in the engine (real Chromium, SwiftShader WebGPU, the shipped toy
pair): every load reports it, WebGPU and WASM are invariant; the injected variant kernel makes auto's
WebGPU champion fall back to WASM with E_BATCH_VARIANT in ready.info and in every receipt (greedy
answers still the champion's), and fails the load when WebGPU was asked for by name or the WASM
champion itself is variant. The GPU decider's diagnostics reach the receipt's numerics.
Run under the browser lock: flock /tmp/browser.lock .venv/bin/python -m pytest tests/test_batch_check_browser.py -x -q"""
import math
import os

import pytest

from browser_fixture import chromium_browser  # noqa: F401
from exactspec.host.browser_run import BrowserRuntime, _url_for
from exactspec.reference.models import default_models_dir

CHAMPION, DRAFT = (os.path.join(default_models_dir(), name) for name in ("champion", "draft"))
MODELS = {"champion": _url_for(CHAMPION, "champion", {}), "draft": _url_for(DRAFT, "draft", {})}
PROMPT = "In the beginning"
POSITIONS = 5                          # batch_check.mjs CHECK_POSITIONS
FAULT = {"faults": True, "faultBatchVariant": True}


@pytest.fixture(scope="module")
def rt(chromium_browser):
    runtime = BrowserRuntime(CHAMPION, DRAFT, browser=chromium_browser, timeout_s=300, champion_backend="webgpu", warm_up=False)
    yield runtime
    runtime.close()


def try_load(rt, **options):
    return rt.page.evaluate("([m, o]) => window.exactspecRunner.tryLoad(m, o)",
                            [MODELS, {"warmUp": False, "calibrate": "off", **options}])


def answer(rt, speculate, **config):
    out = rt.page.evaluate("(p) => window.exactspecRunner.generate(p)",
                           {"prompt": PROMPT, "config": {"speculate": speculate, "k": 4, "temperature": 0,
                                                         "max_new_tokens": 12, **config}})
    assert "refused" not in out, out
    r = out["result"]
    assert r["error"] is None, r["error"]
    return r


def assert_invariant(check, backend):
    assert check["backend"] == backend and check["result"] == "invariant", check
    assert check["positions"] == POSITIONS and check["first_mismatch"] is None and check["ms"] >= 0, check


def test_every_load_checks_and_both_champions_are_invariant(rt):
    info = rt.ready["info"]
    assert info["champion"]["backend"] == "webgpu"
    assert_invariant(info["batch_check"], "webgpu")
    assert info["champion_fallback"] is None
    assert rt.ready["timing_ms"]["batch_check"] == info["batch_check"]["ms"]
    receipt = answer(rt, "none")["receipt"]
    assert receipt["champion_backend"] == "webgpu" and receipt["champion_fallback_code"] == "none"
    wasm = try_load(rt, championBackend="wasm")["ready"]["info"]
    assert wasm["champion"]["backend"] == "wasm" and wasm["champion_fallback"] is None
    assert_invariant(wasm["batch_check"], "wasm")


def test_a_variant_webgpu_champion_falls_back_to_wasm(rt):
    # the hook alone (auto takes SwiftShader as hardware) keeps WebGPU: it is the variant kernel that moves it
    plain = try_load(rt, faults=True, faultAdapterIsHardware=True, championBackend="auto")["ready"]["info"]
    assert plain["champion"]["backend"] == "webgpu" and plain["champion_fallback"] is None
    assert_invariant(plain["batch_check"], "webgpu")

    out = try_load(rt, **FAULT, faultAdapterIsHardware=True, championBackend="auto")
    assert "ready" in out, out
    info = out["ready"]["info"]
    assert info["champion"]["backend"] == "wasm" and "E_BATCH_VARIANT" in info["champion"]["backend_why"]
    fallback = info["champion_fallback"]
    assert fallback["code"] == "E_BATCH_VARIANT" and fallback["from"] == "webgpu", fallback
    assert fallback["message"] and not fallback["message"].startswith("E_BATCH_VARIANT"), fallback
    check = fallback["batch_check"]
    assert check["backend"] == "webgpu" and check["result"] == "variant", check
    assert check["first_mismatch"]["position"] == POSITIONS - 1, check        # the fault flips the last row
    assert_invariant(info["batch_check"], "wasm")                              # the champion that runs was checked too
    alone = answer(rt, "none")
    for mode in ("draft", "lookup"):
        r = answer(rt, mode)
        assert r["token_ids"] == alone["token_ids"], (mode, r["token_ids"], alone["token_ids"])
        assert r["receipt"]["champion_backend"] == "wasm" and r["receipt"]["champion_fallback_code"] == "E_BATCH_VARIANT"


@pytest.mark.parametrize("backend", ["webgpu", "wasm"])
def test_a_variant_champion_asked_for_by_name_fails_the_load(rt, backend):
    out = try_load(rt, **FAULT, championBackend=backend)
    assert out.get("error", {}).get("code") == "E_BATCH_VARIANT", out
    assert f"the {backend} champion" in out["error"]["message"], out
    # the next load is a good one
    assert_invariant(try_load(rt, championBackend=backend)["ready"]["info"]["batch_check"], backend)


def test_the_fault_needs_faults_on(rt):
    info = try_load(rt, faultBatchVariant=True, faultAdapterIsHardware=True, championBackend="auto")["ready"]["info"]
    assert info["champion"]["backend"] == "wasm" and info["champion_fallback"] is None   # SwiftShader: auto's WASM
    assert_invariant(info["batch_check"], "wasm")


def test_gpu_diagnostics_reach_the_receipt(rt):
    assert try_load(rt, championBackend="webgpu")["ready"]["info"]["champion"]["backend"] == "webgpu"
    r = answer(rt, "draft", temperature=1.0, top_p=0.9, seed=7, max_new_tokens=24)
    numerics = r["receipt"]["numerics"]
    assert numerics["decided_rounds"] >= 1 and numerics["judged_rounds"] >= 1, numerics
    assert 0 <= numerics["near_top_p_rounds"] <= numerics["decided_rounds"], numerics
    assert numerics["min_acceptance_margin"] is not None and 0 <= numerics["min_acceptance_margin"] < 1, numerics
    assert math.isfinite(numerics["min_acceptance_margin"])
    greedy = answer(rt, "draft")["receipt"]["numerics"]
    assert greedy["judged_rounds"] == 0 and greedy["min_acceptance_margin"] is None, greedy   # greedy: no accept test
