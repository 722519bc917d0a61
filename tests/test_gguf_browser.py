"""A GGUF file as the browser engine's champion, in headless Chromium (WASM champion, Pyodide
orchestrator): the real SmolLM2-135M-Instruct Q4_1 file answers a chat turn with the CPython
reference's greedy tokens (gguf_pair), prompt lookup gives the same tokens, the receipt names the
file's sha256; a hostile .gguf is refused with the CLI's code and field. The real-file tests skip
only when build/models/status.json says the model is unavailable."""
from __future__ import annotations

import functools
import os
import time

import pytest

from browser_fixture import browser_page, chromium_browser, http_server  # noqa: F401
from engine_loads import FAST_LOAD_JS, browser_runtime
from exactspec.host.browser_run import BrowserRuntime
from exactspec.core.errors import ExactSpecError
from exactspec.formats.gguf_model import GGUFModel
from gguf_builders import REPO, gguf_reference_pair, smollm2_path as fetched_smollm2
from synthetic_models import write_tiny_model

QUESTION = "What is the capital of France?"
N_TOKENS = 16


@pytest.fixture(scope="module")
def smollm2_path():
    return fetched_smollm2()


@functools.lru_cache(maxsize=None)
def reference_tokens(path) -> tuple:
    """(chat prompt ids, greedy answer ids stopping on EOS) of the CPython reference on the file."""
    from exactspec.core.orchestrator import GenerationConfig
    from exactspec.core.policy import SamplingPolicy
    from exactspec.formats.chat import encode_chat_prompt
    pair = gguf_reference_pair(path)
    prompt = encode_chat_prompt(pair.tokenizer, pair.tokenizer_config, [{"role": "user", "content": QUESTION}])
    result = pair.orchestrator.generate(prompt, GenerationConfig(max_new_tokens=N_TOKENS, speculate="none",
                                                                 policy=SamplingPolicy(temperature=0),
                                                                 stop_token_ids=pair.stop_token_ids))
    return prompt, list(result.token_ids)


def test_smollm2_gguf_chat_in_the_browser_equals_reference(smollm2_path, chromium_browser):
    prompt, want = reference_tokens(smollm2_path)
    from exactspec.formats.manifest import sha256_file
    identity, size = sha256_file(smollm2_path)
    start = time.perf_counter()
    # the float function (matmul "f32"), the reference's: under the default q8act-v1 this question's
    # first token turns on a 0.08 logit margin (docs/champion_wasm.md, Weight formats); the full load
    # (warm-up and calibration): this test reports the load's time as a user pays it (one load: a
    # second one, in a new page, measured the same thing again for ~20 s of CI's time)
    rt = BrowserRuntime(smollm2_path, None, browser=chromium_browser, champion_backend="auto", matmul="f32")
    load_s = time.perf_counter() - start
    try:
        info = rt.ready["info"]
        assert info["champion"]["backend"] == "wasm" and info["champion"]["identity"] == identity
        assert info["champion"]["artifact_bytes"] == size
        config = {"temperature": 0, "max_new_tokens": N_TOKENS}
        alone = rt.generate({"prompt": QUESTION, "chat": True, "config": {**config, "speculate": "none"}})["result"]
        lookup = rt.generate({"prompt": QUESTION, "chat": True, "config": {**config, "speculate": "lookup"}})["result"]
        assert alone["prompt_ids"] == prompt
        assert alone["token_ids"] == want, alone["text"]
        assert lookup["token_ids"] == want
        assert "Paris" in alone["text"]
        # its context read from the file's metadata; a request past it refused before any output
        # (the K/V growth to 4096 positions: tests/test_long_context.py)
        assert info["champion"]["max_context"] == 8192
        with pytest.raises(ExactSpecError) as past:
            rt.generate({"prompt": QUESTION, "config": {"max_new_tokens": 8192}})
        assert past.value.code == "E_CONTEXT_OVERFLOW" and "8192" in past.value.message
        receipt = alone["receipt"]
        assert identity in str(receipt)
        decode_ms = receipt["timing_ms"]["decode"] / max(1, len(alone["token_ids"]) - 1)
        load = {k: round(v) for k, v in rt.ready["timing_ms"].items()}
        print(f"[measure] browser GGUF load (new page: Pyodide, check, fetch, dequantise): {load_s:.1f} s; "
              f"timing_ms {load}; champion alone {decode_ms:.0f} ms/token")
    finally:
        rt.close()


