"""safetensors reader and writer in pure Python (standard library only; runs in Pyodide).

Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON (an object: tensor name ->
{dtype, shape, data_offsets}, plus an optional "__metadata__" string map), then the data
buffer. Offsets are relative to the buffer. The reader refuses, with E_MODEL_LOAD naming the
file and the problem, everything the format forbids: a short file, an absurd header length,
a header that is not a UTF-8 JSON object, a malformed entry, an unknown dtype, offsets out of
bounds or reversed, a byte length that disagrees with the shape, and overlaps, gaps or
trailing bytes (the tensors must tile the data buffer exactly). Only regular files are opened
(a FIFO or device is refused without blocking); the 8-byte length and the header are read and
checked against the file size before a single tensor byte is read.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

from .config import open_regular_file, read_exact
from ..core.errors import E_BAD_ARGUMENT, E_MODEL_LOAD, ExactSpecError

MAX_HEADER_BYTES = 100_000_000          # the limit the reference implementation enforces

# dtype -> (bytes per element, struct format or None when struct has no such type)
DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (1, "?"), "U8": (1, "B"), "I8": (1, "b"),
    "F8_E4M3": (1, None), "F8_E5M2": (1, None), "F8_E8M0": (1, None),
    "I16": (2, "h"), "U16": (2, "H"), "F16": (2, "e"), "BF16": (2, None),
    "I32": (4, "i"), "U32": (4, "I"), "F32": (4, "f"),
    "I64": (8, "q"), "U64": (8, "Q"), "F64": (8, "d"), "C64": (8, None),
}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str                 # a key of DTYPES, e.g. "F32"
    shape: tuple[int, ...]
    data: memoryview           # exactly prod(shape) * itemsize bytes, little-endian

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def _fail(path, problem: str):
    raise ExactSpecError(E_MODEL_LOAD, f"safetensors file {path}: {problem}", path=str(path))


def _no_duplicate_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def header_length(prefix, file_size: int, path="<bytes>") -> int:
    """N from the first 8 bytes, refused unless 8 + N fits the file and N <= MAX_HEADER_BYTES."""
    if file_size < 8 or len(prefix) < 8:
        _fail(path, f"file is {file_size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", prefix, 0)
    if n > MAX_HEADER_BYTES:
        _fail(path, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > file_size:
        _fail(path, f"header length {n} exceeds the file size {file_size} - 8")
    return n


def parse_header_json(raw, data_len: int, path="<bytes>") -> tuple[dict, dict]:
    """Validate the N header bytes against a data buffer of data_len bytes. Returns
    (entries, metadata); entries maps name -> (dtype, shape, begin, end), offsets relative to
    the data buffer, and the entries tile [0, data_len) exactly."""
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(path, f"header is not UTF-8 ({e.reason} at byte {e.start})")
    if not text.startswith("{"):
        _fail(path, "header does not start with '{' (not a JSON object)")
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except RecursionError:   # nesting deeper than the interpreter's recursion limit
        _fail(path, "header JSON nests too deep")
    except ValueError as e:
        _fail(path, f"header is not valid JSON ({e})")
    if not isinstance(header, dict):
        _fail(path, "header is not a JSON object")

    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        _fail(path, "__metadata__ is not an object of string values")

    entries = {}
    for name, info in header.items():
        where = f"tensor {name!r}"
        if not isinstance(info, dict):
            _fail(path, f"{where} entry is not an object")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in info:
                _fail(path, f"{where} is missing {key}")
        extra = sorted(set(info) - {"dtype", "shape", "data_offsets"})
        if extra:
            _fail(path, f"{where} has unknown fields {extra}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            _fail(path, f"{where} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            _fail(path, f"{where} shape {shape!r} is not a list of non-negative integers")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets):
            _fail(path, f"{where} data_offsets {offsets!r} is not [begin, end] of non-negative integers")
        begin, end = offsets
        if begin > end:
            _fail(path, f"{where} data_offsets begin {begin} > end {end}")
        if end > data_len:
            _fail(path, f"{where} data_offsets end {end} is past the data buffer ({data_len} bytes)")
        want = math.prod(shape) * DTYPES[dtype][0]
        if end - begin != want:
            _fail(path, f"{where} has {end - begin} bytes but shape {shape} of {dtype} needs {want}")
        entries[name] = (dtype, tuple(shape), begin, end)

    # The tensors must tile the data buffer: sorted by offset, each starts where the last ended.
    cursor = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin < cursor:
            _fail(path, f"tensor {name!r} at [{begin}, {end}) overlaps the previous tensor (ends at {cursor})")
        if begin > cursor:
            _fail(path, f"gap of {begin - cursor} bytes in the data buffer before tensor {name!r} at {begin}")
        cursor = end
    if cursor != data_len:
        _fail(path, f"{data_len - cursor} trailing bytes after the last tensor (data buffer {data_len}, covered {cursor})")
    return entries, metadata


def parse_header(buf, path="<bytes>") -> tuple[dict, dict, int]:
    """Validate a whole file image. Returns (entries, metadata, data_start) as parse_header_json."""
    n = header_length(buf[:8], len(buf), path)
    entries, metadata = parse_header_json(buf[8:8 + n], len(buf) - 8 - n, path)
    return entries, metadata, 8 + n


def _read_validated_header(f, size: int, path) -> tuple[dict, dict, int]:
    """Read only the 8 + N header bytes of an open file and validate them against its size."""
    n = header_length(read_exact(f, min(size, 8), path), size, path)
    entries, metadata = parse_header_json(read_exact(f, n, path), size - 8 - n, path)
    return entries, metadata, 8 + n


def read_header(path) -> tuple[dict, dict]:
    """(entries, metadata) of a validated file; entries: name -> {dtype, shape, data_offsets}.
    Reads the 8 + N header bytes only, never the tensor data."""
    f, size = open_regular_file(path)
    with f:
        entries, metadata, _ = _read_validated_header(f, size, path)
    return ({k: {"dtype": d, "shape": list(s), "data_offsets": [b, e]} for k, (d, s, b, e) in entries.items()},
            metadata)


def load_safetensors(path, with_metadata: bool = False):
    """name -> Tensor (data views one in-memory copy of the data buffer). With
    with_metadata=True, returns (tensors, metadata). The header is validated against the file
    size first; then exactly the declared data buffer is read, nothing past it."""
    f, size = open_regular_file(path)
    with f:
        entries, metadata, start = _read_validated_header(f, size, path)
        view = memoryview(read_exact(f, size - start, path))
    tensors = {name: Tensor(name, dtype, shape, view[b:e]) for name, (dtype, shape, b, e) in entries.items()}
    return (tensors, metadata) if with_metadata else tensors


class SafetensorsReader:
    """One safetensors file read tensor by tensor: the header is validated against the file size
    at open (as read_header), then read(name) reads exactly that tensor's bytes (or a range of
    its rows), so holding a checkpoint costs one tensor at a time, never the whole file."""

    def __init__(self, path):
        self.path = path
        self._file, size = open_regular_file(path)
        try:
            self.entries, self.metadata, self._data_start = _read_validated_header(self._file, size, path)
        except BaseException:
            self._file.close()
            raise

    def header(self) -> dict:
        """name -> {dtype, shape}, as _check_header-style consumers want it."""
        return {k: {"dtype": d, "shape": list(s)} for k, (d, s, _, _) in self.entries.items()}

    def read(self, name: str, row_begin: int = 0, row_end: int | None = None) -> bytes:
        """The bytes of tensor `name`, or of rows [row_begin, row_end) of its first axis."""
        dtype, shape, begin, end = self.entries[name]
        if row_end is not None or row_begin:
            rows = shape[0] if shape else 1
            row_end = rows if row_end is None else row_end
            if not 0 <= row_begin <= row_end <= rows:
                raise ExactSpecError(E_BAD_ARGUMENT, f"rows [{row_begin}, {row_end}) outside tensor {name!r} of {rows} rows")
            row_bytes = (end - begin) // rows if rows else 0
            begin, end = begin + row_begin * row_bytes, begin + row_end * row_bytes
        self._file.seek(self._data_start + begin)
        return read_exact(self._file, end - begin, self.path)

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------
# Values (pure Python) and NumPy views (tests, tools; numpy imported lazily)
# ---------------------------------------------------------------------------------------------


def tensor_values(t: Tensor) -> list:
    """Flat list of Python values, row-major. BF16 widens to float exactly."""
    size, fmt = DTYPES[t.dtype]
    if t.dtype == "BF16":
        halves = struct.unpack(f"<{t.numel}H", t.data)
        return list(struct.unpack(f"<{t.numel}f", struct.pack(f"<{t.numel}I", *(h << 16 for h in halves))))
    if fmt is None:
        raise ExactSpecError(E_BAD_ARGUMENT, f"no pure-Python decoding for dtype {t.dtype}")
    return list(struct.unpack(f"<{t.numel}{fmt}", t.data))


_NUMPY_DTYPES = {"BOOL": "bool", "U8": "<u1", "I8": "<i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
                 "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8", "U64": "<u8", "F64": "<f8",
                 "C64": "<c8"}


def to_numpy(t: Tensor):
    """A NumPy array of the tensor (BF16 widened to float32; F8 types as raw uint8)."""
    import numpy as np
    if t.dtype == "BF16":
        bits = np.frombuffer(t.data, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(t.shape)
    dt = _NUMPY_DTYPES.get(t.dtype, "<u1")
    return np.frombuffer(t.data, dtype=dt).reshape(t.shape)


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def safetensors_layout(specs: dict, metadata: dict | None = None) -> tuple[bytes, list]:
    """The 8 + N header bytes and the data order for tensors specs: name -> (dtype, shape).
    Data is laid out by descending element size, then name (the reference layout), so every
    tensor starts aligned to its element size; the header is space-padded to a multiple of 8
    bytes; metadata keys are written in the order given. Returns (prefix, [(name, dtype, shape,
    nbytes), ...] in data order)."""
    order = []
    for name, (dtype, shape) in specs.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ExactSpecError(E_BAD_ARGUMENT, f"bad tensor name {name!r}")
        if dtype not in DTYPES:
            raise ExactSpecError(E_BAD_ARGUMENT, f"tensor {name!r} has unknown dtype {dtype!r}")
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ExactSpecError(E_BAD_ARGUMENT, f"tensor {name!r} has a negative dimension {shape}")
        order.append((name, dtype, shape, math.prod(shape) * DTYPES[dtype][0]))
    order.sort(key=lambda x: (-DTYPES[x[1]][0], x[0]))
    header: dict = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ExactSpecError(E_BAD_ARGUMENT, "metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype, shape, nbytes in order:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, order


def serialize_safetensors(tensors: dict, metadata: dict | None = None) -> bytes:
    """tensors: name -> (dtype, shape, bytes), laid out as safetensors_layout."""
    specs, blobs = {}, {}
    for name, value in tensors.items():
        try:
            dtype, shape, data = value
        except (TypeError, ValueError):
            raise ExactSpecError(E_BAD_ARGUMENT, f"tensor {name!r} must be (dtype, shape, bytes)") from None
        specs[name], blobs[name] = (dtype, shape), bytes(data)
    prefix, order = safetensors_layout(specs, metadata)
    for name, dtype, shape, nbytes in order:
        if len(blobs[name]) != nbytes:
            raise ExactSpecError(E_BAD_ARGUMENT, f"tensor {name!r} has {len(blobs[name])} bytes, shape {shape} of {dtype} needs {nbytes}")
    return b"".join([prefix] + [blobs[name] for name, _, _, _ in order])


def write_safetensors(path, tensors: dict, metadata: dict | None = None) -> None:
    """serialize_safetensors to `path`, through a fresh file renamed over it (never through a link)."""
    from ..host.safe_files import write_file
    write_file(path, serialize_safetensors(tensors, metadata))
