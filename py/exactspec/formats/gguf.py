"""GGUF container reader: header, metadata and tensor table validated before any tensor byte is read.

Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata
count; the metadata key/value pairs (key: u64 length + UTF-8; value: u32 type + value; an array
is u32 element type + u64 count + elements); one record per tensor (name, u32 n_dims, u64 dims
innermost first, u32 ggml type, u64 offset); padding to `general.alignment` (default 32); then
the data section, where each tensor's offset points.

`GGUFFile(path)` parses everything up to the data section with the standard library only (it
runs in Pyodide), refusing a hostile file with `E_MODEL_LOAD: <file>: <field>: what is wrong`
before anything is sized from it: every count and length is checked against the bytes the file
still holds and against fixed limits, every value type and ggml type against the table, every
tensor against the data section (alignment, bounds, overlaps), and names and keys for
duplicates. Reading data (`read_rows_float32`, `read_float32`) needs NumPy: rows are read and
dequantised in blocks of at most ROW_BLOCK_BYTES, vectorised (gguf_dequant.py), and a row holding
inf or NaN is refused, naming the tensor and the row.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass

from .config import open_regular_file, read_exact
from ..core.errors import E_MODEL_LOAD, ExactSpecError

MAGIC = b"GGUF"
VERSIONS = (2, 3)                  # v1 used 32-bit counts and is long gone
DEFAULT_ALIGNMENT = 32
MAX_TENSORS = 1 << 16              # a 405B Llama has ~1,140 tensors
MAX_KV = 1 << 16                   # real files carry ~40 keys
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 1 << 24         # chat templates are tens of KB
MAX_ARRAY_LEN = 1 << 21            # vocabularies and merge lists: up to ~300k (config caps vocab at 2^20)
MAX_HEADER_BYTES = 1 << 26         # everything before the data section (Llama 3: ~8 MB)
MAX_NAME_BYTES = 256               # ggml's own limit is 64
MAX_DIMS = 4
MAX_ELEMENTS = 1 << 40
MAX_ALIGNMENT = 1 << 20
ROW_BLOCK_BYTES = 8 << 20          # raw bytes dequantised per step
_CHUNK = 1 << 20

# metadata value type -> (name, struct format or None for string/array)
VALUE_TYPES = {0: ("UINT8", "B"), 1: ("INT8", "b"), 2: ("UINT16", "H"), 3: ("INT16", "h"),
               4: ("UINT32", "I"), 5: ("INT32", "i"), 6: ("FLOAT32", "f"), 7: ("BOOL", "B"),
               8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", "Q"), 11: ("INT64", "q"),
               12: ("FLOAT64", "d")}
STRING, ARRAY, BOOL = 8, 9, 7

# ggml tensor type -> (name, elements per block, bytes per block): the types this reader dequantises
TENSOR_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
                8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2)}
# other ggml types, named in refusals
OTHER_TENSOR_TYPES = {6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 13: "Q5_K", 15: "Q8_K",
                      16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
                      22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
                      29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}


def refuse(path: str, field: str, problem: str) -> ExactSpecError:
    return ExactSpecError(E_MODEL_LOAD, f"{path}: {field}: {problem}", file=path, field=field)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str                 # a name of TENSOR_TYPES, e.g. "Q4_1"
    dims: tuple                    # GGUF order, innermost first: (columns, rows, ...)
    offset: int                    # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple:
        """NumPy / Hugging Face order: outermost first, (rows, columns) for a matrix."""
        return tuple(reversed(self.dims))

    @property
    def rows(self) -> int:
        return math.prod(self.dims[1:])

    @property
    def row_bytes(self) -> int:
        _, block, block_bytes = _TYPE_BY_NAME[self.type_name]
        return self.dims[0] // block * block_bytes


_TYPE_BY_NAME = {name: (code, block, size) for code, (name, block, size) in TENSOR_TYPES.items()}


class _Cursor:
    """Sequential reads of the region before the data section, each checked against the bytes
    the file holds and MAX_HEADER_BYTES before anything is read or allocated."""

    def __init__(self, f, size: int, path: str, readable: int | None = None):
        self.f, self.size, self.path = f, size, path
        self.readable = size if readable is None else readable   # bytes f holds (a header-only copy: fewer)
        self.pos = 0                       # file offset of the next byte
        self._buf, self._i = b"", 0

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, field: str) -> bytes:
        if n > self.remaining():
            raise refuse(self.path, field, f"needs {n} bytes at offset {self.pos}, but the file ends at {self.size}")
        if self.pos + n > MAX_HEADER_BYTES:
            raise refuse(self.path, field, f"runs past {MAX_HEADER_BYTES} bytes of header and metadata")
        avail = len(self._buf) - self._i
        if avail < n:
            want = min(max(n - avail, _CHUNK), max(self.readable - self.pos - avail, n - avail))
            self._buf = self._buf[self._i:] + read_exact(self.f, want, self.path)
            self._i = 0
        out = self._buf[self._i:self._i + n]
        self._i += n
        self.pos += n
        return out

    def unpack(self, fmt: str, field: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), field))[0]

    def string(self, field: str, limit: int = MAX_STRING_BYTES) -> str:
        n = self.unpack("Q", field)
        if n > limit:
            raise refuse(self.path, field, f"string of {n} bytes is over the {limit}-byte limit")
        raw = self.take(n, field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise refuse(self.path, field, f"string is not UTF-8 ({e.reason} at byte {e.start})") from None


def _value(cur: _Cursor, vtype: int, field: str) -> tuple:
    """(value, type name): "UINT32", "STRING", "ARRAY[STRING]", ..."""
    if vtype not in VALUE_TYPES:
        raise refuse(cur.path, field, f"value type {vtype} is not a GGUF type (0..12)")
    if vtype == STRING:
        return cur.string(field), "STRING"
    if vtype == ARRAY:
        etype = cur.unpack("I", field)
        count = cur.unpack("Q", field)
        if etype == ARRAY:
            raise refuse(cur.path, field, "arrays of arrays are not supported")
        if etype not in VALUE_TYPES:
            raise refuse(cur.path, field, f"array element type {etype} is not a GGUF type (0..12)")
        if count > MAX_ARRAY_LEN:
            raise refuse(cur.path, field, f"array of {count} elements is over the limit of {MAX_ARRAY_LEN}")
        if etype == STRING:
            if count * 8 > cur.remaining():   # each string takes at least its 8-byte length
                raise refuse(cur.path, field, f"array of {count} strings cannot fit in the {cur.remaining()} "
                             "bytes left in the file")
            return [cur.string(f"{field}[{i}]") for i in range(count)], "ARRAY[STRING]"
        fmt = VALUE_TYPES[etype][1]
        values = list(struct.unpack(f"<{count}{fmt}", cur.take(count * struct.calcsize(fmt), field)))
        if etype == BOOL:
            if any(v > 1 for v in values):
                raise refuse(cur.path, field, "a bool array element is neither 0 nor 1")
            values = [bool(v) for v in values]
        return values, f"ARRAY[{VALUE_TYPES[etype][0]}]"
    value = cur.unpack(VALUE_TYPES[vtype][1], field)
    if vtype == BOOL:
        if value > 1:
            raise refuse(cur.path, field, f"bool byte is {value}, neither 0 nor 1")
        value = bool(value)
    return value, VALUE_TYPES[vtype][0]


class GGUFFile:
    """An open GGUF file: `metadata` (key -> value), `value_types` (key -> value type name),
    `tensors` (name -> TensorInfo, file order), `version`, `alignment`, `data_offset`.
    Nothing but the header, metadata and tensor table is read at construction."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._f, self.size = open_regular_file(self.path)
        try:
            self._parse()
        except BaseException:
            self._f.close()
            raise

    @classmethod
    def from_header(cls, prefix: bytes, size: int, path: str) -> "GGUFFile":
        """The header, metadata and tensor table of a file of `size` bytes from its first bytes
        (the browser hands over only those, up to the data section): every check of a whole
        file, judged against `size`; no tensor data can be read from it."""
        import io
        self = cls.__new__(cls)
        self.path, self.size = path, size
        self._f = io.BytesIO(prefix)
        self._parse(readable=len(prefix))
        return self

    def _parse(self, readable: int | None = None) -> None:
        path = self.path
        cur = _Cursor(self._f, self.size, path, readable)
        if cur.take(min(4, self.size), "magic") != MAGIC:
            raise refuse(path, "magic", "the file does not start with 'GGUF' (not a GGUF file)")
        self.version = cur.unpack("I", "version")
        if self.version not in VERSIONS:
            hint = " (a big-endian file?)" if self.version >= 1 << 16 else ""
            raise refuse(path, "version", f"version {self.version} is not supported (supported: 2, 3){hint}")
        n_tensors = cur.unpack("Q", "tensor_count")
        n_kv = cur.unpack("Q", "kv_count")
        if n_tensors > MAX_TENSORS:
            raise refuse(path, "tensor_count", f"{n_tensors} tensors is over the limit of {MAX_TENSORS}")
        if n_kv > MAX_KV:
            raise refuse(path, "kv_count", f"{n_kv} metadata entries is over the limit of {MAX_KV}")
        self.metadata, self.value_types = {}, {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}", MAX_KEY_BYTES)
            if not key:
                raise refuse(path, f"metadata key #{i}", "is empty")
            if key in self.metadata:
                raise refuse(path, f"metadata[{key[:80]!r}]", "the key appears twice")
            vtype = cur.unpack("I", f"metadata[{key[:80]!r}]")
            self.metadata[key], self.value_types[key] = _value(cur, vtype, f"metadata[{key[:80]!r}]")
        self.alignment = self._alignment()
        records = [self._tensor_record(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors = {}
        for name, dims, type_name, rel_offset, nbytes in records:
            if name in self.tensors:
                raise refuse(self.path, f"tensor {name!r}", "the name appears twice in the tensor table")
            self.tensors[name] = TensorInfo(name, type_name, dims, self.data_offset + rel_offset, nbytes)
        self._check_layout()

    def _alignment(self) -> int:
        value = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        field = "metadata['general.alignment']"
        if "general.alignment" in self.metadata and self.value_types["general.alignment"] != "UINT32":
            raise refuse(self.path, field, f"must be a UINT32, not {self.value_types['general.alignment']}")
        if not 1 <= value <= MAX_ALIGNMENT or value & (value - 1):
            raise refuse(self.path, field, f"{value} is not a power of two in [1, {MAX_ALIGNMENT}]")
        return value

    def _tensor_record(self, cur: _Cursor, i: int) -> tuple:
        path = self.path
        name = cur.string(f"tensor #{i} name", MAX_NAME_BYTES)
        field = f"tensor {name!r}"
        if not name:
            raise refuse(path, f"tensor #{i} name", "is empty")
        n_dims = cur.unpack("I", field)
        if not 1 <= n_dims <= MAX_DIMS:
            raise refuse(path, field, f"n_dims {n_dims} is outside [1, {MAX_DIMS}]")
        dims = tuple(cur.unpack("Q", field) for _ in range(n_dims))
        if any(d < 1 for d in dims):
            raise refuse(path, field, f"dims {list(dims)} has a zero dimension")
        count = math.prod(dims)
        if count > MAX_ELEMENTS:
            raise refuse(path, field, f"dims {list(dims)} hold {count} elements, over the limit of {MAX_ELEMENTS}")
        code = cur.unpack("I", field)
        if code not in TENSOR_TYPES:
            known = OTHER_TENSOR_TYPES.get(code)
            what = f"ggml type {code}" + (f" ({known})" if known else "")
            raise refuse(path, field, f"{what} is not supported (supported: "
                         f"{', '.join(n for n, _, _ in TENSOR_TYPES.values())})")
        type_name, block, block_bytes = TENSOR_TYPES[code]
        if dims[0] % block:
            raise refuse(path, field, f"{type_name} needs the first dimension to be a multiple of {block}, "
                         f"got {dims[0]}")
        offset = cur.unpack("Q", field)
        return name, dims, type_name, offset, count // block * block_bytes

    def _check_layout(self) -> None:
        """Offsets aligned, every tensor inside the data section, no two overlapping."""
        path = self.path
        data_size = self.size - self.data_offset
        for t in self.tensors.values():
            rel = t.offset - self.data_offset
            if rel % self.alignment:
                raise refuse(path, f"tensor {t.name!r}", f"offset {rel} is not a multiple of the alignment "
                             f"{self.alignment}")
            if rel + t.nbytes > data_size:
                raise refuse(path, f"tensor {t.name!r}", f"bytes [{rel}, {rel + t.nbytes}) of the data section "
                             f"run past its end ({max(data_size, 0)} bytes: the file is truncated?)")
        ordered = sorted(self.tensors.values(), key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):
            if a.offset + a.nbytes > b.offset:
                raise refuse(path, f"tensor {b.name!r}", f"overlaps tensor {a.name!r} in the data section")

    # -- data (NumPy) -------------------------------------------------------------------------

    def read_raw(self, name: str, row_begin: int, row_end: int) -> bytes:
        t = self.tensors[name]
        if not 0 <= row_begin <= row_end <= t.rows:
            raise refuse(self.path, f"tensor {name!r}", f"rows [{row_begin}, {row_end}) outside [0, {t.rows})")
        self._f.seek(t.offset + row_begin * t.row_bytes)
        return read_exact(self._f, (row_end - row_begin) * t.row_bytes, self.path)

    def read_rows_float32(self, name: str, row_begin: int, row_end: int):
        """Rows [row_begin, row_end) of a tensor viewed as (rows, dims[0]), float32, dequantised
        ROW_BLOCK_BYTES of raw data at a time into one output array."""
        import numpy as np
        from ..reference.gguf_dequant import dequantize
        t = self.tensors[name]
        out = np.empty((row_end - row_begin, t.dims[0]), dtype=np.float32)
        step = max(1, ROW_BLOCK_BYTES // t.row_bytes)
        for start in range(row_begin, row_end, step):
            stop = min(start + step, row_end)
            with np.errstate(invalid="ignore", over="ignore"):   # refused below, by row
                rows = dequantize(self.read_raw(name, start, stop), t.type_name).reshape(stop - start, t.dims[0])
            finite = np.isfinite(rows).all(axis=1)
            if not finite.all():
                bad = start + int(np.argmin(finite))
                raise refuse(self.path, f"tensor {name!r}", f"row {bad} holds a value that is inf or NaN")
            out[start - row_begin:stop - row_begin] = rows
        return out

    def read_float32(self, name: str):
        """The whole tensor as float32, in NumPy order (its `shape`)."""
        t = self.tensors[name]
        return self.read_rows_float32(name, 0, t.rows).reshape(t.shape)

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
