"""The browser's GGUF reader (web/gguf/) against its CPython twins, under node: dequantisers bitwise
equal to gguf_dequant.py on random blocks of every type, the same refusal (code, file, field and
sentence) as gguf.py on hostile containers, and the tensor map equal to GGUFModel.read_float32."""
from __future__ import annotations

import base64
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q, GGML_QUANT_SIZES

from exactspec.core.errors import ExactSpecError
from exactspec.formats.gguf import GGUFFile, TENSOR_TYPES
from exactspec.reference.gguf_dequant import dequantize
from exactspec.formats.gguf_model import GGUFModel
from gguf_builders import gstr, kv, kv_str, kv_u32, one_tensor_gguf, raw_gguf, tensor_record
from synthetic_models import write_tiny_model
from node_harness import run_harness

HARNESS = Path(__file__).resolve().parent.parent / "web" / "tests" / "gguf_harness.mjs"
TYPES = [name for name, _, _ in TENSOR_TYPES.values()]
b64 = lambda data: base64.b64encode(bytes(data)).decode()


def test_dequantisers_bitwise_on_random_blocks():
    cases, expected = [], []
    for type_name in TYPES:
        rng = np.random.default_rng(sum(map(ord, type_name)) + 7)
        _, size = GGML_QUANT_SIZES[Q[type_name]]
        raw = rng.integers(0, 256, size=(257, size), dtype=np.uint8)   # every bit pattern: inf, NaN, subnormal scales
        cases.append({"type": type_name, "raw": b64(raw.tobytes())})
        with np.errstate(all="ignore"):
            expected.append(dequantize(raw.tobytes(), type_name))
    out = run_harness(HARNESS, {"dequant": cases})["dequant"]
    for type_name, theirs, ours_b64 in zip(TYPES, expected, out):
        ours = np.frombuffer(base64.b64decode(ours_b64), dtype=np.float32)
        assert ours.shape == theirs.shape, type_name
        nan = np.isnan(theirs)
        assert np.array_equal(nan, np.isnan(ours)), type_name
        assert np.array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32)), type_name


def hostile_files() -> list:
    """Broken containers of tests/test_gguf_hostile.py, and every truncation of a valid file."""
    arch = [kv_str("general.architecture", "llama")]
    files = [b"", b"GGML" + b"\0" * 60, one_tensor_gguf(version=1), b"GGUF" + struct.pack(">IQQ", 3, 1, 1) + b"\0" * 64,
             raw_gguf([], [], n_tensors=1 << 40), raw_gguf([], [], n_kv=1 << 40), raw_gguf([], [], n_kv=1000),
             raw_gguf([struct.pack("<Q", 1 << 62)], []), raw_gguf([kv("k", 8, struct.pack("<Q", 1 << 40))], []),
             raw_gguf([kv("k", 9, struct.pack("<IQ", 10, 1 << 23))], []),
             raw_gguf([kv("k", 9, struct.pack("<IQ", 10, 1 << 30))], []),
             raw_gguf([kv("k", 9, struct.pack("<IQ", 8, 1 << 20))], []),
             raw_gguf(arch, [tensor_record("t", (1 << 20, 1 << 20, 1 << 10), 0, 0)])]
    files += [raw_gguf([k], []) for k in (
        kv("k", 13, b""), kv("k", 9, struct.pack("<IQ", 99, 1)), kv("k", 9, struct.pack("<IQ", 9, 1)),
        kv("k", 7, b"\x02"), kv("k", 9, struct.pack("<IQ", 7, 2) + b"\x01\x05"), kv("k", 8, gstr(b"\xff\xfe")),
        kv_u32("general.alignment", 24), kv_u32("general.alignment", 0), kv_str("general.alignment", "32"))]
    files += [raw_gguf([kv_u32(key, 1), kv_u32(key, 2)], []) for key in ("k", "it's", "tab\there")]
    for records, data in [
        ([tensor_record("t", (), 0, 0)], b""), ([tensor_record("t", (32, 1, 1, 1, 1), 0, 0)], b"\0" * 128),
        ([tensor_record("t", (32, 0), 0, 0)], b""), ([tensor_record("t", (32,), 13, 0)], b"\0" * 128),
        ([tensor_record("t", (32,), 77, 0)], b"\0" * 128), ([tensor_record("t", (48,), 8, 0)], b"\0" * 128),
        ([tensor_record("t", (32,), 0, 4)], b"\0" * 256), ([tensor_record("t", (32,), 0, 1 << 60)], b"\0" * 128),
        ([tensor_record("t", (64,), 0, 0)], b"\0" * 128),
        ([tensor_record("a", (32,), 0, 0), tensor_record("b", (32,), 0, 160)], b"\0" * 256),
        ([tensor_record("a", (32,), 0, 0), tensor_record("b", (32,), 0, 64)], b"\0" * 256),
        ([tensor_record("a", (32,), 0, 0), tensor_record("a", (32,), 0, 128)], b"\0" * 256),
        ([tensor_record("", (32,), 0, 0)], b"\0" * 128),
        ([gstr(b"t\xff") + struct.pack("<IQIQ", 1, 32, 0, 0)], b"\0" * 128),
        ([gstr("x" * 300) + struct.pack("<IQIQ", 1, 32, 0, 0)], b"\0" * 128)]:
        files.append(raw_gguf(arch, records, data))
    valid = one_tensor_gguf()
    files += [valid[:cut] for cut in range(len(valid))]
    return files


