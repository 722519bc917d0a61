"""The q8act-v1 matmul (docs/quant_kernels.md): the NumPy twin (py/exactspec/twins/qmatmul_twins.py)
against a scalar transcription of the doc and a float64 matmul, and the WASM kernel's test hook
champion_qmatmul (web/build/cpu.wasm, cpu_mt.wasm at 1-3 threads, through
web/tests/qmatmul_harness.mjs in Node) against the twin bit for bit, every format:

- the twin equals a scalar, element-by-element reading of the doc (independent block decoding from
  the bytes, Python integers, one float32 rounding per operation), and its gather equals
  gguf_dequant's bits; its Q8_0 / Q4_0 / Q4_1 encoders equal llama.cpp's (the gguf package's);
- the twin is within a derived bound of the float64 matmul of the dequantised weights (activation
  rounding <= dx / 2 per element plus float32 rounding of the block terms), and a nibble-order bug
  breaks the bound;
- WASM == twin bitwise at n = 1..9, rows 1, 3, 12, 37, 64, cols 32..1536, with zero blocks, huge
  elements, ties, scale boundaries, tiny and non-finite inputs (NaN rows compared as NaN); and a
  twin broken on purpose (llama.cpp's amax / 127 scale, blocks summed in another order) is caught.
"""
from __future__ import annotations

import base64
import math
import struct

from pathlib import Path

import numpy as np
import pytest

from browser_fixture import REPO_ROOT
from node_harness import run_harness
from test_wasm_champion import WASM, WASM_THREADS, ensure_wasm

from exactspec.reference.gguf_dequant import dequantize
from exactspec.twins import qmatmul_twins as qt

F32 = np.float32
HARNESS = REPO_ROOT / "web" / "tests" / "qmatmul_harness.mjs"
WASM_RELAXED = WASM.with_name("cpu_relaxed.wasm")            # relaxed-SIMD builds (wasm/build.sh)
WASM_THREADS_RELAXED = WASM.with_name("cpu_mt_relaxed.wasm")
U = 2.0 ** -24                       # float32 unit roundoff
U64 = 2.0 ** -53
GGUF = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
ALL = tuple(qt.FORMATS)


def gamma(k: int, u: float = U) -> float:
    """Higham's gamma_k = k u / (1 - k u): the relative bound of k chained float roundings."""
    return k * u / (1 - k * u)


# ----------------------------------------------------------------------------- test data
def row_scales(fmt: str, rows: int, rng) -> np.ndarray | None:
    """Row scales for the formats that take them (F32: none); one row scale 0, one negative."""
    if fmt not in ("ROWQ8", "I8F"):
        return None
    s = rng.uniform(2e-3, 2e-2, rows).astype(F32)
    if rows > 2:
        s[1], s[2] = F32(0), -s[2]
    return s


def special_weights(fmt: str, raw: bytes, rows: int, cols: int) -> bytes:
    """Row 0's first block all zero bytes; for the GGUF formats, the last block of the last row
    gets a huge f16 scale (60000: dw * dx * isum near float32's range with a huge input)."""
    b = bytearray(raw)
    rb, per = qt.row_bytes(fmt, cols), qt.GGUF_BLOCK_BYTES.get(fmt)
    first = per or qt.row_bytes(fmt, 32)
    b[0:first] = bytes(first)
    if per and rows > 1:
        at = rows * rb - per + (208 if fmt == "Q6_K" else 0)
        b[at:at + 2] = np.array([60000.0], dtype="<f2").tobytes()
    return bytes(b)


