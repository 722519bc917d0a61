"""Context as the model allows (issue 21 item 4), in headless Chromium on the WASM champion: the
champion's K/V caches start at 512 positions and grow on demand (wasm/champion.c grow_kv; their
exactness across a growth is tests/test_wasm_champion.py's), so a request reaches 4096 positions, and
one that would pass the model's context is refused before any output with E_CONTEXT_OVERFLOW naming
the limit. On the shipped toy champion with its config's context set to 8192 (the same growth code,
~10x less compute a position than SmolLM2, whose 4060-token prefill took 95 s of CI's time; the real
file's 8192 read from its metadata, and its refusal: tests/test_gguf_browser.py)."""
import json
import os
import shutil

import pytest

from browser_fixture import chromium_browser  # noqa: F401
from engine_loads import FAST_RUNTIME
from exactspec.core.errors import ExactSpecError
from exactspec.host.browser_run import BrowserRuntime
from exactspec.reference.models import default_models_dir

PARAGRAPH = ("The river rose in the spring and the village moved its boats to the high bank, as it "
             "had every year since the old bridge was built. ")
# the toy tokenizer's special ids (<|bos|> .. <|end|>): suppressed, the answer runs to its length
with open(os.path.join(default_models_dir(), "champion", "tokenizer.json"), encoding="utf-8") as f:
    TOY_SPECIAL_IDS = sorted(t["id"] for t in json.load(f)["added_tokens"])


@pytest.fixture(scope="module")
def toy_8192(chromium_browser, tmp_path_factory):
    """The shipped toy champion, its config (and tokenizer config) allowing 8192 positions."""
    folder = tmp_path_factory.mktemp("toy8192") / "champion"
    shutil.copytree(os.path.join(default_models_dir(), "champion"), folder)
    for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        doc = json.loads((folder / name).read_text())
        doc[key] = 8192
        (folder / name).write_text(json.dumps(doc))
    rt = BrowserRuntime(str(folder), None, browser=chromium_browser, timeout_s=600, champion_backend="wasm",
                        **FAST_RUNTIME)
    assert rt.ready["info"]["champion"]["max_context"] == 8192
    yield rt
    rt.close()


def test_a_request_reaches_4096_positions(toy_8192):
    runtime = toy_8192
    text = PARAGRAPH * 115                                   # ~4030 tokens
    probe = runtime.generate({"prompt": text, "config": {"max_new_tokens": 1, "speculate": "none"}})["result"]
    n_prompt = len(probe["prompt_ids"])
    assert probe["error"] is None and 3000 < n_prompt < 4090, (probe["error"], n_prompt)
    new = 4096 - n_prompt + 8                                # past 4096 positions
    # the special ids suppressed: the answer runs to its length; the prompt's K/V is the first
    # request's (prefix reuse), which grew the caches past 4000
    out = runtime.generate({"prompt": text, "config": {"max_new_tokens": new, "speculate": "none", "temperature": 0,
                                                       "suppress_token_ids": TOY_SPECIAL_IDS}})["result"]
    assert out["error"] is None and out["finish_reason"] == "length", (out["error"], out["finish_reason"])
    assert out["stats"]["prompt_reused"]["champion"] == n_prompt - 1
    assert n_prompt + len(out["token_ids"]) > 4096
    memory = runtime.page.evaluate("() => window.exactspecRunner.memory()")
    print(f"[measure] prompt {n_prompt} + {len(out['token_ids'])} tokens; first request's prefill "
          f"{probe['timing_ms']['prefill']:.0f} ms; memory {memory}")


def test_past_the_model_s_context_is_refused_before_output(toy_8192):
    with pytest.raises(ExactSpecError) as info:
        toy_8192.generate({"prompt": PARAGRAPH, "config": {"max_new_tokens": 8192}})
    assert info.value.code == "E_CONTEXT_OVERFLOW" and "8192" in info.value.message