def test_reader_refuses_as_gguf_py(tmp_path):
    files = hostile_files()
    python = []
    for i, data in enumerate(files):
        path = tmp_path / f"h{i}.gguf"
        path.write_bytes(data)
        with pytest.raises(ExactSpecError) as info:
            GGUFFile(str(path)).close()
        python.append(str(info.value))
    out = run_harness(HARNESS, {"headers": [{"label": str(tmp_path / f"h{i}.gguf"), "file": b64(d)}
                                            for i, d in enumerate(files)]})["headers"]
    assert len(python) > 70
    for ours, theirs in zip(out, python):
        assert "error" in ours, theirs
        assert ours["error"] == theirs


def test_reader_reads_a_valid_header_as_gguf_py(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_model(str(path), types={"attn_q.weight": Q.Q4_K, "ffn_down.weight": Q.Q6_K})
    out = run_harness(HARNESS, {"headers": [{"label": "tiny.gguf", "file": b64(path.read_bytes())}]})["headers"][0]["ok"]
    with GGUFFile(str(path)) as f:
        assert out["data_offset"] == f.data_offset and out["n_kv"] == len(f.metadata)
        assert [tuple(t[:2]) for t in out["tensors"]] == [(t.name, t.type_name) for t in f.tensors.values()]
        assert [t[2:] for t in out["tensors"]] == [[list(t.dims), t.offset, t.nbytes] for t in f.tensors.values()]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tensor_map_equals_gguf_model(tmp_path, arch):
    """Every type in one file; q/k rows un-permuted (llama) or left (qwen2); bitwise GGUFModel's."""
    path = tmp_path / f"{arch}.gguf"
    types = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K, "attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q4_1,
             "attn_v.weight": Q.Q4_0, "attn_output.weight": Q.F16, "ffn_gate.weight": Q.BF16, "ffn_up.weight": Q.Q8_0,
             "ffn_down.weight": Q.Q6_K, "attn_norm.weight": Q.F16}
    write_tiny_model(str(path), arch=arch, types=types)
    with GGUFModel(str(path)) as model:
        case = {"label": "m.gguf", "file": b64(path.read_bytes()), "config": model.config}
        eager, lazy = (m["ok"] for m in run_harness(HARNESS, {"models": [case, {**case, "lazy": True}]})["models"])
        assert sorted(eager) == sorted(model.names) and lazy == eager
        for name, (shape, data) in eager.items():
            ours = np.frombuffer(base64.b64decode(data), dtype=np.float32).reshape(shape)
            assert np.array_equal(ours.view(np.uint32), model.read_float32(name).view(np.uint32)), name


def test_tensor_map_refuses_a_non_finite_row(tmp_path):
    path = tmp_path / "inf.gguf"
    path.write_bytes(raw_gguf([kv_str("general.architecture", "llama")],
                              [tensor_record("output_norm.weight", (32, 3), 0, 0)],
                              np.array([0.0] * 64 + [np.inf] + [0.0] * 31, dtype=np.float32).tobytes()))
    with GGUFFile(str(path)) as f, pytest.raises(ExactSpecError) as info:
        f.read_float32("output_norm.weight")
    case = {"label": str(path), "file": b64(path.read_bytes()), "config": {"model_type": "llama"}}
    out = run_harness(HARNESS, {"models": [case]})["models"][0]
    assert out["error"] == str(info.value)


def test_header_stream_stops_at_the_data_section(tmp_path):
    """readGgufHeader (what the page's model check runs) reads a streamed file only up to the chunk
    that completes the tensor table (it asks for 64 KiB, then doubles); the tensor table is judged
    against the declared size (a truncated file is refused from its header alone)."""
    path = tmp_path / "tiny.gguf"
    write_tiny_model(str(path))
    with GGUFFile(str(path)) as f:
        data_offset, n_tensors, size = f.data_offset, len(f.tensors), f.size
    chunk = 4096
    out = run_harness(HARNESS, {"streams": [{"path": str(path), "chunk": chunk},
                                            {"path": str(path), "chunk": chunk, "size": size - 100}]})["streams"]
    ok = out[0]["ok"]
    assert ok["data_offset"] == data_offset and ok["prefix"] == data_offset and ok["n_tensors"] == n_tensors
    assert ok["pulled"] <= max(1 << 16, 2 * data_offset) + chunk < size, (ok, size)
    assert out[1]["error"].startswith(f"E_MODEL_LOAD: {path}: tensor ") and "run past its end" in out[1]["error"]


def test_header_stream_of_the_real_model_reads_a_few_megabytes():
    from gguf_builders import smollm2_path
    path = smollm2_path()
    with GGUFFile(path) as f:
        data_offset, size = f.data_offset, f.size
    ok = run_harness(HARNESS, {"streams": [{"path": path, "chunk": 1 << 16}]})["streams"][0]["ok"]
    print(f"[measure] SmolLM2 header: data section at {data_offset} bytes; the stream read {ok['pulled']} of {size}")
    assert ok["prefix"] == data_offset and ok["pulled"] <= 2 * data_offset + (1 << 16)
