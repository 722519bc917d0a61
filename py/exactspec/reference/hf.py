"""A Hugging Face model folder as published: config.json and its weights, one file or shards.

`open_checkpoint(model_dir)` finds the weights the way transformers does (`model.safetensors`,
else `model.safetensors.index.json` and the shards its `weight_map` names), validates every
header before a tensor byte is read, and returns a `Checkpoint` that reads one tensor at a time
(`read_float32`, `read_rows_float32`): F32, F16 and BF16 (BF16 widened by a 16-bit shift, exact).
`load_config(model_dir)` is config.json through the one validator (exactspec.formats.config). Every
refusal is `E_MODEL_LOAD` naming the file and the problem. NumPy is imported only by the
float32 readers (CPython); the rest is standard library.
"""
from __future__ import annotations

import hashlib
import os
import re

from ..formats.config import MAX_CONFIG_BYTES, LlamaConfig, read_json_file, read_regular_file, validate_config
from ..core.errors import E_MODEL_LOAD, ExactSpecError
from ..formats.safetensors import SafetensorsReader

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_INDEX_BYTES = 16 << 20          # a 400B model's index is ~2 MB
MAX_SHARDS = 1000                 # each shard stays open while read (file descriptors)
FLOAT_DTYPES = ("F32", "F16", "BF16")
_SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.safetensors")


def _refuse(where: str, problem: str, **detail) -> ExactSpecError:
    return ExactSpecError(E_MODEL_LOAD, f"{where}: {problem}", **detail)


def load_config(model_dir) -> tuple[dict, LlamaConfig]:
    """(config.json as parsed, its validated LlamaConfig)."""
    path = os.path.join(os.fspath(model_dir), CONFIG_FILE)
    raw = read_json_file(path, max_bytes=MAX_CONFIG_BYTES)
    return raw, validate_config(raw, source=path)


def shard_files(index: dict, where: str) -> dict:
    """weight_map of a parsed model.safetensors.index.json: tensor name -> shard file name,
    refused unless every value is a plain file name in the same folder (no path separators, no
    leading dot) ending in .safetensors, with at most MAX_SHARDS distinct shards."""
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise _refuse(where, "has no 'weight_map' object")
    weight_map = index["weight_map"]
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not _SHARD_NAME.fullmatch(shard):
            raise _refuse(where, f"weight_map[{name[:80]!r}] = {str(shard)[:80]!r} is not a shard file name "
                          "in this folder (letters, digits, '.', '_', '-', ending in .safetensors)")
    if len(set(weight_map.values())) > MAX_SHARDS:
        raise _refuse(where, f"names {len(set(weight_map.values()))} shards, over the limit of {MAX_SHARDS}")
    return weight_map


class Checkpoint:
    """The weights of a folder, read one tensor at a time (see module docstring)."""

    def __init__(self, readers: list, where: dict, files: list, index_path=None):
        self._readers = readers          # SafetensorsReader per file
        self._where = where              # tensor name -> index into readers
        self.files = files               # paths, in order
        self.index_path = index_path     # model.safetensors.index.json or None

    @property
    def metadata(self) -> dict:
        """The files' __metadata__ merged (a key whose value differs between shards is dropped)."""
        merged, conflicting = {}, set()
        for r in self._readers:
            for k, v in r.metadata.items():
                if k in merged and merged[k] != v:
                    conflicting.add(k)
                merged.setdefault(k, v)
        return {k: v for k, v in merged.items() if k not in conflicting}

    def header(self) -> dict:
        """name -> {dtype, shape} over all files."""
        out = {}
        for r in self._readers:
            out.update(r.header())
        return out

    def __contains__(self, name) -> bool:
        return name in self._where

    def entry(self, name: str) -> tuple[str, tuple]:
        dtype, shape, _, _ = self._readers[self._where[name]].entries[name]
        return dtype, shape

    def path_of(self, name: str) -> str:
        return self._readers[self._where[name]].path

    def read_bytes(self, name: str, row_begin: int = 0, row_end=None) -> bytes:
        return self._readers[self._where[name]].read(name, row_begin, row_end)

    def read_rows_float32(self, name: str, row_begin: int, row_end: int):
        """Rows [row_begin, row_end) of a float tensor as a float32 NumPy array."""
        dtype, shape = self.entry(name)
        data = self.read_bytes(name, row_begin, row_end)
        return decode_float32(name, dtype, (row_end - row_begin, *shape[1:]), data, self.path_of(name))

    def read_float32(self, name: str):
        dtype, shape = self.entry(name)
        return decode_float32(name, dtype, shape, self.read_bytes(name), self.path_of(name))

    def close(self) -> None:
        for r in self._readers:
            r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def checkpoint_digest(ckpt: Checkpoint) -> tuple[str, int]:
    """(sha256 hex, bytes) naming a checkpoint's weights: of the file itself when it is one file;
    for shards, the sha256 of the index file's bytes followed by each shard's sha256 hex (file
    name order), and the byte count of the index and shards together."""
    from ..formats.manifest import sha256_file
    if ckpt.index_path is None:
        return sha256_file(ckpt.files[0])
    _, total = sha256_file(ckpt.index_path)
    h = hashlib.sha256(read_regular_file(ckpt.index_path, max_bytes=MAX_INDEX_BYTES))
    for path in ckpt.files:
        sha, nbytes = sha256_file(path)
        h.update(sha.encode())
        total += nbytes
    return h.hexdigest(), total


