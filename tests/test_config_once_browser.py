"""Config parsed once in the browser: the model check's validated config (Pyodide, validate_config) is what
the champion (WebGPU and WASM) and the draft load from, config.json is fetched once per model, a
config Python accepts loads on both backends, and one it refuses is refused with its code and sentence."""
import json
import os
import shutil

import pytest

from browser_fixture import chromium_browser  # noqa: F401
from engine_loads import FAST_LOAD, browser_runtime
from exactspec.core.errors import ExactSpecError
from exactspec.formats.config import validate_config
from exactspec.reference.models import default_models_dir

MODELS = default_models_dir()
MOUNTED = {"champion": "/models/champion/", "draft": "/models/draft/", "manifest": None}
PAYLOAD = {"prompt": "And the LORD said", "config": {"temperature": 0, "max_new_tokens": 8}}


@pytest.fixture(scope="module")
def pair(tmp_path_factory, chromium_browser):
    """A copy of the shipped pair served from a mount (a test edits its config.json and restores it)."""
    root = tmp_path_factory.mktemp("pair")
    for role in ("champion", "draft"):
        shutil.copytree(os.path.join(MODELS, role), root / role)
    rt = browser_runtime(str(root / "champion"), str(root / "draft"), browser=chromium_browser, timeout_s=600)
    yield rt, root
    rt.close()


def edited(root, role, fields):
    """Write config.json of `role` with `fields` changed; returns (path, the original bytes)."""
    path = root / role / "config.json"
    saved = path.read_bytes()
    path.write_text(json.dumps({**json.loads(saved), **fields}))
    return path, saved


def load_counting_configs(rt, backend):
    """tryLoad with the given champion backend -> (its answer, the config.json requests seen, workers included)."""
    seen = []
    listener = lambda req: seen.append(req.url) if req.url.endswith("/config.json") else None  # noqa: E731
    rt.page.on("request", listener)
    try:
        out = rt.page.evaluate("([m, o]) => window.exactspecRunner.tryLoad(m, o)", [MOUNTED, {"championBackend": backend, **FAST_LOAD}])
    finally:
        rt.page.remove_listener("request", listener)
    return out, seen


@pytest.mark.parametrize("backend", ["webgpu", "wasm"])
def test_a_config_python_accepts_loads_everywhere_and_config_json_is_fetched_once(pair, backend):
    """pretraining_tp 2 (which transformers 5 ignores and validate_config accepts) loads on this champion
    backend and the draft, each config.json is requested once, and the greedy answer is the
    unchanged pair's."""
    rt, root = pair
    validate_config({**json.loads((root / "champion" / "config.json").read_text()), "pretraining_tp": 2})
    plain, _ = load_counting_configs(rt, backend)
    assert "ready" in plain, plain
    want = rt.page.evaluate("(p) => window.exactspecRunner.generate(p)", PAYLOAD)["result"]["token_ids"]
    restore = [edited(root, role, {"pretraining_tp": 2}) for role in ("champion", "draft")]
    try:
        out, seen = load_counting_configs(rt, backend)
        assert "ready" in out, out
        assert out["ready"]["info"]["champion"]["backend"] == backend and out["ready"]["info"]["draft"] is not None, out
        assert sorted(u.rsplit("/", 2)[-2] for u in seen) == ["champion", "draft"], seen   # one fetch per model
        got = rt.page.evaluate("(p) => window.exactspecRunner.generate(p)",
                               {**PAYLOAD, "config": {**PAYLOAD["config"], "speculate": "draft"}})["result"]
        assert got["error"] is None and got["token_ids"] == want
    finally:
        for path, saved in restore:
            path.write_bytes(saved)


@pytest.mark.parametrize("role, fields", [("champion", {"intermediate_size": 766}), ("draft", {"head_dim": 66})])
@pytest.mark.parametrize("backend", ["webgpu", "wasm"])
def test_a_config_python_refuses_is_refused_with_its_code_and_sentence(pair, backend, role, fields):
    """Sizes the int8 kernels cannot pack are refused by validate_config, and the engine refuses the
    load with exactly its code and sentence, whichever champion backend was asked for."""
    rt, root = pair
    path, saved = edited(root, role, fields)
    try:
        with pytest.raises(ExactSpecError) as want:
            validate_config(json.loads(path.read_text()), source=f"{role}/config.json")
        out, _ = load_counting_configs(rt, backend)
    finally:
        path.write_bytes(saved)
    assert out.get("error") == {"code": want.value.code, "message": f"{want.value.code}: {want.value.message}"}, out
