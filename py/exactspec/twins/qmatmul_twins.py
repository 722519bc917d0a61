"""NumPy twin of the q8act-v1 matmul (docs/quant_kernels.md): every format of the C kernel, bit for bit.

The function of the WASM kernel (wasm/qmatmul.c, test hook `champion_qmatmul`), the WGSL kernels and
the CPython reference (`LlamaReference(..., matmul="q8act")`), written operation by operation in
float32 NumPy (one rounding per operation, no fused multiply-add), vectorised over rows and positions
and sequential over blocks, so its results are the declared bits:

- ROWQ8 and the GGUF block formats (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K): activations quantised per block of
  32 with table scales (section 1), integer block sums (exact), one float term per block added
  in block order (section 3);
- F32 and I8F: the float matmul of docs/champion_wasm.md ("q8 arithmetic", "Batch invariance"): one
  f32x4 accumulator per element over the input in steps of 4, then (l0 + l2) + (l1 + l3), then
  * scale.

Also: the embedding gather's element formula (`dequantize_rows`, section 4), random valid blocks for
tests (`random_blocks`) and round-to-nearest encoders (`quantize_weights`; Q8_0 / Q4_0 / Q4_1 are
llama.cpp's reference quantisers bit for bit, Q4_K / Q6_K plain round-to-nearest without llama.cpp's
scale search). Raw blocks are GGUF's bytes (py/exactspec/reference/gguf_dequant.py has the layouts).
"""
from __future__ import annotations

import numpy as np

from ..reference.gguf_dequant import _nibbles, q4_k_scales

