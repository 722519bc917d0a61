"""Peak resident bytes with the draft in the WASM champion's own instance: one memory, counted once.

The CPU module holds both models in one WASM memory (web/orchestrator/bridge.mjs: inline placement
next to a WASM champion). The receipt's and engine.memory()'s draft category is the draft's OWN
memory, so it is 0 there: counting the shared memory under both categories doubled the peak
(evaluation dev run: SmolLM2 + its draft 2.02x champion alone)."""
import os

from browser_fixture import chromium_browser  # noqa: F401
from engine_loads import browser_runtime
from exactspec.reference.models import default_models_dir

MODELS = default_models_dir()


def _peak(rt):
    result = rt.generate({"prompt": "In the beginning", "config": {"temperature": 0, "max_new_tokens": 6, "speculate": "draft",
                                                                    "k": 4}})["result"]
    assert result["error"] is None
    return result["receipt"]["peak_resident_bytes"]


def test_an_inline_draft_is_counted_once_in_the_champions_memory(chromium_browser):  # noqa: F811
    champion, draft = os.path.join(MODELS, "champion"), os.path.join(MODELS, "draft")
    alone = browser_runtime(champion, None, browser=chromium_browser, champion_backend="wasm")
    try:
        result = alone.generate({"prompt": "In the beginning", "config": {"temperature": 0, "max_new_tokens": 6,
                                                                           "speculate": "none"}})["result"]
        alone_peak = result["receipt"]["peak_resident_bytes"]
    finally:
        alone.close()
    rt = browser_runtime(champion, draft, browser=chromium_browser, champion_backend="wasm")
    try:
        assert rt.ready["info"]["draft"]["placement"] == "inline", rt.ready["info"]["draft"]
        peak = _peak(rt)
    finally:
        rt.close()
    assert peak["wasm_draft"] == 0, peak
    # the one memory holds both models: at least the champion alone's, and less than twice it
    assert alone_peak["wasm_champion"] <= peak["wasm_champion"] < 2 * alone_peak["wasm_champion"], (alone_peak, peak)
