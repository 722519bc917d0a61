"""`exactspec convert`: the q8 run artifact streamed from a Hugging Face folder.

The shipped champion converts to its own model.q8.safetensors byte for byte (up to the order of
the metadata keys, which the safetensors library writes in hash order); a synthetic bf16 folder
converts to the same numbers as export_hf's torch quantiser; a sharded folder converts to the
same bytes as one file; memory stays at a block of rows, not a tensor; the CLI reports progress
on stderr and fails with coded lines.
"""
import hashlib
import json
import os
import shutil
import sys
import tracemalloc

import numpy as np
import pytest
import torch

from exactspec import convert as convert_module
from exactspec.cli import main as cli_main
from exactspec.convert import MODEL_FILE, convert
from exactspec.hf import open_checkpoint
from exactspec.manifest import MUST_MATCH, load_model_identity
from exactspec.models import default_models_dir
from exactspec.reference_llama import LlamaReference
from exactspec.safetensors import load_safetensors, read_header, serialize_safetensors
from hf_synth import ROOT, synth_models_dirs  # noqa: F401  (a fixture)

sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
from export_hf import quantize_rows  # noqa: E402  (the torch quantiser the shipped files came from)

Q8 = "model.q8.safetensors"


def _with_sorted_metadata(path) -> bytes:
    tensors, metadata = load_safetensors(path, with_metadata=True)
    return serialize_safetensors({n: (t.dtype, t.shape, t.data) for n, t in tensors.items()},
                                 dict(sorted(metadata.items())))


def test_shipped_champion_converts_to_its_own_bytes(tmp_path):
    src = os.path.join(default_models_dir(), "champion")
    entry = convert(src, tmp_path / "champion")
    out = (tmp_path / "champion" / Q8).read_bytes()
    assert out == _with_sorted_metadata(os.path.join(src, Q8))
    assert read_header(os.path.join(src, Q8))[1] == read_header(tmp_path / "champion" / Q8)[1]
    artifact = entry["model"]["run_artifact"]
    assert (artifact["sha256"], artifact["bytes"]) == (hashlib.sha256(out).hexdigest(), len(out))
    assert json.loads((tmp_path / "champion" / MODEL_FILE).read_text())["model"] == entry["model"]
    shipped = load_model_identity(src, run_weights=Q8)
    converted = load_model_identity(str(tmp_path / "champion"), run_weights=Q8)
    assert {f: converted[f] for f in MUST_MATCH} == {f: shipped[f] for f in MUST_MATCH}
    assert {e["path"] for e in entry["files"]} >= {Q8, "config.json", "tokenizer.json", "generation_config.json"}


@pytest.mark.parametrize("shape,q8_embedding", [("qwen2.5-mid-untied", False), ("qwen2.5-mid-untied", True),
                                                 ("qwen2.5-mid", True)])
def test_synthetic_q8_equals_the_torch_quantiser(synth_models_dirs, tmp_path, shape, q8_embedding):
    """Qwen2: biases stay float, an untied lm_head is quantised (and the embedding when asked,
    tied or not), bf16 is widened exactly."""
    src = synth_models_dirs[shape]
    convert(src, tmp_path, q8_embedding=q8_embedding)
    assert ("model.embed_tokens.weight.q8" in read_header(tmp_path / Q8)[0]) == q8_embedding
    raw = load_safetensors(os.path.join(src, "model.safetensors"))
    want = {}
    for name, t in raw.items():
        w = torch.frombuffer(bytearray(t.data), dtype=torch.bfloat16).reshape(t.shape).float()
        if w.dim() == 2 and (name != "model.embed_tokens.weight" or q8_embedding):
            q, s = quantize_rows(w)
            want[name] = (q.float() * s[:, None]).numpy()
        else:
            want[name] = w.numpy()
    assert ("lm_head.weight" in want) == shape.endswith("untied") and any(n.endswith("q_proj.bias") for n in want)
    config = json.loads((tmp_path / "config.json").read_text())
    ours = LlamaReference.from_dir(tmp_path, weights="q8")
    hand = LlamaReference(config, want, identity="hand")
    ids = list(range(5, 200, 7))
    assert np.array_equal(ours.forward(ids, 0), hand.forward(ids, 0))


