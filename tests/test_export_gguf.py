"""tools/export_gguf.py: the GGUF read back with gguf.GGUFReader has llama.cpp's names, shapes,
types and metadata; de-permuting q/k gives our tensors exactly (F32); Q8_0 is within its bound;
Q4_0 / Q4_1 / Q8_0 blocks are llama.cpp's reference quantisers' bytes (gguf-py's port of
quantize_row_*_ref) and our GGUF decoder reads them back as gguf-py does, the embedding in Q8_0."""
import importlib.util
import os

import gguf
import numpy as np
import pytest

from exactspec.formats.config import read_json_file
from exactspec.core.errors import ExactSpecError
from exactspec.reference.models import default_models_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("export_gguf", os.path.join(ROOT, "tools", "export_gguf.py"))
export_gguf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(export_gguf)

MODELS = default_models_dir()
LAYER_NAMES = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm", "ffn_norm"]


def _export(tmp_path_factory, model: str, export_type: str, weights: str = "f32"):
    out = str(tmp_path_factory.mktemp("gguf") / f"{model}.{export_type}.gguf")
    export_gguf.export_gguf(os.path.join(MODELS, model), out, export_type, weights)
    return gguf.GGUFReader(out)


@pytest.fixture(scope="module", params=["champion", "draft"])
def exported(request, tmp_path_factory):
    """(model name, source (config, tensors, tokenizer, tokenizer_config), f32 reader, q8_0 reader)."""
    model = request.param
    source = export_gguf.read_source(os.path.join(MODELS, model), "f32")
    return (model, source, _export(tmp_path_factory, model, "f32"), _export(tmp_path_factory, model, "q8_0"))


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def expected_tensors(config) -> dict:
    """llama.cpp name -> (HF name, HF shape) for every tensor the export must hold."""
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    hf = {"attn_q": ("self_attn.q_proj", (q, d)), "attn_k": ("self_attn.k_proj", (kv, d)),
          "attn_v": ("self_attn.v_proj", (kv, d)), "attn_output": ("self_attn.o_proj", (d, q)),
          "ffn_gate": ("mlp.gate_proj", (f, d)), "ffn_up": ("mlp.up_proj", (f, d)),
          "ffn_down": ("mlp.down_proj", (d, f)), "attn_norm": ("input_layernorm", (d,)),
          "ffn_norm": ("post_attention_layernorm", (d,))}
    out = {"token_embd.weight": ("model.embed_tokens.weight", (v, d)), "output_norm.weight": ("model.norm.weight", (d,))}
    for i in range(config["num_hidden_layers"]):
        for name in LAYER_NAMES:
            out[f"blk.{i}.{name}.weight"] = (f"model.layers.{i}.{hf[name][0]}.weight", hf[name][1])
    return out


def our_view(reader_tensor, config, values: np.ndarray) -> np.ndarray:
    """A tensor read back, in HF row order (q/k de-permuted)."""
    if ".attn_q." in reader_tensor.name:
        return export_gguf.unpermute_rope_rows(values, config["num_attention_heads"])
    if ".attn_k." in reader_tensor.name:
        return export_gguf.unpermute_rope_rows(values, config["num_key_value_heads"])
    return values


# ---- pure parts ----

