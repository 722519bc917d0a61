"""Champion/draft compatibility: what must be identical for exact speculative decoding.

Exactness needs both models to speak the same token language: the draft proposes token ids
that the champion scores, so ids, the text they stand for, the prompt they were given (chat
template, special tokens) and where generation stops must mean the same thing on both sides.
Weights, sizes, context length and RoPE may differ: the draft is only a proposal that the
champion's own distribution accepts or corrects, and no KV cache is ever shared. Those are
recorded in the manifest but never refused. Pure Python (hashlib, json); runs in Pyodide.
"""
from __future__ import annotations

import hashlib
import json
import os

from .errors import E_MANIFEST_MISMATCH, E_MODEL_LOAD, ExactSpecError
from .tokenizer import Tokenizer

MANIFEST_VERSION = 1
FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
WEIGHTS_FILE = "model.safetensors"

# Fields that must be identical (in this order of reporting).
MUST_MATCH = (
    "tokenizer_sha256", "tokenizer_vocab_size", "config_vocab_size", "token_map_sha256",
    "added_tokens", "merges_sha256", "model_options_sha256", "normalizer_sha256",
    "pre_tokenizer_sha256", "post_processor_sha256", "decoder_sha256", "tokenizer_flags",
    "chat_template_sha256", "bos_token_id", "eos_token_id", "pad_token_id", "stop_token_ids",
)
# Recorded, allowed to differ.
MAY_DIFFER = (
    "weights_sha256", "weights_bytes", "model_type", "architectures", "hidden_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "max_position_embeddings", "model_max_length", "rope_theta", "rope_scaling", "torch_dtype",
    "tie_word_embeddings",
)
# tokenizer_config.json switches that change the ids or text transformers would produce.
_TOKENIZER_FLAGS = ("add_bos_token", "add_eos_token", "clean_up_tokenization_spaces",
                    "add_prefix_space", "legacy")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_json(value) -> str:
    return sha256_bytes(canonical_json(value))