def test_hostile_gguf_refused_with_the_clis_code(tmp_path, chromium_browser):
    """A tiny model whose metadata says 3 layers but holds 2: the page names the same field."""
    path = tmp_path / "bad.gguf"
    write_tiny_model(str(path), edit=lambda w: w.add_uint32("llama.block_count", 3))
    with pytest.raises(ExactSpecError) as cli:
        GGUFModel(str(path))
    with pytest.raises(ExactSpecError) as page:
        browser_runtime(str(path), None, browser=chromium_browser, champion_backend="wasm")
    assert page.value.code == cli.value.code == "E_MODEL_LOAD"
    field = cli.value.message.split(": ")[1]
    assert field in page.value.message and str(page.value).count("E_MODEL_LOAD") == 1, (str(page.value), str(cli.value))


@pytest.fixture(scope="module")
def tiny_draft(smollm2_path, tmp_path_factory):
    from test_gguf_cli import write_tiny_draft   # a 1-layer bf16 Llama with the GGUF's rebuilt tokenizer
    return write_tiny_draft(smollm2_path, str(tmp_path_factory.mktemp("smollm2-tiny-draft")))


def test_a_draft_folder_pairs_with_the_gguf_champion_and_stays_exact(smollm2_path, tiny_draft, chromium_browser):
    prompt, want = reference_tokens(smollm2_path)
    # the float function, whose tokens the reference gives (q8act flips this question's near-tie)
    with browser_runtime(smollm2_path, tiny_draft, browser=chromium_browser, champion_backend="wasm", matmul="f32") as rt:
        assert rt.ready["info"]["manifest"]["pair_checked"] is True
        out = rt.generate({"prompt": QUESTION, "chat": True,
                           "config": {"temperature": 0, "max_new_tokens": N_TOKENS, "speculate": "draft", "k": 3}})
        result = out["result"]
        assert result["token_ids"] == want and result["stats"]["proposed"] > 0, result["stats"]


def test_a_mismatched_draft_is_refused_naming_the_field(smollm2_path, tiny_draft, chromium_browser, tmp_path):
    import json
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(tiny_draft, bad)
    generation = bad / "generation_config.json"
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "eos_token_id": [2, 0]}))
    with pytest.raises(ExactSpecError) as page:
        browser_runtime(smollm2_path, str(bad), browser=chromium_browser, champion_backend="wasm")
    assert page.value.code == "E_MANIFEST_MISMATCH" and "field 'stop_token_ids' differs" in page.value.message
    assert str(page.value).count("E_MANIFEST_MISMATCH") == 1


PICKED_FILE_JS = """async ([fileUrl, name, matmul = "auto"]) => {
  const { createEngine } = await import("/web/exactspec.mjs");
  const blob = await (await fetch(fileUrl)).blob();
  const file = new File([blob], name);                 // as <input type=file> gives it
  try {
    const engine = await createEngine({ champion: file, draft: null, championBackend: "wasm", matmul, ...%s });
    const out = await engine.generate("What is the capital of France?",
      { chat: true, temperature: 0, max_new_tokens: 16, speculate: "none" });
    const info = engine.ready.info.champion;
    engine.terminate();
    return { token_ids: out.token_ids, identity: info.identity };
  } catch (err) {
    return { error: { code: err.code, message: err.message } };
  }
}""" % FAST_LOAD_JS


def test_a_picked_gguf_file_runs_through_the_engine_api(smollm2_path, browser_page, http_server, tmp_path):
    """createEngine({champion: File}): the file read in the worker behind a local URL; the real model
    fetched from where `exactspec serve` puts it (web/models/smollm2-135m-instruct/)."""
    prompt, want = reference_tokens(smollm2_path)
    from exactspec.formats.manifest import sha256_file
    name = os.path.basename(smollm2_path)
    browser_page.goto(http_server.url + "/web/runner.html")
    # the float function: the reference's tokens (under q8act a near-tie of this question flips, docs/quant_kernels.md)
    out = browser_page.evaluate(PICKED_FILE_JS, [f"/web/models/smollm2-135m-instruct/{name}", name, "f32"])
    assert out.get("token_ids") == want and out["identity"] == sha256_file(smollm2_path)[0], out


