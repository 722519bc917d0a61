"""Context as the model allows (issue 21 item 4), in headless Chromium on the WASM champion with the
real SmolLM2-135M-Instruct Q4_1 file (max_position_embeddings 8192): the champion's K/V caches start
at 512 positions and grow on demand (wasm/champion.c grow_kv; their exactness across a growth is
tests/test_wasm_champion.py's), a request reaches 4096 positions, and one that would pass 8192 is
refused before any output with E_CONTEXT_OVERFLOW naming the limit."""
import pytest

from browser_fixture import chromium_browser  # noqa: F401
from exactspec.core.errors import ExactSpecError
from exactspec.host.browser_run import BrowserRuntime
from gguf_builders import smollm2_path

PARAGRAPH = ("The river rose in the spring and the village moved its boats to the high bank, as it "
             "had every year since the old bridge was built. ")


@pytest.fixture(scope="module")
def runtime(chromium_browser):
    rt = BrowserRuntime(smollm2_path(), None, browser=chromium_browser, timeout_s=900, champion_backend="wasm",
                        calibrate="off")
    assert rt.ready["info"]["champion"]["max_context"] == 8192
    yield rt
    rt.close()


def test_a_request_reaches_4096_positions(runtime):
    text = PARAGRAPH * 140                                   # ~4060 tokens
    probe = runtime.generate({"prompt": text, "config": {"max_new_tokens": 1, "speculate": "none"}})["result"]
    n_prompt = len(probe["prompt_ids"])
    assert probe["error"] is None and 3000 < n_prompt < 4090, (probe["error"], n_prompt)
    new = 4096 - n_prompt + 8                                # past 4096 positions
    # the special ids (<|endoftext|>, <|im_start|>, <|im_end|>) suppressed: the answer runs to its
    # length; the prompt's K/V is the first request's (prefix reuse), which grew the caches past 4000
    out = runtime.generate({"prompt": text, "config": {"max_new_tokens": new, "speculate": "none", "temperature": 0,
                                                       "suppress_token_ids": [0, 1, 2]}})["result"]
    assert out["error"] is None and out["finish_reason"] == "length", (out["error"], out["finish_reason"])
    assert out["stats"]["prompt_reused"]["champion"] == n_prompt - 1
    assert n_prompt + len(out["token_ids"]) > 4096
    memory = runtime.page.evaluate("() => window.exactspecRunner.memory()")
    print(f"[measure] prompt {n_prompt} + {len(out['token_ids'])} tokens; first request's prefill "
          f"{probe['timing_ms']['prefill']:.0f} ms; memory {memory}")


def test_past_the_model_s_context_is_refused_before_output(runtime):
    with pytest.raises(ExactSpecError) as info:
        runtime.generate({"prompt": PARAGRAPH, "config": {"max_new_tokens": 8192}})
    assert info.value.code == "E_CONTEXT_OVERFLOW" and "8192" in info.value.message
