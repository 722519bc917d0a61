"""Raw GGUF bytes built field by field (to write what no writer would: wrong counts, types,
offsets), the fetched SmolLM2 GGUF's path and its float reference pair (built once per process). Tiny
random GGUF models: synthetic_models.py."""
from __future__ import annotations

import functools
import json
import os
import struct

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUS_FILE = os.path.join(REPO, "build", "models", "status.json")


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


def smollm2_path() -> str:
    """The fetched SmolLM2 GGUF's path; the calling test skips only when set-up reported the model
    unavailable (build/models/status.json), saying why."""
    import pytest
    status = smollm2_status()
    if not status.get("available"):
        pytest.skip(f"SmolLM2 GGUF unavailable (build/models/status.json): {status.get('reason')}")
    return os.path.join(REPO, "build", "models", status["path"])


@functools.lru_cache(maxsize=None)
def gguf_reference_pair(path: str):
    """gguf_pair.load_gguf_pair(path): the float reference pair on a GGUF, built once per test process
    (SmolLM2-135M: ~8 s and ~1 GB) for the modules that only generate from it or read its tokenizer."""
    from exactspec.reference.gguf_pair import load_gguf_pair
    return load_gguf_pair(path)


def smollm2_status() -> dict:
    """build/models/status.json, written by tools/fetch_models.py (run here first if it never ran)."""
    if not os.path.exists(STATUS_FILE):
        import subprocess
        import sys
        subprocess.run([sys.executable, os.path.join(REPO, "tools", "fetch_models.py")], check=False)
    with open(STATUS_FILE, encoding="utf-8") as f:
        return json.load(f)
