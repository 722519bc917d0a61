"""Small GGUF files for the GGUF tests: tiny random llama/qwen2 models (gguf's GGUFWriter) and raw bytes
built field by field (to write what no writer would: wrong counts, types, offsets)."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFWriter, GGML_QUANT_SIZES, quants

import tokenizer_families as families

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUS_FILE = os.path.join(REPO, "build", "models", "status.json")
TINY = {"hidden": 256, "heads": 4, "kv_heads": 2, "layers": 2, "ffn": 512, "context": 128}   # K-quants: rows of 256


# ---- raw bytes -------------------------------------------------------------------------------

def gstr(s) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, 4, struct.pack("<I", value))


def kv_str(key: str, value: str) -> bytes:
    return kv(key, 8, gstr(value))


def tensor_record(name: str, dims, ggml_type: int, offset: int) -> bytes:
    return (gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", ggml_type, offset))


def raw_gguf(kvs: list, records: list, data: bytes = b"", *, n_kv=None, n_tensors=None, version: int = 3,
             magic: bytes = b"GGUF", alignment: int = 32) -> bytes:
    head = magic + struct.pack("<IQQ", version, len(records) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(records)
    pad = -len(head) % alignment
    return head + b"\0" * pad + data


def one_tensor_gguf(dims=(32, 2), ggml_type: int = 0, offset: int = 0, data: bytes | None = None, **kw) -> bytes:
    """A valid file holding one F32 tensor 't' (or the given fields), for tests that break one field."""
    if data is None:
        data = np.arange(int(np.prod(dims)), dtype=np.float32).tobytes()
    return raw_gguf([kv_str("general.architecture", "llama")], [tensor_record("t", dims, ggml_type, offset)], data, **kw)


# ---- tiny models -----------------------------------------------------------------------------

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
    d, h, kvh, f = TINY["hidden"], TINY["heads"], TINY["kv_heads"], TINY["ffn"]
    hd = d // h
    tokens, merges, token_types = tokenizer or byte_level_vocab()
    v = len(tokens)
    w = GGUFWriter(path, arch)
    w.add_context_length(TINY["context"])
    w.add_embedding_length(d)
    w.add_block_count(TINY["layers"])
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
    for i in range(TINY["layers"]):
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


def smollm2_path() -> str:
    """The fetched SmolLM2 GGUF's path; the calling test skips only when set-up reported the model
    unavailable (build/models/status.json), saying why."""
    import pytest
    status = smollm2_status()
    if not status.get("available"):
        pytest.skip(f"SmolLM2 GGUF unavailable (build/models/status.json): {status.get('reason')}")
    return os.path.join(REPO, "build", "models", status["path"])


def smollm2_status() -> dict:
    """build/models/status.json, written by tools/fetch_models.py (run here first if it never ran)."""
    if not os.path.exists(STATUS_FILE):
        import subprocess
        import sys
        subprocess.run([sys.executable, os.path.join(REPO, "tools", "fetch_models.py")], check=False)
    with open(STATUS_FILE, encoding="utf-8") as f:
        return json.load(f)


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
