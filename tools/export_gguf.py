"""Export one of our Llama models (Hugging Face layout) to GGUF for llama.cpp / wllama: llama.cpp's
tensor names, q/k rows permuted to its RoPE layout, our byte-level BPE as tokenizer model `gpt2`.

    python tools/export_gguf.py web/models/champion build/gguf/champion.f32.gguf --type f32
    python tools/export_gguf.py web/models/champion build/gguf/champion.q8_0.gguf --type q8_0
    python tools/export_gguf.py web/models/champion build/gguf/champion.q8src.f32.gguf --weights q8
    python tools/export_gguf.py build/widened/champion-1.7b build/widened/champion-1.7b.q4_1.gguf --type q4_1

--weights picks the source file: f32 (model.safetensors, default) or q8 (model.q8.safetensors
dequantised exactly as our browser champion and the reference see it, W = q8 * scale in float32),
so an F32 export of the q8 source computes the same function as our browser engine.
--type: f32 keeps every value; q8_0 / q4_0 / q4_1 store every 2-D linear in that GGUF block
format and the embedding (token_embd, also the tied head; an untied output.weight likewise) as
Q8_0, quantised by llama.cpp's reference quantisers (quantize_row_*_ref, bit for bit: the encoders
of exactspec.twins.qmatmul_twins); 1-D norms stay F32, as llama.cpp's converter does. A block
format needs every 2-D tensor's width a multiple of 32 (E_BAD_ARGUMENT naming the tensor).
The file is written one tensor at a time (large ones in row chunks), read from the safetensors
one tensor at a time: a 1.7B float32 folder exports in about its largest tensor's memory.
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
from exactspec.reference.reference_llama import _dequantise_q8, _tensor_to_float32, q8_product  # noqa: E402  (the browser's view of q8)
from exactspec.formats.safetensors import SafetensorsReader, Tensor, load_safetensors  # noqa: E402
from exactspec.twins.qmatmul_twins import quantize_weights  # noqa: E402  (llama.cpp's reference quantisers)

SOURCE_FILES = {"f32": "model.safetensors", "q8": "model.q8.safetensors"}
# --type -> (general.file_type name in gguf.LlamaFileType, 2-D linears' format, the embedding's format)
EXPORT_TYPES = {"f32": ("ALL_F32", "F32", "F32"), "q8_0": ("MOSTLY_Q8_0", "Q8_0", "Q8_0"),
                "q4_0": ("MOSTLY_Q4_0", "Q4_0", "Q8_0"), "q4_1": ("MOSTLY_Q4_1", "Q4_1", "Q8_0")}
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}   # per 32 values
CHUNK_VALUES = 1 << 22          # a large tensor is read, converted and quantised this many values at a time
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


def source_entries(reader: SafetensorsReader, weights: str) -> dict:
    """HF name -> (shape, how to read rows [a, b) of it as float32) of a model file opened tensor by
    tensor: as read_source decodes it (q8: `<n>.q8` times `<n>.scale` in float32), a range of rows
    at a time."""
    header, path = reader.entries, reader.path

    def plain(name):
        dtype, shape = header[name][0], tuple(header[name][1])
        return shape, lambda a, b: _tensor_to_float32(name, Tensor(name, dtype, (b - a,) + shape[1:],
                                                                   memoryview(reader.read(name, a, b))), path)

    def q8(base):
        (dtype, shape), scale_name = header[base + ".q8"][:2], base + ".scale"
        if str(dtype).upper() != "I8" or len(shape) != 2:
            raise ExactSpecError(E_MODEL_LOAD, f"tensor {base + '.q8'!r} in {path} must be 2-D I8")
        if scale_name not in header or tuple(header[scale_name][1]) != (shape[0],):
            raise ExactSpecError(E_MODEL_LOAD, f"{path}: {base + '.q8'!r} needs {scale_name!r} of shape ({shape[0]},)")
        scale = plain(scale_name)[1](0, shape[0])
        return tuple(shape), lambda a, b: q8_product(reader.read(base + ".q8", a, b), b - a, shape[1], scale[a:b])

    out = {}
    for name in header:
        if weights == "q8" and name.endswith(".scale") and name[:-6] + ".q8" in header:
            continue
        if weights == "q8" and name.endswith(".q8"):
            out[name[:-3]] = q8(name[:-3])
        else:
            out[name] = plain(name)
    return out


def tensor_format(hf_name: str, shape: tuple, export_type: str) -> str:
    """The GGUF format one tensor is written in: norms (1-D) F32, the embedding and an untied head
    the type's embedding format, every other 2-D tensor the type's linear format."""
    _, linear, embedding = EXPORT_TYPES[export_type]
    if len(shape) != 2:
        return "F32"
    return embedding if hf_name in ("model.embed_tokens.weight", "lm_head.weight") else linear


def encode(fmt: str, w: np.ndarray) -> np.ndarray:
    """float32 (rows, cols) -> the bytes of fmt (uint8), llama.cpp's reference quantiser for blocks."""
    if fmt == "F32":
        return np.ascontiguousarray(w, dtype="<f4").reshape(-1).view(np.uint8)
    return np.frombuffer(quantize_weights(fmt, np.ascontiguousarray(w, dtype=np.float32)), dtype=np.uint8)


