"""NumPy float32 twins of the WebGPU acceptor kernels (shaders/*.wgsl, web/gpu/accept.mjs).

Same names as the kernels, same float32 recipes and the same fixed summation order, so tests
can tell a kernel bug from float32-vs-float64 rounding. `plog_f32`, `gumbel_f32` and
`wg_sum_f32` repeat the kernels operation by operation (only IEEE +, -, *, /, frexp), so they
are expected to match the GPU bit for bit; `processors_rows` uses NumPy's float32 exp, which
may differ from the device exp by an ulp. The float64 references stay `exactspec.reference.processors`
and `exactspec.core.acceptance`; these twins are not used by the engine.
"""
from __future__ import annotations

import numpy as np

from ..core import rng

WG = 4                                                         # the kernels' default on SwiftShader (V <= 32768)
MAX_PER = 8192                                                 # private floats per invocation (accept.mjs)


def workgroup_size(V: int) -> int:
    """The acceptor's default on SwiftShader: the smallest of 4, 16, 64, 256 with ceil(V / WG) <= MAX_PER."""
    return next((wg for wg in (4, 16, 64, 256) if -(-V // wg) <= MAX_PER), 256)
NONE = 0xFFFFFFFF
ROW_INVALID = 1
ROW_NEAR_TOP_P = 2
TOP_P_NEAR = np.float32(1e-5)
FLT_MIN_NORMAL = np.float32(1.17549435e-38)
_F = np.float32
_PLOG_C = [_F(1.0 / (2 * k + 3)) for k in range(12)]          # f32 nearest 1/3 .. 1/25
_SQRT_HALF = _F(0.70710677)
_LN2_HI = _F(0.693145751953125)
_LN2_LO = _F(1.4286068e-06)


# ---------------------------------------------------------------- sample_gumbel.wgsl
def plog_f32(x):
    """The portable log of docs/rng.md in float32 (shaders/sample_gumbel.wgsl), elementwise."""
    x = np.asarray(x, dtype=np.float32)
    m, e = np.frexp(x)                                         # m float32 in [0.5, 1)
    small = m < _SQRT_HALF
    m = np.where(small, m * _F(2.0), m).astype(np.float32)
    e = (e - small).astype(np.float32)
    f = m - _F(1.0)
    s = f / (_F(2.0) + f)
    z = s * s
    p = np.full_like(z, _PLOG_C[11])
    for c in _PLOG_C[10::-1]:
        p = p * z + c
    t = _F(2.0) * s
    log_m = t + t * (z * p)
    return e * _LN2_HI + (log_m + e * _LN2_LO)


def uniform_open_open_f32(bits):
    return (((np.asarray(bits, np.uint32) >> np.uint32(9)) << np.uint32(1)) + np.uint32(1)).astype(np.float32) \
        * _F(2.0 ** -24)


def uniform_open_closed_f32(bits):
    return ((np.asarray(bits, np.uint32) >> np.uint32(8)) + np.uint32(1)).astype(np.float32) * _F(2.0 ** -24)


def gumbel_f32(bits):
    """-plog_f32(-plog_f32(uniform_open_open(bits))) in float32."""
    return -plog_f32(-plog_f32(uniform_open_open_f32(bits)))


# ---------------------------------------------------------------- threefry_bits.wgsl
def threefry_bits(addrs):
    """(n, 8) u32 addresses (seed_lo, seed_hi, domain, round, position, token, weight f32 bits, 0)
    -> (n, 8) u32 words (k0, k1, bits, x1, u_oc, u_oo, gumbel_f32, plog_f32(weight)), bit for bit."""
    a = np.asarray(addrs, np.uint32).reshape(-1, 8)
    out = np.zeros_like(a)
    for r, row in enumerate(a):                                 # level 1 unvalidated: KATs use any words
        k0, k1 = rng._threefry(int(row[0]), int(row[1]), int(row[2]), int(row[3]))
        out[r, :4] = (k0, k1) + rng._threefry(k0, k1, int(row[4]), int(row[5]))
    out[:, 4] = uniform_open_closed_f32(out[:, 2]).view(np.uint32)
    out[:, 5] = uniform_open_open_f32(out[:, 2]).view(np.uint32)
    out[:, 6] = gumbel_f32(out[:, 2]).view(np.uint32)
    with np.errstate(all="ignore"):
        out[:, 7] = plog_f32(a[:, 6].view(np.float32)).view(np.uint32)
    return out


# ---------------------------------------------------------------- accept_common.wgsl
def _lanes(values, fill, wg=WG):
    """(V,) -> (PER, wg): element [i, t] is token t + i * wg (padding = fill)."""
    v = np.asarray(values)
    per = -(-v.shape[0] // wg)
    out = np.full(per * wg, fill, dtype=v.dtype)
    out[: v.shape[0]] = v
    return out.reshape(per, wg)


def wg_sum_f32(values, wg=WG):
    """The kernels' fixed-order float32 sum of a (V,) vector (padding contributes 0)."""
    gs = int(round(wg ** 0.5))
    lanes = _lanes(np.asarray(values, np.float32), _F(0.0), wg)
    local = np.zeros(wg, np.float32)
    for i in range(lanes.shape[0]):                            # each invocation, sequentially over i
        local = local + lanes[i]
    groups = np.zeros(gs, np.float32)
    for t in range(gs):                                        # gs groups of gs consecutive invocations
        groups = groups + local.reshape(gs, gs)[:, t]
    total = _F(0.0)
    for g in groups:
        total = _F(total + g)
    return total


# ---------------------------------------------------------------- processors_rows.wgsl
def _process_row(x, ctx, policy, greedy):
    """One row in float32 by the kernel's recipe -> (probs f32 (V,), status, argmax)."""
    V = x.shape[0]
    wg = workgroup_size(V)
    ids = np.arange(V)
    bad = bool(np.isnan(x).any() or np.isposinf(x).any())
    x = x.copy()
    masked = np.zeros(V, bool)
    masked[list(policy.suppress_token_ids)] = True
    if policy.grammar is not None:
        allowed = np.zeros(V, bool)
        allowed[list(policy.grammar.allowed_token_ids([]))] = True
        masked |= ~allowed
    x[masked] = -np.inf
    pen = _F(policy.repetition_penalty)
    if policy.repetition_penalty != 1.0 and len(ctx):
        c = np.unique(np.asarray(ctx, np.int64))
        v = x[c]
        fin = np.isfinite(v)
        with np.errstate(over="ignore", invalid="ignore"):
            x[c] = np.where(fin, np.where(v > 0, v / pen, v * pen), v)
    if policy.temperature != 0 and policy.temperature != 1.0:
        with np.errstate(over="ignore", invalid="ignore"):
            x = np.where(np.isfinite(x), x / _F(policy.temperature), x).astype(np.float32)
    if bad or np.isnan(x).any() or np.isposinf(x).any() or not np.isfinite(x).any():
        return np.full(V, np.nan, np.float32), ROW_INVALID, NONE
    if policy.temperature == 0:
        am = int(np.argmax(x))
        p = np.zeros(V, np.float32)
        p[am] = 1.0
        return p, 0, am
    n_finite = int(np.isfinite(x).sum())
    if 0 < policy.top_k < n_finite:
        order = np.lexsort((ids, -x.astype(np.float64)))
        x[order[policy.top_k:]] = -np.inf
    fin = np.isfinite(x)
    e = np.where(fin, np.exp(x - x[fin].max()), _F(0.0)).astype(np.float32)
    p = (e / wg_sum_f32(e, wg)).astype(np.float32)
    status = 0
    if policy.top_p < 1.0:
        top_p = _F(policy.top_p)
        order = np.lexsort((ids, -p.astype(np.float64)))
        cum = np.cumsum(p[order], dtype=np.float32)
        n_keep = min(int(np.searchsorted(cum, top_p, side="left")) + 1, int((p > 0).sum()))
        keep = np.zeros(V, bool)
        keep[order[:n_keep]] = True
        v = p[order[n_keep - 1]]
        mass = wg_sum_f32(np.where(keep, p, 0), wg)
        nxt = p[order[n_keep]] if n_keep < V else _F(0)
        if mass - top_p < TOP_P_NEAR or top_p - (mass - v) < TOP_P_NEAR or (nxt != v and nxt > v * (1 - TOP_P_NEAR)):
            status |= ROW_NEAR_TOP_P
        p = np.where(keep, p, 0).astype(np.float32)
        p = (p / wg_sum_f32(p, wg)).astype(np.float32)
    am = int(np.argmax(p)) if greedy else NONE
    return p, status, am


def processors_rows(logits, context_ids, proposals, policy, greedy=False):
    """(n, V) logits -> (probs f32 (n, V), status (n,), argmax (n,)); row i sees context + proposals[:i]."""
    rows = np.asarray(logits, dtype=np.float32)
    out = [_process_row(rows[i], list(context_ids) + list(proposals[:i]), policy, greedy) for i in range(rows.shape[0])]
    return (np.stack([o[0] for o in out]), np.array([o[1] for o in out]), np.array([o[2] for o in out]))


# ---------------------------------------------------------------- accept_decide.wgsl
def _gumbel_max_f32(w, seed, domain, round_id, position):
    """Gumbel-max in float32 over w >= FLT_MIN -> (token or None, winning score)."""
    w = np.asarray(w, np.float32)
    ok = w >= FLT_MIN_NORMAL
    if not ok.any():
        return None, None
    bits = rng.draw_bits_row_np(seed, domain, round_id, position, w.shape[0])
    score = np.full(w.shape, -np.inf, np.float32)
    score[ok] = plog_f32(w[ok]) + gumbel_f32(bits[ok])
    x = int(np.argmax(score))
    return x, float(score[x])


def accept_decide(probs, status, argmax, p_draft, proposals, seed, round_id, stop_token_ids, remaining, greedy):
    """Float32 twin of the decision kernel -> dict like acceptor.decide()."""
    m = len(proposals)
    res = dict(n_accepted=0, next_token=-1, rejected_at=-1, ended_by="", error_code="")

    def fail(code):
        return dict(n_accepted=0, next_token=-1, rejected_at=-1, ended_by="", error_code=code)

    def sample(w, domain, position, residual):
        x, _ = _gumbel_max_f32(w, seed, domain, round_id, position)
        if x is None:
            return fail("E_RESIDUAL_INVARIANT" if residual else "E_TARGET_NUMERIC_OR_MASK")
        return {**res, "next_token": x}

    if m == 0:
        if status[0] & ROW_INVALID:
            return fail("E_TARGET_NUMERIC_OR_MASK")
        if greedy:
            return {**res, "next_token": int(argmax[0])}
        return sample(probs[0], rng.TARGET_BASELINE, 0, False)
    n = 0
    for i in range(m):
        if status[i] & ROW_INVALID:
            return fail("E_TARGET_NUMERIC_OR_MASK")
        y = proposals[i]
        if greedy:
            if y != argmax[i]:
                return {**res, "n_accepted": n, "next_token": int(argmax[i]), "rejected_at": i}
        else:
            q, p = _F(probs[i][y]), _F(p_draft[i][y])
            a = min(_F(1.0), q / p) if p > 0 else _F(1.0)
            u = uniform_open_closed_f32(rng.draw_bits(seed, rng.ACCEPT_UNIFORM, round_id, i, 0))
            if not u <= a:
                res.update(n_accepted=n, rejected_at=i)
                pd = np.asarray(p_draft[i], np.float32)
                w = np.maximum(np.asarray(probs[i], np.float32) - pd, _F(0.0))
                mass = wg_sum_f32(w, workgroup_size(w.shape[0]))
                if not np.isfinite(pd).all() or not (mass > 0 and np.isfinite(mass)):
                    return fail("E_RESIDUAL_INVARIANT")
                return sample(w, rng.CORRECTION_SAMPLE, i, True)
        n += 1
        if y in stop_token_ids:
            return {**res, "n_accepted": n, "ended_by": "stop"}
        if n == remaining:
            return {**res, "n_accepted": n, "ended_by": "length"}
    if status[m] & ROW_INVALID:
        return fail("E_TARGET_NUMERIC_OR_MASK")
    res["n_accepted"] = m
    if greedy:
        return {**res, "next_token": int(argmax[m])}
    return sample(probs[m], rng.TARGET_EXTRA, 0, False)
