"""Hugging Face folders for the converter tests: `hf_folder` (the shipped champion's weights as
bf16/f16 shards with an index, or one file) and HOSTILE, the folders `exactspec convert` refuses,
each a mutation of a fresh two-shard bf16 folder, for the CLI and the page alike
(tests/test_page_convert_hostile.py). Data only: no test here."""
from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np

from exactspec.formats.safetensors import load_safetensors, to_numpy, write_safetensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAMPION = os.path.join(ROOT, "web", "models", "champion")
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
INDEX = "model.safetensors.index.json"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def to_half(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "F16":
        return values.astype("<f2").tobytes()
    bits = values.astype("<f4").view("<u4")
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()   # round to nearest even


def hf_folder(d: str, dtype: str = "BF16", shards: int = 2) -> str:
    """The shipped champion's weights in dtype, in `shards` files (an index when more than one)."""
    os.makedirs(d)
    for name in SMALL_FILES:
        shutil.copy(os.path.join(CHAMPION, name), d)
    tensors = {k: to_numpy(t) for k, t in load_safetensors(os.path.join(CHAMPION, "model.safetensors")).items()}
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(d, file), {n: (dtype, tensors[n].shape, to_half(tensors[n], dtype)) for n in part},
                          {"format": "pt", "shard": str(s)} if shards > 1 else {"format": "pt"})
        weight_map.update({n: file for n in part})
    if shards > 1:
        with open(os.path.join(d, INDEX), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return d


# ----------------------------------------------------------------------------- raw editing
def read_raw(path: str) -> tuple[dict, bytes]:
    """(header JSON object, data buffer) of a safetensors file, unchecked."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob)
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def write_raw(path: str, header: dict, data: bytes) -> None:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def _index(d: str) -> dict:
    with open(os.path.join(d, INDEX)) as f:
        return json.load(f)


def _set_index(d: str, index: dict) -> None:
    with open(os.path.join(d, INDEX), "w") as f:
        json.dump(index, f)


def _shard_of(d: str, tensor: str) -> str:
    return os.path.join(d, _index(d)["weight_map"][tensor])


def _add_tensor(d: str, shard: str, name: str, dtype: str, shape: list, data: bytes) -> None:
    header, body = read_raw(os.path.join(d, shard))
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(data)]}
    write_raw(os.path.join(d, shard), header, body + data)


def _set_config(d: str, text: str) -> None:
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(text)


def _config_text(**fields) -> str:
    with open(os.path.join(CHAMPION, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(fields)
    return json.dumps(cfg)


# ----------------------------------------------------------------------------- the hostile folders
def truncated_shard(d):
    """The cut falls inside a 2-D weight (short reads once became NaN scales and zeros)."""
    path = _shard_of(d, "model.layers.3.mlp.up_proj.weight")
    header, body = read_raw(path)
    begin, end = header["model.layers.3.mlp.up_proj.weight"]["data_offsets"]
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - len(body) + (begin + end) // 2)


def header_claims_a_huge_tensor(d):
    """A 16384 x 65536 tensor (2 GiB of bf16) declared in a shard of a few MB."""
    path = _shard_of(d, "model.layers.0.mlp.gate_proj.weight")
    header, body = read_raw(path)
    entry = header["model.layers.0.mlp.gate_proj.weight"]
    entry["shape"] = [16384, 65536]
    entry["data_offsets"] = [entry["data_offsets"][0], entry["data_offsets"][0] + 16384 * 65536 * 2]
    write_raw(path, header, body)


def shape_disagrees_with_config(d):
    """mlp.down_proj declared (768, 256) instead of (256, 768): the same bytes, another matrix."""
    path = _shard_of(d, "model.layers.2.mlp.down_proj.weight")
    header, body = read_raw(path)
    header["model.layers.2.mlp.down_proj.weight"]["shape"] = [768, 256]
    write_raw(path, header, body)


def tensor_in_two_shards(d):
    """The second shard also holds a tensor the index maps to the first."""
    name = next(n for n, s in _index(d)["weight_map"].items() if s == SHARDS[0] and n.endswith("q_proj.weight"))
    header, body = read_raw(os.path.join(d, SHARDS[0]))
    b, e = header[name]["data_offsets"]
    _add_tensor(d, SHARDS[1], name, header[name]["dtype"], header[name]["shape"], body[b:e])


def tensor_named_proto(d):
    """A tensor named __proto__, in a shard and in the index."""
    _add_tensor(d, SHARDS[1], "__proto__", "BF16", [4], bytes(8))
    index = _index(d)
    index["weight_map"]["__proto__"] = SHARDS[1]
    _set_index(d, index)


def champion_carries_head_ids(d):
    """A champion with a draft's restricted-vocabulary tensor (docs/draft_wasm.md), sound values."""
    _add_tensor(d, SHARDS[1], "exactspec.head_ids", "I32", [8], np.arange(8, dtype="<i4").tobytes())
    index = _index(d)
    index["weight_map"]["exactspec.head_ids"] = SHARDS[1]
    _set_index(d, index)


def index_value_proto(d):
    """An index that maps a tensor to the 'file' __proto__."""
    index = _index(d)
    index["weight_map"]["model.norm.weight"] = "__proto__"
    _set_index(d, index)


def index_key_proto(d):
    """An index that maps a tensor named __proto__ (no shard holds one) to the second shard."""
    index = _index(d)
    index["weight_map"]["__proto__"] = SHARDS[1]
    _set_index(d, index)


def index_names_an_absent_shard(d):
    """model.norm.weight moved from its shard to one the folder lacks."""
    index = _index(d)
    path = os.path.join(d, index["weight_map"]["model.norm.weight"])
    tensors, metadata = load_safetensors(path, with_metadata=True)
    write_safetensors(path, {n: (t.dtype, t.shape, t.data) for n, t in tensors.items() if n != "model.norm.weight"}, metadata)
    index["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors"
    _set_index(d, index)


def trailing_bytes(d):
    with open(os.path.join(d, SHARDS[1]), "ab") as f:
        f.write(bytes(4096))


def overlapping_tensors(d):
    path = os.path.join(d, SHARDS[1])
    header, body = read_raw(path)
    first, second = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])[:2]
    b = header[first]["data_offsets"][0]
    header[second]["data_offsets"] = [b, b + header[second]["data_offsets"][1] - header[second]["data_offsets"][0]]
    write_raw(path, header, body)


