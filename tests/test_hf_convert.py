"""`exactspec convert`: the q8 run artifact streamed from a Hugging Face folder.

The shipped champion converts to its own model.q8.safetensors byte for byte (up to the order of
the metadata keys, which the safetensors library writes in hash order); a synthetic bf16 folder
converts to the same numbers as export_hf's torch quantiser; a sharded folder converts to the
same bytes as one file; memory stays at a block of rows, not a tensor; the CLI reports progress
on stderr and fails with coded lines. Hostile and unlucky destinations (issue 16): convert never
writes through a link (planted in SRC, in DST, or DST itself), refuses inf/NaN weights naming the
tensor and row, and a convert that fails or is stopped by SIGTERM leaves DST exactly as it was.
"""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tracemalloc
import warnings

import numpy as np
import pytest
import torch

from exactspec.reference import convert as convert_module
from exactspec.host.cli import main as cli_main
from exactspec.reference.convert import MODEL_FILE, convert
from exactspec.reference.hf import open_checkpoint
from exactspec.formats.manifest import MUST_MATCH, load_model_identity
from exactspec.reference.models import default_models_dir
from exactspec.reference.reference_llama import LlamaReference
from exactspec.formats.safetensors import (load_safetensors, read_header, safetensors_layout, serialize_safetensors,
                                   write_safetensors)
from synthetic_models import REPO_ROOT as ROOT, synth_models_dirs  # noqa: F401  (a fixture)

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


# ---- hostile and unlucky destinations (issue 16) ----

VICTIM = b"the victim's own line\n"


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    return victim


def _folder_bytes(folder) -> dict:
    """Every entry of a folder, hidden ones included: name -> bytes (or the link's target)."""
    return {name: os.readlink(folder / name) if (folder / name).is_symlink() else (folder / name).read_bytes()
            for name in sorted(os.listdir(folder))}


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_in_place_convert_never_writes_through_a_planted_tmp_link(synth_models_dirs, tmp_path, capsys):
    """The reported case: SRC holds model.q8.safetensors.tmp -> ../victim.txt, converted in place."""
    folder = tmp_path / "folder"
    shutil.copytree(synth_models_dirs["tinyllama-mid"], folder)
    victim = _victim(tmp_path)
    os.symlink("../victim.txt", folder / (Q8 + ".tmp"))
    assert cli_main(["convert", str(folder), str(folder)]) == 0
    capsys.readouterr()
    assert victim.read_bytes() == VICTIM
    assert (folder / Q8).is_file() and not (folder / Q8).is_symlink()
    assert not [n for n in os.listdir(folder) if n.startswith(".exactspec-convert-")]


@pytest.mark.parametrize("planted, target", [
    ("config.json", "../victim.txt"), ("tokenizer.json", "../victim.txt"), (MODEL_FILE, "../victim.txt"),
    (Q8, "../victim.txt"), ("tokenizer_config.json", "../created_outside.txt"),   # a dangling link too
])
def test_a_link_planted_in_dst_is_refused_and_never_written_through(synth_models_dirs, tmp_path, capsys,
                                                                    planted, target):
    victim, dst = _victim(tmp_path), tmp_path / "dst"
    dst.mkdir()
    os.symlink(target, dst / planted)
    assert cli_main(["convert", synth_models_dirs["tinyllama-mid"], str(dst)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"exactspec: E_IO: {dst / planted}: is a symbolic link"), line
    assert victim.read_bytes() == VICTIM and not (tmp_path / "created_outside.txt").exists()
    assert os.listdir(dst) == [planted]   # nothing else written, no staging left


@pytest.mark.parametrize("slash", ["", "/"])
def test_a_dst_that_is_itself_a_link_is_refused(synth_models_dirs, tmp_path, capsys, slash):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "dst")
    assert cli_main(["convert", synth_models_dirs["tinyllama-mid"], str(tmp_path / "dst") + slash]) == 1
    assert _one_line(capsys.readouterr().err).startswith(f"exactspec: E_IO: {tmp_path / 'dst'}: is a symbolic link")
    assert os.listdir(real) == []


def test_in_place_convert_of_a_hub_style_folder_keeps_its_links(synth_models_dirs, tmp_path, capsys):
    """A Hugging Face cache snapshot links every file to a blob: converting it in place is allowed
    (its own small files are not rewritten, so nothing is written through them)."""
    src, blobs, snapshot = synth_models_dirs["tinyllama-mid"], tmp_path / "blobs", tmp_path / "snapshot"
    blobs.mkdir()
    snapshot.mkdir()
    for name in os.listdir(src):
        shutil.copy(os.path.join(src, name), blobs / name)
        os.symlink(f"../blobs/{name}", snapshot / name)
    before = _folder_bytes(blobs)
    assert cli_main(["convert", str(snapshot), str(snapshot)]) == 0
    capsys.readouterr()
    assert _folder_bytes(blobs) == before
    assert all((snapshot / name).is_symlink() for name in os.listdir(src))
    assert (snapshot / Q8).is_file() and not (snapshot / Q8).is_symlink()