def decode_float32(name: str, dtype: str, shape, data, path: str):
    """F32 / F16 / BF16 bytes -> float32 array of shape (exact: every value is representable)."""
    import numpy as np
    dtype = str(dtype).upper()
    if dtype == "F32":
        arr = np.frombuffer(data, dtype="<f4")
    elif dtype == "F16":
        arr = np.frombuffer(data, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":   # bfloat16 is the top half of a float32: widen the bits, no rounding
        arr = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        raise _refuse(path, f"tensor {name!r} has unsupported dtype {dtype} (supported: {', '.join(FLOAT_DTYPES)})",
                      tensor=name, file=path)
    return arr.reshape(tuple(shape))


def open_safetensors_files(paths: list, names_per_file=None, where: str = "") -> Checkpoint:
    """A Checkpoint over several files; a tensor in two files is refused; with names_per_file
    (path -> set of names an index assigns it) each file must hold exactly its names."""
    readers, owner = [], {}
    try:
        for path in paths:
            r = SafetensorsReader(path)
            readers.append(r)
            if names_per_file is not None and set(r.entries) != names_per_file[path]:
                extra = sorted(set(r.entries) - names_per_file[path])
                missing = sorted(names_per_file[path] - set(r.entries))
                what = (f"holds {extra[0]!r}, which {INDEX_FILE} does not map to it" if extra
                        else f"lacks {missing[0]!r}, which {INDEX_FILE} maps to it")
                raise _refuse(path, what)
            for name in r.entries:
                if name in owner:
                    raise _refuse(path, f"tensor {name!r} is also in {readers[owner[name]].path}")
                owner[name] = len(readers) - 1
    except BaseException:
        for r in readers:
            r.close()
        raise
    return Checkpoint(readers, owner, list(paths))


def open_checkpoint(model_dir) -> Checkpoint:
    """The folder's weights: model.safetensors if present (transformers' first choice), else the
    shards of model.safetensors.index.json; neither is E_MODEL_LOAD."""
    model_dir = os.fspath(model_dir)
    single = os.path.join(model_dir, WEIGHTS_FILE)
    index_path = os.path.join(model_dir, INDEX_FILE)
    if os.path.exists(single) or not os.path.exists(index_path):
        if not os.path.exists(single):
            raise _refuse(model_dir, f"has neither {WEIGHTS_FILE} nor {INDEX_FILE}")
        return open_safetensors_files([single])
    weight_map = shard_files(read_json_file(index_path, max_bytes=MAX_INDEX_BYTES), index_path)
    names_per_file: dict = {}
    for name, shard in weight_map.items():
        names_per_file.setdefault(os.path.join(model_dir, shard), set()).add(name)
    paths = sorted(names_per_file)
    ckpt = open_safetensors_files(paths, names_per_file, index_path)
    ckpt.index_path = index_path
    return ckpt
