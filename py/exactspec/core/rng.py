"""Addressed randomness: Threefry-2x32-20, (seed, domain, round, position, token) -> bits -> floats -> samplers."""
from __future__ import annotations

import math
import operator
from typing import Sequence

from .errors import E_BAD_ARGUMENT, E_PROCESSOR_INVALID, ExactSpecError

# Pure Python at module level: this file also runs in Pyodide. NumPy twins import numpy lazily.
# The full recipe (bit for bit) is in docs/rng.md; bump RNG_VERSION if any of it changes.
RNG_VERSION = "threefry2x32-20/addr-v1/float-v1/plog-v1"

# ---------------------------------------------------------------- domains (stable ids, never change)
DRAFT_SAMPLE = 1
ACCEPT_UNIFORM = 2
CORRECTION_SAMPLE = 3
TARGET_EXTRA = 4
TARGET_BASELINE = 5
DOMAIN_NAMES = {
    DRAFT_SAMPLE: "draft_sample",
    ACCEPT_UNIFORM: "accept_uniform",
    CORRECTION_SAMPLE: "correction_sample",
    TARGET_EXTRA: "target_extra",
    TARGET_BASELINE: "target_baseline",
}
DOMAIN_IDS = {name: i for i, name in DOMAIN_NAMES.items()}

# ---------------------------------------------------------------- Threefry-2x32 (Random123)
_M32 = 0xFFFFFFFF
_PARITY = 0x1BD11BDA                                # Skein key-schedule parity constant
_ROT = (13, 15, 26, 6, 17, 29, 16, 24)              # Random123 R_32x2_{0..7}_0
_ROUNDS = 20


def _threefry(k0: int, k1: int, c0: int, c1: int, rounds: int = _ROUNDS) -> tuple[int, int]:
    ks = (k0, k1, _PARITY ^ k0 ^ k1)
    x0 = (c0 + k0) & _M32
    x1 = (c1 + k1) & _M32
    for r in range(rounds):
        x0 = (x0 + x1) & _M32
        rot = _ROT[r % 8]
        x1 = ((x1 << rot) | (x1 >> (32 - rot))) & _M32
        x1 ^= x0
        if r % 4 == 3:                              # key injection s after every 4th round
            s = (r + 1) // 4
            x0 = (x0 + ks[s % 3]) & _M32
            x1 = (x1 + ks[(s + 1) % 3] + s) & _M32
    return x0, x1


def _check_u(name: str, value, bits: int) -> int:
    try:
        v = operator.index(value)                   # int or NumPy integer; rejects floats
    except TypeError:
        v = -1
    if isinstance(value, bool) or not 0 <= v < (1 << bits):
        raise ExactSpecError(E_BAD_ARGUMENT, f"{name} must be an integer in [0, 2^{bits}), got {value!r}")
    return v


def threefry2x32(key: tuple[int, int], counter: tuple[int, int]) -> tuple[int, int]:
    """Threefry-2x32 with 20 rounds; all words uint32. Matches Random123's threefry2x32_R(20, ...)."""
    k0, k1 = (_check_u("key", k, 32) for k in key)
    c0, c1 = (_check_u("counter", c, 32) for c in counter)
    return _threefry(k0, k1, c0, c1)


def _as_u32_array(np, name: str, values):
    a = np.asarray(values)
    if a.dtype == np.uint32:
        return a
    if a.dtype.kind not in "iu" or (a.size and (a.min() < 0 or a.max() > _M32)):
        raise ExactSpecError(E_BAD_ARGUMENT, f"{name} must hold integers in [0, 2^32)")
    return a.astype(np.uint32)


