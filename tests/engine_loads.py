"""How tests load browser engines: FAST_LOAD (no warm-up requests, no calibration) unless a test opts into the full load."""
import json

from exactspec.host.browser_run import BrowserRuntime

# The load options a test passes to createEngine / window.exactspecRunner.load / tryLoad: no warm-up
# requests (web/orchestrator/warmup.mjs, up to 1.5 s a load) and no calibration (calibrate "off": the
# policy's conservative default). Every other phase of the load still runs: the model and pair checks,
# the batch-invariance check, the WASM champion's own warm forwards and threads choice. A test about
# warm-up, calibration or the first request's speed, or one that measures the load itself, loads
# without FAST_LOAD (BrowserRuntime(...) or browser_runtime(..., full_load=True)), and says why.
FAST_LOAD = {"warmUp": False, "calibrate": "off"}

# The same, as a JS object literal to spread into an inline createEngine({ ..., ...FAST_LOAD_JS }) call.
FAST_LOAD_JS = json.dumps(FAST_LOAD)

# The same, as BrowserRuntime's keyword arguments.
FAST_RUNTIME = {"warm_up": False, "calibrate": "off"}


def browser_runtime(champion, draft, *, full_load: bool = False, **options) -> BrowserRuntime:
    """A BrowserRuntime loaded with FAST_LOAD; full_load=True: the load a user gets (warm-up and
    calibration), for the tests about those. Explicit options win over FAST_LOAD's."""
    return BrowserRuntime(champion, draft, **{**({} if full_load else FAST_RUNTIME), **options})