def special_inputs(n: int, cols: int, rng) -> np.ndarray:
    """(n, cols) float32: row 0 plain; then rows with a zero block, a tiny and a just-normal block
    (the 2^-100 threshold, subnormals), one huge element, a NaN, ties (x = (m + 1/2) 2^k), the
    scale boundary (amax = 127 2^k and 127.5 2^k), an infinity; further rows of varied magnitude."""
    x = (rng.standard_normal((n, cols)) * np.exp(rng.uniform(-3, 3, (n, 1)))).astype(F32)
    nb = cols // 32
    blk = lambda t, b: x[t, 32 * (b % nb):32 * (b % nb) + 32]   # noqa: E731
    if n > 1:
        blk(1, 0)[:] = 0
        if nb > 1:
            blk(1, 1)[:] = (rng.standard_normal(32) * 1e-32).astype(F32)          # amax < 2^-100
            blk(1, 1)[3] = np.float32(1e-45)                                       # a subnormal
        if nb > 2:
            blk(1, 2)[:] = (rng.standard_normal(32) * 1e-30).astype(F32)
            blk(1, 2)[0] = np.ldexp(F32(1), -100)                                  # amax = 2^-100 exactly
    if n > 2:
        blk(2, 0)[5] = F32(1e30)                                                   # one huge element
    if n > 3:
        x[3, cols // 2] = np.nan
    if n > 4:
        k = int(rng.integers(-20, 10))
        m = rng.integers(-50, 50, 32).astype(F32) + F32(0.5)
        m[0] = F32(100)                                                            # amax = 100 2^k: dx = 2^k
        blk(4, 0)[:] = np.ldexp(m, k)
    if n > 5:
        k = int(rng.integers(-20, 10))
        blk(5, 0)[0] = np.ldexp(F32(127), k)                                       # e = E - 6
        if nb > 1:
            blk(5, 1)[0] = np.ldexp(F32(127.5), k)                                 # e = E - 5
            blk(5, 1)[1] = np.ldexp(F32(-63.75), k)                                # a tie at 2^(k+1)
    if n > 6:
        x[6, 0] = np.inf
    return x


def shapes(fmt: str) -> list:
    """(n, rows, cols): n = 1..9, rows not multiples of 4 or 8 (and 64: 8-row tiles), cols 32..1536;
    one at SmolLM2-135M's down_proj size (576 rows: 72 chunks of 8 for the thread pool)."""
    if qt.block_elems(fmt) == 256:
        return [(1, 1, 256), (2, 3, 256), (3, 12, 512), (4, 37, 256), (5, 37, 512), (6, 12, 1536),
                (7, 3, 768), (8, 37, 256), (9, 12, 512), (1, 64, 512), (9, 37, 1536), (5, 576, 1536)]
    odd = [(3, 5, 36), (2, 9, 100)] if fmt in ("F32", "I8F") else []   # the float function: cols % 4
    return [(1, 1, 32), (2, 3, 64), (3, 12, 96), (4, 37, 160), (5, 37, 512), (6, 12, 1536),
            (7, 3, 32), (8, 37, 64), (9, 12, 512), (1, 64, 96), (9, 37, 1536), (5, 576, 1536)] + odd


def make_cases(fmt: str, seed: int) -> list:
    """[(n, rows, cols, raw, scale, x)] for every shape of `fmt`."""
    rng = np.random.default_rng(seed)
    out = []
    for n, rows, cols in shapes(fmt):
        raw = special_weights(fmt, qt.random_blocks(fmt, rows, cols, rng), rows, cols)
        out.append((n, rows, cols, raw, row_scales(fmt, rows, rng), special_inputs(n, cols, rng)))
    return out


# ----------------------------------------------------------------------------- a scalar reading of the doc
def scalar_activations(xb):
    """One block of 32 float32 -> (qx list, dx float32), section 1, with Python floats: the table
    constants from their definition (not from the twin), x * s exact in float64 then rounded once
    to float32, round() half to even."""
    vals = [float(v) for v in xb]
    if any(not math.isfinite(v) for v in vals) or max(abs(v) for v in vals) >= 2.0 ** 100:
        return [0] * 32, F32(np.nan)
    amax = max(abs(v) for v in vals)
    if amax < 2.0 ** -100:
        return [0] * 32, F32(0)
    E = math.frexp(amax)[1] - 1
    j = int((amax / 2.0 ** E - 1.0) * 64)                # the top 6 mantissa bits
    scale = float(F32(8128.0 / (65 + j)))
    step = float(F32(1.0 / scale))
    s = scale * 2.0 ** -E
    return [round(float(F32(v * s))) for v in vals], F32(step * 2.0 ** E)


def scalar_block(fmt: str, blk: bytes):
    """One GGUF block -> (q list, per-32 (dw, mw) list, per-16 sub list or None), ggml's layouts."""
    h = lambda o: F32(struct.unpack_from("<e", blk, o)[0])            # noqa: E731
    if fmt == "Q8_0":
        return list(struct.unpack_from("<32b", blk, 2)), [(h(0), None)], None
    if fmt in ("Q4_0", "Q4_1"):
        qs = blk[2:] if fmt == "Q4_0" else blk[4:]
        q = [qs[j] & 15 for j in range(16)] + [qs[j] >> 4 for j in range(16)]
        if fmt == "Q4_0":
            return [v - 8 for v in q], [(h(0), None)], None
        return q, [(h(0), h(2))], None
    if fmt == "Q4_K":
        d, dmin, sc, qs = h(0), h(2), blk[4:16], blk[16:]
        q, scales = [], []
        for j in range(8):                                            # ggml's get_scale_min_k4
            if j < 4:
                s, m = sc[j] & 63, sc[j + 4] & 63
            else:
                s, m = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)
            scales.append((F32(d * F32(s)), -F32(dmin * F32(m))))
        for c in range(4):
            q += [qs[32 * c + l] & 15 for l in range(32)] + [qs[32 * c + l] >> 4 for l in range(32)]
        return q, scales, None
    ql, qh, sc, d = blk[0:128], blk[128:192], struct.unpack_from("<16b", blk, 192), h(208)
    q = [0] * 256
    for half in range(2):                                             # ggml's dequantize_row_q6_K
        L, H, y = ql[64 * half:], qh[32 * half:], 128 * half
        for l in range(32):
            q[y + l] = ((L[l] & 15) | (((H[l] >> 0) & 3) << 4)) - 32
            q[y + l + 32] = ((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32
            q[y + l + 64] = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32
            q[y + l + 96] = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32
    return q, [(d, None)] * 8, list(sc)


@np.errstate(over="ignore", invalid="ignore")
def scalar_qmatmul(fmt: str, raw: bytes, x, rows: int, cols: int, scale) -> np.ndarray:
    """Section 3 element by element: int block sums, c_b = f32(f32(dw dx) isum) [+ f32(f32(mw dx) xsum)],
    acc = +0.0 + c_0 + c_1 + ... in order, ROWQ8: * s_r. F32 / I8F: the f32x4 lanes of docs/champion_wasm.md."""
    n = x.shape[0]
    y = np.zeros((n, rows), F32)
    rb = qt.row_bytes(fmt, cols)
    for r in range(rows):
        row = raw[r * rb:(r + 1) * rb]
        if fmt in ("F32", "I8F"):
            w = struct.unpack(f"<{cols}f", row) if fmt == "F32" else struct.unpack(f"<{cols}b", row)
            for t in range(n):
                lanes = [F32(0)] * 4
                for i in range(cols):
                    lanes[i % 4] = F32(lanes[i % 4] + F32(F32(w[i]) * x[t, i]))
                s = F32(F32(lanes[0] + lanes[2]) + F32(lanes[1] + lanes[3]))
                y[t, r] = s if scale is None else F32(s * scale[r])
            continue
        if fmt == "ROWQ8":
            q, per, sub = list(struct.unpack(f"<{cols}b", row)), [(F32(1), None)] * (cols // 32), None
        else:
            q, per, sub = [], [], [] if fmt == "Q6_K" else None
            bb = qt.GGUF_BLOCK_BYTES[fmt]
            for o in range(0, rb, bb):
                bq, bper, bsub = scalar_block(fmt, row[o:o + bb])
                q += bq
                per += bper
                if sub is not None:
                    sub += bsub
        for t in range(n):
            acc = F32(0)
            for b in range(cols // 32):
                qx, dx = scalar_activations(x[t, 32 * b:32 * b + 32])
                qb = q[32 * b:32 * b + 32]
                if sub is None:
                    isum = sum(qb[j] * qx[j] for j in range(32))
                else:
                    isum = sub[2 * b] * sum(qb[j] * qx[j] for j in range(16)) + \
                        sub[2 * b + 1] * sum(qb[j] * qx[j] for j in range(16, 32))
                dw, mw = per[b]
                c = F32(F32(dw * dx) * F32(isum))
                if mw is not None:
                    c = F32(c + F32(F32(mw * dx) * F32(sum(qx))))
                acc = F32(acc + c)
            y[t, r] = acc if fmt != "ROWQ8" else F32(acc * scale[r])
    return y


@pytest.mark.parametrize("fmt", ALL)
def test_twin_equals_scalar_reading_of_the_doc(fmt):
    """The vectorised twin == the scalar transcription, bit for bit (NaN rows as NaN), on small
    cases with every special input and weight."""
    rng = np.random.default_rng(11)
    big, small = (512, 256) if qt.block_elems(fmt) == 256 else (128, 32)
    for n, rows, cols in [(7, 3, big), (2, 5, big), (7, 3, small)]:    # small: row 0 all zero blocks (signed zeros)
        raw = special_weights(fmt, qt.random_blocks(fmt, rows, cols, rng), rows, cols)
        s, x = row_scales(fmt, rows, rng), special_inputs(n, cols, rng)
        assert_same_bits(qt.qmatmul(fmt, raw, x, rows, cols, s), scalar_qmatmul(fmt, raw, x, rows, cols, s),
                         f"{fmt} ({n}, {rows}, {cols})")


def test_activation_quantisation_cases():
    """Section 1 on chosen blocks: the table scale at a mantissa-bin edge, 127 reached, ties to even,
    the 2^-100 and 2^100 thresholds, non-finite blocks; and on random blocks the scalar reading gives
    the same qx, dx."""
    x = np.zeros((1, 32 * 8), F32)
    x[0, 0:3] = [127, 0.5, -2.5]                         # amax 127 = 2^6 (1 + 63/64 + ...): j = 63
    x[0, 32:35] = [1.0, 0.5, -1.0]                        # amax 1: E = 0, j = 0, s = 8128/65
    x[0, 64] = np.ldexp(F32(1), -100)                    # amax = 2^-100: a normal block
    x[0, 96] = np.ldexp(F32(1), -101)                    # below: a zero block
    x[0, 128] = np.nan
    x[0, 160] = -np.inf
    x[0, 192:194] = [np.ldexp(F32(1), 100), F32(-1)]     # amax = 2^100: refused as NaN
    x[0, 224:226] = [np.nextafter(np.ldexp(F32(1), 100), F32(0)), F32(3e29)]   # just below 2^100: a block
    qx, dx, xsum = qt.quantize_activations(x)
    s63, s0 = F32(8128 / 128), F32(8128 / 65)
    assert qx[0, 0:3].tolist() == [126, 0, -2] and dx[0, 0] == F32(1 / s63) * 64   # s = 63.5 / 64: 126.008 -> 126
    assert qx[0, 32:35].tolist() == [125, 63, -125] and dx[0, 1] == F32(1 / s0)     # s = 125.046: 62.52 -> 63
    assert qx[0, 64] == 125 and dx[0, 2] == np.ldexp(F32(1 / s0), -100)
    assert dx[0, 3] == 0 and not qx[0, 96:128].any()
    assert np.isnan(dx[0, 4:7]).all() and not qx[0, 128:224].any()
    assert np.isfinite(dx[0, 7]) and qx[0, 224] == 127
    rng = np.random.default_rng(3)
    x = special_inputs(9, 256, rng)
    qx, dx, xsum = qt.quantize_activations(x)
    for t in range(9):
        for b in range(8):
            q, d = scalar_activations(x[t, 32 * b:32 * b + 32])
            assert qx[t, 32 * b:32 * b + 32].tolist() == q and xsum[t, b] == sum(q)
            assert (np.isnan(dx[t, b]) and np.isnan(d)) or dx[t, b] == d


def test_block_sums_exact_at_the_extremes():
    """block_sums (a float32 matmul) == int64 sums where they are largest: |q| = 128 or 127 against
    qx = +-127 (32 products of 2^14: 2^19 < 2^24), sub-scales -128, and random mixtures."""
    rng = np.random.default_rng(8)
    qx = np.concatenate([np.full((1, 64), 127), np.full((1, 64), -127), rng.integers(-127, 128, (3, 64))]).astype(np.int8)
    q = np.concatenate([np.full((1, 64), -128), np.full((1, 64), 127), rng.integers(-128, 128, (5, 64))]).astype(np.int32)
    sub = np.concatenate([np.full((1, 4), -128), rng.integers(-128, 128, (6, 4))]).astype(np.int32)
    for s in (None, sub):
        for b in range(2):
            sl = slice(32 * b, 32 * b + 32)
            prod = qx[:, None, sl].astype(np.int64) * q[None, :, sl]
            want = prod.sum(-1) if s is None else \
                prod[..., :16].sum(-1) * s[None, :, 2 * b] + prod[..., 16:].sum(-1) * s[None, :, 2 * b + 1]
            assert np.array_equal(qt.block_sums(q, s, qx, b), want)


@pytest.mark.parametrize("fmt", GGUF)
def test_gather_equals_gguf_dequant(fmt):
    """dequantize_rows (section 4's element formula) == gguf_dequant (ggml's dequantisers) bit for bit."""
    rng = np.random.default_rng(5)
    cols = 512 if qt.block_elems(fmt) == 256 else 96
    raw = special_weights(fmt, qt.random_blocks(fmt, 7, cols, rng), 7, cols)
    got = qt.dequantize_rows(fmt, raw, 7, cols)
    assert np.array_equal(got.reshape(-1).view(np.uint32), dequantize(raw, fmt).view(np.uint32))


@pytest.mark.parametrize("fmt", ("Q8_0", "Q4_0", "Q4_1"))
def test_encoders_equal_llama_reference(fmt):
    """quantize_weights == the gguf package's quantisers (llama.cpp's quantize_row_*_ref) byte for byte,
    including an all-zero block and a constant block."""
    from gguf import GGMLQuantizationType, quants
    w = (np.random.default_rng(2).standard_normal((6, 256)) * 0.05).astype(F32)
    w[1, :32] = 0
    w[2, 32:64] = F32(0.25)
    assert qt.quantize_weights(fmt, w) == quants.quantize(w, getattr(GGMLQuantizationType, fmt)).tobytes()


@pytest.mark.parametrize("fmt", ("Q4_K", "Q6_K", "ROWQ8", "I8F"))
def test_encoders_round_trip(fmt):
    """The round-to-nearest encoders: each element comes back within half its step, plus what a
    clipped element can lose (the scale's own rounding: Q6_K / Q4_K scales are 6- or 8-bit multiples
    of a float16 super-scale)."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((5, 512)) * 0.05).astype(F32)
    w[0, :256] = 0
    raw = qt.quantize_weights(fmt, w)
    s = qt.row_scales_for(w) if fmt in ("ROWQ8", "I8F") else None
    back = qt.dequantize_rows(fmt, raw, 5, 512, s).astype(np.float64)
    err = np.abs(back - w)
    assert not back[0, :256].any()
    q, dw, mw, sub = qt.decode_blocks(fmt, raw, 5, 512)
    if fmt in ("ROWQ8", "I8F"):             # w / s rounded, |w / s| <= 127: no clipping
        bound = np.repeat(np.abs(s.astype(np.float64))[:, None], 512, 1) * (0.5 + 2 * U)
    elif fmt == "Q6_K":
        step = np.repeat(np.abs(dw), 32, 1) * np.repeat(np.abs(sub), 16, 1)
        want = np.repeat(np.abs(w.reshape(5, 32, 16)).max(2) / 31, 16, 1)          # the unrounded step
        bound = step / 2 + 32 * np.abs(want - step) + 1e-12
    else:                                   # Q4_K: step d sc and offset dmin m, both rounded
        step, off = np.repeat(np.abs(dw), 32, 1), np.repeat(np.abs(mw), 32, 1)
        blocks = w.reshape(5, 16, 32)
        lo = np.minimum(blocks.min(2), 0)
        want_step = np.repeat((blocks.max(2) - lo) / 15, 32, 1)
        want_off = np.repeat(-lo, 32, 1)
        bound = step / 2 + 16 * np.abs(want_step - step) + np.abs(want_off - off) + 1e-12
    assert (err <= bound).all(), f"{fmt}: worst {np.max(err - bound)} over the bound"


# ----------------------------------------------------------------------------- twin vs float64
def exact_weights(fmt: str, raw: bytes, rows: int, cols: int, scale) -> np.ndarray:
    """(rows, cols) float64: the weights section 2 says the integers stand for, unrounded
    (ROWQ8: q s_r; Q4_1 / Q4_K: dw q + mw; Q6_K: dw sub q)."""
    if fmt in ("F32", "I8F"):
        w = np.frombuffer(raw, "<f4" if fmt == "F32" else np.int8).reshape(rows, cols).astype(np.float64)
        return w if scale is None else w * scale.astype(np.float64)[:, None]
    q, dw, mw, sub = qt.decode_blocks(fmt, raw, rows, cols)
    w = np.repeat(dw.astype(np.float64), 32, 1) * q
    if sub is not None:
        w = w * np.repeat(sub, 16, 1)
    if mw is not None:
        w = w + np.repeat(mw.astype(np.float64), 32, 1)
    return w if scale is None else w * scale.astype(np.float64)[:, None]


def error_bound(fmt: str, raw: bytes, x, rows: int, cols: int, scale) -> np.ndarray:
    """(n, rows) bound on |twin - x W^T| (W exact, float64), derived from the doc:
    q8act formats: x_j becomes qx_j dx_b with |x_j - qx_j dx_b| <= dx_b / 2 (a zero block: <= amax
    < 2^-100), so the activation term is sum_j |w_j| e_j; the block term c_b rounds at most twice
    around T1 + T2 (dw dx is exact: a power of two), the nb - 1 additions and the row scale once each:
    gamma_{nb+2} sum_b (|T1_b| + |T2_b|) |s_r|. Float formats: products, K/4 lane additions, the
    two-level reduction and the scale: gamma_{K/4+4} sum_j |w_j x_j|. Plus float64's own error."""
    x64 = x.astype(np.float64)
    w = exact_weights(fmt, raw, rows, cols, scale)
    f64_err = gamma(cols + 2, U64) * (np.abs(x64) @ np.abs(w).T)
    if fmt in ("F32", "I8F"):
        return gamma(cols // 4 + 4) * (np.abs(x64) @ np.abs(w).T) + f64_err
    qx, dx, xsum = qt.quantize_activations(x)
    nb = cols // 32
    amax = np.abs(x64).reshape(x.shape[0], nb, 32).max(2)
    e = np.where(dx > 0, dx.astype(np.float64) / 2, amax)
    act = (np.abs(w) @ np.repeat(e, 32, 1).T).T
    q, dw, mw, sub = qt.decode_blocks(fmt, raw, rows, cols)
    terms = np.zeros((x.shape[0], rows))
    for b in range(nb):
        isum = qt.block_sums(q, sub, qx, b).astype(np.float64)
        terms += np.abs(dw[None, :, b].astype(np.float64) * dx[:, b, None] * isum)
        if mw is not None:
            terms += np.abs(mw[None, :, b].astype(np.float64) * dx[:, b, None] * xsum[:, b, None])
    s = 1.0 if scale is None else np.abs(scale.astype(np.float64))[None, :]
    rounding = gamma(nb + 2) * terms * s
    return act + rounding + f64_err + gamma(2, U64) * (act + rounding)


def finite_cases(fmt: str, seed: int):
    """make_cases without the non-finite and overflowing inputs (rows 3 and 6) and the huge weight
    scale: the bound is about finite arithmetic."""
    rng = np.random.default_rng(seed)
    for n, rows, cols in shapes(fmt):
        x = special_inputs(n, cols, rng)
        x = x[[t for t in range(n) if t not in (3, 6)]] if n > 3 else x
        yield rows, cols, qt.random_blocks(fmt, rows, cols, rng), row_scales(fmt, rows, rng), x


@pytest.mark.parametrize("fmt", ALL)
def test_twin_within_the_quantisation_bound(fmt):
    worst = 0.0
    for rows, cols, raw, s, x in finite_cases(fmt, 21):
        y = qt.qmatmul(fmt, raw, x, rows, cols, s).astype(np.float64)
        ref = x.astype(np.float64) @ exact_weights(fmt, raw, rows, cols, s).T
        bound = error_bound(fmt, raw, x, rows, cols, s)
        assert np.isfinite(y).all()
        assert (np.abs(y - ref) <= bound).all(), f"{fmt} ({x.shape[0]}, {rows}, {cols}): over the bound"
        worst = max(worst, float(np.max(np.abs(y - ref) / np.maximum(bound, 1e-300))))
    assert worst > 0                        # the twin is not the float64 matmul itself


def swap_nibbles(fmt: str, raw: bytes, rows: int, cols: int) -> bytes:
    """The weights with the two nibbles of every quant byte swapped (a layout bug); F32: every
    row's elements in reverse order."""
    b = np.frombuffer(raw, np.uint8).copy()
    if fmt == "F32":
        return np.ascontiguousarray(b.view("<f4").reshape(rows, cols)[:, ::-1]).tobytes()
    if fmt in ("ROWQ8", "I8F"):
        quant = np.ones(b.size, bool)
    else:
        bb = qt.GGUF_BLOCK_BYTES[fmt]
        where = {"Q8_0": slice(2, 34), "Q4_0": slice(2, 18), "Q4_1": slice(4, 20), "Q4_K": slice(16, 144),
                 "Q6_K": slice(0, 128)}[fmt]
        mask = np.zeros(bb, bool)
        mask[where] = True
        quant = np.tile(mask, b.size // bb)
    b[quant] = (b[quant] >> 4) | (b[quant] << 4)
    if fmt in ("ROWQ8", "I8F"):
        b[b == 0x80] = 0x81                 # keep int8 in [-127, 127]
    return b.tobytes()


@pytest.mark.parametrize("fmt", ALL)
def test_the_bound_catches_a_layout_bug(fmt):
    """A twin reading swapped nibbles (the bytes of another layout) leaves the bound in every case
    with 3 outputs or more (a single output can land inside it by chance): the bound checks the
    function, not only its size."""
    for rows, cols, raw, s, x in finite_cases(fmt, 22):
        wrong = qt.qmatmul(fmt, swap_nibbles(fmt, raw, rows, cols), x, rows, cols, s).astype(np.float64)
        ref = x.astype(np.float64) @ exact_weights(fmt, raw, rows, cols, s).T
        over = np.abs(wrong - ref) > error_bound(fmt, raw, x, rows, cols, s)
        assert over.any() or over.size < 3, f"{fmt} ({x.shape[0]}, {rows}, {cols}): the layout bug stays inside the bound"


# ----------------------------------------------------------------------------- WASM vs twin
def b64(a) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def run_wasm(cases: list, wasm=WASM, threads: int = 1, fmt_code=None, node_flags: tuple = ()) -> dict:
    """node_flags: V8 flags beyond the relaxed builds' own (e.g. one wasm tier only)."""
    ensure_wasm()
    spec = {"wasm": str(wasm), "threads": threads, "cases": [
        {"fmt": qt.FORMATS[fmt] if fmt_code is None else fmt_code, "n": n, "rows": rows, "cols": cols,
         "w": base64.b64encode(raw).decode(), "scale": None if s is None else b64(s.astype("<f4")),
         "x": b64(x.astype("<f4"))}
        for fmt, (n, rows, cols, raw, s, x) in cases]}
    relaxed = "relaxed" in Path(wasm).name
    out = run_harness(HARNESS, spec, (("--experimental-wasm-relaxed-simd",) if relaxed else ()) + tuple(node_flags))
    assert out["exports"], f"{wasm.name} has no champion_qmatmul export (wasm/qmatmul.c)"
    return out


def outputs(out: dict, cases: list) -> list:
    got = []
    for (fmt, (n, rows, cols, *_)), r in zip(cases, out["results"]):
        assert r["status"] == 0, f"{fmt} ({n}, {rows}, {cols}): status {r['status']}"
        assert r["guard_ok"], f"{fmt} ({n}, {rows}, {cols}): bytes written past the (n, rows) output"
        got.append(np.frombuffer(base64.b64decode(r["out"]), "<f4").reshape(n, rows))
    return got


def first_difference(got: np.ndarray, want: np.ndarray) -> str | None:
    """None when the same bits (NaN as NaN, whatever its payload: WASM does not fix NaN bits);
    else where and what the first differing element is."""
    gn, wn = np.isnan(got), np.isnan(want)
    differ = (gn != wn) | (~gn & ~wn & (got.view(np.uint32) != want.view(np.uint32)))
    if not differ.any():
        return None
    t, r = map(int, np.argwhere(differ)[0])
    g, w = got[t, r], want[t, r]
    return (f"{int(differ.sum())} elements differ, first [{t}, {r}]: got {g!r} (0x{int(g.view(np.uint32)):08x}), "
            f"twin {w!r} (0x{int(w.view(np.uint32)):08x})")


def assert_same_bits(got, want, what: str) -> None:
    diff = first_difference(np.asarray(got, F32), np.asarray(want, F32))
    assert diff is None, f"{what}: {diff}"


_runs: dict = {}


def wasm_results(fmt: str, wasm=WASM, threads: int = 1, node_flags: tuple = ()) -> tuple:
    """(cases, WASM outputs) of make_cases(fmt), one Node run per (format, module, threads, flags)."""
    key = (fmt, wasm, threads, node_flags)
    if key not in _runs:
        cases = [(fmt, c) for c in make_cases(fmt, seed=100 + qt.FORMATS[fmt])]
        _runs[key] = (cases, outputs(run_wasm(cases, wasm, threads, node_flags=node_flags), cases))
    return _runs[key]


@pytest.mark.parametrize("fmt", ALL)
def test_wasm_equals_twin_bitwise(fmt):
    """champion_qmatmul == the twin, every element's bits, n = 1..9, rows 1, 3, 12, 37, 64,
    cols 32..1536, with every special input (a NaN or an infinity makes its row NaN)."""
    cases, got = wasm_results(fmt)
    differ = []
    for (_, (n, rows, cols, raw, s, x)), y in zip(cases, got):
        diff = first_difference(y, qt.qmatmul(fmt, raw, x, rows, cols, s))
        if diff:
            differ.append(f"{fmt} (n, rows, cols) = ({n}, {rows}, {cols}): {diff}")
        if n > 3:
            assert np.isnan(y[3]).all()     # the NaN input row
    assert not differ, "\n".join(differ)


@pytest.mark.parametrize("fmt", ("Q8_0", "Q4_K", "Q6_K", "ROWQ8", "F32"))
def test_wasm_threads_equal_twin_bitwise(fmt):
    """cpu_mt.wasm with a pool of 1, 2 and 3 threads: the same bits as the twin."""
    differ = []
    for threads in (1, 2, 3):
        cases, got = wasm_results(fmt, WASM_THREADS, threads)
        for (_, (n, rows, cols, raw, s, x)), y in zip(cases, got):
            diff = first_difference(y, qt.qmatmul(fmt, raw, x, rows, cols, s))
            if diff:
                differ.append(f"{fmt} {threads} threads ({n}, {rows}, {cols}): {diff}")
    assert not differ, "\n".join(differ)


@pytest.mark.parametrize("fmt", ALL)
def test_relaxed_simd_build_gives_the_same_bits(fmt):
    """cpu_relaxed.wasm (the Q4 formats' dot products with relaxed_dot_i8x16_i7x16_add) and
    cpu_mt_relaxed.wasm at 2 threads: every output the same bits as the SIMD128 build and the twin."""
    cases, plain = wasm_results(fmt)
    for wasm, threads in ((WASM_RELAXED, 1), (WASM_THREADS_RELAXED, 2)):
        _, got = wasm_results(fmt, wasm, threads)
        for (_, (n, rows, cols, raw, s, x)), y, y_plain in zip(cases, got, plain):
            assert_same_bits(y, y_plain, f"{fmt} {wasm.name} x{threads} vs cpu.wasm ({n}, {rows}, {cols})")
            assert_same_bits(y, qt.qmatmul(fmt, raw, x, rows, cols, s), f"{fmt} {wasm.name} vs twin")


@pytest.mark.parametrize("tier", ("--liftoff-only", "--no-liftoff"))
def test_relaxed_q4_dots_in_each_wasm_tier(tier):
    """The relaxed build's Q4 dot products compiled by each of V8's wasm tiers alone (which one runs
    is otherwise a matter of timing): Node 20's Liftoff computes relaxed_dot_i8x16_i7x16_add wrongly
    in some forms (2x the sums), so each tier must give the twin's bits on its own."""
    for fmt in ("Q4_0", "Q4_1", "Q4_K"):
        cases, got = wasm_results(fmt, WASM_RELAXED, 1, (tier,))
        for (_, (n, rows, cols, raw, s, x)), y in zip(cases, got):
            assert_same_bits(y, qt.qmatmul(fmt, raw, x, rows, cols, s), f"{fmt} {tier} ({n}, {rows}, {cols})")


def twin_amax_127(fmt, raw, x, rows, cols, s):
    """A broken twin: llama.cpp's activation scale d = amax / 127, q = round(x / d)."""
    xb = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(xb).max(2) / F32(127)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        qx = np.where(d[..., None] > 0, np.rint(xb / d[..., None]), 0).astype(np.int8).reshape(x.shape)
    q, dw, mw, sub = qt.decode_blocks(fmt, raw, rows, cols)
    xsum = qx.reshape(x.shape[0], -1, 32).astype(np.int32).sum(2)
    acc = np.zeros((x.shape[0], rows), F32)
    for b in range(cols // 32):
        c = (dw[None, :, b] * d[:, b, None]) * qt.block_sums(q, sub, qx, b).astype(F32)
        if mw is not None:
            c = c + (mw[None, :, b] * d[:, b, None]) * xsum[:, b, None].astype(F32)
        acc = acc + c
    return acc if fmt != "ROWQ8" else acc * s[None, :]


def twin_reversed_blocks(fmt, raw, x, rows, cols, s):
    """A broken twin: the block terms summed last block first."""
    qx, dx, xsum = qt.quantize_activations(x)
    q, dw, mw, sub = qt.decode_blocks(fmt, raw, rows, cols)
    acc = np.zeros((x.shape[0], rows), F32)
    for b in reversed(range(cols // 32)):
        c = (dw[None, :, b] * dx[:, b, None]) * qt.block_sums(q, sub, qx, b).astype(F32)
        if mw is not None:
            c = c + (mw[None, :, b] * dx[:, b, None]) * xsum[:, b, None].astype(F32)
        acc = acc + c
    return acc if fmt != "ROWQ8" else acc * s[None, :]


@pytest.mark.parametrize("fmt", ("Q8_0", "Q4_1", "ROWQ8"))
@pytest.mark.parametrize("broken", (twin_amax_127, twin_reversed_blocks))
def test_a_broken_twin_is_caught(fmt, broken):
    """The comparison has teeth: a twin with llama.cpp's amax / 127 scale, or summing the blocks in
    another order, differs from the kernel somewhere while the twin matches it everywhere."""
    cases, got = wasm_results(fmt)
    caught = 0
    for (_, (n, rows, cols, raw, s, x)), y in zip(cases, got):
        assert_same_bits(y, qt.qmatmul(fmt, raw, x, rows, cols, s), f"{fmt} ({n}, {rows}, {cols})")
        with np.errstate(all="ignore"):
            caught += first_difference(y, np.asarray(broken(fmt, raw, x, rows, cols, s), F32)) is not None
    assert caught > 0, f"{broken.__name__} agrees with the kernel on every {fmt} case"


def test_wasm_refuses_what_the_format_cannot_hold():
    """A K-quant whose cols are not a multiple of 256, a block format with cols not a multiple of 32
    and an unknown format code: a nonzero status; a non-finite f16 scale (Q8_0's d = inf, Q4_1's
    m = NaN): E_MODEL_LOAD, as a weight file with one is refused at load (docs/quant_kernels.md 2)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 32)).astype(F32)
    inf_d = bytearray(qt.random_blocks("Q8_0", 2, 32, rng))
    inf_d[34:36] = np.array([np.inf], "<f2").tobytes()
    nan_m = bytearray(qt.random_blocks("Q4_1", 2, 32, rng))
    nan_m[2:4] = np.array([np.nan], "<f2").tobytes()
    cases = [("Q4_K", (1, 2, 32, bytes(2 * 18), None, x)), ("Q4_0", (1, 2, 16, bytes(2 * 9), None, x[:, :16])),
             ("Q8_0", (1, 2, 32, bytes(inf_d), None, x)), ("Q4_1", (1, 2, 32, bytes(nan_m), None, x))]
    statuses = [r["status"] for r in run_wasm(cases)["results"]]
    unknown = run_wasm([("Q8_0", (1, 2, 32, bytes(2 * 34), None, x))], fmt_code=7)["results"][0]["status"]
    assert statuses[0] != 0 and statuses[1] != 0 and unknown != 0, (statuses, unknown)
    assert statuses[2:] == [4, 4]           # ERR_MODEL_LOAD (wasm/wasm_status.h)


def test_the_kernels_tables_are_generated_from_the_twin():
    """wasm/qact_table.h and the table in shaders/quantize_act.wgsl are tools/gen_qact_table.py's
    output of the twin's ACT_SCALE / ACT_STEP; a hand edit of either is caught."""
    import subprocess
    import sys
    gen = REPO_ROOT / "tools" / "gen_qact_table.py"
    assert subprocess.run([sys.executable, str(gen), "--check"], capture_output=True).returncode == 0
    assert qt.ACT_SCALE[0] == np.float32(8128 / 65) and qt.ACT_SCALE[63] == np.float32(63.5)
    assert (qt.ACT_SCALE * (1 + (np.arange(64) + 1) / 64) <= 127 * (1 + 2.0 ** -23)).all()   # |x s| < 127.5
