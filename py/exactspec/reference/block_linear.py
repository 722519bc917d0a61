"""One quantised linear held in its blocks, computed with the q8act-v1 function (docs/quant_kernels.md).

The CPython reference's `matmul="q8act"` (reference_llama.LlamaReference) keeps every quantised
linear as a `BlockLinear`: the raw bytes as the file stores them (a row is `cols / 32` blocks, or
`cols / 256` for the K-quants; ROWQ8: `cols` int8 and a float32 row scale), never dequantised.
`matmul(x)` rounds the float64 activations to float32 (what the browser kernels hold) and calls
the NumPy twin `exactspec.twins.qmatmul_twins.qmatmul`, so the product is the declared function
bit for bit; `rows_float32(ids)` is the embedding gather (the twin's `dequantize_rows`, section 4).
Refusals (`E_MODEL_LOAD`, naming the tensor and the file): an unknown format, `cols` not a
multiple of the block, a byte count that is not `rows * row_bytes`, a non-finite f16 scale.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import E_MODEL_LOAD, ExactSpecError
from ..twins import qmatmul_twins as twin

BLOCK_FORMATS = ("ROWQ8", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")

# Byte offsets of each block's float16 scales (d, m, dmin), checked finite at load.
_F16_SCALE_OFFSETS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q6_K": (208,)}


def _refuse(source: str, name: str, problem: str) -> ExactSpecError:
    return ExactSpecError(E_MODEL_LOAD, f"{source}: tensor {name!r}: {problem}", tensor=name, file=source)


class BlockLinear:
    """A (rows, cols) linear in format `fmt` (a BLOCK_FORMATS name); see the module docstring."""

    def __init__(self, fmt: str, raw, rows: int, cols: int, row_scale=None, *, name: str = "", source: str = ""):
        if fmt not in BLOCK_FORMATS:
            raise _refuse(source, name, f"format {fmt!r} is not one q8act computes ({', '.join(BLOCK_FORMATS)})")
        block = twin.block_elems(fmt)
        if cols % block:
            raise _refuse(source, name, f"{cols} columns are not a multiple of the {fmt} block ({block}): "
                          "q8act-v1 quantises activations in blocks of 32")
        row_bytes = twin.row_bytes(fmt, cols)
        data = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
        if data.size != rows * row_bytes:
            raise _refuse(source, name, f"holds {data.size} bytes, {rows} rows of {fmt} need {rows * row_bytes}")
        blocks = data.reshape(rows * cols // block, -1)
        for at in _F16_SCALE_OFFSETS.get(fmt, ()):
            halves = np.ascontiguousarray(blocks[:, at:at + 2]).view("<f2")
            if not np.isfinite(halves).all():
                raise _refuse(source, name, f"block {int(np.argmin(np.isfinite(halves)))} has a non-finite "
                              "float16 scale")
        if fmt == "ROWQ8":
            row_scale = np.asarray(row_scale, dtype=np.float32)
            if row_scale.shape != (rows,):
                raise _refuse(source, name, f"row scale of shape {row_scale.shape}, expected ({rows},)")
        elif row_scale is not None:
            raise _refuse(source, name, f"{fmt} carries its scales in its blocks, not a row scale")
        self.fmt, self.rows, self.cols, self.row_bytes = fmt, int(rows), int(cols), row_bytes
        self.raw = data.reshape(rows, row_bytes)
        self.row_scale = row_scale

    @property
    def shape(self) -> tuple:
        return (self.rows, self.cols)

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """(n, cols) activations (float64 or float32) -> (n, rows) float64 holding float32 values:
        q8act-v1 on the float32 rounding of x."""
        x32 = np.ascontiguousarray(np.asarray(x).astype(np.float32))
        return twin.qmatmul(self.fmt, self.raw, x32, self.rows, self.cols, row_scale=self.row_scale).astype(np.float64)

    def rows_float32(self, ids) -> np.ndarray:
        """(len(ids), cols) float32: rows `ids` dequantised by the element formula (the embedding gather)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        scale = None if self.row_scale is None else self.row_scale[ids]
        return twin.dequantize_rows(self.fmt, np.ascontiguousarray(self.raw[ids]), ids.size, self.cols, row_scale=scale)

    def permuted_rows(self, order) -> "BlockLinear":
        """The same linear with its rows reordered (row i of the result is row order[i]): a row's
        blocks move whole, so its products are unchanged (llama.cpp's q/k RoPE order undone)."""
        order = np.asarray(order, dtype=np.int64)
        scale = None if self.row_scale is None else self.row_scale[order]
        out = object.__new__(BlockLinear)
        out.fmt, out.rows, out.cols, out.row_bytes = self.fmt, self.rows, self.cols, self.row_bytes
        out.raw, out.row_scale = np.ascontiguousarray(self.raw[order]), scale
        return out
