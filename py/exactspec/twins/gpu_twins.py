"""NumPy twins of the champion's WebGPU kernels (shaders/<name>.wgsl): same names, float64 math.

Each twin takes the kernel's inputs as arrays (the f32/int8 values the GPU sees) and returns what
the kernel writes, computed in float64 with the reference Llama's building blocks
(py/exactspec/reference/reference_llama.py). tests/test_gpu_champion.py compares kernel and twin within
tests/tolerances.py. Shapes: n = block rows, H = hidden, F = intermediate, hd = head_dim.
"""
from __future__ import annotations

import numpy as np

from ..reference.reference_llama import apply_rope, rms_norm, rope_inv_freq, silu, softmax_rows


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def embed_gather(embed, ids) -> np.ndarray:
    """embed (V, H), ids (n,) -> (n, H): exact rows."""
    return _f64(embed)[np.asarray(ids, dtype=np.int64)]


def rmsnorm_f32(x, weight, eps: float) -> np.ndarray:
    """x (n, H), weight (H,) -> (n, H)."""
    return rms_norm(_f64(x), _f64(weight), eps)


def matmul_q8(q8, scale, x, residual=None) -> np.ndarray:
    """q8 (out, in) int8, scale (out,), x (n, in) -> (n, out) = x @ (q8 * scale[:, None])^T,
    plus residual (n, out) when given (the kernel's Meta.accumulate)."""
    y = (_f64(x) @ _f64(q8).T) * _f64(scale)[None, :]
    return y if residual is None else _f64(residual) + y


def matmul_f32(weight, x, residual=None) -> np.ndarray:
    """weight (out, in) f32, x (n, in) -> (n, out) = x @ weight^T, plus residual (n, out) when
    given (Meta.accumulate). Every f32 linear: layer linears and the LM head (tied: the embedding)."""
    y = _f64(x) @ _f64(weight).T
    return y if residual is None else _f64(residual) + y


def rope_table(max_context: int, head_dim: int, theta: float) -> np.ndarray:
    """(max_context, hd/2, 2) float64 (cos, sin): the table champion.mjs uploads (as float32)."""
    angles = np.arange(max_context, dtype=np.float64)[:, None] * rope_inv_freq(head_dim, theta)[None, :]
    return np.stack((np.cos(angles), np.sin(angles)), axis=-1)


def rope_qkv(qkv, start_pos: int, heads: int, kv_heads: int, head_dim: int, theta: float):
    """qkv (n, (heads + 2 KV) hd) -> (q (n, heads, hd), k (n, KV, hd), v (n, KV, hd)): q and k
    rotated at positions start_pos + j (HF rotate_half); rope_qkv writes k, v to the cache."""
    qkv = _f64(qkv)
    n = qkv.shape[0]
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    angles = np.arange(start_pos, start_pos + n, dtype=np.float64)[:, None] * rope_inv_freq(head_dim, theta)
    angles = np.concatenate((angles, angles), axis=-1)[:, None, :]      # (n, 1, hd)
    cos, sin = np.cos(angles), np.sin(angles)
    q = apply_rope(qkv[:, :q_dim].reshape(n, heads, head_dim), cos, sin)
    k = apply_rope(qkv[:, q_dim:q_dim + kv_dim].reshape(n, kv_heads, head_dim), cos, sin)
    v = qkv[:, q_dim + kv_dim:].reshape(n, kv_heads, head_dim)
    return q, k, v


def attention_scores(q, k_cache, start_pos: int) -> list[np.ndarray]:
    """q (n, heads, hd); k_cache (T, KV, hd) of one layer -> per query row j a (heads, keys_j)
    array of q.k * hd**-0.5 over keys [0, start_pos + j]; head h reads kv head h // (heads / KV)."""
    q, k_cache = _f64(q), _f64(k_cache)
    n, heads, hd = q.shape
    group = heads // k_cache.shape[1]
    out = []
    for j in range(n):
        keys = k_cache[:start_pos + j + 1]                                   # (keys, KV, hd)
        out.append(np.stack([keys[:, h // group] @ q[j, h] for h in range(heads)]) * hd ** -0.5)
    return out


def attention_softmax(scores) -> list[np.ndarray]:
    """Per query row: stable softmax over its keys (rows of (heads, keys_j))."""
    return [softmax_rows(_f64(s)) for s in scores]


def attention_values(probs, v_cache) -> np.ndarray:
    """Per query row probs (heads, keys_j); v_cache (T, KV, hd) -> (n, heads * hd)."""
    v_cache = _f64(v_cache)
    heads, group = probs[0].shape[0], probs[0].shape[0] // v_cache.shape[1]
    rows = [np.stack([p[h] @ v_cache[:p.shape[1], h // group] for h in range(heads)]).reshape(-1) for p in probs]
    return np.stack(rows)


def attention(q, k_cache, v_cache, start_pos: int) -> np.ndarray:
    """The three attention kernels composed: causal GQA attention, (n, heads * hd)."""
    return attention_values(attention_softmax(attention_scores(q, k_cache, start_pos)), v_cache)


def swiglu_f32(gate_up) -> np.ndarray:
    """gate_up (n, 2F) -> (n, F) = silu(gate) * up."""
    gate_up = _f64(gate_up)
    f = gate_up.shape[1] // 2
    return silu(gate_up[:, :f]) * gate_up[:, f:]


def embed_gather_q8(q8, scale, ids) -> np.ndarray:
    """q8 (V, H) int8, scale (V,) f32, ids (n,) -> (n, H): the float32 product q8 * scale (exact
    as the reference dequantises it), as float64."""
    ids = np.asarray(ids, dtype=np.int64)
    return (np.asarray(q8)[ids].astype(np.float32) * np.asarray(scale, np.float32)[ids, None]).astype(np.float64)


def bias_add_f32(y, bias) -> np.ndarray:
    """y (n, rows), bias (rows,) -> y + bias."""
    return _f64(y) + _f64(bias)[None, :]
