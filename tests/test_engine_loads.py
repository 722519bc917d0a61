"""The tests' engine load (tests/engine_loads.py) skips the warm-up and the calibration and nothing else."""
import os

from browser_fixture import chromium_browser  # noqa: F401
from engine_loads import FAST_RUNTIME, browser_runtime
from exactspec.reference.models import default_models_dir

MODELS = default_models_dir()


def test_the_fast_load_has_no_warm_up_and_no_calibration_and_answers(chromium_browser):  # noqa: F811
    """BrowserRuntime passes warm_up and calibrate to the engine: the load reports no warm-up
    requests and no calibration, and its other phases ran (the batch-invariance check included)."""
    assert FAST_RUNTIME == {"warm_up": False, "calibrate": "off"}
    rt = browser_runtime(os.path.join(MODELS, "champion"), os.path.join(MODELS, "draft"), browser=chromium_browser,
                         champion_backend="wasm")
    try:
        timing, info = rt.ready["timing_ms"], rt.ready["info"]
        assert timing["warmup"] == 0 and info["warmup"] is None, (timing, info.get("warmup"))
        assert info.get("calibration") is None and not timing.get("calibration"), (info.get("calibration"), timing)
        assert timing["champion_load"] > 0 and info["batch_check"]["result"] == "invariant" and info["draft"] is not None
        config = {"temperature": 0, "max_new_tokens": 8}
        alone = rt.generate({"prompt": "In the beginning", "config": {**config, "speculate": "none"}})["result"]
        drafted = rt.generate({"prompt": "In the beginning", "config": {**config, "speculate": "draft", "k": 4}})["result"]
        assert alone["error"] is None and len(alone["token_ids"]) == 8 and drafted["token_ids"] == alone["token_ids"]
    finally:
        rt.close()