def test_rope_permutation_moves_half_pairs_to_adjacent_rows():
    # one head of head_dim 4: HF pairs rows (0, 2) and (1, 3); llama.cpp wants them adjacent
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    assert export_gguf.permute_rope_rows(w, 1)[:, 0].tolist() == [0, 4, 2, 6]
    # two heads of 4 rows each: each head permuted on its own
    w2 = np.arange(8, dtype=np.float32).reshape(8, 1)
    assert export_gguf.permute_rope_rows(w2, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    rng = np.random.default_rng(0)
    for heads, hd in ((4, 64), (2, 64), (1, 8)):
        m = rng.standard_normal((heads * hd, 16)).astype(np.float32)
        assert np.array_equal(export_gguf.unpermute_rope_rows(export_gguf.permute_rope_rows(m, heads), heads), m)


def test_tensor_names_and_unknown_name_refused():
    assert export_gguf.gguf_tensor_name("model.layers.11.self_attn.o_proj.weight") == "blk.11.attn_output.weight"
    assert export_gguf.gguf_tensor_name("model.embed_tokens.weight") == "token_embd.weight"
    for bad in ("model.layers.x.mlp.up_proj.weight", "model.layers.0.mlp.up.weight", "rotary.inv_freq"):
        with pytest.raises(ExactSpecError) as e:
            export_gguf.gguf_tensor_name(bad)
        assert e.value.code == "E_MODEL_LOAD"


def test_bad_type_and_weights_are_coded(tmp_path):
    for kwargs in ({"export_type": "q5_0"}, {"weights": "f16"}):
        with pytest.raises(ExactSpecError) as e:
            export_gguf.export_gguf(os.path.join(MODELS, "draft"), str(tmp_path / "x.gguf"), **kwargs)
        assert e.value.code == "E_BAD_ARGUMENT"


# ---- the files ----

def test_metadata(exported):
    model, (config, _, tok, tok_config), reader, reader_q8 = exported
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "general.file_type") == gguf.LlamaFileType.ALL_F32
    assert field(reader_q8, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    hd = config["head_dim"]
    for key, want in {"llama.context_length": config["max_position_embeddings"],
                      "llama.embedding_length": config["hidden_size"], "llama.block_count": config["num_hidden_layers"],
                      "llama.feed_forward_length": config["intermediate_size"],
                      "llama.attention.head_count": config["num_attention_heads"],
                      "llama.attention.head_count_kv": config["num_key_value_heads"],
                      "llama.attention.key_length": hd, "llama.attention.value_length": hd,
                      "llama.rope.dimension_count": hd, "llama.vocab_size": config["vocab_size"]}.items():
        assert field(reader, key) == want, key
    assert field(reader, "llama.rope.freq_base") == pytest.approx(config["rope_theta"], rel=1e-7)
    assert np.float32(field(reader, "llama.attention.layer_norm_rms_epsilon")) == np.float32(config["rms_norm_eps"])
    # tokenizer: gpt2 BPE with our vocabulary, merges, types and special ids
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    tokens = field(reader, "tokenizer.ggml.tokens")
    vocab = tok["model"]["vocab"]
    assert len(tokens) == config["vocab_size"] and all(vocab[t] == i for i, t in enumerate(tokens))
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}
    assert special and field(reader, "tokenizer.ggml.token_type") == [3 if i in special else 1 for i in range(len(tokens))]
    assert field(reader, "tokenizer.ggml.merges") == [" ".join(m) for m in tok["model"]["merges"]]
    ids = {t: vocab[t] for t in ("<|bos|>", "<|eos|>", "<|pad|>", "<|end|>")}
    assert field(reader, "tokenizer.ggml.bos_token_id") == ids[tok_config["bos_token"]] == config["bos_token_id"]
    assert field(reader, "tokenizer.ggml.eos_token_id") == ids[tok_config["eos_token"]]
    assert field(reader, "tokenizer.ggml.padding_token_id") == ids["<|pad|>"] == config["pad_token_id"]
    assert field(reader, "tokenizer.ggml.eot_token_id") == ids["<|end|>"]
    assert {field(reader, "tokenizer.ggml.eos_token_id"), field(reader, "tokenizer.ggml.eot_token_id")} == set(config["eos_token_id"])
    assert field(reader, "tokenizer.ggml.add_bos_token") is tok_config["add_bos_token"] is True
    assert field(reader, "tokenizer.ggml.add_eos_token") is False
    assert field(reader, "tokenizer.chat_template") == tok_config["chat_template"]


