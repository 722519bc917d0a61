"""safetensors reader/writer: round trips with the official package, one test per corruption,
hostile files (sparse giants, /dev/zero, FIFOs) refused without reading them."""
from __future__ import annotations

import json
import os
import resource
import struct
import threading
import tracemalloc

import numpy as np
import pytest

import exactspec.formats.safetensors as st_module
from exactspec.core.errors import E_MODEL_LOAD, ExactSpecError
from exactspec.formats.safetensors import (
    MAX_HEADER_BYTES, load_safetensors, read_header, serialize_safetensors, tensor_values, to_numpy,
    write_safetensors,
)


def _reference():
    """The official `safetensors` package (installed with the test extras), NumPy flavour."""
    import safetensors.numpy
    return safetensors.numpy


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "embed.weight": rng.standard_normal((7, 5)).astype(np.float32),
        "layers.0.q.weight": rng.integers(-128, 128, (3, 4, 2), dtype=np.int8),
        "layers.0.q.scale": rng.standard_normal(3).astype(np.float16),
        "norm": rng.standard_normal(1).astype(np.float64),
        "ids": np.arange(11, dtype=np.int32),
        "big": np.arange(5, dtype=np.int64) - 2,
        "u16": np.arange(3, dtype=np.uint16),
        "mask": np.array([True, False, True]),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "scalar": np.array(3.5, dtype=np.float32),
        "ünïcode name": np.ones(2, dtype=np.uint8),
    }


def test_files_written_by_safetensors_load_identically(tmp_path):
    st_numpy = _reference()
    arrays = _arrays()
    path = tmp_path / "ref.safetensors"
    st_numpy.save_file(arrays, str(path), metadata={"format": "np", "note": "x"})
    tensors, metadata = load_safetensors(path, with_metadata=True)
    assert metadata == {"format": "np", "note": "x"}
    assert set(tensors) == set(arrays)
    for name, a in arrays.items():
        t = tensors[name]
        assert t.shape == a.shape and t.nbytes == a.nbytes
        got = to_numpy(t)
        assert got.dtype == a.dtype and np.array_equal(got, a)
        assert tensor_values(t) == a.reshape(-1).tolist()
    header, _ = read_header(path)
    assert header["embed.weight"]["dtype"] == "F32"


def test_files_we_write_load_identically_with_safetensors(tmp_path):
    st_numpy = _reference()
    arrays = _arrays()
    names = {np.dtype(np.float32): "F32", np.dtype(np.int8): "I8", np.dtype(np.float16): "F16",
             np.dtype(np.float64): "F64", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
             np.dtype(np.uint16): "U16", np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8"}
    path = tmp_path / "ours.safetensors"
    write_safetensors(path, {k: (names[a.dtype], a.shape, a.tobytes()) for k, a in arrays.items()},
                      metadata={"producer": "exactspec"})
    loaded = st_numpy.load_file(str(path))
    assert set(loaded) == set(arrays)
    for name, a in arrays.items():
        assert loaded[name].dtype == a.dtype and np.array_equal(loaded[name], a)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    assert n % 8 == 0                                           # data buffer 8-byte aligned
    for name, t in load_safetensors(path).items():              # each tensor aligned to its size
        begin = read_header(path)[0][name]["data_offsets"][0]
        assert (begin % {"F64": 8, "I64": 8, "F32": 4, "I32": 4}.get(t.dtype, 1)) == 0
    # byte-identical with the reference writer when metadata agrees
    ref = tmp_path / "ref.safetensors"
    st_numpy.save_file(arrays, str(ref), metadata={"producer": "exactspec"})
    assert load_safetensors(ref).keys() == load_safetensors(path).keys()


def test_bf16_widens_exactly(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 0.0, -0.0, np.inf], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    path = tmp_path / "bf16.safetensors"
    write_safetensors(path, {"w": ("BF16", (2, 3), bits.tobytes())})
    t = load_safetensors(path)["w"]
    assert t.dtype == "BF16" and t.shape == (2, 3)
    assert np.array_equal(to_numpy(t), values.reshape(2, 3))
    assert tensor_values(t)[:3] == [1.0, -2.5, 3.140625]


# ---------------------------------------------------------------------------------------------
# Corruptions: each refused with E_MODEL_LOAD, the file named, the problem stated.
# ---------------------------------------------------------------------------------------------


def _raw(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def _file(header: dict, data: bytes, pad: bytes = b"") -> bytes:
    raw = json.dumps(header).encode() + pad
    return struct.pack("<Q", len(raw)) + raw + data


GOOD_HEADER = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "I8", "shape": [2, 2], "data_offsets": [8, 12]}}
GOOD_DATA = bytes(12)


def _with(name, **changes):
    h = json.loads(json.dumps(GOOD_HEADER))
    h[name].update(changes)
    return h


def _without(name, key):
    h = json.loads(json.dumps(GOOD_HEADER))
    del h[name][key]
    return h