def config_float_size(d):
    _set_config(d, _config_text().replace('"hidden_size": 256,', '"hidden_size": 256.0,'))


def config_absurd_layers(d):
    _set_config(d, _config_text(num_hidden_layers=10 ** 9))


def config_duplicate_key(d):
    _set_config(d, _config_text()[:-1] + ', "vocab_size": 4096}')


def config_unsupported_rope(d):
    _set_config(d, _config_text(rope_scaling={"rope_type": "yarn", "factor": 4.0}))


def _poke_bf16(d: str, tensor: str, flat_index: int, bits: int) -> None:
    path = _shard_of(d, tensor)
    header, body = read_raw(path)
    b = header[tensor]["data_offsets"][0] + 2 * flat_index
    write_raw(path, header, body[:b] + struct.pack("<H", bits) + body[b + 2:])


def inf_in_a_weight(d):
    """+inf in row 5 of a 2-D weight (bf16 0x7f80)."""
    _poke_bf16(d, "model.layers.1.self_attn.o_proj.weight", 5 * 256 + 7, 0x7F80)


def nan_in_a_norm(d):
    """NaN in element 9 of a norm weight (bf16 0x7fc0)."""
    _poke_bf16(d, "model.layers.4.input_layernorm.weight", 9, 0x7FC0)


# name -> (mutation, the code both refuse it with, a phrase both messages hold, refused before any weight is converted)
HOSTILE = {
    "truncated shard": (truncated_shard, "E_MODEL_LOAD", "past the data buffer", True),
    "header claims 16384x65536": (header_claims_a_huge_tensor, "E_MODEL_LOAD", "past the data buffer", True),
    "shape disagrees with config": (shape_disagrees_with_config, "E_MODEL_LOAD", "expected (256, 768)", True),
    "tensor in two shards": (tensor_in_two_shards, "E_MODEL_LOAD", "does not map to it", True),
    "tensor named __proto__": (tensor_named_proto, "E_MODEL_LOAD", "unexpected tensor '__proto__'", True),
    "champion carries exactspec.head_ids": (champion_carries_head_ids, "E_MODEL_LOAD",
                                            "unexpected tensor 'exactspec.head_ids'", True),
    "index value __proto__": (index_value_proto, "E_MODEL_LOAD", "is not a shard file name", True),
    "index key __proto__": (index_key_proto, "E_MODEL_LOAD", "lacks '__proto__'", True),
    "index names an absent shard": (index_names_an_absent_shard, "E_MODEL_LOAD", "file not found", True),
    "trailing bytes": (trailing_bytes, "E_MODEL_LOAD", "trailing bytes", True),
    "overlapping tensors": (overlapping_tensors, "E_MODEL_LOAD", "overlaps", True),
    "config hidden_size 256.0": (config_float_size, "E_MODEL_LOAD", "hidden_size must be an integer", True),
    "config 1e9 layers": (config_absurd_layers, "E_MODEL_LOAD", "num_hidden_layers 1000000000 is outside", True),
    "config duplicate key": (config_duplicate_key, "E_MODEL_LOAD", "duplicate key 'vocab_size'", True),
    "config rope yarn": (config_unsupported_rope, "E_MODEL_LOAD", "is not supported", True),
    "inf in a weight": (inf_in_a_weight, "E_MODEL_LOAD", "model.layers.1.self_attn.o_proj.weight: row 5, column 7 is inf", False),
    "nan in a norm": (nan_in_a_norm, "E_MODEL_LOAD", "model.layers.4.input_layernorm.weight: element 9 is nan", False),
}