def threefry2x32_np(key: tuple[int, int], counters_x0, counters_x1):
    """NumPy twin of threefry2x32 over broadcast counter arrays -> (x0, x1) uint32 arrays, bit-identical."""
    import numpy as np

    k0, k1 = (_check_u("key", k, 32) for k in key)
    c0 = _as_u32_array(np, "counters_x0", counters_x0)
    c1 = _as_u32_array(np, "counters_x1", counters_x1)
    c0, c1 = np.broadcast_arrays(c0, c1)
    shape = c0.shape
    # 1-D copies: uint32 array arithmetic wraps mod 2^32 silently (0-d scalars would warn).
    x0 = c0.reshape(-1).copy()
    x1 = c1.reshape(-1).copy()
    ks = (np.uint32(k0), np.uint32(k1), np.uint32(_PARITY ^ k0 ^ k1))
    x0 += ks[0]
    x1 += ks[1]
    for r in range(_ROUNDS):
        x0 += x1
        rot = _ROT[r % 8]
        x1 = (x1 << np.uint32(rot)) | (x1 >> np.uint32(32 - rot))
        x1 ^= x0
        if r % 4 == 3:
            s = (r + 1) // 4
            x0 += ks[s % 3]
            x1 += ks[(s + 1) % 3]
            x1 += np.uint32(s)
    return x0.reshape(shape), x1.reshape(shape)


# ---------------------------------------------------------------- addressed draws
def _check_address(seed, domain, round_id) -> tuple[int, int, int]:
    seed = _check_u("seed", seed, 64)
    if isinstance(domain, bool) or domain not in DOMAIN_NAMES:
        raise ExactSpecError(E_BAD_ARGUMENT, f"domain must be one of {sorted(DOMAIN_NAMES)}, got {domain!r}")
    return seed, int(domain), _check_u("round_id", round_id, 32)


def round_key(seed: int, domain: int, round_id: int) -> tuple[int, int]:
    """Level 1: per-(seed, domain, round) key = threefry(key=(seed lo, seed hi), counter=(domain, round))."""
    seed, domain, round_id = _check_address(seed, domain, round_id)
    return _threefry(seed & _M32, seed >> 32, domain, round_id)


def draw_bits(seed: int, domain: int, round_id: int, position: int, token: int) -> int:
    """Level 2: 32 bits for one address = threefry(round_key, counter=(position, token))[0]."""
    k0, k1 = round_key(seed, domain, round_id)
    return _threefry(k0, k1, _check_u("position", position, 32), _check_u("token", token, 32))[0]


def draw_bits_np(seed: int, domain: int, round_id: int, positions, tokens):
    """NumPy twin of draw_bits over broadcast positions x tokens -> uint32 array."""
    return threefry2x32_np(round_key(seed, domain, round_id), positions, tokens)[0]


def draw_bits_row_np(seed: int, domain: int, round_id: int, position: int, vocab_size: int):
    """Bits for every token of one position -> uint32 array (vocab_size,)."""
    import numpy as np

    position = _check_u("position", position, 32)
    vocab_size = _check_u("vocab_size", vocab_size, 32)
    return draw_bits_np(seed, domain, round_id, np.uint32(position), np.arange(vocab_size, dtype=np.uint32))


# ---------------------------------------------------------------- bits -> floats (exact in f32 and f64)
_TWO_M24 = 2.0 ** -24


def uniform_open_closed(bits: int) -> float:
    """(0, 1]: ((bits >> 8) + 1) * 2^-24; 24-bit integer numerator, exact in float32."""
    return ((bits >> 8) + 1) * _TWO_M24


def uniform_open_open(bits: int) -> float:
    """(0, 1): (((bits >> 9) << 1) + 1) * 2^-24; odd numerator in [1, 2^24 - 1], exact in float32."""
    return (((bits >> 9) << 1) + 1) * _TWO_M24


def uniform_open_closed_np(bits):
    import numpy as np

    return ((np.asarray(bits, dtype=np.uint32) >> np.uint32(8)).astype(np.float64) + 1.0) * _TWO_M24


def uniform_open_open_np(bits):
    import numpy as np

    b = np.asarray(bits, dtype=np.uint32) >> np.uint32(9)
    return (b.astype(np.float64) * 2.0 + 1.0) * _TWO_M24


# ---------------------------------------------------------------- portable log (basic IEEE ops only)
# libm log differs by an ulp between glibc, musl (Pyodide) and NumPy's SIMD loops; Gumbel scores
# must agree bit for bit between the scalar and NumPy paths, so log is built from frexp, +, -, *, /.
_SQRT_HALF = 0.7071067811865476                     # double nearest sqrt(1/2)
_LN2_HI = 6.93147180369123816490e-01                # fdlibm ln2_hi: e * _LN2_HI exact for |e| < 2^11
_LN2_LO = 1.90821492927058770002e-10                # fdlibm ln2_lo
_PLOG_C = tuple(1.0 / (2 * k + 3) for k in range(12))  # atanh series 1/3, 1/5, ..., 1/25


