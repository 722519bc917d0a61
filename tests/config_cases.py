"""Hostile and valid config.json cases (data only), shared by tests/test_config.py and browser tests.

BAD_CONFIGS: (name, config dict, expected code) — the shipped champion's config with one field
changed. `float("inf")` stands for `1e400` (json.dumps writes it as the literal `Infinity`, which
the bounded loader refuses too). BAD_CONFIG_BYTES: (name, raw config.json bytes, expected code)
for what only exists as bytes. GOOD_CONFIGS: (name, config dict) that must validate.
"""
from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "web", "models", "champion", "config.json"), encoding="utf-8") as _f:
    CHAMPION_CONFIG: dict = json.load(_f)
with open(os.path.join(ROOT, "web", "models", "draft", "config.json"), encoding="utf-8") as _f:
    DRAFT_CONFIG: dict = json.load(_f)

DELETE = object()   # marks a field to remove


def changed(**fields) -> dict:
    """The champion config with fields replaced (or removed, with DELETE)."""
    cfg = dict(CHAMPION_CONFIG)
    for key, value in fields.items():
        if value is DELETE:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


BAD_CONFIGS: list[tuple[str, dict, str]] = [
    ("layers 1e9", changed(num_hidden_layers=10 ** 9), "E_MODEL_LOAD"),
    ("layers 1e9 as float", changed(num_hidden_layers=1e9), "E_MODEL_LOAD"),
    ("hidden 1e400 (inf)", changed(hidden_size=float("inf")), "E_MODEL_LOAD"),
    ("hidden nan", changed(hidden_size=float("nan")), "E_MODEL_LOAD"),
    ("hidden 256.9", changed(hidden_size=256.9), "E_MODEL_LOAD"),
    ("hidden 256.0", changed(hidden_size=256.0), "E_MODEL_LOAD"),
    ("hidden string", changed(hidden_size="256"), "E_MODEL_LOAD"),
    ("hidden true", changed(hidden_size=True), "E_MODEL_LOAD"),
    ("hidden null", changed(hidden_size=None), "E_MODEL_LOAD"),
    ("hidden list", changed(hidden_size=[256]), "E_MODEL_LOAD"),
    ("hidden over 65536", changed(hidden_size=1 << 17), "E_MODEL_LOAD"),
    ("zero heads", changed(num_attention_heads=0), "E_MODEL_LOAD"),
    ("zero heads, no head_dim", changed(num_attention_heads=0, head_dim=DELETE), "E_MODEL_LOAD"),
    ("negative heads", changed(num_attention_heads=-4), "E_MODEL_LOAD"),
    ("negative layers", changed(num_hidden_layers=-1), "E_MODEL_LOAD"),
    ("zero vocab", changed(vocab_size=0), "E_MODEL_LOAD"),
    ("vocab over 2^20", changed(vocab_size=(1 << 20) + 1), "E_MODEL_LOAD"),
    ("context over 2^20", changed(max_position_embeddings=(1 << 20) + 1), "E_MODEL_LOAD"),
    ("heads not dividing hidden", changed(num_attention_heads=5, num_key_value_heads=5, head_dim=DELETE),
     "E_MODEL_LOAD"),
    ("kv heads not dividing heads", changed(num_key_value_heads=3), "E_MODEL_LOAD"),
    ("kv heads over heads", changed(num_key_value_heads=8), "E_MODEL_LOAD"),
    ("odd head_dim", changed(head_dim=63), "E_MODEL_LOAD"),
    ("head_dim 1 derived", changed(hidden_size=4, num_attention_heads=4, num_key_value_heads=4, head_dim=DELETE),
     "E_MODEL_LOAD"),
    ("missing vocab_size", changed(vocab_size=DELETE), "E_MODEL_LOAD"),
    ("missing max_position_embeddings", changed(max_position_embeddings=DELETE), "E_MODEL_LOAD"),
    ("eps zero", changed(rms_norm_eps=0.0), "E_MODEL_LOAD"),
    ("eps negative", changed(rms_norm_eps=-1e-5), "E_MODEL_LOAD"),
    ("eps inf", changed(rms_norm_eps=float("inf")), "E_MODEL_LOAD"),
    ("eps string", changed(rms_norm_eps="1e-5"), "E_MODEL_LOAD"),
    ("rope_theta inf", changed(rope_theta=float("inf")), "E_MODEL_LOAD"),
    ("rope_theta zero", changed(rope_theta=0.0), "E_MODEL_LOAD"),
    ("rope_theta bool", changed(rope_theta=True), "E_MODEL_LOAD"),
    ("rope_scaling dynamic", changed(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "E_MODEL_LOAD"),
    ("rope_scaling string", changed(rope_scaling="linear"), "E_MODEL_LOAD"),
    ("rope_parameters llama3", changed(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}), "E_MODEL_LOAD"),
    ("rope_parameters list", changed(rope_parameters=[1]), "E_MODEL_LOAD"),
    ("model_type mistral", changed(model_type="mistral"), "E_MODEL_LOAD"),
    ("hidden_act gelu", changed(hidden_act="gelu"), "E_MODEL_LOAD"),
    ("attention_bias true", changed(attention_bias=True), "E_MODEL_LOAD"),
    ("mlp_bias string", changed(mlp_bias="no"), "E_MODEL_LOAD"),
    ("tie_word_embeddings 1", changed(tie_word_embeddings=1), "E_MODEL_LOAD"),
    # int8 weights packed 4 per word: the q8 artifact and both browser kernels need multiples of 4
    ("hidden not a multiple of 4", changed(hidden_size=254), "E_MODEL_LOAD"),
    ("intermediate not a multiple of 4", changed(intermediate_size=766), "E_MODEL_LOAD"),
    ("head_dim even, not a multiple of 4", changed(head_dim=66), "E_MODEL_LOAD"),
]