def test_f32_tensors_are_ours_exactly(exported):
    model, (config, tensors, _, _), reader, _ = exported
    want = expected_tensors(config)
    assert config["tie_word_embeddings"] and "output.weight" not in want   # tied: llama.cpp reuses token_embd
    assert sorted(t.name for t in reader.tensors) == sorted(want)
    for t in reader.tensors:
        hf_name, hf_shape = want[t.name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
        assert tuple(int(d) for d in t.shape) == tuple(reversed(hf_shape)), t.name   # GGUF lists ne0 (inner) first
        values = np.asarray(t.data).reshape(hf_shape)
        assert np.array_equal(our_view(t, config, values), tensors[hf_name]), t.name
    # and the permutation really happened: q rows of layer 0 are not stored in HF order
    q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    assert not np.array_equal(np.asarray(q.data).reshape(want[q.name][1]), tensors[want[q.name][0]])


def test_q8_0_tensors_within_block_bound(exported):
    model, (config, tensors, _, _), _, reader = exported
    want = expected_tensors(config)
    assert sorted(t.name for t in reader.tensors) == sorted(want)
    for t in reader.tensors:
        hf_name, hf_shape = want[t.name]
        ours = tensors[hf_name]
        if len(hf_shape) == 1:   # norms stay F32, exactly ours
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
            assert np.array_equal(np.asarray(t.data).reshape(hf_shape), ours), t.name
            continue
        assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, t.name
        assert tuple(int(d) for d in t.shape) == tuple(reversed(hf_shape)), t.name
        assert t.n_bytes == ours.size // 32 * 34, t.name   # 32 int8 + one float16 scale per block
        values = our_view(t, config, gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(hf_shape))
        # Bound per block of 32: d = amax/127; rounding to the int8 grid costs d/2 (0.51 d with
        # float32 rounding of x/d), the float16 scale costs 127 |d16 - d| <= 127 d 2^-11 (normal)
        # or 127 * 2^-25 (subnormal).
        blocks = ours.reshape(-1, 32)
        d = np.abs(blocks).max(axis=1, keepdims=True) / 127
        bound = d * (0.51 + 127 * 2.0 ** -11) + 127 * 2.0 ** -25
        err = np.abs(values.reshape(-1, 32) - blocks)
        assert (err <= bound).all(), (t.name, float((err - bound).max()))
        assert err.max() > 0, t.name   # it really is quantised


def test_q8_source_exports_the_browser_view(tmp_path_factory):
    """--weights q8: the F32 export holds model.q8.safetensors dequantised (W = q8 * scale in float32)."""
    reader = _export(tmp_path_factory, "draft", "f32", weights="q8")
    config, tensors, _, _ = export_gguf.read_source(os.path.join(MODELS, "draft"), "q8")
    raw_config = read_json_file(os.path.join(MODELS, "draft", "config.json"))
    assert config == raw_config
    t = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    values = np.asarray(t.data).reshape(tensors["model.layers.1.mlp.down_proj.weight"].shape)
    assert np.array_equal(values, tensors["model.layers.1.mlp.down_proj.weight"])
    f32 = export_gguf.read_source(os.path.join(MODELS, "draft"), "f32")[1]
    assert not np.array_equal(values, f32["model.layers.1.mlp.down_proj.weight"])


def test_cli_writes_file_and_refuses_missing_source(tmp_path, capsys):
    out = tmp_path / "d.gguf"
    assert export_gguf.main([os.path.join(MODELS, "draft"), str(out), "--type", "q8_0"]) == 0
    assert out.stat().st_size > 0 and "q8_0" in capsys.readouterr().out
    assert export_gguf.main([str(tmp_path / "nowhere"), str(tmp_path / "e.gguf")]) == 1
    assert "E_" in capsys.readouterr().err


# ---- block formats: llama.cpp's bytes, read back exactly, written tensor by tensor ----

@pytest.fixture(scope="module", params=["q4_0", "q4_1", "q8_0"])
def block_export(request, tmp_path_factory):
    """(type, source tensors, reader) of the toy champion exported in a block format."""
    source = export_gguf.read_source(os.path.join(MODELS, "champion"), "f32")
    return request.param, source, _export(tmp_path_factory, "champion", request.param)


def test_block_tensors_are_llama_cpp_reference_bytes(block_export):
    from exactspec.reference.gguf_dequant import dequantize as our_dequantize
    export_type, (config, tensors, _, _), reader = block_export
    linear = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
              "q8_0": gguf.GGMLQuantizationType.Q8_0}[export_type]
    assert field(reader, "general.file_type") == getattr(gguf.LlamaFileType, "MOSTLY_" + export_type.upper())
    want = expected_tensors(config)
    assert sorted(t.name for t in reader.tensors) == sorted(want)
    for t in reader.tensors:
        hf_name, hf_shape = want[t.name]
        if len(hf_shape) == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32 and np.array_equal(np.asarray(t.data), tensors[hf_name])
            continue
        qtype = gguf.GGMLQuantizationType.Q8_0 if t.name == "token_embd.weight" else linear
        assert t.tensor_type == qtype, t.name
        w = tensors[hf_name]
        if ".attn_q." in t.name or ".attn_k." in t.name:
            heads = config["num_attention_heads"] if ".attn_q." in t.name else config["num_key_value_heads"]
            w = export_gguf.permute_rope_rows(w, heads)
        raw = np.asarray(t.data).reshape(-1)
        assert np.array_equal(raw, gguf.quants.quantize(np.ascontiguousarray(w), qtype).reshape(-1)), t.name
        back = our_dequantize(raw.tobytes(), qtype.name)
        assert np.array_equal(back, gguf.quants.dequantize(raw, qtype).reshape(-1)), t.name
        # and it is w within the block format's error, per block of 32 (f16: relative 2^-11, normal):
        # Q8_0 d = amax/127: half a step + 127 f16 errors of d; Q4_0 d = amax/8: a whole step (the
        # sign opposite the largest element clips at 7 d, not 8 d) + 8 f16 errors; Q4_1 d = (max-min)/15:
        # half a step + 15 f16 errors of d + the f16 error of min.
        blocks = w.reshape(-1, 32)
        err = np.abs(back.reshape(-1, 32) - blocks).max(axis=1)
        amax, lo = np.abs(blocks).max(axis=1), blocks.min(axis=1)
        bound = {gguf.GGMLQuantizationType.Q8_0: amax / 127 * (0.51 + 127 * 2.0 ** -11),
                 gguf.GGMLQuantizationType.Q4_0: amax / 8 * (1.01 + 8 * 2.0 ** -11),
                 gguf.GGMLQuantizationType.Q4_1: np.ptp(blocks, axis=1) / 15 * (0.51 + 15 * 2.0 ** -11)
                 + np.abs(lo) * 2.0 ** -11}[qtype]
        assert (err <= bound + 2.0 ** -20).all(), (t.name, float((err - bound).max()))
        assert err.max() > 0, t.name