CORRUPTIONS = {
    "short file": (b"\x01\x00\x00", "shorter than the 8-byte"),
    "empty file": (b"", "shorter than the 8-byte"),
    "header longer than file": (struct.pack("<Q", 1000) + b"{}", "exceeds the file size"),
    "header over 100 MB": (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "exceeds the 100000000-byte limit"),
    "header length 2^64-1": (b"\xff" * 8 + b"{}", "exceeds the 100000000-byte limit"),
    "header nested too deep": (_raw(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b""), "nests too deep"),
    "header not utf-8": (struct.pack("<Q", 4) + b"{\xff\xfe}", "not UTF-8"),
    "header not json": (struct.pack("<Q", 5) + b"{abc}", "not valid JSON"),
    "header not object": (struct.pack("<Q", 2) + b"[]", "does not start with '{'"),
    "duplicate tensor": (_raw(b'{"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]},'
                                b'"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}', b"\0"), "duplicate key"),
    "entry not object": (_file({"a": 3}, b""), "entry is not an object"),
    "missing dtype": (_file(_without("a", "dtype"), GOOD_DATA), "missing dtype"),
    "missing shape": (_file(_without("a", "shape"), GOOD_DATA), "missing shape"),
    "missing data_offsets": (_file(_without("b", "data_offsets"), GOOD_DATA), "missing data_offsets"),
    "unknown field": (_file(_with("a", extra=1), GOOD_DATA), "unknown fields"),
    "unknown dtype": (_file(_with("a", dtype="F33"), GOOD_DATA), "unknown dtype 'F33'"),
    "negative dim": (_file(_with("a", shape=[-2]), GOOD_DATA), "non-negative integers"),
    "float dim": (_file(_with("a", shape=[2.0]), GOOD_DATA), "non-negative integers"),
    "bad offsets": (_file(_with("a", data_offsets=[0]), GOOD_DATA), "[begin, end]"),
    "offsets out of bounds": (_file(_with("b", data_offsets=[8, 13]), GOOD_DATA), "past the data buffer"),
    "begin after end": (_file(_with("b", data_offsets=[12, 8]), GOOD_DATA), "begin 12 > end 8"),
    "length mismatch": (_file(_with("b", shape=[2, 3]), GOOD_DATA), "needs 6"),
    "overlap": (_file(_with("b", data_offsets=[4, 8], shape=[4]), bytes(8)), "overlaps"),
    "gap": (_file(_with("b", data_offsets=[9, 13]), bytes(13)), "gap of 1 bytes"),
    "trailing garbage": (_file(GOOD_HEADER, GOOD_DATA + b"junk"), "4 trailing bytes"),
    "uncovered buffer": (_file({}, b"x"), "1 trailing bytes"),
    "bad metadata": (_file(dict(GOOD_HEADER, __metadata__={"k": 1}), GOOD_DATA), "__metadata__"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruption_is_refused(tmp_path, case):
    blob, problem = CORRUPTIONS[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    for reader in (load_safetensors, read_header):
        with pytest.raises(ExactSpecError) as err:
            reader(path)
        assert err.value.code == E_MODEL_LOAD
        assert str(path) in err.value.message
        assert problem in err.value.message, err.value.message


# Refused by us on purpose although the reference reader may accept them.
STRICTER_THAN_REFERENCE = {"unknown field", "duplicate tensor"}


@pytest.mark.parametrize("case", sorted(set(CORRUPTIONS) - STRICTER_THAN_REFERENCE))
def test_reference_reader_also_refuses(tmp_path, case):
    blob, _ = CORRUPTIONS[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(Exception):
        _reference().load_file(str(path))


def test_missing_file_is_refused(tmp_path):
    path = tmp_path / "nope.safetensors"
    with pytest.raises(ExactSpecError) as err:
        load_safetensors(path)
    assert err.value.code == E_MODEL_LOAD and str(path) in err.value.message


def test_zero_size_tensors_and_padding_are_accepted(tmp_path):
    header = {"z": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},
              "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}
    path = tmp_path / "z.safetensors"
    path.write_bytes(_file(header, b"\x07", pad=b"   "))
    tensors = load_safetensors(path)
    assert tensors["z"].shape == (0, 3) and tensors["z"].nbytes == 0
    assert bytes(tensors["a"].data) == b"\x07"


def test_writer_rejects_wrong_byte_length():
    with pytest.raises(ExactSpecError):
        serialize_safetensors({"w": ("F32", (2,), b"\0" * 7)})


SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "web", "models")


@pytest.mark.parametrize("rel", ["champion/model.safetensors", "champion/model.q8.safetensors",
                                 "draft/model.safetensors", "draft/model.q8.safetensors"])
def test_shipped_checkpoints_load_identically(rel):
    path = os.path.join(SHIPPED, rel)
    assert os.path.exists(path), f"missing {path}"
    ours, ref = load_safetensors(path), _reference().load_file(path)
    assert set(ours) == set(ref)
    for name, a in ref.items():
        assert ours[name].shape == a.shape
        assert bytes(ours[name].data) == a.tobytes()


# ---------------------------------------------------------------------------------------------
# Hostile files: refused (or inspected) without reading what they declare.
# ---------------------------------------------------------------------------------------------

GIB = 1 << 30
PEAK_BYTES = 4 << 20   # Python-side allocation bound for inspecting / refusing any file below


def _peak_of(fn):
    """(result or raised ExactSpecError, peak bytes traced by tracemalloc while fn ran)."""
    tracemalloc.start()
    try:
        try:
            out = fn()
        except ExactSpecError as err:
            out = err
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _sparse(path, blob: bytes, size: int):
    path.write_bytes(blob)
    os.truncate(path, size)   # a hole: no disk, no page cache, but read() would return zeros
    return path


def _assert_refused(out, path, problem):
    assert isinstance(out, ExactSpecError), out
    assert out.code == E_MODEL_LOAD and str(path) in out.message and problem in out.message, out.message


@pytest.mark.parametrize("reader", [load_safetensors, read_header])
def test_8_gib_sparse_tail_is_refused_from_the_header(tmp_path, reader):
    path = _sparse(tmp_path / "tail.safetensors", _file(GOOD_HEADER, GOOD_DATA), 8 * GIB)
    out, peak = _peak_of(lambda: reader(path))
    _assert_refused(out, path, "trailing bytes after the last tensor")
    assert peak < PEAK_BYTES, peak
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * GIB // 1024   # kB: never near 8 GiB


def _giant_header(n_bytes: int) -> dict:
    return {"model.embed_tokens.weight": {"dtype": "F32", "shape": [n_bytes // 4 // 256, 256],
                                          "data_offsets": [0, n_bytes]}}


def test_8_gib_declared_tensor_header_is_read_without_its_data(tmp_path):
    header = _giant_header(8 * GIB)
    blob = _file(header, b"")
    path = _sparse(tmp_path / "giant.safetensors", blob, len(blob) + 8 * GIB)
    out, peak = _peak_of(lambda: read_header(path))
    assert out[0] == header and peak < PEAK_BYTES, (out, peak)


def test_reference_loader_checks_the_header_against_the_config_before_reading(tmp_path):
    from exactspec.reference.reference_llama import LlamaReference
    blob = _file(_giant_header(8 * GIB), b"")
    _sparse(tmp_path / "model.safetensors", blob, len(blob) + 8 * GIB)
    (tmp_path / "config.json").write_bytes(open(os.path.join(SHIPPED, "champion", "config.json"), "rb").read())
    out, peak = _peak_of(lambda: LlamaReference.from_dir(tmp_path))
    _assert_refused(out, tmp_path / "model.safetensors", "model.embed_tokens.weight' has shape (8388608, 256)")
    assert peak < PEAK_BYTES, peak


def test_reads_are_exactly_the_header_then_exactly_the_data(tmp_path, monkeypatch):
    blob = _file(GOOD_HEADER, GOOD_DATA, pad=b"  ")
    good = tmp_path / "good.safetensors"
    good.write_bytes(blob)
    tail = _sparse(tmp_path / "tail.safetensors", blob, 1 << 20)
    requested = []

    def counting_open(path):
        f, size = open_regular(path)
        real_read = f.read
        f.read = lambda n=-1: (requested.append(n), real_read(n))[1]
        return f, size

    open_regular = st_module.open_regular_file
    monkeypatch.setattr(st_module, "open_regular_file", counting_open)
    header_end = len(blob) - len(GOOD_DATA)
    read_header(good)
    assert requested == [8, header_end - 8]
    requested.clear()
    load_safetensors(good)
    assert requested == [8, header_end - 8, len(GOOD_DATA)]
    requested.clear()
    with pytest.raises(ExactSpecError, match="trailing bytes"):
        load_safetensors(tail)
    assert requested == [8, header_end - 8]   # the 1 MiB tail is never asked for


def test_symlink_to_dev_zero_is_refused(tmp_path):
    link = tmp_path / "zero.safetensors"
    os.symlink("/dev/zero", link)
    for reader in (load_safetensors, read_header):
        out, peak = _peak_of(lambda: reader(link))
        _assert_refused(out, link, "is a character device, not a regular file")
        assert peak < PEAK_BYTES


def test_directory_is_refused(tmp_path):
    out, _ = _peak_of(lambda: load_safetensors(tmp_path))
    _assert_refused(out, tmp_path, "is a directory, not a regular file")


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_peak_of(lambda: load_safetensors(fifo))[0]),
                              daemon=True)
    worker.start()
    worker.join(timeout=30)   # a hang guard only: a correct reader returns at once
    if worker.is_alive():     # unblock the stuck open() so the thread can end, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("load_safetensors blocked on a FIFO")
    _assert_refused(outcome[0], fifo, "is a FIFO, not a regular file")


def test_file_shrinking_under_the_reader_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    path.write_bytes(_file(GOOD_HEADER, GOOD_DATA))
    real_open = st_module.open_regular_file

    def open_then_shrink(p):
        f, size = real_open(p)
        os.truncate(p, size - 4)   # another process cuts the file after it was measured
        return f, size

    monkeypatch.setattr(st_module, "open_regular_file", open_then_shrink)
    with pytest.raises(ExactSpecError) as err:
        load_safetensors(path)
    assert err.value.code == E_MODEL_LOAD and "ended after 8 of 12 expected bytes" in err.value.message
