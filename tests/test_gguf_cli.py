"""A GGUF file through the command line (issue 17): `exactspec generate --champion FILE.gguf` on the
reference backend, the draft that web/models/manifest.json binds to the champion's sha256 picked
automatically, mismatched drafts refused naming the field, chat_template.jinja read as transformers
reads it. The real SmolLM2 GGUF (tools/fetch_models.py); skipped only when build/models/status.json
says it is unavailable, with its reason. The shipped pairing (web/models/smollm2-draft) runs as
committed; the other drafts are a tiny random bf16 Llama made here with the GGUF's rebuilt
tokenizer (as tools/train/distill_smollm2.py exports its draft).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from exactspec.formats.manifest import canonical_json, sha256_file
from gguf_builders import REPO, smollm2_path

QUESTION = "What is the capital of France?"
ANSWER_TOKENS = 12


def cli(*args, models_dir=None):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "py"))
    env.pop("EXACTSPEC_DEBUG", None)
    if models_dir:
        env["EXACTSPEC_MODELS"] = str(models_dir)
    return subprocess.run([sys.executable, "-m", "exactspec.host.cli", *args], capture_output=True, text=True, env=env,
                          timeout=900)


def one_coded_line(stderr: str, code: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"exactspec: {code}: "), stderr
    assert lines[0].count(code) == 1, stderr
    return lines[0]


@pytest.fixture(scope="module")
def gguf_path():
    return smollm2_path()


def write_tiny_draft(gguf_path: str, out: str) -> str:
    """A 1-layer random Llama (bf16, tied) with the GGUF's vocabulary, saved by transformers, and the
    GGUF's tokenizer files as exactspec rebuilds them."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from exactspec.formats.gguf import GGUFFile
    from exactspec.formats.gguf_tokenizer import stop_token_ids, tokenizer_config, tokenizer_spec
    with GGUFFile(gguf_path) as f:
        spec, tok_config, stops = tokenizer_spec(f), tokenizer_config(f), stop_token_ids(f)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    with open(os.path.join(out, "tokenizer.json"), "wb") as fh:
        fh.write(canonical_json(spec))
    for name, value in (("tokenizer_config.json", tok_config), ("generation_config.json", {"eos_token_id": list(stops)})):
        with open(os.path.join(out, name), "w", encoding="utf-8") as fh:
            json.dump(value, fh, indent=1)
    return out


@pytest.fixture(scope="module")
def tiny_draft(gguf_path, tmp_path_factory):
    return write_tiny_draft(gguf_path, str(tmp_path_factory.mktemp("smollm2-tiny-draft")))