def test_export_in_row_chunks_is_the_same_file(tmp_path, monkeypatch):
    """A tensor read, converted and quantised a few rows at a time gives the same file (the 1.7B
    export's memory): chunks of 1000 values split every 2-D tensor (the q8 source too)."""
    whole = tmp_path / "whole.gguf"
    export_gguf.export_gguf(os.path.join(MODELS, "draft"), str(whole), "q4_1", "q8")
    monkeypatch.setattr(export_gguf, "CHUNK_VALUES", 1000)
    chunked = tmp_path / "chunked.gguf"
    export_gguf.export_gguf(os.path.join(MODELS, "draft"), str(chunked), "q4_1", "q8")
    assert whole.read_bytes() == chunked.read_bytes()


def test_block_format_needs_widths_of_whole_blocks(tmp_path):
    """A 2-D tensor whose width is not a multiple of 32 cannot be stored in blocks: E_BAD_ARGUMENT
    naming the tensor (F32 still exports)."""
    import json
    import shutil
    from safetensors.numpy import save_file
    src = os.path.join(MODELS, "draft")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), tmp_path / name)
    config = dict(read_json_file(os.path.join(src, "config.json")), hidden_size=80, intermediate_size=96,
                  num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=80)
    (tmp_path / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (4096, 80), "model.norm.weight": (80,)}
    p = "model.layers.0."
    shapes.update({p + "input_layernorm.weight": (80,), p + "post_attention_layernorm.weight": (80,),
                   p + "self_attn.q_proj.weight": (80, 80), p + "self_attn.k_proj.weight": (80, 80),
                   p + "self_attn.v_proj.weight": (80, 80), p + "self_attn.o_proj.weight": (80, 80),
                   p + "mlp.gate_proj.weight": (96, 80), p + "mlp.up_proj.weight": (96, 80), p + "mlp.down_proj.weight": (80, 96)})
    save_file({k: rng.normal(0, 0.1, v).astype(np.float32) for k, v in shapes.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ExactSpecError) as e:
        export_gguf.export_gguf(str(tmp_path), str(tmp_path / "x.gguf"), "q4_1")
    assert e.value.code == "E_BAD_ARGUMENT" and "80 columns" in e.value.message and "32" in e.value.message
    assert export_gguf.export_gguf(str(tmp_path), str(tmp_path / "y.gguf"), "f32")["formats"] == {"F32": len(shapes)}