def export_gguf(model_dir: str, out_path: str, export_type: str = "f32", weights: str = "f32") -> dict:
    """Write out_path; returns a summary {tensors, bytes, type, weights, formats (format -> tensor count)}."""
    import gguf   # only the exporter needs it ([test] extra)
    if export_type not in EXPORT_TYPES:
        raise ExactSpecError(E_BAD_ARGUMENT, f"--type must be one of {', '.join(EXPORT_TYPES)}, got {export_type!r}")
    if weights not in SOURCE_FILES:
        raise ExactSpecError(E_BAD_ARGUMENT, f"--weights must be one of {', '.join(SOURCE_FILES)}, got {weights!r}")
    config = read_json_file(os.path.join(model_dir, "config.json"))
    tok = read_json_file(os.path.join(model_dir, "tokenizer.json"), max_bytes=1 << 28)
    tok_config = read_json_file(os.path.join(model_dir, "tokenizer_config.json"), max_bytes=MAX_TOKENIZER_CONFIG_BYTES)
    c = validate_config(config, source=os.path.join(model_dir, "config.json"))
    with SafetensorsReader(os.path.join(model_dir, SOURCE_FILES[weights])) as reader:
        return _write(gguf, reader, model_dir, out_path, export_type, weights, c, tok, tok_config)


def _write(gguf, reader, model_dir, out_path, export_type, weights, c, tok, tok_config) -> dict:
    tokens, token_types, merges = vocab_tables(tok, c.vocab_size)

    writer = gguf.GGUFWriter(out_path, arch="llama")
    writer.add_name(os.path.basename(os.path.normpath(model_dir)))
    writer.add_file_type(getattr(gguf.LlamaFileType, EXPORT_TYPES[export_type][0]))
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

    entries = source_entries(reader, weights)
    plan = []                                   # (gguf name, HF name, shape, format, bytes), in file order
    for hf_name, (shape, _) in entries.items():
        if hf_name == "lm_head.weight" and c.tie_word_embeddings:
            continue   # tied: llama.cpp reuses token_embd when there is no output tensor
        name, fmt = gguf_tensor_name(hf_name), tensor_format(hf_name, shape, export_type)
        values = int(np.prod(shape, dtype=np.int64))
        if fmt != "F32" and shape[-1] % 32:
            raise ExactSpecError(E_BAD_ARGUMENT, f"--type {export_type}: tensor {hf_name!r} has {shape[-1]} columns, "
                                                 f"not a multiple of 32 (a {fmt} block)")
        plan.append((name, hf_name, shape, fmt, values * 4 if fmt == "F32" else values // 32 * BLOCK_BYTES[fmt]))
    for name, _, shape, fmt, nbytes in plan:
        writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes,
                               raw_dtype=None if fmt == "F32" else getattr(gguf.GGMLQuantizationType, fmt))
    formats: dict = {}
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, hf_name, shape, fmt, nbytes in plan:
            read = entries[hf_name][1]
            rows = shape[0] if shape else 1
            heads = (c.num_attention_heads if hf_name.endswith("q_proj.weight") else
                     c.num_key_value_heads if hf_name.endswith("k_proj.weight") else None)
            # a chunk of whole rows (q/k: whole, their RoPE permutation moves rows within a head)
            step = rows if heads or len(shape) < 2 else max(1, CHUNK_VALUES // shape[1])
            parts = []
            for a in range(0, rows, step):
                w = read(a, min(rows, a + step)).reshape((-1,) + tuple(shape[1:]))
                if heads:
                    w = permute_rope_rows(w, heads)
                parts.append(encode(fmt, w.reshape(len(w), -1)) if len(shape) == 2 else encode("F32", w))
            data = np.concatenate(parts) if len(parts) > 1 else parts[0]
            assert data.nbytes == nbytes, (name, data.nbytes, nbytes)
            writer.write_tensor_data(data)
            formats[fmt] = formats.get(fmt, 0) + 1
        writer.close()
    except OSError as exc:
        raise ExactSpecError(E_IO, f"cannot write {out_path}: {exc.strerror or exc}") from None
    return {"tensors": len(plan), "bytes": os.path.getsize(out_path), "type": export_type, "weights": weights,
            "formats": formats}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src_dir", help="model folder: config.json, model(.q8).safetensors, tokenizer files")
    ap.add_argument("out", help="output .gguf path (under build/)")
    ap.add_argument("--type", choices=tuple(EXPORT_TYPES), default="f32")
    ap.add_argument("--weights", choices=tuple(SOURCE_FILES), default="f32")
    args = ap.parse_args(argv)
    try:
        summary = export_gguf(args.src_dir, args.out, args.type, args.weights)
    except ExactSpecError as exc:
        print(f"export_gguf: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    print(f"export_gguf: wrote {args.out} ({summary['bytes']} bytes, {args.type}: "
          + ", ".join(f"{n} {fmt}" for fmt, n in sorted(summary["formats"].items())) + f" tensors, from {SOURCE_FILES[args.weights]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