def test_a_picked_hostile_gguf_file_is_refused_with_the_clis_code(browser_page, http_server, tmp_path):
    path = tmp_path / "bad.gguf"
    write_tiny_model(str(path), edit=lambda w: w.add_uint32("llama.block_count", 3))
    with pytest.raises(ExactSpecError) as cli:
        GGUFModel(str(path))
    served = os.path.join(REPO, "build", "test_gguf_browser_hostile.gguf")   # build/ is served; removed below
    with open(served, "wb") as f:
        f.write(path.read_bytes())
    try:
        browser_page.goto(http_server.url + "/web/runner.html")
        out = browser_page.evaluate(PICKED_FILE_JS, ["/build/test_gguf_browser_hostile.gguf", "bad.gguf"])
    finally:
        os.remove(served)
    assert out["error"]["code"] == cli.value.code == "E_MODEL_LOAD", out
    assert out["error"]["message"] == "E_MODEL_LOAD: bad.gguf: " + cli.value.message.split(": ", 1)[1], (out, str(cli.value))


def test_a_picked_gguf_with_an_inf_weight_is_refused_naming_tensor_and_row(browser_page, http_server, tmp_path):
    """The header is sound, a weight is not: refused at load as the CLI's reference refuses it."""
    import numpy as np
    from exactspec.formats.gguf import GGUFFile
    from exactspec.formats.gguf_model import load_reference
    path = tmp_path / "inf.gguf"
    write_tiny_model(str(path))                                     # every tensor F32
    data = bytearray(path.read_bytes())
    with GGUFFile(str(path)) as f:
        t = f.tensors["blk.1.ffn_up.weight"]
        at = t.offset + 5 * t.row_bytes + 4 * 7                     # row 5, column 7
    data[at:at + 4] = np.float32(np.inf).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ExactSpecError) as cli:
        load_reference(str(path))
    served = os.path.join(REPO, "build", "test_gguf_browser_inf.gguf")
    with open(served, "wb") as f:
        f.write(bytes(data))
    try:
        browser_page.goto(http_server.url + "/web/runner.html")
        out = browser_page.evaluate(PICKED_FILE_JS, ["/build/test_gguf_browser_inf.gguf", "inf.gguf"])
    finally:
        os.remove(served)
    assert "row 5 holds a value that is inf or NaN" in cli.value.message
    assert out["error"]["message"] == "E_MODEL_LOAD: inf.gguf: " + cli.value.message.split(": ", 1)[1], (out, str(cli.value))


def test_smollm2_gguf_on_the_webgpu_champion(smollm2_path, chromium_browser):
    """The same file through the WebGPU champion (createChampionFromTensors; SwiftShader here, ~2 s
    a token, so 6 tokens) with the draft made for it (web/models/smollm2-draft): the reference's
    greedy tokens alone, with the draft and with prompt lookup (blocks of k + 1 positions verified
    on the GPU must give the single-position tokens)."""
    prompt, want = reference_tokens(smollm2_path)
    draft = os.path.join(REPO, "web", "models", "smollm2-draft")
    with browser_runtime(smollm2_path, draft, browser=chromium_browser, champion_backend="webgpu") as rt:
        assert rt.ready["info"]["champion"]["backend"] == "webgpu"
        outs = {mode: rt.generate({"prompt": QUESTION, "chat": True,
                                   "config": {"temperature": 0, "max_new_tokens": 6, "speculate": mode, "k": 3}}
                                  )["result"] for mode in ("none", "draft", "lookup")}
    for mode, out in outs.items():
        assert out["token_ids"] == want[:6], (mode, out["text"])
    assert outs["draft"]["stats"]["proposed"] > 0, outs["draft"]["stats"]