def portable_log(x: float) -> float:
    """Natural log of a finite x > 0 within ~1 ulp; bitwise reproducible (recipe in docs/rng.md)."""
    m, e = math.frexp(x)                            # x = m * 2^e, m in [0.5, 1)
    if m < _SQRT_HALF:
        m *= 2.0
        e -= 1                                      # m in [sqrt(1/2), sqrt(2))
    f = m - 1.0                                     # exact (Sterbenz)
    s = f / (2.0 + f)
    z = s * s
    p = _PLOG_C[11]
    for c in _PLOG_C[10::-1]:
        p = p * z + c
    t = 2.0 * s
    log_m = t + t * (z * p)
    return e * _LN2_HI + (log_m + e * _LN2_LO)


def portable_log_np(x):
    """NumPy twin of portable_log; bit-identical elementwise (x: float64 array, finite, > 0)."""
    import numpy as np

    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    small = m < _SQRT_HALF
    m = np.where(small, m * 2.0, m)
    e = (e - small).astype(np.float64)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    p = np.full_like(z, _PLOG_C[11])
    for c in _PLOG_C[10::-1]:
        p = p * z + c
    t = 2.0 * s
    log_m = t + t * (z * p)
    return e * _LN2_HI + (log_m + e * _LN2_LO)


def gumbel(bits: int) -> float:
    """Standard Gumbel: -log(-log(u)), u = uniform_open_open(bits); finite, in [-2.82, 16.64]."""
    return -portable_log(-portable_log(uniform_open_open(bits)))


def gumbel_np(bits):
    return -portable_log_np(-portable_log_np(uniform_open_open_np(bits)))


# ---------------------------------------------------------------- samplers
def uniform_accept(seed: int, round_id: int, position: int) -> float:
    """The accept-test uniform u in (0, 1] for (round, position); accept iff u <= accept_probability."""
    return uniform_open_closed(draw_bits(seed, ACCEPT_UNIFORM, round_id, position, 0))


def sample_gumbel_max(weights: Sequence[float], seed: int, domain: int, round_id: int, position: int) -> int:
    """argmax_x over weights[x] > 0 of log w(x) + G(x); ties -> lowest id. Weights need not sum to 1."""
    k0, k1 = round_key(seed, domain, round_id)
    position = _check_u("position", position, 32)
    best, best_score = -1, -math.inf
    for x, w in enumerate(weights):
        w = float(w)
        if not (0.0 <= w < math.inf):
            raise ExactSpecError(E_PROCESSOR_INVALID, f"weight {x} is {w!r}; need finite and >= 0", token=x)
        if w == 0.0:
            continue
        score = portable_log(w) + gumbel(_threefry(k0, k1, position, x)[0])
        if score > best_score:
            best, best_score = x, score
    if best < 0:
        raise ExactSpecError(E_PROCESSOR_INVALID, "no valid token: no positive finite weight")
    return best


def sample_gumbel_max_np(weights, seed: int, domain: int, round_id: int, position: int) -> int:
    """NumPy twin of sample_gumbel_max (weights: (V,) float) -> the same index, bit for bit."""
    import numpy as np

    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise ExactSpecError(E_BAD_ARGUMENT, f"weights must be 1-D, got shape {w.shape}")
    bad = ~((w >= 0.0) & (w < np.inf))
    if bad.any():
        x = int(np.argmax(bad))
        raise ExactSpecError(E_PROCESSOR_INVALID, f"weight {x} is {w[x]!r}; need finite and >= 0", token=x)
    positive = w > 0.0
    if not positive.any():
        raise ExactSpecError(E_PROCESSOR_INVALID, "no valid token: no positive finite weight")
    bits = draw_bits_row_np(seed, domain, round_id, position, w.shape[0])     # (V,) uint32
    score = np.full(w.shape, -np.inf)                                         # (V,) float64
    score[positive] = portable_log_np(w[positive]) + gumbel_np(bits[positive])
    return int(np.argmax(score))                                              # first max = lowest id