def _bf16_bits(value: float) -> bytes:
    return (np.array([value], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def _with_value(src, dst, tensor: str, index: tuple, value: float):
    """A copy of folder src whose BF16 `tensor` holds `value` at `index`."""
    shutil.copytree(src, dst)
    tensors, metadata = load_safetensors(os.path.join(src, "model.safetensors"), with_metadata=True)
    out = {n: (t.dtype, t.shape, bytearray(t.data)) for n, t in tensors.items()}
    dtype, shape, data = out[tensor]
    at = 2 * int(np.ravel_multi_index(index, shape))
    data[at:at + 2] = _bf16_bits(value)
    write_safetensors(os.path.join(dst, "model.safetensors"), out, metadata)
    return dst


@pytest.mark.parametrize("tensor, index, value, where", [
    ("model.layers.1.mlp.down_proj.weight", (3, 7), np.inf, "row 3, column 7 is inf"),
    ("model.layers.1.mlp.down_proj.weight", (63, 159), np.nan, "row 63, column 159 is nan"),
    ("model.embed_tokens.weight", (40000, 1), -np.inf, "row 40000, column 1 is -inf"),   # kept as F32
    ("model.norm.weight", (5,), np.nan, "element 5 is nan"),
])
def test_inf_or_nan_is_refused_and_a_failed_reconvert_leaves_dst_as_it_was(synth_models_dirs, tmp_path, capsys,
                                                                           tensor, index, value, where):
    """convert A DST, then convert B DST with B failing part-way (a non-finite weight): DST is A's,
    byte for byte (not B's small files beside A's artifact); no NumPy warning on the way."""
    dst = tmp_path / "dst"
    assert cli_main(["convert", synth_models_dirs["tinyllama-mid"], str(dst)]) == 0
    before = _folder_bytes(dst)
    bad = _with_value(synth_models_dirs["smollm2-mid"], tmp_path / "bad", tensor, index, value)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a NumPy RuntimeWarning would fail the test
        assert cli_main(["convert", str(bad), str(dst)]) == 1
        assert cli_main(["convert", str(bad), str(tmp_path / "fresh")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"exactspec: E_MODEL_LOAD: {tensor}: {where} (convert needs finite weights)"
    assert err[-1] in err[:-1] and "Traceback" not in "".join(err)
    assert _folder_bytes(dst) == before
    assert not (tmp_path / "fresh").exists()   # a folder convert created is not left behind


def _big_sparse_folder(folder, tokenizer_from: str, layers: int = 8):
    """A Llama folder of ~420 MB of F32 zeros, stored sparse (made at once, converted in seconds)."""
    folder.mkdir()
    config = json.loads(open(os.path.join(tokenizer_from, "config.json")).read())
    config.update(hidden_size=512, intermediate_size=8192, num_hidden_layers=layers, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)
    vocab, hidden, inter, kv = config["vocab_size"], 512, 8192, 2 * 64
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                       p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                       p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                       p + "mlp.down_proj.weight": (hidden, inter)})
    prefix, order = safetensors_layout({n: ("F32", s) for n, s in shapes.items()}, None)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(prefix)
        f.truncate(len(prefix) + sum(nbytes for *_, nbytes in order))
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(tokenizer_from, name), folder / name)
    return folder


def test_sigterm_during_convert_is_one_coded_line_and_leaves_dst_as_it_was(synth_models_dirs, tmp_path):
    """A real `exactspec convert` process, sent SIGTERM once its first progress line is out: it
    exits 143 with one E_CANCELLED line, its staging folder removed, DST still the earlier convert."""
    dst = tmp_path / "dst"
    convert(synth_models_dirs["tinyllama-mid"], dst)
    before = _folder_bytes(dst)
    big = _big_sparse_folder(tmp_path / "big", synth_models_dirs["tinyllama-mid"])
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "py"))
    env.pop("EXACTSPEC_DEBUG", None)
    p = subprocess.Popen([sys.executable, "-m", "exactspec.host.cli", "convert", str(big), str(dst)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = p.stderr.readline()
        assert first.startswith("exactspec convert: "), first   # the weights are being written
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 143
        rest = p.stderr.read()
    finally:
        p.kill()
        p.wait()
    assert _one_line(rest) == "exactspec: E_CANCELLED: terminated (SIGTERM)"
    assert _folder_bytes(dst) == before