F32 = np.float32
FORMATS = {"F32": 0, "ROWQ8": 100, "I8F": 101, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
_NAMES = {code: name for name, code in FORMATS.items()}
GGUF_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q4_K": 144, "Q6_K": 210}
Q8ACT = ("ROWQ8", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")      # the formats whose matmul is q8act
ZERO_BLOCK_AMAX = np.ldexp(F32(1), -100)                      # amax below this: a zero block


def format_name(fmt) -> str:
    """A format's name from its name or its code (FORMATS)."""
    if isinstance(fmt, str) and fmt in FORMATS:
        return fmt
    if not isinstance(fmt, str) and int(fmt) in _NAMES:
        return _NAMES[int(fmt)]
    raise ValueError(f"unknown format {fmt!r}")


def block_elems(fmt) -> int:
    """Elements per block: 256 for the K-quants, 32 otherwise (F32 / I8F: the q8act block)."""
    return 256 if format_name(fmt) in ("Q4_K", "Q6_K") else 32


def row_bytes(fmt, cols: int) -> int:
    """Bytes of one weight row of `cols` elements (row scales of ROWQ8 / I8F / F32 not counted)."""
    name = format_name(fmt)
    if name == "F32":
        return 4 * cols
    if name in ("ROWQ8", "I8F"):
        return cols
    if cols % block_elems(name):
        raise ValueError(f"{name}: cols {cols} is not a multiple of {block_elems(name)}")
    return cols // block_elems(name) * GGUF_BLOCK_BYTES[name]


def _check_cols(name: str, cols: int) -> None:
    need = 4 if name in ("F32", "I8F") else block_elems(name)
    if cols <= 0 or cols % need:
        raise ValueError(f"{name}: cols {cols} is not a positive multiple of {need}")


# ----------------------------------------------------------------------------- 1. activations
# the activation scale tables (section 1): j = the top 6 mantissa bits of a block's amax
ACT_SCALE = np.array([np.float32(8128.0 / (65 + j)) for j in range(64)], dtype=F32)     # 127 * 64 / (65 + j)
ACT_STEP = np.array([np.float32(1.0 / float(ACT_SCALE[j])) for j in range(64)], dtype=F32)
HUGE_BLOCK_AMAX = F32(2.0 ** 100)             # a block with amax at or above: dx NaN (the row becomes NaN)


def quantize_activations(x):
    """x (n, K) float32 -> qx int8 (n, K), dx float32 (n, K/32), xsum int32 (n, K/32) (section 1).

    A block with a non-finite element or amax >= 2^100: dx NaN, qx 0; amax < 2^-100: dx 0, qx 0;
    else, with amax = 2^E (1 + f) and j = the top 6 bits of f: s = 2^-E ACT_SCALE[j] (exact),
    qx = nearest_even(f32(x s)) (|qx| <= 127), dx = 2^E ACT_STEP[j] (exact)."""
    x = np.asarray(x, dtype=F32)
    n, K = x.shape
    if K % 32:
        raise ValueError(f"K {K} is not a multiple of 32")
    xb = x.reshape(n, K // 32, 32)
    amax = np.max(np.abs(xb), axis=-1)                        # NaN propagates: not finite
    finite = np.isfinite(amax) & (amax < HUGE_BLOCK_AMAX)
    normal = finite & (amax >= ZERO_BLOCK_AMAX)
    bits = np.where(normal, amax, F32(1)).astype(F32).view(np.uint32)
    E = (bits >> 23).astype(np.int32) - 127                   # floor(log2(amax)), exact
    j = ((bits >> 17) & 63).astype(np.int64)
    s = np.ldexp(ACT_SCALE[j], -E).astype(F32)                # exact: a power-of-two scaling
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = (xb * s[..., None]).astype(F32)              # one rounding
    qx = np.where(normal[..., None], np.rint(np.where(normal[..., None], scaled, F32(0))), F32(0)).astype(np.int8)
    dx = np.where(normal, np.ldexp(ACT_STEP[j], E).astype(F32), np.where(finite, F32(0), F32(np.nan))).astype(F32)
    xsum = qx.astype(np.int32).sum(axis=-1, dtype=np.int32)
    return qx.reshape(n, K), dx, xsum


# ----------------------------------------------------------------------------- 2. weight blocks
def _blocks(raw, rows: int, cols: int, name: str) -> np.ndarray:
    data = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, (bytes, bytearray, memoryview)) \
        else np.asarray(raw, dtype=np.uint8).reshape(-1)
    need = rows * row_bytes(name, cols)
    if data.size != need:
        raise ValueError(f"{name}: {data.size} bytes for ({rows}, {cols}), need {need}")
    return data


def _half(b: np.ndarray, start: int) -> np.ndarray:
    """(N, bytes) uint8 -> (N,) float32 of the float16 at byte `start` (exact)."""
    return np.ascontiguousarray(b[:, start:start + 2]).view("<f2").astype(F32).reshape(-1)


def decode_blocks(fmt, raw, rows: int, cols: int):
    """Raw weights -> (q int32 (rows, K), dw f32 (rows, K/32), mw f32 (rows, K/32) or None,
    sub int32 (rows, K/16) for Q6_K (the int8 sub-block scales) else None), section 2's columns.
    ROWQ8 / I8F: q the int8 values, dw 1 (the row scale is applied by the caller)."""
    name = format_name(fmt)
    if name == "F32":
        raise ValueError("F32 has no blocks")
    _check_cols(name, cols)
    data = _blocks(raw, rows, cols, name)
    K, nb = cols, cols // 32
    if name in ("ROWQ8", "I8F"):
        q = data.view(np.int8).reshape(rows, K).astype(np.int32)
        return q, np.ones((rows, nb), F32), None, None
    b = data.reshape(-1, GGUF_BLOCK_BYTES[name])                  # (rows * blocks per row, block bytes)
    N = b.shape[0]
    if name == "Q8_0":
        return (b[:, 2:].view(np.int8).astype(np.int32).reshape(rows, K), _half(b, 0).reshape(rows, nb), None, None)
    if name in ("Q4_0", "Q4_1"):
        off = 2 if name == "Q4_0" else 4
        q = _nibbles(b[:, off:], 16).reshape(N, 32).astype(np.int32)
        if name == "Q4_0":
            return (q - 8).reshape(rows, K), _half(b, 0).reshape(rows, nb), None, None
        return q.reshape(rows, K), _half(b, 0).reshape(rows, nb), _half(b, 2).reshape(rows, nb), None
    if name == "Q4_K":
        d, dmin = _half(b, 0), _half(b, 2)
        sc, mn = q4_k_scales(b[:, 4:16])                      # (N, 8) each, 6 bits
        dw = d[:, None] * sc.astype(F32)                      # exact: 11 x 6 significant bits
        mw = -(dmin[:, None] * mn.astype(F32))
        q = _nibbles(b[:, 16:], 32).reshape(N, 256).astype(np.int32)
        return q.reshape(rows, K), dw.reshape(rows, nb), mw.reshape(rows, nb), None
    # Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d
    low = _nibbles(b[:, :128], 64).reshape(N, 8, 32)
    qh = b[:, 128:192].reshape(N, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    high = (qh & 0x03).reshape(N, 8, 32)
    q = (low | (high << 4)).astype(np.int32).reshape(N, 256) - 32
    sub = b[:, 192:208].view(np.int8).astype(np.int32)        # (N, 16)
    dw = np.repeat(_half(b, 208), 8)                          # one d per 32-block of the super-block
    return q.reshape(rows, K), dw.reshape(rows, nb), None, sub.reshape(rows, K // 16)


# ----------------------------------------------------------------------------- 3. the matmul
def _row_scale(name: str, row_scale, rows: int):
    if row_scale is None:
        if name in ("ROWQ8", "I8F"):
            raise ValueError(f"{name} needs row scales")
        return None
    s = np.asarray(row_scale, dtype=F32).reshape(-1)
    if s.size != rows:
        raise ValueError(f"{rows} rows, {s.size} row scales")
    return s


def block_sums(q, sub, qx, b: int) -> np.ndarray:
    """isum_b (n, rows) int32 of block b: q (rows, K) int32, qx (n, K) int8 (Q6_K: with its sub-scales).
    The dot products run as a float32 matmul (BLAS): every product and partial sum is an integer
    below 2^24 (|q| <= 128, |qx| <= 127, 32 terms), so exact in any order, with or without FMA."""
    sl = slice(32 * b, 32 * b + 32)
    xb, wt = qx[:, sl].astype(F32), q[:, sl].T.astype(F32)
    if sub is None:
        return (xb @ wt).astype(np.int32)
    lo = (xb[:, :16] @ wt[:16]).astype(np.int64) * sub[:, 2 * b].astype(np.int64)[None, :]
    hi = (xb[:, 16:] @ wt[16:]).astype(np.int64) * sub[:, 2 * b + 1].astype(np.int64)[None, :]
    return (lo + hi).astype(np.int32)


def _q8act(name, raw, x, rows, cols, row_scale):
    q, dw, mw, sub = decode_blocks(name, raw, rows, cols)
    qx, dx, xsum = quantize_activations(x)
    n = qx.shape[0]
    acc = np.zeros((n, rows), F32)                            # +0.0 (docs/quant_kernels.md §3)
    for b in range(cols // 32):
        isum = block_sums(q, sub, qx, b).astype(F32)          # exact: |isum| < 2^24
        c = (dw[None, :, b] * dx[:, b, None]) * isum          # (n, rows): f32(f32(dw dx) * isum)
        if mw is not None:
            c = c + (mw[None, :, b] * dx[:, b, None]) * xsum[:, b, None].astype(F32)
        acc = acc + c                                         # block order, from +0.0
    if row_scale is not None:
        acc = acc * row_scale[None, :]
    return acc.astype(F32, copy=False)


def _float_matmul(w, x, row_scale):
    """docs/champion_wasm.md's float matmul: lane j of one f32x4 accumulator sums the products of
    inputs i = j mod 4 in order (starting from +0), then (l0 + l2) + (l1 + l3), then * scale."""
    n, K = x.shape
    lanes = np.zeros((n, w.shape[0], 4), F32)
    for i in range(0, K, 4):
        lanes = lanes + w[None, :, i:i + 4] * x[:, None, i:i + 4]
    y = (lanes[..., 0] + lanes[..., 2]) + (lanes[..., 1] + lanes[..., 3])
    if row_scale is not None:
        y = y * row_scale[None, :]
    return y.astype(F32, copy=False)


def qmatmul(fmt, raw, x, rows: int, cols: int, row_scale=None) -> np.ndarray:
    """out (n, rows) float32 = the declared matmul of x (n, cols) float32 with the weights `raw`
    (fmt's layout: GGUF blocks, int8 values, or float32 values), row scales (rows,) for ROWQ8 / I8F
    (optional for F32), not accumulating: champion_qmatmul's function."""
    name = format_name(fmt)
    _check_cols(name, cols)
    x = np.asarray(x, dtype=F32)
    if x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"x {x.shape} is not (n, {cols})")
    s = _row_scale(name, row_scale, rows)
    with np.errstate(over="ignore", invalid="ignore"):       # inf and NaN are part of the function
        if name in ("F32", "I8F"):
            w = _blocks(raw, rows, cols, name).view("<f4" if name == "F32" else np.int8)
            return _float_matmul(w.reshape(rows, cols).astype(F32), x, s)
        return _q8act(name, raw, x, rows, cols, s if name == "ROWQ8" else None)


# ----------------------------------------------------------------------------- 4. other tensors
def dequantize_rows(fmt, raw, rows: int, cols: int, row_scale=None) -> np.ndarray:
    """(rows, cols) float32 by the embedding gather's element formula (section 4); for the GGUF
    formats the same bits as gguf_dequant.dequantize."""
    name = format_name(fmt)
    s = _row_scale(name, row_scale, rows)
    if name == "F32":
        w = _blocks(raw, rows, cols, name).view("<f4").reshape(rows, cols).astype(F32)
        return w if s is None else w * s[:, None]
    q, dw, mw, sub = decode_blocks(name, raw, rows, cols)
    qf = q.astype(F32)
    if name in ("ROWQ8", "I8F"):
        return qf * s[:, None]
    d32 = np.repeat(dw, 32, axis=1)                           # per element
    if name in ("Q8_0", "Q4_0"):
        return d32 * qf
    if name == "Q4_1":
        return d32 * qf + np.repeat(mw, 32, axis=1)
    data = _blocks(raw, rows, cols, name).reshape(-1, GGUF_BLOCK_BYTES[name])
    if name == "Q4_K":                                        # f32(f32(f32(d * sc) * q) - f32(dmin * m))
        return d32 * qf + np.repeat(mw, 32, axis=1)           # dw = d * sc, mw = -(dmin * m): exact
    d = np.repeat(_half(data, 208), 256).reshape(rows, cols)  # Q6_K: f32(f32(d * sc) * (q - 32))
    return (d * np.repeat(sub, 16, axis=1).astype(F32)) * qf


# ----------------------------------------------------------------------------- test data, encoders
def _f16_bytes(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float32).astype("<f2").reshape(-1, 1).view(np.uint8)


def random_blocks(fmt, rows: int, cols: int, rng: np.random.Generator) -> bytes:
    """Random valid weights in fmt's layout (finite, normal f16 scales of realistic size; F32 values
    ~N(0, 0.05); ROWQ8 / I8F int8 in [-127, 127], scales separate)."""
    name = format_name(fmt)
    _check_cols(name, cols)
    if name == "F32":
        return (rng.standard_normal((rows, cols)) * 0.05).astype("<f4").tobytes()
    if name in ("ROWQ8", "I8F"):
        return rng.integers(-127, 128, (rows, cols)).astype(np.int8).tobytes()
    N = rows * cols // block_elems(name)
    u8 = lambda k: rng.integers(0, 256, (N, k)).astype(np.uint8)   # noqa: E731
    mag = lambda lo, hi: np.exp(rng.uniform(np.log(lo), np.log(hi), N))   # noqa: E731
    sign = lambda: np.where(rng.random(N) < 0.5, -1.0, 1.0)   # noqa: E731
    if name == "Q8_0":
        parts = [_f16_bytes(mag(1e-4, 2e-2) * sign()), u8(32)]
    elif name == "Q4_0":
        parts = [_f16_bytes(mag(1e-3, 2e-2) * sign()), u8(16)]
    elif name == "Q4_1":
        parts = [_f16_bytes(mag(1e-3, 2e-2)), _f16_bytes(-mag(1e-3, 0.2)), u8(16)]
    elif name == "Q4_K":
        parts = [_f16_bytes(mag(1e-4, 2e-3)), _f16_bytes(mag(1e-4, 2e-3)), u8(12), u8(128)]
    else:   # Q6_K
        parts = [u8(128), u8(64), u8(16), _f16_bytes(mag(1e-5, 2e-4))]
    return np.concatenate(parts, axis=1).tobytes()


def _roundf(v: np.ndarray) -> np.ndarray:
    """C's roundf (half away from zero) of float32 values."""
    return np.sign(v) * np.floor(np.abs(v) + F32(0.5))


def _pack_nibbles(q: np.ndarray, group: int) -> np.ndarray:
    """(N, 2 * group per chunk) values 0..15 -> bytes: per chunk of 2 * group values, byte j holds
    value j (low) and value j + group (high)."""
    N = q.shape[0]
    g = q.astype(np.uint8).reshape(N, -1, 2, group)
    return (g[:, :, 0, :] | (g[:, :, 1, :] << np.uint8(4))).reshape(N, -1)


def quantize_weights(fmt, w) -> bytes:
    """w (rows, cols) float32 -> fmt's raw bytes. Q8_0 / Q4_0 / Q4_1: llama.cpp's reference
    quantisers (quantize_row_*_ref) bit for bit; Q4_K / Q6_K: round-to-nearest with the scales
    taken from each sub-block's range (no search); ROWQ8 / I8F: the int8 values of
    w / (amax / 127) per row (the row scales: `row_scales_for`); F32: the values."""
    name = format_name(fmt)
    w = np.asarray(w, dtype=F32)
    rows, cols = w.shape
    _check_cols(name, cols)
    if name == "F32":
        return w.astype("<f4").tobytes()
    if name in ("ROWQ8", "I8F"):
        s = row_scales_for(w)
        inv = np.where(s == 0, F32(0), F32(1) / np.where(s == 0, F32(1), s))
        return np.clip(_roundf(w * inv[:, None]), -127, 127).astype(np.int8).tobytes()
    B = block_elems(name)
    x = w.reshape(-1, B)
    N = x.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        if name == "Q8_0":
            d = np.max(np.abs(x), axis=1) / F32(127)
            inv = np.where(d == 0, F32(0), F32(1) / d).astype(F32)
            qs = _roundf(x * inv[:, None]).astype(np.int8).view(np.uint8)
            parts = [_f16_bytes(d), qs]
        elif name == "Q4_0":
            imax = np.argmax(np.abs(x), axis=1)
            d = x[np.arange(N), imax] / F32(-8)
            inv = np.where(d == 0, F32(0), F32(1) / d).astype(F32)
            q = np.minimum(15, np.trunc(x * inv[:, None] + F32(8.5))).astype(np.uint8)
            parts = [_f16_bytes(d), _pack_nibbles(q, 16)]
        elif name == "Q4_1":
            lo, hi = np.min(x, axis=1), np.max(x, axis=1)
            d = (hi - lo) / F32(15)
            inv = np.where(d == 0, F32(0), F32(1) / d).astype(F32)
            q = np.minimum(15, np.trunc((x - lo[:, None]) * inv[:, None] + F32(0.5))).astype(np.uint8)
            parts = [_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q, 16)]
        elif name == "Q6_K":
            xs = x.reshape(N, 16, 16)
            amax = np.max(np.abs(xs), axis=2)                 # per 16: scale = amax / 31
            scale = amax / F32(31)
            dmax = np.max(scale, axis=1)
            d = (dmax / F32(127)).astype(np.float16).astype(F32)
            sc = np.where(d[:, None] == 0, 0, np.clip(_roundf(scale / np.where(d == 0, 1, d)[:, None]), -128, 127))
            step = d[:, None] * sc.astype(F32)                # the dequantiser's f32(d * sc)
            q = np.where(step[..., None] == 0, 0,
                         np.clip(_roundf(xs / np.where(step == 0, 1, step)[..., None]), -32, 31)) + 32
            q = q.astype(np.uint8).reshape(N, 256)
            ql = np.zeros((N, 128), np.uint8)
            qh = np.zeros((N, 64), np.uint8)
            for h in range(2):                                # ggml's layout (gguf_dequant.q6_k)
                v = q[:, 128 * h:128 * h + 128].reshape(N, 4, 32)
                ql[:, 64 * h:64 * h + 32] = (v[:, 0] & 15) | ((v[:, 2] & 15) << 4)
                ql[:, 64 * h + 32:64 * h + 64] = (v[:, 1] & 15) | ((v[:, 3] & 15) << 4)
                qh[:, 32 * h:32 * h + 32] = (v[:, 0] >> 4) | ((v[:, 1] >> 4) << 2) | ((v[:, 2] >> 4) << 4) | ((v[:, 3] >> 4) << 6)
            parts = [ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)]
        else:   # Q4_K: x = (d * sc) * q - dmin * m, q in 0..15, sc and m 6 bits
            xs = x.reshape(N, 8, 32)
            lo = np.minimum(np.min(xs, axis=2), F32(0))
            hi = np.max(xs, axis=2)
            scale, mins = (hi - lo) / F32(15), -lo
            d = (np.max(scale, axis=1) / F32(63)).astype(np.float16).astype(F32)
            dmin = (np.max(mins, axis=1) / F32(63)).astype(np.float16).astype(F32)
            sc = np.where(d[:, None] == 0, 0, np.clip(_roundf(scale / np.where(d == 0, 1, d)[:, None]), 0, 63)).astype(np.uint8)
            mn = np.where(dmin[:, None] == 0, 0, np.clip(_roundf(mins / np.where(dmin == 0, 1, dmin)[:, None]), 0, 63)).astype(np.uint8)
            step, off = d[:, None] * sc.astype(F32), dmin[:, None] * mn.astype(F32)
            q = np.where(step[..., None] == 0, 0,
                         np.clip(_roundf((xs + off[..., None]) / np.where(step == 0, 1, step)[..., None]), 0, 15))
            packed = np.zeros((N, 12), np.uint8)              # inverse of gguf_dequant.q4_k_scales
            packed[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
            packed[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
            packed[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
            parts = [_f16_bytes(d), _f16_bytes(dmin), packed, _pack_nibbles(q.reshape(N, 256), 32)]
    return np.concatenate(parts, axis=1).tobytes()


def row_scales_for(w) -> np.ndarray:
    """(rows,) float32 row scales amax / 127 of w (rows, cols): ROWQ8 / I8F's quantize_weights."""
    return (np.max(np.abs(np.asarray(w, dtype=F32)), axis=1) / F32(127)).astype(F32)