def models_dir_binding(tmp_path, gguf_path: str, draft: str):
    """A models folder whose manifest.json (the shipped one plus a `drafts` entry) binds `draft` to the
    GGUF's sha256."""
    with open(os.path.join(REPO, "web", "models", "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    manifest["drafts"] = {sha256_file(gguf_path)[0]: {"dir": "smollm2-draft", "champion": os.path.basename(gguf_path)}}
    root = tmp_path / "models"
    shutil.copytree(draft, root / "smollm2-draft")
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def chat_json(gguf_path, *flags, models_dir=None):
    r = cli("generate", "--champion", gguf_path, "--chat", "--prompt", QUESTION, "--max-new-tokens", str(ANSWER_TOKENS),
            "--json", *flags, models_dir=models_dir)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def alone(gguf_path):
    return chat_json(gguf_path, "--speculate", "none")


@pytest.fixture(scope="module")
def browser_alone(gguf_path):
    """Champion alone in the browser engine (WASM champion, the default matmul q8act-v1): the tokens every
    other browser mode must give. (Not the reference's: on this question q8act-v1 and the float function
    part at a 0.08 logit margin, docs/champion_wasm.md, Weight formats.)"""
    return chat_json(gguf_path, "--backend", "browser", "--champion-backend", "wasm", "--temperature", "0", "--speculate", "none")


def test_generate_chat_on_the_gguf_answers(gguf_path):
    r = cli("generate", "--champion", gguf_path, "--chat", "--prompt", QUESTION)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("[eos]"), r.stderr


def test_the_draft_the_manifest_binds_is_picked_and_exact(gguf_path, tiny_draft, alone, tmp_path):
    out = chat_json(gguf_path, "--temperature", "0", "--speculate", "draft",
                    models_dir=models_dir_binding(tmp_path, gguf_path, tiny_draft))
    assert out["stats"]["proposed"] > 0 and out["stats"]["mode"] == "draft", out["stats"]
    assert out["token_ids"] == alone["token_ids"] and "Paris" in out["text"]


def test_the_shipped_manifest_pairs_the_smollm2_draft(gguf_path, alone):
    """web/models/manifest.json binds web/models/smollm2-draft to the GGUF's sha256: with
    --speculate draft and no --draft the command line runs that draft, and its greedy tokens are
    the champion's. With neither, the default (auto) may use that draft where it measures that it
    pays; its greedy tokens are the champion's either way."""
    default = chat_json(gguf_path, "--temperature", "0")
    assert default["stats"]["mode"] == "auto" and default["token_ids"] == alone["token_ids"], default["stats"]
    out = chat_json(gguf_path, "--temperature", "0", "--speculate", "draft")
    assert out["stats"]["mode"] == "draft" and out["stats"]["proposed"] > 0, out["stats"]
    assert out["token_ids"] == alone["token_ids"] and "Paris" in out["text"]


def test_the_browser_backend_pairs_the_smollm2_draft_too(gguf_path, browser_alone):
    """`--backend browser` with the GGUF and no --draft runs the draft the shipped manifest binds
    (checked against its entry there), greedy tokens equal to champion alone in the browser. (Alone
    in the browser from the command line: test_generate_chat_on_the_gguf_answers_in_the_browser;
    lookup on the GGUF in the browser: test_gguf_browser.py.)"""
    out = chat_json(gguf_path, "--backend", "browser", "--temperature", "0", "--speculate", "draft")
    assert out["stats"]["mode"] == "draft" and out["stats"]["proposed"] > 0, out["stats"]
    assert out["token_ids"] == browser_alone["token_ids"], out["text"]
    timing = out["timing_ms"]
    print(f"[measure] browser draft: {timing.get('decode', 0) / max(1, len(out['token_ids']) - 1):.1f} ms/token "
          f"(decode {timing.get('decode')}, stats {out['stats']})")


def models_dir_without_drafts(tmp_path):
    """A models folder whose manifest.json is the shipped one without its `drafts` entry."""
    with open(os.path.join(REPO, "web", "models", "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    manifest.pop("drafts")
    root = tmp_path / "models"
    root.mkdir()
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_without_a_bound_draft_auto_runs_without_one_and_draft_is_refused(gguf_path, alone, tmp_path):
    assert alone["finish_reason"] == "eos" and "Paris" in alone["text"]
    bare = models_dir_without_drafts(tmp_path)
    out = chat_json(gguf_path, models_dir=bare)    # no --speculate (auto), no draft bound to the GGUF
    assert out["stats"]["mode"] == "auto" and out["token_ids"] == alone["token_ids"]
    assert out["stats"]["auto"]["rounds_by_method"]["draft"] == 0 and out["receipt"]["draft_artifact_hash"] == "prompt-lookup-v1"
    r = cli("generate", "--champion", gguf_path, "--prompt", "x", "--speculate", "draft", models_dir=bare)
    assert r.returncode == 2 and "no draft is known for" in one_coded_line(r.stderr, "E_BAD_ARGUMENT")


def test_a_gguf_draft_runs_on_the_reference(gguf_path, alone):
    """The file as its own draft: every proposal accepted, the answer champion alone's."""
    out = chat_json(gguf_path, "--draft", gguf_path, "--speculate", "draft")
    assert out["stats"]["mode"] == "draft" and out["stats"]["accepted"] == out["stats"]["proposed"] > 0
    assert out["token_ids"] == alone["token_ids"]


def _broken_copy(draft: str, dest, file: str, edit) -> str:
    shutil.copytree(draft, dest)
    path = os.path.join(dest, file)
    with open(path, encoding="utf-8") as fh:
        value = json.load(fh)
    edit(value)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(value, fh)
    return str(dest)


@pytest.mark.parametrize("file,edit,field", [
    ("tokenizer_config.json", lambda c: c.update(eos_token="<|endoftext|>"), "eos_token_id"),
    ("generation_config.json", lambda c: c.update(eos_token_id=[2, 0]), "stop_token_ids"),
    ("tokenizer.json", lambda t: t["model"]["vocab"].update(a=t["model"]["vocab"]["b"], b=t["model"]["vocab"]["a"]),
     "token_map_sha256"),
], ids=["eos", "stop-ids", "token-map"])
def test_a_mismatched_draft_is_refused_naming_the_field(gguf_path, tiny_draft, tmp_path, file, edit, field):
    bad = _broken_copy(tiny_draft, tmp_path / "bad", file, edit)
    for flags, models_dir in ((["--draft", bad], None), (["--speculate", "draft"], models_dir_binding(tmp_path, gguf_path, bad))):
        r = cli("generate", "--champion", gguf_path, "--prompt", "x", "--max-new-tokens", "1", *flags,
                models_dir=models_dir)
        assert r.returncode == 1 and r.stdout == ""
        line = one_coded_line(r.stderr, "E_MANIFEST_MISMATCH")
        assert f"draft {bad if models_dir is None else models_dir / 'smollm2-draft'} does not pair with champion {gguf_path}: " \
            f"field '{field}' differs" in line, line


def test_the_shipped_draft_is_refused_for_the_gguf(gguf_path):
    r = cli("generate", "--champion", gguf_path, "--draft", os.path.join(REPO, "web", "models", "draft"), "--prompt", "x")
    assert r.returncode == 1
    assert "field 'tokenizer_vocab_size' differs: champion 49152 draft 4096" in one_coded_line(r.stderr, "E_MANIFEST_MISMATCH")


def test_what_a_gguf_cannot_do_is_one_line(gguf_path):
    r = cli("generate", "--champion", gguf_path, "--prompt", "x", "--weights", "q8", "--speculate", "none")
    assert r.returncode == 2 and "--weights: a GGUF champion runs the file's own weights" in one_coded_line(
        r.stderr, "E_BAD_ARGUMENT")


def test_a_gguf_draft_runs_on_the_browser_backend(gguf_path, browser_alone, tmp_path):
    """`--backend browser --draft FILE.gguf` (once refused in one line): a tiny random GGUF draft
    carrying the champion's tokenizer proposes, and the greedy answer is champion alone's in the
    browser."""
    from synthetic_models import write_tiny_draft_gguf
    draft = str(tmp_path / "tiny-draft.gguf")
    write_tiny_draft_gguf(gguf_path, draft)
    out = chat_json(gguf_path, "--backend", "browser", "--champion-backend", "wasm", "--temperature", "0",
                    "--draft", draft, "--speculate", "draft")
    assert out["stats"]["mode"] == "draft" and out["stats"]["proposed"] > 0, out["stats"]
    assert out["token_ids"] == browser_alone["token_ids"] and out["finish_reason"] == browser_alone["finish_reason"]


def test_generate_chat_on_the_gguf_answers_in_the_browser(gguf_path, browser_alone):
    """The browser engine (WASM champion, the file's own weights in their blocks) answers; a GGUF
    champion's default mode is auto (with the draft the manifest binds to the file), and it gives
    champion alone's tokens."""
    r = cli("generate", "--backend", "browser", "--champion-backend", "wasm", "--champion", gguf_path, "--chat",
            "--prompt", QUESTION, "--max-new-tokens", str(ANSWER_TOKENS), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stats"]["mode"] == "auto" and out["token_ids"] == browser_alone["token_ids"] and out["text"].strip()


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUX" + bytes(60))
    r = cli("generate", "--champion", str(path), "--prompt", "x", "--speculate", "none")
    assert r.returncode == 1 and str(path) in one_coded_line(r.stderr, "E_MODEL_LOAD")


# ---------------------------------------------------------------------------------------------
# chat_template.jinja: where transformers saves the template today
# ---------------------------------------------------------------------------------------------

def _prompt_ids(folder) -> list:
    r = cli("generate", "--champion", str(folder), "--chat", "--prompt", QUESTION, "--speculate", "none",
            "--max-new-tokens", "1", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["prompt_ids"]


def test_chat_template_jinja_is_read_as_transformers_reads_it(tiny_draft, tmp_path):
    """A folder whose tokenizer_config.json has no chat_template and a chat_template.jinja beside it
    (and one with both: the .jinja file wins, as in transformers)."""
    from transformers import AutoTokenizer
    messages = [{"role": "user", "content": QUESTION}]
    template = json.load(open(os.path.join(tiny_draft, "tokenizer_config.json")))["chat_template"]

    def move_template(c):
        c.pop("chat_template")
    folder = _broken_copy(tiny_draft, tmp_path / "jinja", "tokenizer_config.json", move_template)
    with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as fh:
        fh.write(template)
    want = list(AutoTokenizer.from_pretrained(folder).apply_chat_template(messages, add_generation_prompt=True,
                                                                          tokenize=True, return_dict=False))
    assert _prompt_ids(folder) == want
    both = _broken_copy(tiny_draft, tmp_path / "both", "tokenizer_config.json", lambda c: None)
    with open(os.path.join(both, "chat_template.jinja"), "w", encoding="utf-8") as fh:
        fh.write("<|im_start|>{{ messages[0]['content'] }}<|im_end|>")
    want = list(AutoTokenizer.from_pretrained(both).apply_chat_template(messages, add_generation_prompt=True,
                                                                        tokenize=True, return_dict=False))
    assert _prompt_ids(both) == want and want[0] == 1 and want[-1] == 2
