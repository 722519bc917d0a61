"""Every synthetic model the tests build, in one place (random weights, fixed seeds).

- random Hugging Face folders made by transformers (`tiny_llama`, `family`, `draft_tiny_llama`),
  with their model.q8.safetensors (`write_q8`), and `lively_llama` (an in-memory model whose
  logits are peaked: test_reference_llama);
- folders written directly with NumPy where transformers cannot make the shape or the file
  (`untied_mha`, `odd_q8`, `vocab_q8`);
- tiny GGUF files as llama.cpp lays them out (`write_tiny_model`, `write_tiny_draft_gguf`);
- the published hub shapes of tools/synth_models.py (`synth_models_dirs`, a session fixture).

Folders under build/test_models/ (gitignored, served by the test server) are built once and
reused: a name ends in _v<N>, raised when its recipe changes; `publish` renames a finished
folder into place atomically, so a concurrent run sees nothing or the whole model.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q, GGUFWriter, GGML_QUANT_SIZES, quants

import tokenizer_families as families

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_MODELS = REPO_ROOT / "build" / "test_models"

sys.path.insert(0, str(REPO_ROOT / "tools"))
import synth_models  # noqa: E402  (tools/synth_models.py: the hub shapes)


# ----------------------------------------------------------------------------- cache
def publish(tmp: Path, final: Path) -> Path:
    """Atomic rename: a concurrent run sees nothing or the whole model (the first one wins)."""
    try:
        os.replace(tmp, final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def cached(name: str, marker: str, build) -> Path:
    """TEST_MODELS/name, made by build(tmp_dir) unless it already holds `marker`."""
    final = TEST_MODELS / name
    if not (final / marker).exists():
        tmp = TEST_MODELS / f"{name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        build(tmp)
        publish(tmp, final)
    return final


# ----------------------------------------------------------------------------- int8 rows
def quantize_rows(w: np.ndarray):
    """Symmetric per-output-row int8 (the exporter's rule, in float32): w ~= q * scale[:, None]."""
    w = np.asarray(w, dtype=np.float32)
    scale = (np.maximum(np.abs(w).max(axis=1), np.float32(1e-12)) / np.float32(127.0)).astype(np.float32)
    q = np.clip(np.round(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def write_q8(model_dir: Path, embed_q8: bool = False, head_q8: bool = False) -> None:
    """model.safetensors -> model.q8.safetensors (docs/browser_contract.md): layer linears int8 per
    row; the embedding and an untied lm_head as int8 + scale when asked, else float32; 1-D
    tensors (norms, biases) float32."""
    from safetensors.numpy import load_file, save_file
    out = {}
    for name, w in load_file(str(model_dir / "model.safetensors")).items():
        q8 = w.ndim == 2 and (name not in ("model.embed_tokens.weight", "lm_head.weight")
                              or (embed_q8 and name == "model.embed_tokens.weight") or (head_q8 and name == "lm_head.weight"))
        if q8:
            out[name + ".q8"], out[name + ".scale"] = quantize_rows(w)
        else:
            out[name] = w.astype(np.float32)
    save_file(out, str(model_dir / "model.q8.safetensors"))


# ----------------------------------------------------------------------------- transformers
def _random_hf(model_dir: Path, kind: str, cfg: dict, seed: int, norm_jitter: float, bias_std: float = 0.0) -> None:
    """transformers' from_config under torch.manual_seed(seed), float32; norm weights
    1 + norm_jitter * N(0, 1) and biases bias_std * N(0, 1), drawn in parameter order; saved."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if kind == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**cfg)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + norm_jitter * torch.randn_like(p))
            elif bias_std and name.endswith(".bias"):
                p.copy_(bias_std * torch.randn_like(p))
    model.save_pretrained(str(model_dir), safe_serialization=True)


TINY_LLAMA = dict(vocab_size=1000, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                  max_position_embeddings=64, rope_theta=500.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=True, initializer_range=0.08)


def tiny_llama(seed: int = 0) -> Path:
    """A random HF Llama: GQA (4 heads / 2 kv), tied embeddings, V = 1000 (not a multiple of
    the workgroup size), H = 96, rope_theta 500, non-unit norm weights; f32 and q8 files."""
    def build(d):
        _random_hf(d, "llama", TINY_LLAMA, seed, norm_jitter=0.2)
        write_q8(d)
    return cached(f"tiny_llama_s{seed}_v1", "model.q8.safetensors", build)


def long_llama(seed: int = 0) -> Path:
    """tiny_llama with room for 2048 positions: the WASM champion's K/V caches start at 512 and
    must grow (twice, past 1024) to hold a long sequence."""
    def build(d):
        _random_hf(d, "llama", dict(TINY_LLAMA, max_position_embeddings=2048), seed, norm_jitter=0.2)
        write_q8(d)
    return cached(f"long_llama_s{seed}_v1", "model.q8.safetensors", build)


FAMILIES = {
    # Qwen2: q/k/v biases, untied float32 head, GQA 6/2
    "qwen2_bias_untied": dict(kind="qwen2", embed_q8=False, head_q8=False, cfg=dict(
        vocab_size=3001, hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    # Llama 3.x RoPE (llama3 scaling), tied int8 embedding, GQA 8/2, head_dim 16
    "llama3_rope_tied_q8": dict(kind="llama", embed_q8=True, head_q8=False, cfg=dict(
        vocab_size=2500, hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64))),
    # linear RoPE, untied int8 head, GQA 14/2 (Qwen2.5-0.5B's ratio), head_dim 8
    "linear_rope_untied_q8": dict(kind="llama", embed_q8=False, head_q8=True, cfg=dict(
        vocab_size=2048, hidden_size=112, intermediate_size=160, num_hidden_layers=2, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
}


def family(name: str) -> Path:
    """FAMILIES[name] (mid-size, one real-model feature each), seeded by len(name); f32 and q8."""
    spec = FAMILIES[name]

    def build(d):
        _random_hf(d, spec["kind"], dict(initializer_range=0.08, **spec["cfg"]), len(name), norm_jitter=0.2, bias_std=0.5)
        write_q8(d, spec["embed_q8"], spec["head_q8"])
    return cached(f"{name}_v1", "model.q8.safetensors", build)


QWEN_IDS, QWEN_ROWS = 151665, 151936    # Qwen2.5's tokenizer ids and embedding rows: 271 rows of padding


def padded_qwen2(role: str) -> Path:
    """A transformers-made Qwen2 of Qwen2.5's vocabulary shape: an embedding of 151,936 rows (tied
    head) under a tokenizer of 151,665 ids (tokenizer_families.qwen2: 151,643 model tokens + 22
    added), tiny otherwise (H = 32). The padding rows are scaled x30, so without suppression they
    win nearly every argmax and draw: a test that they never appear has power. role "champion"
    (2 layers) or "draft" (1 layer, another seed); a published folder (model.safetensors and the
    five small files): the browser's q8 file is `exactspec convert`'s (model_cache.browser_ready)."""
    def build(d):
        from safetensors.numpy import load_file, save_file
        cfg = dict(vocab_size=QWEN_ROWS, hidden_size=32, intermediate_size=64, num_hidden_layers=2 if role == "champion" else 1,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rope_theta=1e6,
                   rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.1,
                   bos_token_id=None, eos_token_id=151645, pad_token_id=151643)
        _random_hf(d, "qwen2", cfg, 7 if role == "champion" else 8, norm_jitter=0.2, bias_std=0.3)
        weights = load_file(str(d / "model.safetensors"))
        weights["model.embed_tokens.weight"][QWEN_IDS:] *= np.float32(30.0)
        save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
        spec = families.qwen2(families.byte_level_base())
        (d / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
        (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                             "bos_token": None, "add_bos_token": False}))
        (d / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645, "pad_token_id": 151643}))
    return cached(f"padded_qwen2_{role}_v2", "tokenizer.json", build)


def draft_tiny_llama() -> Path:
    """A random Llama draft with awkward sizes (V = 301, GQA 4:2, rope_theta 5e5, non-unit norms)."""
    cfg = dict(vocab_size=301, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               max_position_embeddings=96, rope_theta=500000.0, rms_norm_eps=1e-5,
               tie_word_embeddings=True, initializer_range=0.3, bos_token_id=0,
               eos_token_id=1, pad_token_id=None)
    return cached("draft_tiny_llama_v1", "model.safetensors", lambda d: _random_hf(d, "llama", cfg, 1234, norm_jitter=0.3))


def lively_llama(cfg_kwargs: dict, seed: int, max_pos: int = 64):
    """A LlamaForCausalLM (in memory, eager attention) with deliberately large random weights
    (peaked, non-uniform logits)."""
    import torch
    import transformers
    config = transformers.LlamaConfig(max_position_embeddings=max_pos, attn_implementation="eager", **cfg_kwargs)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif "embed_tokens" in name or p.ndim == 1:   # embeddings and any biases
                p.copy_(torch.randn(p.shape, generator=gen))
            else:  # linear (out, in): std 1.5/sqrt(in) keeps activations O(1) but lively
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / p.shape[1] ** 0.5))
    return model


# ----------------------------------------------------------------------------- NumPy-written
_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _linear_shapes(D: int, F: int, H: int, KV: int, hd: int) -> list:
    return list(zip(_LINEARS, [(H * hd, D), (KV * hd, D), (KV * hd, D), (D, H * hd), (F, D), (F, D), (D, F)]))


def untied_mha() -> Path:
    """Untied LM head, MHA with num_key_value_heads / head_dim / rope_theta / rms_norm_eps left
    to their defaults, one layer, V = 67: the config paths draft_tiny_llama does not take (F32)."""
    def build(d):
        from safetensors.numpy import save_file
        V, D, F, H = 67, 32, 48, 2
        rs = np.random.default_rng(77)
        t = {"model.embed_tokens.weight": rs.normal(0, 0.5, (V, D)), "model.norm.weight": 1 + 0.2 * rs.normal(size=D),
             "lm_head.weight": rs.normal(0, 0.5, (V, D))}
        p = "model.layers.0."
        t.update({p + "input_layernorm.weight": 1 + 0.2 * rs.normal(size=D),
                  p + "post_attention_layernorm.weight": 1 + 0.2 * rs.normal(size=D)})
        for name, shape in _linear_shapes(D, F, H, H, D // H):
            t[p + name + ".weight"] = rs.normal(0, 0.4, shape)
        config = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
                  "num_hidden_layers": 1, "num_attention_heads": H, "max_position_embeddings": 40,
                  "tie_word_embeddings": False, "hidden_act": "silu"}
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in t.items()}, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(config))
    return cached("untied_mha_v1", "model.safetensors", build)


def odd_q8() -> Path:
    """V = 301 (LM head rows not a multiple of 4), MQA (4 heads / 1 KV head), head_dim 16,
    3 layers, rope_theta 5e5, eps 1e-6, non-unit norms; q8 written directly."""
    def build(d):
        from safetensors.numpy import save_file
        V, D, F, H, KV, hd, L = 301, 64, 176, 4, 1, 16, 3
        rs = np.random.default_rng(2024)
        t = {"model.embed_tokens.weight": rs.normal(0, 0.6, (V, D)), "model.norm.weight": 1 + 0.3 * rs.normal(size=D)}
        for layer in range(L):
            p = f"model.layers.{layer}."
            t[p + "input_layernorm.weight"] = 1 + 0.3 * rs.normal(size=D)
            t[p + "post_attention_layernorm.weight"] = 1 + 0.3 * rs.normal(size=D)
            for name, shape in _linear_shapes(D, F, H, KV, hd):
                q, s = quantize_rows(rs.normal(0, 0.25, shape))
                t[p + name + ".weight.q8"], t[p + name + ".weight.scale"] = q, s
        config = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
                  "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": hd,
                  "max_position_embeddings": 80, "rope_theta": 500000.0, "rms_norm_eps": 1e-6,
                  "tie_word_embeddings": True, "hidden_act": "silu"}
        save_file({k: np.ascontiguousarray(v, dtype=v.dtype if v.dtype == np.int8 else np.float32) for k, v in t.items()},
                  str(d / "model.q8.safetensors"))
        (d / "config.json").write_text(json.dumps(config))
    return cached("champion_wasm_odd_v1", "model.q8.safetensors", build)


def vocab_q8(V: int) -> Path:
    """A 1-layer q8 model of vocabulary V (for decide tests: only V matters, logits are set directly)."""
    def build(d):
        from safetensors.numpy import save_file
        D, F = 8, 8
        rs = np.random.default_rng(V)
        t = {"model.embed_tokens.weight": rs.normal(size=(V, D)).astype(np.float32),
             "model.norm.weight": np.ones(D, np.float32)}
        p = "model.layers.0."
        t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = np.ones(D, np.float32)
        for name, shape in _linear_shapes(D, F, 2, 2, D // 2):
            t[p + name + ".weight.q8"], t[p + name + ".weight.scale"] = quantize_rows(rs.normal(size=shape))
        config = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F, "num_hidden_layers": 1,
                  "num_attention_heads": 2, "max_position_embeddings": 16, "tie_word_embeddings": True}
        save_file(t, str(d / "model.q8.safetensors"))
        (d / "config.json").write_text(json.dumps(config))
    return cached(f"champion_wasm_v{V}_v1", "model.q8.safetensors", build)


# ----------------------------------------------------------------------------- GGUF
GGUF_TINY = {"hidden": 256, "heads": 4, "kv_heads": 2, "layers": 2, "ffn": 512, "context": 128}   # K-quants: rows of 256


def random_blocks(rng, qtype: Q, n_values: int) -> np.ndarray:
    """Raw bytes of n_values of qtype: quantised by gguf where it can, else random bytes with sane
    float16 scales (K-quants, which gguf cannot quantise)."""
    values = rng.standard_normal(n_values).astype(np.float32) * 0.05
    if qtype in (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1):
        return values if qtype == Q.F32 else quants.quantize(values, qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_values // block, size), dtype=np.uint8)
    halves = {Q.Q4_K: (0, 2), Q.Q6_K: (208,)}[qtype]
    for at in halves:
        raw[:, at:at + 2] = (rng.random((n_values // block, 1)) * 2e-4).astype(np.float16).view(np.uint8)
    return raw.reshape(-1)


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF -> llama.cpp row order (convert_hf_to_gguf.py's permute), applied to HF q/k weights."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def byte_level_vocab(size: int = 400):
    """(tokens, merges, token types) of a small trained byte-level BPE, two control tokens first."""
    spec = families.byte_level_base(vocab_size=size)
    specials = ["<|endoftext|>", "<|im_start|>"]
    tokens = specials + [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, merges, [3, 3] + [1] * (len(tokens) - 2)


def write_tiny_model(path: str, *, arch: str = "llama", types=None, seed: int = 0, tokenizer=None,
                     omit=(), edit=None) -> dict:
    """A random tiny model as llama.cpp lays it out (q/k permuted for llama, biases for qwen2).
    types: GGUF tensor name suffix -> qtype (default F32); omit: GGUF tensor names left out;
    edit(writer): called last, to add, replace (add_key_value again) or delete (del
    writer.kv_data[0][key]) metadata, or add tensors. Returns the HF-layout float32 tensors the
    reader must give back: gguf's own dequantisation, rows put back in HF order by inverting
    llama.cpp's forward permute as an index map."""
    rng = np.random.default_rng(seed)
    d, h, kvh, f = GGUF_TINY["hidden"], GGUF_TINY["heads"], GGUF_TINY["kv_heads"], GGUF_TINY["ffn"]
    hd = d // h
    tokens, merges, token_types = tokenizer or byte_level_vocab()
    v = len(tokens)
    w = GGUFWriter(path, arch)
    w.add_context_length(GGUF_TINY["context"])
    w.add_embedding_length(d)
    w.add_block_count(GGUF_TINY["layers"])
    w.add_feed_forward_length(f)
    w.add_head_count(h)
    w.add_head_count_kv(kvh)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(hd)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    types = types or {}
    expected = {}

    def tensor(gguf_name: str, hf_name: str, shape: tuple, rope_heads: int = 0):
        if gguf_name in omit:
            return
        qtype = types.get(gguf_name.split(".", 2)[-1] if gguf_name.startswith("blk.") else gguf_name, Q.F32)
        if len(shape) == 1:
            qtype = Q.F32 if qtype not in (Q.F32, Q.F16, Q.BF16) else qtype
        raw = random_blocks(rng, qtype, int(np.prod(shape)))
        stored = quants.dequantize(np.asarray(raw), qtype).astype(np.float32).reshape(shape)   # llama.cpp order
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(gguf_name, np.asarray(raw).reshape(shape))
        else:   # bytes, one row of blocks per matrix row
            w.add_tensor(gguf_name, np.asarray(raw).view(np.uint8).reshape(*shape[:-1], -1), raw_dtype=qtype)
        expected[hf_name] = stored
        if rope_heads:   # stored[r] = hf[perm[r]] with perm = llama.cpp's permute of the row indices
            perm = permute_rope_rows(np.arange(shape[0]), rope_heads)
            expected[hf_name] = np.empty_like(stored)
            expected[hf_name][perm] = stored

    tensor("token_embd.weight", "model.embed_tokens.weight", (v, d))
    tensor("output_norm.weight", "model.norm.weight", (d,))
    tensor("output.weight", "lm_head.weight", (v, d))
    for i in range(GGUF_TINY["layers"]):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        llama = arch == "llama"
        tensor(b + "attn_norm.weight", p + "input_layernorm.weight", (d,))
        tensor(b + "attn_q.weight", p + "self_attn.q_proj.weight", (h * hd, d), h if llama else 0)
        tensor(b + "attn_k.weight", p + "self_attn.k_proj.weight", (kvh * hd, d), kvh if llama else 0)
        tensor(b + "attn_v.weight", p + "self_attn.v_proj.weight", (kvh * hd, d))
        if not llama:
            tensor(b + "attn_q.bias", p + "self_attn.q_proj.bias", (h * hd,))
            tensor(b + "attn_k.bias", p + "self_attn.k_proj.bias", (kvh * hd,))
            tensor(b + "attn_v.bias", p + "self_attn.v_proj.bias", (kvh * hd,))
        tensor(b + "attn_output.weight", p + "self_attn.o_proj.weight", (d, h * hd))
        tensor(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", (d,))
        tensor(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", (f, d))
        tensor(b + "ffn_up.weight", p + "mlp.up_proj.weight", (f, d))
        tensor(b + "ffn_down.weight", p + "mlp.down_proj.weight", (d, f))
    if edit is not None:
        edit(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected



def write_tiny_draft_gguf(champion: str, path: str, *, edit=None) -> None:
    """A GGUF draft for the GGUF `champion`: write_tiny_model's random llama (tied: no output.weight;
    a Q8_0 embedding, the rest F32) carrying every tokenizer.* entry of the champion's metadata as
    the champion stores it, so the two pair. edit(writer): as write_tiny_model's, after the copy."""
    from gguf import GGUFValueType as V
    from exactspec.formats.gguf import GGUFFile
    with GGUFFile(champion) as f:
        entries = {k: (v, f.value_types[k]) for k, v in f.metadata.items() if k.startswith("tokenizer.")}

    def copy_tokenizer(w):
        for key, (value, vtype) in entries.items():
            w.kv_data[0].pop(key, None)                 # write_tiny_model's own tokenizer entries, replaced quietly
            if vtype.startswith("ARRAY["):
                w.add_key_value(key, list(value), V.ARRAY, V[vtype[len("ARRAY["):-1]])
            else:
                w.add_key_value(key, value, V[vtype])
        if edit is not None:
            edit(w)

    tokenizer = tuple(entries[f"tokenizer.ggml.{k}"][0] for k in ("tokens", "merges", "token_type"))
    write_tiny_model(path, tokenizer=tokenizer, types={"token_embd.weight": Q.Q8_0}, omit=("output.weight",),
                     edit=copy_tokenizer)


# ----------------------------------------------------------------------------- hub shapes
HUB_INIT_STD = 0.2
HUB_CHAMPIONS = ("smollm2-mid", "qwen2.5-mid", "qwen2.5-mid-untied", "llama3.2-mid", "tinyllama-mid")
HUB_DRAFTS = {"smollm2-mid": "smollm2-draft", "qwen2.5-mid": "qwen2.5-draft", "qwen2.5-mid-untied": "qwen2.5-draft",
              "llama3.2-mid": "llama3.2-draft", "tinyllama-mid": "tinyllama-draft"}


@pytest.fixture(scope="session")
def synth_models_dirs() -> dict:
    """{shape: folder} for the mid-size shapes of every family and their drafts, written by
    tools/synth_models.py through transformers (bf16 on disk, initializer_range 0.2 so that
    attention, RoPE and biases visibly shape the logits), built once into build/test_models/.
    The folders are shared: a test that changes one copies it first."""
    shapes = (*HUB_CHAMPIONS, *sorted(set(HUB_DRAFTS.values())))

    def build(d):
        for shape in shapes:
            synth_models.make_model(shape, str(d), seed=0, init_std=HUB_INIT_STD)
        (d / "complete").write_text("")
    root = cached("hub_shapes_v1", "complete", build)
    return {shape: str(root / shape) for shape in shapes}