def sha256_file(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
    except OSError as e:
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: cannot read ({e.strerror or e})") from None
    return h.hexdigest(), size


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: file not found") from None
    except OSError as e:
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: cannot read ({e.strerror or e})") from None


def _read_json_object(path: str) -> tuple[dict, bytes]:
    raw = _read_bytes(path)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: not valid UTF-8 JSON ({e})") from None
    if not isinstance(value, dict):
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: not a JSON object")
    return value, raw


def _token_content(value):
    """tokenizer_config tokens are a string, an AddedToken-like object, or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _as_id_list(value, path: str, key: str) -> list[int]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: {key} must be a token id or a list of ids")
    return sorted(set(items))


def load_model_identity(model_dir: str) -> dict:
    """Everything that identifies a model's token language and shape, hashed where large."""
    paths = {name: os.path.join(model_dir, name) for name in FILES}
    config, _ = _read_json_object(paths["config.json"])
    tok_spec, tok_raw = _read_json_object(paths["tokenizer.json"])
    tok_config, _ = _read_json_object(paths["tokenizer_config.json"])
    gen_config, _ = _read_json_object(paths["generation_config.json"])
    try:
        tokenizer = Tokenizer(tok_spec)
    except ExactSpecError as e:
        raise ExactSpecError(e.code, f"{paths['tokenizer.json']}: {e.message}") from None

    model = tok_spec["model"]
    token_map = [[i, tokenizer.id_to_token(i)] for i in range(tokenizer.vocab_size)]
    merges = [m.split(" ") if isinstance(m, str) else list(m) for m in model.get("merges", [])]
    model_options = {k: v for k, v in model.items() if k not in ("vocab", "merges")}
    added = [{k: t.get(k) for k in ("id", "content", "special", "single_word", "lstrip", "rstrip", "normalized")}
             for t in tok_spec.get("added_tokens") or []]

    chat_template = tok_config.get("chat_template")
    jinja_path = os.path.join(model_dir, "chat_template.jinja")
    if chat_template is None and os.path.exists(jinja_path):
        chat_template = _read_bytes(jinja_path).decode("utf-8", "replace")

    def token_id(key: str):
        content = _token_content(tok_config.get(key))
        if content is None:
            return config.get(key + "_id")
        i = tokenizer.token_to_id(content)
        if i is None:
            raise ExactSpecError(E_MODEL_LOAD, f"{paths['tokenizer_config.json']}: {key} {content!r} is not in the vocabulary")
        return i

    weights_path = os.path.join(model_dir, WEIGHTS_FILE)
    if not os.path.exists(weights_path):
        raise ExactSpecError(E_MODEL_LOAD, f"{weights_path}: file not found")
    weights_sha, weights_bytes = sha256_file(weights_path)

    config_vocab = config.get("vocab_size")
    if not isinstance(config_vocab, int) or isinstance(config_vocab, bool):
        raise ExactSpecError(E_MODEL_LOAD, f"{paths['config.json']}: vocab_size missing or not an integer")

    identity = {
        "model_dir": os.path.abspath(model_dir),
        "tokenizer_sha256": sha256_bytes(tok_raw),
        "tokenizer_vocab_size": tokenizer.vocab_size,
        "config_vocab_size": config_vocab,
        "token_map_sha256": sha256_json(token_map),
        "added_tokens": added,
        "merges_sha256": sha256_json(merges),
        "model_options_sha256": sha256_json(model_options),
        "normalizer_sha256": sha256_json(tok_spec.get("normalizer")),
        "pre_tokenizer_sha256": sha256_json(tok_spec.get("pre_tokenizer")),
        "post_processor_sha256": sha256_json(tok_spec.get("post_processor")),
        "decoder_sha256": sha256_json(tok_spec.get("decoder")),
        "tokenizer_flags": {k: tok_config.get(k) for k in _TOKENIZER_FLAGS},
        "chat_template_sha256": None if chat_template is None else sha256_json(chat_template),
        "bos_token_id": token_id("bos_token"),
        "eos_token_id": token_id("eos_token"),
        "pad_token_id": token_id("pad_token"),
        "stop_token_ids": _as_id_list(gen_config.get("eos_token_id"), paths["generation_config.json"], "eos_token_id"),
        "weights_sha256": weights_sha,
        "weights_bytes": weights_bytes,
        "model_max_length": tok_config.get("model_max_length"),
    }
    for key in MAY_DIFFER:
        if key not in identity:
            identity[key] = config.get(key)
    return identity


def _show(value) -> str:
    if isinstance(value, str) and len(value) == 64:
        return value[:12] + ".."
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def check_pair(champion_dir: str, draft_dir: str) -> dict:
    """The pair's manifest, or E_MANIFEST_MISMATCH naming every field that must match and
    does not (the draft's output vocabulary must equal the champion's, so both configs'
    vocab_size must also equal the champion tokenizer's size)."""
    champion = load_model_identity(champion_dir)
    draft = load_model_identity(draft_dir)
    problems = []
    for field in MUST_MATCH:
        if champion[field] != draft[field]:
            problems.append((field, f"field {field!r} differs: champion {_show(champion[field])} draft {_show(draft[field])}"))
    for side, ident in (("champion", champion), ("draft", draft)):
        if ident["config_vocab_size"] != champion["tokenizer_vocab_size"]:
            problems.append(("config_vocab_size",
                             f"field 'config_vocab_size' of {side} ({ident['config_vocab_size']}) differs from "
                             f"the tokenizer vocab size {champion['tokenizer_vocab_size']}"))
    if problems:
        fields = list(dict.fromkeys(f for f, _ in problems))
        raise ExactSpecError(E_MANIFEST_MISMATCH, "; ".join(m for _, m in problems), fields=fields)
    return {
        "manifest_version": MANIFEST_VERSION,
        "shared": {field: champion[field] for field in MUST_MATCH},
        "champion": {field: champion[field] for field in MAY_DIFFER},
        "draft": {field: draft[field] for field in MAY_DIFFER},
        "differs": [field for field in MAY_DIFFER if champion[field] != draft[field]],
    }
