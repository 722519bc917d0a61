"""GGUF tensor types to float32, vectorised NumPy (CPython): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K.

Each dequantiser takes whole blocks of raw bytes and performs the same float32 operations, in the
same order, as ggml's `dequantize_row_*` and the `gguf` package's `gguf.quants`, so the values are
identical bit for bit (tests/test_gguf_dequant.py checks each on random blocks). Block layouts
(bytes, little-endian; d, m, dmin are float16):
  Q8_0  32 values in 34 bytes: d, 32 x int8                          x = d * q
  Q4_0  32 values in 18 bytes: d, 16 bytes of nibbles                x = d * (q - 8)
  Q4_1  32 values in 20 bytes: d, m, 16 bytes of nibbles             x = d * q + m
  Q4_K 256 values in 144 bytes: d, dmin, 12 bytes of eight 6-bit (scale, min) pairs,
        128 bytes of nibbles                                         x = (d * sc) * q - dmin * mn
  Q6_K 256 values in 210 bytes: 128 bytes low nibbles, 64 bytes high 2-bit pairs,
        16 x int8 scales, d                                          x = (d * sc) * (q - 32)
Nibbles: byte j of a 32-value group holds value j in its low half and value j + 16 in its high
half (Q4_K and Q6_K: groups of 64 values over 32 bytes, low halves first).
"""
from __future__ import annotations

import numpy as np

F32 = np.float32


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """Column (n, 1) float32 of the float16 at byte `start` of each block."""
    return np.ascontiguousarray(blocks[:, start:start + 2]).view("<f2").astype(F32)


def _nibbles(packed: np.ndarray, group_bytes: int) -> np.ndarray:
    """(n, bytes) uint8 -> (n, groups, 2 * group_bytes) uint8: per group of group_bytes bytes,
    the low nibbles then the high nibbles."""
    n = packed.shape[0]
    g = packed.reshape(n, -1, group_bytes)
    return np.concatenate([g & 0x0F, g >> 4], axis=-1)


def q8_0(blocks: np.ndarray) -> np.ndarray:
    d = _half(blocks, 0)
    return blocks[:, 2:].view(np.int8).astype(F32) * d


def q4_0(blocks: np.ndarray) -> np.ndarray:
    d = _half(blocks, 0)
    q = _nibbles(blocks[:, 2:], 16).reshape(blocks.shape[0], 32).astype(np.int8) - np.int8(8)
    return d * q.astype(F32)


def q4_1(blocks: np.ndarray) -> np.ndarray:
    d, m = _half(blocks, 0), _half(blocks, 2)
    q = _nibbles(blocks[:, 4:], 16).reshape(blocks.shape[0], 32).astype(F32)
    return d * q + m


def q4_k_scales(packed: np.ndarray) -> tuple:
    """(n, 12) uint8 -> (scales, mins), each (n, 8) uint8 of 6 bits. Bytes 0-3 hold scales 0-3 in
    their low 6 bits, bytes 4-7 mins 0-3; bytes 8-11 hold the low 4 bits of scales 4-7 (low
    nibble) and mins 4-7 (high nibble), whose top 2 bits are the top bits of bytes 0-3 / 4-7."""
    lo, mid, hi = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return scales, mins


def q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _half(blocks, 0), _half(blocks, 2)
    sc, mn = q4_k_scales(blocks[:, 4:16])
    scale = (d * sc.astype(F32)).reshape(n, 8, 1)
    offset = (dmin * mn.astype(F32)).reshape(n, 8, 1)
    q = _nibbles(blocks[:, 16:], 32).reshape(n, 8, 32).astype(F32)
    return (scale * q - offset).reshape(n, 256)


def q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    low = _nibbles(blocks[:, :128], 64).reshape(n, 8, 32)                  # 4 low bits
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    high = (qh & 0x03).reshape(n, 8, 32)                                   # 2 high bits
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(F32)
    scale = _half(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(F32)
    return (scale.reshape(n, 16, 1) * q).reshape(n, 256)


_BLOCKWISE = {"Q8_0": (q8_0, 34), "Q4_0": (q4_0, 18), "Q4_1": (q4_1, 20), "Q4_K": (q4_k, 144), "Q6_K": (q6_k, 210)}


def dequantize(raw, type_name: str) -> np.ndarray:
    """Raw bytes of whole blocks -> flat float32 values."""
    if type_name == "F32":
        return np.frombuffer(raw, dtype="<f4")
    if type_name == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(F32)
    if type_name == "BF16":   # the top half of a float32: widen the bits, no rounding
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(F32)
    fn, block_bytes = _BLOCKWISE[type_name]
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, block_bytes)
    return fn(blocks).reshape(-1)