def test_sharded_source_converts_to_the_same_bytes(synth_models_dirs, tmp_path):
    from transformers import AutoModelForCausalLM
    src = synth_models_dirs["llama3.2-mid"]
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(
        sharded, safe_serialization=True, max_shard_size="5MB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), sharded / name)
    assert (sharded / "model.safetensors.index.json").exists()
    convert(src, tmp_path / "a")
    convert(sharded, tmp_path / "b")
    assert (tmp_path / "a" / Q8).read_bytes() == (tmp_path / "b" / Q8).read_bytes()


def test_convert_streams_in_row_blocks(synth_models_dirs, tmp_path, monkeypatch):
    """The weights pass (write_artifact) with blocks of 2^16 values: its traced peak stays far below
    the 151936 x 56 embedding it converts (the tokenizer's identity, parsed before, is apart)."""
    monkeypatch.setattr(convert_module, "CHUNK_VALUES", 1 << 16)
    embedding_f32 = 151936 * 56 * 4
    with open_checkpoint(synth_models_dirs["qwen2.5-mid"]) as ckpt:
        plan = convert_module.plan_outputs(ckpt.header(), tied=True)
        tracemalloc.start()
        try:
            convert_module.write_artifact(ckpt, str(tmp_path / Q8), plan, {})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    print(f"write_artifact peak (traced) {peak / 1e6:.2f} MB, embedding {embedding_f32 / 1e6:.1f} MB in float32")
    assert peak < embedding_f32 / 16, peak


def test_cli_convert_progress_and_errors(synth_models_dirs, tmp_path, capsys):
    src = synth_models_dirs["tinyllama-mid"]
    assert cli_main(["convert", src, str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "exactspec convert:" in captured.err and "tensors" in captured.err
    assert str(tmp_path / "out" / Q8) in captured.out
    assert cli_main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert "exactspec: E_MODEL_LOAD:" in err and "config.json" in err
    (tmp_path / "a_file").write_text("x")
    assert cli_main(["convert", src, str(tmp_path / "a_file")]) == 1
    assert "exactspec: E_IO:" in capsys.readouterr().err
    no_tokenizer = tmp_path / "no_tok"
    shutil.copytree(src, no_tokenizer)
    os.remove(no_tokenizer / "tokenizer.json")
    assert cli_main(["convert", str(no_tokenizer), str(tmp_path / "y")]) == 1
    err = capsys.readouterr().err
    assert "E_MODEL_LOAD" in err and "tokenizer.json" in err
    assert not (tmp_path / "y" / Q8).exists()


@pytest.mark.parametrize("shape", ["smollm2-mid"])
def test_converted_champion_runs_by_default_as_q8(shape, synth_models_dirs, tmp_path, capsys):
    convert(synth_models_dirs[shape], tmp_path)
    args = ["generate", "--champion", str(tmp_path), "--draft", synth_models_dirs["smollm2-draft"],
            "--prompt", "Hi", "--temperature", "0", "--max-new-tokens", "4", "--json"]
    assert cli_main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["error"] is None
    q8_sha = hashlib.sha256((tmp_path / Q8).read_bytes()).hexdigest()
    assert q8_sha in json.dumps(result["receipt"])


def test_draft_role_writes_f32_weights_and_the_pair_runs(synth_models_dirs, tmp_path, capsys):
    """--role draft: model.safetensors, every tensor F32 (what the WASM draft reads), the same
    function as the bf16 source; a converted champion and draft pass the pair check and agree."""
    champion, draft = tmp_path / "champion", tmp_path / "draft"
    assert cli_main(["convert", synth_models_dirs["tinyllama-mid"], str(champion)]) == 0
    assert cli_main(["convert", "--role", "draft", synth_models_dirs["tinyllama-draft"], str(draft)]) == 0
    capsys.readouterr()
    header, metadata = read_header(draft / "model.safetensors")
    assert {e["dtype"] for e in header.values()} == {"F32"} and "quantization" not in metadata
    entry = json.loads((draft / MODEL_FILE).read_text())
    assert entry["model"]["run_artifact"]["quantization"] == "f32"
    ids = list(range(5, 90, 3))
    src = LlamaReference.from_dir(synth_models_dirs["tinyllama-draft"])
    assert np.array_equal(LlamaReference.from_dir(draft).forward(ids, 0), src.forward(ids, 0))
    args = ["generate", "--champion", str(champion), "--prompt", "Hi", "--temperature", "0",
            "--max-new-tokens", "5", "--json"]
    assert cli_main(args + ["--draft", str(draft)]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert cli_main(args + ["--speculate", "none"]) == 0
    assert spec["token_ids"] == json.loads(capsys.readouterr().out)["token_ids"]
    src_copy = tmp_path / "in_place"
    shutil.copytree(synth_models_dirs["tinyllama-draft"], src_copy)
    assert cli_main(["convert", "--role", "draft", str(src_copy), str(src_copy)]) == 2
    assert "E_BAD_ARGUMENT" in capsys.readouterr().err
