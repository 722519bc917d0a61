"""Load memory in the engine (real Chromium, SwiftShader WebGPU, the shipped toy pair): the
champion's streamed load (WASM and WebGPU) reports its load transient (ready.info, engine.memory(),
the receipt's peak_resident_bytes) within 1.1x its largest tensor; a WebGPU champion over gpuMemoryBudget is refused
before its weights are requested, naming the maxContext that would fit, and under championBackend
"auto" the WASM champion runs instead (champion_fallback E_OUT_OF_MEMORY, in every receipt).
Run under the browser lock: flock /tmp/browser.lock .venv/bin/python -m pytest tests/test_load_memory_browser.py -x -q"""
import os

import pytest

from browser_fixture import chromium_browser  # noqa: F401
from exactspec.host.browser_run import BrowserRuntime, _url_for
from exactspec.reference.models import default_models_dir

CHAMPION, DRAFT = (os.path.join(default_models_dir(), name) for name in ("champion", "draft"))
MODELS = {"champion": _url_for(CHAMPION, "champion", {}), "draft": _url_for(DRAFT, "draft", {})}


@pytest.fixture(scope="module")
def rt(chromium_browser):
    runtime = BrowserRuntime(CHAMPION, DRAFT, browser=chromium_browser, timeout_s=300, champion_backend="wasm",
                             warm_up=False, calibrate="off")
    yield runtime
    runtime.close()


def try_load(rt, **options):
    return rt.page.evaluate("([m, o]) => window.exactspecRunner.tryLoad(m, o)",
                            [MODELS, {"warmUp": False, "calibrate": "off", "cache": False, **options}])


def answer(rt):
    out = rt.page.evaluate("(p) => window.exactspecRunner.generate(p)",
                           {"prompt": "In the beginning", "config": {"speculate": "none", "temperature": 0, "max_new_tokens": 6}})
    assert "refused" not in out and out["result"]["error"] is None, out
    return out["result"]


def test_the_wasm_champions_streamed_load_reports_its_transient(rt):
    transient = rt.ready["info"]["champion"]["load_transient"]
    assert transient["streamed"] is True, transient
    assert 0 < transient["largest_tensor"] <= transient["peak"] <= 1.1 * transient["largest_tensor"], transient
    assert transient["peak"] < rt.ready["info"]["champion"]["artifact_bytes"] / 2      # never the whole file
    memory = rt.page.evaluate("() => window.exactspecRunner.memory()")
    assert memory["load_transient_bytes"] == transient["peak"], memory
    receipt = answer(rt)["receipt"]
    assert receipt["peak_resident_bytes"]["load_transient"] == transient["peak"], receipt["peak_resident_bytes"]


def wasm_answer(rt):
    """The greedy answer's ids on the WASM champion (the engine is reloaded on WASM after)."""
    assert "ready" in try_load(rt, championBackend="wasm")
    return answer(rt)["token_ids"]


def weight_requests(rt, run):
    """URLs of the champion's weights requested while run() runs (the page and its workers)."""
    seen = []
    listener = lambda request: seen.append(request.url)
    rt.page.on("request", listener)
    try:
        out = run()
    finally:
        rt.page.remove_listener("request", listener)
    return out, [u for u in seen if "/champion/" in u and u.endswith(".safetensors")]


def test_a_webgpu_champion_over_the_budget_is_refused_before_its_weights(rt):
    budget = 2_000_000                                       # the toy champion's plan needs more at any context
    out, fetched = weight_requests(rt, lambda: try_load(rt, championBackend="webgpu", gpuMemoryBudget=budget))
    assert out.get("error", {}).get("code") == "E_OUT_OF_MEMORY", out
    message = out["error"]["message"]
    assert "exceed the memory budget of 1.9 MiB" in message and ("would fit" in message or "do not fit" in message), message
    assert fetched == [], fetched                            # refused from the config alone
    roomy, fetched = weight_requests(rt, lambda: try_load(rt, championBackend="webgpu", gpuMemoryBudget=0))
    assert roomy["ready"]["info"]["champion"]["backend"] == "webgpu", roomy
    assert roomy["ready"]["info"]["champion"]["gpu_memory_budget"] == {"bytes": 0, "source": "none"}
    assert fetched, "a load within the budget fetches the weights"
    transient = roomy["ready"]["info"]["champion"]["load_transient"]       # the WebGPU champion streams too
    assert transient["streamed"] is True and transient["peak"] <= 1.1 * transient["largest_tensor"], transient
    assert answer(rt)["token_ids"] == wasm_answer(rt), "WebGPU and WASM greedy answers differ"


def test_a_budget_between_the_weights_and_the_full_context_names_the_context_that_fits(rt):
    """Budgets from the weights' size up: the first refused one that leaves room for some positions
    names them ("maxContext <= N would fit", N below the model's 512); a larger one loads."""
    named = None
    for budget in range(9_000_000, 40_000_000, 500_000):
        out = try_load(rt, championBackend="webgpu", gpuMemoryBudget=budget)
        if "ready" in out:
            break
        message = out["error"]["message"]
        assert out["error"]["code"] == "E_OUT_OF_MEMORY", out
        if "would fit" in message:
            named = int(message.split("maxContext <= ")[1].split(" ")[0])
            assert 0 < named < 512, message
    assert named is not None and "ready" in out, (named, out)


def test_auto_falls_back_to_wasm_when_webgpu_does_not_fit(rt):
    out = try_load(rt, faults=True, faultAdapterIsHardware=True, championBackend="auto", gpuMemoryBudget=2_000_000)
    info = out["ready"]["info"]
    assert info["champion"]["backend"] == "wasm", info["champion"]
    fallback = info["champion_fallback"]
    assert fallback["code"] == "E_OUT_OF_MEMORY" and fallback["from"] == "webgpu", fallback
    assert fallback["gpu_memory_budget"] == {"bytes": 2_000_000, "source": "option"}
    assert "memory budget" in info["champion"]["backend_why"], info["champion"]["backend_why"]
    assert answer(rt)["receipt"]["champion_fallback_code"] == "E_OUT_OF_MEMORY"


def test_a_bad_budget_is_refused(rt):
    out = try_load(rt, championBackend="webgpu", gpuMemoryBudget=-5)
    assert out["error"]["code"] == "E_BAD_ARGUMENT" and "gpuMemoryBudget" in out["error"]["message"], out
