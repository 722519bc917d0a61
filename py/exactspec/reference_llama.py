"""NumPy reference Llama forward pass (CPython only): the accuracy yardstick for every kernel.

Computes Hugging Face `LlamaForCausalLM` semantics with every activation, matmul, softmax and
RoPE angle in float64. Weights are dequantised to float32 values (exact for F16/BF16) and held
as float64 arrays so each matmul is a float64 BLAS call. Used by the orchestrator as the
reference champion and draft through the "runner" protocol:

    vocab_size, max_context, identity, config, from_dir(), forward(token_ids, start_pos), reset()

The KV cache is positional: forward() writes positions [start_pos, start_pos+n) and attends over
[0, start_pos+i]; anything beyond start_pos+n is forgotten, so rollback is just a smaller
start_pos on the next call. See docs/reference_model.md for tolerances and speed.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Sequence

import numpy as np

from .errors import E_BAD_ARGUMENT, E_CONTEXT_OVERFLOW, E_MODEL_LOAD, ExactSpecError
from .safetensors import load_safetensors

# Agreement the tests demand (tests/test_reference_llama.py; docs/reference_model.md explains).
REFERENCE_TOLERANCES = {
    "vs_hf_float64_abs": 1e-9,        # max |logit diff| vs HF run entirely in float64
    "vs_hf_float32_abs": 1e-4,        # max |logit diff| vs stock HF float32
    "block_vs_single_rel": 1e-12,     # n-token block vs n single-token calls, relative to max |logit|
}

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
Q8_WEIGHTS_FILE = "model.q8.safetensors"   # browser weights: int8 per-row linears (docs/browser_contract.md)

# Tensors a checkpoint may carry that the forward pass does not need (old HF exports).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


# ---------------------------------------------------------------------------------------------
# Loading: config, tensors, dtype conversion
# ---------------------------------------------------------------------------------------------

def _load_error(message: str, **detail) -> ExactSpecError:
    return ExactSpecError(E_MODEL_LOAD, message, **detail)


def _tensor_to_float32(name: str, tensor, path: str) -> np.ndarray:
    """Decode one safetensors tensor (F32/F16/BF16) to a float32 array of its declared shape."""
    dtype = str(tensor.dtype).upper()
    shape = tuple(int(d) for d in tensor.shape)
    raw = tensor.data
    if dtype == "F32":
        arr = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        # bfloat16 is the top half of a float32: widen the bits, no rounding involved.
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)
        arr = bits.view(np.float32)
    else:
        raise _load_error(f"tensor {name!r} in {path} has unsupported dtype {dtype} "
                          "(supported: F32, F16, BF16)", tensor=name, file=path)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if arr.size != count:
        raise _load_error(f"tensor {name!r} in {path} holds {arr.size} values, shape {shape} "
                          f"needs {count}", tensor=name, file=path)
    return arr.reshape(shape).astype(np.float32, copy=False)


def _dequantise_q8(raw: dict, path: str) -> dict[str, np.ndarray]:
    """model.q8.safetensors -> float32 tensors under HF names: ``<n>.q8`` int8 (out, in) times
    ``<n>.scale`` float32 (out,) becomes ``<n>`` (the product is formed in float32, as the
    exporter's check does); every other tensor (norms, embedding) is decoded as usual."""
    tensors = {}
    for name, t in raw.items():
        if name.endswith(".scale") and name[:-6] + ".q8" in raw:
            continue
        if not name.endswith(".q8"):
            tensors[name] = _tensor_to_float32(name, t, path)
            continue
        base = name[:-3]
        if str(t.dtype).upper() != "I8" or len(t.shape) != 2:
            raise _load_error(f"tensor {name!r} in {path} must be 2-D I8", tensor=name, file=path)
        scale_t = raw.get(base + ".scale")
        if scale_t is None:
            raise _load_error(f"{path}: {name!r} has no {base + '.scale'!r}", tensor=name, file=path)
        scale = _tensor_to_float32(base + ".scale", scale_t, path)
        rows, cols = (int(d) for d in t.shape)
        if scale.shape != (rows,):
            raise _load_error(f"{path}: {base + '.scale'!r} has shape {scale.shape}, expected ({rows},)",
                              tensor=base + ".scale", file=path)
        q8 = np.frombuffer(t.data, dtype=np.int8)
        if q8.size != rows * cols:
            raise _load_error(f"tensor {name!r} in {path} holds {q8.size} values, shape {t.shape} "
                              f"needs {rows * cols}", tensor=name, file=path)
        tensors[base] = q8.reshape(rows, cols).astype(np.float32) * scale[:, None]
    return tensors


def _rope_theta(config: dict, path: str) -> float:
    """rope_theta from either the legacy keys (rope_theta/rope_scaling) or rope_parameters."""
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    if isinstance(params, dict):
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise _load_error(f"{path}: rope_type {rope_type!r} is not supported "
                              "(only default RoPE)", field="rope_parameters")
        theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    else:
        theta = config.get("rope_theta", 10000.0)
    if scaling is not None:
        scaling_type = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling
        if scaling_type != "default":
            raise _load_error(f"{path}: rope_scaling {scaling!r} is not supported "
                              "(only rope_scaling null)", field="rope_scaling")
    return float(theta)


def _parse_config(config: dict, path: str) -> dict:
    """Validate config.json and return the derived hyper-parameters the forward pass uses."""
    model_type = config.get("model_type", "llama")
    if model_type != "llama":
        raise _load_error(f"{path}: model_type {model_type!r} is not 'llama'", field="model_type")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise _load_error(f"{path}: hidden_act {act!r} is not supported (only silu)", field="hidden_act")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise _load_error(f"{path}: {flag}=true is not supported", field=flag)
    try:
        hidden = int(config["hidden_size"])
        n_heads = int(config["num_attention_heads"])
        hp = {
            "vocab_size": int(config["vocab_size"]),
            "hidden_size": hidden,
            "intermediate_size": int(config["intermediate_size"]),
            "num_layers": int(config["num_hidden_layers"]),
            "num_heads": n_heads,
            "num_kv_heads": int(config.get("num_key_value_heads") or n_heads),
            "head_dim": int(config.get("head_dim") or hidden // n_heads),
            "rms_norm_eps": float(config.get("rms_norm_eps", 1e-6)),
            "max_context": int(config["max_position_embeddings"]),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        }
    except KeyError as exc:
        raise _load_error(f"{path}: missing config field {exc.args[0]!r}", field=exc.args[0]) from None
    except (TypeError, ValueError) as exc:
        raise _load_error(f"{path}: malformed config field ({exc})") from None
    hp["rope_theta"] = _rope_theta(config, path)
    if hp["num_heads"] % hp["num_kv_heads"] != 0:
        raise _load_error(f"{path}: num_attention_heads {hp['num_heads']} is not a multiple of "
                          f"num_key_value_heads {hp['num_kv_heads']}", field="num_key_value_heads")
    if hp["head_dim"] % 2 != 0:
        raise _load_error(f"{path}: head_dim {hp['head_dim']} must be even for RoPE", field="head_dim")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "max_context"):
        if hp[key] <= 0:
            raise _load_error(f"{path}: {key} must be positive, got {hp[key]}", field=key)
    return hp


def _expected_shapes(hp: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor name the checkpoint must hold, with its HF (out_features, in_features) shape."""
    d, f, v = hp["hidden_size"], hp["intermediate_size"], hp["vocab_size"]
    q_dim = hp["num_heads"] * hp["head_dim"]
    kv_dim = hp["num_kv_heads"] * hp["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    for i in range(hp["num_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q_dim, d),
            p + "self_attn.k_proj.weight": (kv_dim, d),
            p + "self_attn.v_proj.weight": (kv_dim, d),
            p + "self_attn.o_proj.weight": (d, q_dim),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        })
    if not hp["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    return shapes


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Math: the float64 building blocks (HF semantics)
# ---------------------------------------------------------------------------------------------

def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * weight, row-wise. x: (n, D) float64."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x * (1.0 / np.sqrt(variance + eps)))


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """(head_dim/2,) float64: theta^(-2i/head_dim), HF's default RoPE frequencies."""
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """HF rotate_half convention: x*cos + rotate_half(x)*sin, halves (not interleaved pairs).

    x: (n, heads, head_dim); cos, sin: (n, 1, head_dim) with the half-table repeated twice.
    """
    half = x.shape[-1] // 2
    rotated = np.concatenate((-x[..., half:], x[..., :half]), axis=-1)
    return x * cos + rotated * sin


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Stable softmax over the last axis; -inf entries (masked) become exact zeros."""
    peak = np.max(scores, axis=-1, keepdims=True)
    e = np.exp(scores - peak)
    return e / np.sum(e, axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------

class LlamaReference:
    """Float64 Llama forward pass with a positional KV cache (see module docstring)."""

    def __init__(self, config: dict, tensors: dict[str, np.ndarray], identity: str,
                 source: str = "<memory>"):
        hp = _parse_config(config, source)
        self.config = dict(config)
        self.identity = identity
        self.vocab_size = hp["vocab_size"]
        self.max_context = hp["max_context"]
        self._hp = hp
        self._load_weights(tensors, source)
        self._inv_freq = rope_inv_freq(hp["head_dim"], hp["rope_theta"])  # (head_dim/2,)
        self._scale = hp["head_dim"] ** -0.5   # same Python expression HF uses
        self.reset()

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_dir(cls, model_dir, weights: str = "f32") -> "LlamaReference":
        """Load config.json + model.safetensors, or with weights="q8" model.q8.safetensors
        dequantised as the browser champion sees it (``W = q8 * scale[:, None]`` in float32)."""
        if weights not in ("f32", "q8"):
            raise ExactSpecError(E_BAD_ARGUMENT, f"weights must be 'f32' or 'q8', got {weights!r}")
        model_dir = os.fspath(model_dir)
        config_path = os.path.join(model_dir, CONFIG_FILE)
        weights_path = os.path.join(model_dir, WEIGHTS_FILE if weights == "f32" else Q8_WEIGHTS_FILE)
        for p in (config_path, weights_path):
            if not os.path.isfile(p):
                raise _load_error(f"model file not found: {p}", file=p)
        try:
            with open(config_path, "r", encoding="utf-8") as fh:
                config = json.load(fh)
        except (OSError, ValueError) as exc:
            raise _load_error(f"cannot read {config_path}: {exc}", file=config_path) from None
        if not isinstance(config, dict):
            raise _load_error(f"{config_path} is not a JSON object", file=config_path)
        try:
            raw = load_safetensors(weights_path)
        except ExactSpecError:
            raise
        except Exception as exc:  # the reader's own failure, re-coded for callers
            raise _load_error(f"cannot read {weights_path}: {exc}", file=weights_path) from None
        if weights == "q8":
            tensors = _dequantise_q8(raw, weights_path)
        else:
            tensors = {name: _tensor_to_float32(name, t, weights_path) for name, t in raw.items()}
        return cls(config, tensors, _sha256_file(weights_path), source=weights_path)

    def _load_weights(self, tensors: dict[str, np.ndarray], source: str) -> None:
        hp = self._hp
        expected = _expected_shapes(hp)
        for name in tensors:
            if name.endswith(".bias"):
                raise _load_error(f"{source}: bias tensor {name!r} is not supported", tensor=name, file=source)
            if name not in expected and not name.endswith(_IGNORED_SUFFIXES):
                if name == "lm_head.weight":
                    continue  # tied checkpoints may still carry a copy; HF ties it to embed_tokens
                raise _load_error(f"{source}: unexpected tensor {name!r}", tensor=name, file=source)
        for name, shape in expected.items():
            if name not in tensors:
                raise _load_error(f"{source}: missing tensor {name!r}", tensor=name, file=source)
            got = tuple(tensors[name].shape)
            if got != shape:
                raise _load_error(f"{source}: tensor {name!r} has shape {got}, expected {shape}",
                                  tensor=name, file=source)

        def w64(name: str) -> np.ndarray:
            return np.asarray(tensors[name], dtype=np.float32).astype(np.float64)

        def linear(name: str) -> np.ndarray:
            # HF stores (out, in); keep (in, out) contiguous so x @ W is one BLAS call.
            return np.ascontiguousarray(w64(name).T)

        self._embed = w64("model.embed_tokens.weight")                      # (V, D)
        self._final_norm = w64("model.norm.weight")                         # (D,)
        head = "model.embed_tokens.weight" if hp["tie_word_embeddings"] else "lm_head.weight"
        self._lm_head = linear(head)                                        # (D, V)
        self._layers = []
        for i in range(hp["num_layers"]):
            p = f"model.layers.{i}."
            # q|k|v and gate|up are fused column-wise: one BLAS call each, same dot products.
            self._layers.append({
                "attn_norm": w64(p + "input_layernorm.weight"),            # (D,)
                "mlp_norm": w64(p + "post_attention_layernorm.weight"),    # (D,)
                "w_qkv": np.concatenate([linear(p + "self_attn.q_proj.weight"),
                                         linear(p + "self_attn.k_proj.weight"),
                                         linear(p + "self_attn.v_proj.weight")], axis=1),
                                                                           # (D, (H+2KV)*hd)
                "w_o": linear(p + "self_attn.o_proj.weight"),              # (H*hd, D)
                "w_gate_up": np.concatenate([linear(p + "mlp.gate_proj.weight"),
                                             linear(p + "mlp.up_proj.weight")], axis=1),
                                                                           # (D, 2F)
                "w_down": linear(p + "mlp.down_proj.weight"),              # (F, D)
            })

    # -- cache --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every cached position."""
        self.length = 0   # materialised cache length: positions [0, length) are valid
        self._capacity = 0
        self._k_cache: list[np.ndarray] = []   # per layer (KV, capacity, hd), keys after RoPE
        self._v_cache: list[np.ndarray] = []   # per layer (KV, capacity, hd)

    def _ensure_capacity(self, needed: int) -> None:
        if needed <= self._capacity:
            return
        cap = min(self.max_context, max(needed, 2 * self._capacity, 64))
        hp = self._hp
        shape = (hp["num_kv_heads"], cap, hp["head_dim"])
        new_k, new_v = [], []
        for layer in range(hp["num_layers"]):
            k = np.zeros(shape, dtype=np.float64)
            v = np.zeros(shape, dtype=np.float64)
            if self._capacity:
                k[:, : self.length] = self._k_cache[layer][:, : self.length]
                v[:, : self.length] = self._v_cache[layer][:, : self.length]
            new_k.append(k)
            new_v.append(v)
        self._k_cache, self._v_cache, self._capacity = new_k, new_v, cap

    # -- forward ------------------------------------------------------------------------------

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        """Logits (n, V) float64 for positions [start_pos, start_pos+n), updating the cache."""
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise ExactSpecError(E_BAD_ARGUMENT, f"token_ids must be a non-empty 1-D sequence, got shape {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ExactSpecError(E_BAD_ARGUMENT, f"token_ids must be integers, got dtype {ids.dtype}")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ExactSpecError(E_BAD_ARGUMENT, f"token id out of range [0, {self.vocab_size})")
        start_pos = int(start_pos)
        if start_pos < 0 or start_pos > self.length:
            raise ExactSpecError(E_BAD_ARGUMENT, f"start_pos {start_pos} outside [0, {self.length}] "
                                 "(cannot skip uncached positions)")
        n = int(ids.size)
        end = start_pos + n
        if end > self.max_context:
            raise ExactSpecError(E_CONTEXT_OVERFLOW, f"positions up to {end} exceed max_context "
                                 f"{self.max_context}", needed=end, limit=self.max_context)
        self._ensure_capacity(end)
        hp = self._hp
        n_heads, n_kv, hd = hp["num_heads"], hp["num_kv_heads"], hp["head_dim"]
        group = n_heads // n_kv
        eps = hp["rms_norm_eps"]

        angles = np.arange(start_pos, end, dtype=np.float64)[:, None] * self._inv_freq[None, :]
        angles = np.concatenate((angles, angles), axis=-1)[:, None, :]   # (n, 1, hd)
        cos, sin = np.cos(angles), np.sin(angles)
        # causal mask over the T = end cached positions: query i sees keys [0, start_pos+i]
        key_pos = np.arange(end)[None, :]                                 # (1, T)
        query_pos = np.arange(start_pos, end)[:, None]                    # (n, 1)
        mask = np.where(key_pos <= query_pos, 0.0, -np.inf)               # (n, T)

        q_dim, kv_dim, f_dim = n_heads * hd, n_kv * hd, hp["intermediate_size"]
        x = self._embed[ids]                                              # (n, D)
        for layer, w in enumerate(self._layers):
            qkv = rms_norm(x, w["attn_norm"], eps) @ w["w_qkv"]               # (n, (H+2KV)*hd)
            q = apply_rope(qkv[:, :q_dim].reshape(n, n_heads, hd), cos, sin)  # (n, H, hd)
            k = apply_rope(qkv[:, q_dim:q_dim + kv_dim].reshape(n, n_kv, hd), cos, sin)  # (n, KV, hd)
            v = qkv[:, q_dim + kv_dim:].reshape(n, n_kv, hd)                  # (n, KV, hd)
            k_cache, v_cache = self._k_cache[layer], self._v_cache[layer]
            k_cache[:, start_pos:end] = k.transpose(1, 0, 2)
            v_cache[:, start_pos:end] = v.transpose(1, 0, 2)
            # query head h uses kv head h // group (HF repeat_kv order)
            qg = q.reshape(n, n_kv, group, hd).transpose(1, 2, 0, 3)          # (KV, G, n, hd)
            keys = k_cache[:, None, :end]                                     # (KV, 1, T, hd)
            values = v_cache[:, None, :end]                                   # (KV, 1, T, hd)
            scores = (qg @ keys.transpose(0, 1, 3, 2)) * self._scale + mask   # (KV, G, n, T)
            attn = softmax_rows(scores) @ values                              # (KV, G, n, hd)
            attn = attn.transpose(2, 0, 1, 3).reshape(n, q_dim)               # (n, H*hd)
            x = x + attn @ w["w_o"]
            gate_up = rms_norm(x, w["mlp_norm"], eps) @ w["w_gate_up"]        # (n, 2F)
            x = x + (silu(gate_up[:, :f_dim]) * gate_up[:, f_dim:]) @ w["w_down"]
        self.length = end   # positions beyond end from earlier calls are forgotten
        return rms_norm(x, self._final_norm, eps) @ self._lm_head        # (n, V)