_DEEP = 100_000
BAD_CONFIG_BYTES: list[tuple[str, bytes, str]] = [
    ("nested 100,000 deep", b'{"vocab_size":' + b"[" * _DEEP + b"]" * _DEEP + b"}", "E_MODEL_LOAD"),
    ("nested 100,000 deep, unclosed", b"[" * _DEEP, "E_MODEL_LOAD"),
    ("hidden 1e400 literal", json.dumps(CHAMPION_CONFIG).replace('"hidden_size": 256', '"hidden_size": 1e400')
     .encode(), "E_MODEL_LOAD"),
    ("Infinity literal", json.dumps(changed(hidden_size=float("inf"))).encode(), "E_MODEL_LOAD"),
    ("NaN literal", json.dumps(changed(rms_norm_eps=float("nan"))).encode(), "E_MODEL_LOAD"),
    ("-Infinity literal", b'{"rope_theta": -Infinity}', "E_MODEL_LOAD"),
    ("integer of 5000 digits", b'{"vocab_size": ' + b"9" * 5000 + b"}", "E_MODEL_LOAD"),
    ("duplicate key", b'{"vocab_size": 4096, "vocab_size": 8}', "E_MODEL_LOAD"),
    ("not UTF-8", b'{"model_type": "ll\xffama"}', "E_MODEL_LOAD"),
    ("not JSON", b"{vocab_size: 4096}", "E_MODEL_LOAD"),
    ("empty", b"", "E_MODEL_LOAD"),
    ("top-level array", b"[]", "E_MODEL_LOAD"),
    ("two megabytes of spaces", b"{}" + b" " * (2 << 20), "E_MODEL_LOAD"),
]

GOOD_CONFIGS: list[tuple[str, dict]] = [
    ("shipped champion", dict(CHAMPION_CONFIG)),
    ("shipped draft", dict(DRAFT_CONFIG)),
    ("head_dim and kv heads absent", changed(head_dim=DELETE, num_key_value_heads=DELETE)),
    ("head_dim and kv heads null", changed(head_dim=None, num_key_value_heads=None)),
    ("model_type, act, eps, rope absent", changed(model_type=DELETE, hidden_act=DELETE, rms_norm_eps=DELETE,
                                                  rope_theta=DELETE, rope_scaling=DELETE)),
    ("rope_parameters layout", changed(rope_theta=DELETE, rope_parameters={"rope_type": "default",
                                                                           "rope_theta": 500000.0})),
    ("rope_scaling default", changed(rope_scaling={"type": "default"})),
    ("integer rope_theta", changed(rope_theta=500000)),
    ("heads x head_dim != hidden", changed(num_attention_heads=8, num_key_value_heads=8, head_dim=16)),
    ("pretraining_tp 2 (ignored, as transformers 5 does)", changed(pretraining_tp=2)),
    ("Llama-3.1-405B sizes", changed(vocab_size=128256, hidden_size=16384, intermediate_size=53248,
                                     num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8,
                                     head_dim=128, max_position_embeddings=131072, rope_theta=500000.0)),
    ("upper bounds", changed(vocab_size=1 << 20, hidden_size=1 << 16, intermediate_size=1 << 18,
                             num_hidden_layers=1024, num_attention_heads=1024, num_key_value_heads=1024,
                             head_dim=1024, max_position_embeddings=1 << 20)),
]
