"""A GGUF file as the browser engine's DRAFT (issue 17), in headless Chromium (WASM champion, Pyodide
orchestrator): a tiny random llama GGUF carrying the real SmolLM2 GGUF's tokenizer, made here
(synthetic_models.write_tiny_draft_gguf), drafts for the SmolLM2 GGUF champion and the greedy answer is
champion alone's; a draft whose tokenizer differs is refused with the CLI's code and field, beside a
GGUF champion and beside a folder champion; a hostile draft file is refused as the CLI refuses it.
Node, no browser: the draft's logits on a tiny GGUF are the NumPy reference's on the same file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from browser_fixture import browser_page, chromium_browser, http_server  # noqa: F401
from engine_loads import FAST_LOAD, browser_runtime
from exactspec.core.errors import ExactSpecError
from exactspec.formats.gguf_model import GGUFModel, load_reference
from exactspec.formats.manifest import sha256_file
from gguf_builders import REPO, smollm2_path as fetched_smollm2
from synthetic_models import write_tiny_draft_gguf, write_tiny_model
from tolerances import max_error, within

QUESTION = "What is the capital of France?"
N_TOKENS = 16
TOY_CHAMPION = os.path.join(REPO, "web", "models", "champion")


@pytest.fixture(scope="module")
def smollm2_path():
    return fetched_smollm2()


@pytest.fixture(scope="module")
def tiny_gguf_draft(smollm2_path, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf-draft") / "tiny-draft.gguf")
    write_tiny_draft_gguf(smollm2_path, path)
    return path


def cli_refusal(champion: str, draft: str) -> ExactSpecError:
    """What `exactspec generate --champion C --draft D` (reference backend) prints: one coded line."""
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "py"))
    r = subprocess.run([sys.executable, "-m", "exactspec.host.cli", "generate", "--champion", champion, "--draft", draft,
                        "--prompt", "x", "--max-new-tokens", "1", "--speculate", "draft"],
                       capture_output=True, text=True, env=env, timeout=600)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("exactspec: E_"), r.stderr
    code, message = lines[0][len("exactspec: "):].split(": ", 1)
    return ExactSpecError(code, message)


def test_a_gguf_draft_drafts_for_the_gguf_champion_and_stays_exact(smollm2_path, tiny_gguf_draft, chromium_browser):
    with browser_runtime(smollm2_path, tiny_gguf_draft, browser=chromium_browser, champion_backend="wasm") as rt:
        info = rt.ready["info"]
        assert info["draft"]["identity"] == sha256_file(tiny_gguf_draft)[0]          # the file's sha256, as a champion's
        assert info["draft"]["artifact_bytes"] == os.path.getsize(tiny_gguf_draft)
        assert info["manifest"]["pair_checked"] is True and info["manifest"]["gguf_draft"]["layers"] == 2
        config = {"temperature": 0, "max_new_tokens": N_TOKENS, "k": 3}
        alone, drafted = (rt.generate({"prompt": QUESTION, "chat": True, "config": {**config, "speculate": mode}})["result"]
                          for mode in ("none", "draft"))
    assert drafted["stats"]["mode"] == "draft" and drafted["stats"]["proposed"] > 0, drafted["stats"]
    assert drafted["token_ids"] == alone["token_ids"] and alone["finish_reason"] == drafted["finish_reason"], (alone["text"], drafted["text"])
    assert sha256_file(tiny_gguf_draft)[0] in str(drafted["receipt"])


# A damaged draft -> (the edit, the code a load refuses it with, the phrase it names; None: the field
# GGUFModel names). The foreground tests below refuse each; the background test expects the same.
DAMAGES = {"eos": (lambda w: w.add_uint32("tokenizer.ggml.eos_token_id", 0), "E_MANIFEST_MISMATCH",
                   "field 'eos_token_id' differs: champion 2 draft 0"),
           "layers": (lambda w: w.add_uint32("llama.block_count", 3), "E_MODEL_LOAD", None)}


@pytest.mark.parametrize("champion_kind", ["gguf", "folder"])
def test_a_mismatched_gguf_draft_is_refused_with_the_clis_code_and_field(smollm2_path, chromium_browser, tmp_path,
                                                                         champion_kind):
    """Beside the GGUF champion: a draft whose EOS id differs; beside the shipped toy folder champion
    (vocabulary 4096): the SmolLM2-tokenizer draft itself (49152)."""
    if champion_kind == "gguf":
        champion, draft = smollm2_path, str(tmp_path / "eos.gguf")
        edit, _, phrase = DAMAGES["eos"]
        write_tiny_draft_gguf(smollm2_path, draft, edit=edit)
    else:
        champion, draft = TOY_CHAMPION, str(tmp_path / "smollm2-tokenizer.gguf")
        write_tiny_draft_gguf(smollm2_path, draft)
        phrase = "field 'tokenizer_vocab_size' differs: champion 4096 draft 49152"
    cli = cli_refusal(champion, draft)
    with pytest.raises(ExactSpecError) as page:
        browser_runtime(champion, draft, browser=chromium_browser, champion_backend="wasm")
    assert page.value.code == cli.code == "E_MANIFEST_MISMATCH", (str(page.value), str(cli))
    assert phrase in page.value.message and phrase in cli.message, (str(page.value), str(cli))
    assert str(page.value).count("E_MANIFEST_MISMATCH") == 1


def test_a_hostile_gguf_draft_is_refused_with_the_clis_code_and_field(smollm2_path, chromium_browser, tmp_path):
    """Metadata says 3 layers, the tensor table holds 2: refused at the check, before any weight."""
    path = str(tmp_path / "bad-draft.gguf")
    edit, code, _ = DAMAGES["layers"]
    write_tiny_draft_gguf(smollm2_path, path, edit=edit)
    with pytest.raises(ExactSpecError) as cli:
        GGUFModel(path)
    with pytest.raises(ExactSpecError) as page:
        browser_runtime(smollm2_path, path, browser=chromium_browser, champion_backend="wasm")
    assert page.value.code == cli.value.code == code
    field = cli.value.message.split(": ")[1]
    assert field in page.value.message and str(page.value).count("E_MODEL_LOAD") == 1, (str(page.value), str(cli.value))


BACKGROUND_DONE = "() => window.exactspecRunner.info()?.info?.draft_loading === false"


@pytest.mark.parametrize("damage", [None, "eos", "layers"], ids=["intact", "eos", "layers"])
def test_a_gguf_draft_loaded_in_the_background_is_checked_there(smollm2_path, tiny_gguf_draft, chromium_browser, tmp_path,
                                                                damage):
    """draftInBackground with a GGUF draft (model_check.mjs checkDraft's GGUF branch): the engine is
    ready with the champion alone before the draft's file is read; an intact draft then arrives (its
    file's sha256 its identity) and drafts exactly; a mismatched draft (another EOS) or a hostile one
    (3 layers in its metadata, 2 in its tensor table) leaves a ready champion-alone engine whose
    draft_error has the code and field the same load refuses with when the draft loads before ready
    (DAMAGES: the two foreground tests above refuse these very damages with them)."""
    path, code = tiny_gguf_draft, None
    if damage is not None:
        path = str(tmp_path / f"{damage}.gguf")
        edit, code, phrase = DAMAGES[damage]
        write_tiny_draft_gguf(smollm2_path, path, edit=edit)
        if phrase is None:
            with pytest.raises(ExactSpecError) as cli:
                GGUFModel(path)
            assert cli.value.code == code
            phrase = cli.value.message.split(": ")[1]
    config = {"temperature": 0, "max_new_tokens": N_TOKENS, "k": 3}
    with browser_runtime(smollm2_path, path, browser=chromium_browser, champion_backend="wasm",
                         draft_in_background=True) as rt:
        assert rt.ready["info"]["draft_loading"] is True and rt.ready["info"]["draft_error"] is None
        assert rt.ready["info"]["draft"] is None
        rt.page.wait_for_function(BACKGROUND_DONE, timeout=120000)
        info = rt.page.evaluate("() => window.exactspecRunner.info().info")
        alone = rt.generate({"prompt": QUESTION, "chat": True, "config": {**config, "speculate": "none"}})["result"]
        assert alone["error"] is None
        if code is None:
            assert info["draft_error"] is None and info["draft"]["identity"] == sha256_file(path)[0]
            drafted = rt.generate({"prompt": QUESTION, "chat": True, "config": {**config, "speculate": "draft"}})["result"]
            assert drafted["token_ids"] == alone["token_ids"] and drafted["stats"]["proposed"] > 0, drafted["stats"]
        else:
            err = info["draft_error"]
            assert info["draft"] is None and err["code"] == code, (err, code)
            assert phrase in err["message"], (err, phrase)


DRAFT_JS = """
import { readFileSync } from "node:fs";
import { createDraft } from "%s";
import { validateConfig } from "%s";
const [path, config] = [process.argv[2], validateConfig(JSON.parse(process.argv[3]))];   // as the model check hands it over
const fetchFn = async (url) => new Response(readFileSync(new URL(url)));
const draft = await createDraft({ wasmBytes: readFileSync("%s"), modelUrl: "file://" + path, configJson: config, fetchFn });
const logits = draft.forward(JSON.parse(process.argv[4]), 0);
process.stdout.write(JSON.stringify({ identity: draft.identity, bytes: draft.artifactBytes,
  logits: Buffer.from(logits.buffer).toString("base64") }));
"""


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_wasm_draft_on_a_gguf_gives_the_references_logits(tmp_path, arch):
    """createDraft on a .gguf URL (quantised tensors, q/k rows un-permuted for llama, biases for qwen2)
    against the NumPy reference on the same file, and the file's sha256 as its identity."""
    from gguf import GGMLQuantizationType as Q
    import base64
    path = str(tmp_path / f"{arch}.gguf")
    write_tiny_model(path, arch=arch, types={"token_embd.weight": Q.Q8_0, "attn_q.weight": Q.Q4_K,
                                             "attn_k.weight": Q.Q4_1, "ffn_up.weight": Q.Q6_K})
    with GGUFModel(path) as model:
        config = model.config
    ids = [5, 17, 3, 99, 250, 7]
    script = tmp_path / "draft.mjs"
    script.write_text(DRAFT_JS % (Path(REPO, "web", "draft", "draft.mjs").as_uri(), Path(REPO, "web", "formats", "model_checks.mjs").as_uri(),
                                  Path(REPO, "web", "build", "cpu.wasm")))
    r = subprocess.run(["node", str(script), path, json.dumps(config), json.dumps(ids)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    ref = load_reference(path)
    want = np.asarray(ref.forward(ids, 0), dtype=np.float32).reshape(len(ids), -1)[-1]
    got = np.frombuffer(base64.b64decode(out["logits"]), dtype=np.float32)
    assert out["identity"] == ref.identity and out["bytes"] == os.path.getsize(path)
    print(f"[err] GGUF draft_logits ({arch}) max abs {max_error(got, want, 'draft_logits'):.3g}")
    assert within(got, want, "draft_logits"), max_error(got, want, "draft_logits")


ENGINE_JS = """async ([championUrl, draftUrl, picked, placement, fastLoad]) => {
  const { createEngine } = await import("/web/exactspec.mjs");
  const file = async (url) => new File([await (await fetch(url)).blob()], url.split("/").pop());   // as <input type=file> gives it
  const [champion, draft] = picked ? [await file(championUrl), await file(draftUrl)] : [championUrl, draftUrl];
  const stages = new Set();
  try {
    const engine = await createEngine({ champion, draft, championBackend: "wasm", draftPlacement: placement, ...fastLoad,
      onProgress: (p) => stages.add(p.stage === "fetch" ? `fetch ${p.name}` : p.stage) });
    const run = (speculate) => engine.generate("What is the capital of France?",
      { chat: true, temperature: 0, max_new_tokens: 8, k: 3, speculate });
    const alone = await run("none"), drafted = await run("draft");
    const info = engine.ready.info.draft;
    engine.terminate();
    return { alone: alone.token_ids, drafted: drafted.token_ids, proposed: drafted.stats.proposed, info, stages: [...stages] };
  } catch (err) {
    return { error: { code: err.code, message: err.message } };
  }
}"""


@pytest.mark.parametrize("picked,placement", [(True, "auto"), (False, "worker")], ids=["picked-files-inline", "urls-worker"])
def test_the_engine_api_takes_a_gguf_draft(smollm2_path, tiny_gguf_draft, browser_page, http_server, picked, placement):
    """createEngine({draft: File | URL}): picked files are read in the orchestrator worker (the draft
    inline); a URL draft in its own worker gets the checked config with its URL. Its bytes are
    reported as load progress."""
    served = os.path.join(REPO, "build", f"test_gguf_browser_draft_{os.getpid()}.gguf")   # build/ is served
    with open(served, "wb") as f, open(tiny_gguf_draft, "rb") as src:
        f.write(src.read())
    try:
        browser_page.goto(http_server.url + "/web/runner.html")
        out = browser_page.evaluate(ENGINE_JS, [f"/web/models/smollm2-135m-instruct/{os.path.basename(smollm2_path)}",
                                                f"/build/{os.path.basename(served)}", picked, placement, FAST_LOAD])
    finally:
        os.remove(served)
    assert "error" not in out, out
    assert out["info"]["identity"] == sha256_file(tiny_gguf_draft)[0] and out["info"]["placement"] == ("inline" if picked else "worker")
    assert out["drafted"] == out["alone"] and out["proposed"] > 0, out
    if picked:              # (the draft worker's own fetches are not counted, as for a folder draft)
        assert any(s.startswith("fetch ") and s.endswith(".gguf") and "smollm2" not in s.lower() for s in out["stages"]), out["stages"]
