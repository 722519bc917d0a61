"""Export one of our Llama models (Hugging Face layout) to GGUF for llama.cpp / wllama: llama.cpp's
tensor names, q/k rows permuted to its RoPE layout, our byte-level BPE as tokenizer model `gpt2`.

    python tools/export_gguf.py web/models/champion build/gguf/champion.f32.gguf --type f32
    python tools/export_gguf.py web/models/champion build/gguf/champion.q8_0.gguf --type q8_0
    python tools/export_gguf.py web/models/champion build/gguf/champion.q8src.f32.gguf --weights q8

--weights picks the source file: f32 (model.safetensors, default) or q8 (model.q8.safetensors
dequantised exactly as our browser champion and the reference see it, W = q8 * scale in float32),
so an F32 export of the q8 source computes the same function as our browser engine.
--type: f32 keeps every value; q8_0 stores every 2-D tensor as llama.cpp Q8_0 (blocks of 32 int8
with one float16 scale each); 1-D norms stay F32, as llama.cpp's converter does.
Exports belong under build/ (gitignored): the repository carries no GGUF files.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from exactspec.formats.config import read_json_file, validate_config  # noqa: E402
from exactspec.core.errors import E_BAD_ARGUMENT, E_IO, E_MODEL_LOAD, ExactSpecError  # noqa: E402
from exactspec.reference.reference_llama import _dequantise_q8, _tensor_to_float32  # noqa: E402  (the browser's view of q8)
from exactspec.formats.safetensors import load_safetensors  # noqa: E402

SOURCE_FILES = {"f32": "model.safetensors", "q8": "model.q8.safetensors"}
EXPORT_TYPES = ("f32", "q8_0")
MAX_TOKENIZER_CONFIG_BYTES = 1 << 24

# HF name inside layer i -> llama.cpp name inside blk.i
LAYER_TENSORS = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
GLOBAL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                  "lm_head.weight": "output.weight"}


# ---- pure: names, RoPE row order, tokenizer metadata ----

def gguf_tensor_name(hf_name: str) -> str:
    """llama.cpp's name for one HF Llama tensor name (E_MODEL_LOAD for a name it has no place for)."""
    if hf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[hf_name]
    parts = hf_name.split(".", 3)   # model, layers, i, rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit() and parts[3] in LAYER_TENSORS:
        return f"blk.{int(parts[2])}.{LAYER_TENSORS[parts[3]]}"
    raise ExactSpecError(E_MODEL_LOAD, f"tensor {hf_name!r} has no llama.cpp name")


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF q/k rows (out = heads x head_dim, in) -> llama.cpp's order. HF rotates pairs (j, j + hd/2)
    of each head (rotate_half); llama.cpp's LLAMA rope rotates adjacent pairs (2j, 2j+1). So row j
    of each head moves to 2j and row j + hd/2 to 2j + 1 (n_heads: the q or the kv head count)."""
    out_dim = w.shape[0]
    head_dim = out_dim // n_heads
    return w.reshape(n_heads, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of permute_rope_rows: llama.cpp's q/k row order back to HF's."""
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def vocab_tables(tokenizer_json: dict, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, token types, merges as "a b") from a byte-level BPE tokenizer.json. Special
    added tokens are CONTROL (3), other added ones USER_DEFINED (4), the rest NORMAL (1)."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ExactSpecError(E_MODEL_LOAD, "tokenizer.json: a BPE model with a vocab is needed")
    by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    types = {}
    for added in tokenizer_json.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        types[added["id"]] = 3 if added.get("special") else 4
    if sorted(by_id) != list(range(vocab_size)):
        raise ExactSpecError(E_MODEL_LOAD, f"tokenizer.json: token ids are not exactly 0..{vocab_size - 1}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return [by_id[i] for i in range(vocab_size)], [types.get(i, 1) for i in range(vocab_size)], merges


def token_id(tokens: list[str], text: str | None, what: str) -> int:
    if text not in tokens:
        raise ExactSpecError(E_MODEL_LOAD, f"tokenizer_config.json: {what} {text!r} is not in the vocabulary")
    return tokens.index(text)


# ---- I/O ----

def read_source(model_dir: str, weights: str) -> tuple[dict, dict[str, np.ndarray], dict, dict]:
    """(config, HF-named float32 tensors, tokenizer.json, tokenizer_config.json) of one model folder."""
    if weights not in SOURCE_FILES:
        raise ExactSpecError(E_BAD_ARGUMENT, f"--weights must be one of {', '.join(SOURCE_FILES)}, got {weights!r}")
    config = read_json_file(os.path.join(model_dir, "config.json"))
    path = os.path.join(model_dir, SOURCE_FILES[weights])
    raw = load_safetensors(path)
    tensors = _dequantise_q8(raw, path) if weights == "q8" else {n: _tensor_to_float32(n, t, path) for n, t in raw.items()}
    tok = read_json_file(os.path.join(model_dir, "tokenizer.json"), max_bytes=1 << 28)
    tok_config = read_json_file(os.path.join(model_dir, "tokenizer_config.json"), max_bytes=MAX_TOKENIZER_CONFIG_BYTES)
    return config, tensors, tok, tok_config


def export_gguf(model_dir: str, out_path: str, export_type: str = "f32", weights: str = "f32") -> dict:
    """Write out_path; returns a summary {tensors, bytes, type, weights}."""
    import gguf   # only the exporter needs it ([test] extra)
    if export_type not in EXPORT_TYPES:
        raise ExactSpecError(E_BAD_ARGUMENT, f"--type must be one of {', '.join(EXPORT_TYPES)}, got {export_type!r}")
    config, tensors, tok, tok_config = read_source(model_dir, weights)
    c = validate_config(config, source=os.path.join(model_dir, "config.json"))
    tokens, token_types, merges = vocab_tables(tok, c.vocab_size)

    writer = gguf.GGUFWriter(out_path, arch="llama")
    writer.add_name(os.path.basename(os.path.normpath(model_dir)))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if export_type == "f32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_vocab_size(c.vocab_size)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(float(c.rope_theta))
    writer.add_layer_norm_rms_eps(float(c.rms_norm_eps))

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")   # GPT-2's split regex, as our ByteLevel(use_regex) pre-tokenizer
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(token_id(tokens, tok_config.get("bos_token"), "bos_token"))
    writer.add_eos_token_id(token_id(tokens, tok_config.get("eos_token"), "eos_token"))
    if tok_config.get("pad_token"):
        writer.add_pad_token_id(token_id(tokens, tok_config["pad_token"], "pad_token"))
    if "<|end|>" in tokens:   # our chat turn end: a stop id, llama.cpp's end-of-turn
        writer.add_eot_token_id(tokens.index("<|end|>"))
    writer.add_add_bos_token(bool(tok_config.get("add_bos_token", False)))
    writer.add_add_eos_token(bool(tok_config.get("add_eos_token", False)))
    if tok_config.get("chat_template"):
        writer.add_chat_template(tok_config["chat_template"])

    for hf_name, w in tensors.items():
        if hf_name == "lm_head.weight" and c.tie_word_embeddings:
            continue   # tied: llama.cpp reuses token_embd when there is no output tensor
        name = gguf_tensor_name(hf_name)
        if hf_name.endswith("q_proj.weight"):
            w = permute_rope_rows(w, c.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            w = permute_rope_rows(w, c.num_key_value_heads)
        w = np.ascontiguousarray(w, dtype=np.float32)
        if export_type == "q8_0" and w.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, w)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    except OSError as exc:
        raise ExactSpecError(E_IO, f"cannot write {out_path}: {exc.strerror or exc}") from None
    return {"tensors": len(writer.tensors[0]) if writer.tensors else 0, "bytes": os.path.getsize(out_path),
            "type": export_type, "weights": weights}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src_dir", help="model folder: config.json, model(.q8).safetensors, tokenizer files")
    ap.add_argument("out", help="output .gguf path (under build/)")
    ap.add_argument("--type", choices=EXPORT_TYPES, default="f32")
    ap.add_argument("--weights", choices=tuple(SOURCE_FILES), default="f32")
    args = ap.parse_args(argv)
    try:
        summary = export_gguf(args.src_dir, args.out, args.type, args.weights)
    except ExactSpecError as exc:
        print(f"export_gguf: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    print(f"export_gguf: wrote {args.out} ({summary['bytes']} bytes, {args.type}, from {SOURCE_FILES[args.weights]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
