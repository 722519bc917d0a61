"""NumPy reference Llama forward pass (CPython only): the accuracy yardstick for every kernel.

Computes Hugging Face `LlamaForCausalLM` semantics with every activation, matmul, softmax and
RoPE angle in float64. Weights are dequantised to float32 values (exact for F16/BF16) and held
as float64 arrays so each matmul is a float64 BLAS call. Used by the orchestrator as the
reference champion and draft through the "runner" protocol:

    vocab_size, max_context, identity, config, from_dir(), forward(token_ids, start_pos), reset()

The KV cache is positional: forward() writes positions [start_pos, start_pos+n) and attends over
[0, start_pos+i]; anything beyond start_pos+n is forgotten, so rollback is just a smaller
start_pos on the next call. See docs/reference_model.md for tolerances and speed.

`matmul="q8act"` computes every quantised linear (q8 artifact int8 rows, GGUF Q8_0/Q4_0/Q4_1/Q4_K/
Q6_K blocks) with the declared q8act-v1 function on its stored blocks (block_linear.BlockLinear,
the NumPy twin, docs/quant_kernels.md): float32 outputs, every other step in float64 as above.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..core.errors import E_BAD_ARGUMENT, E_CONTEXT_OVERFLOW, E_MODEL_LOAD, ExactSpecError
from ..formats.config import read_json_file, rope_inv_freq as config_rope_inv_freq, validate_config
from .hf import checkpoint_digest, decode_float32, open_checkpoint, open_safetensors_files
from .restricted_vocab import (EMBED_ROWS, HEAD_IDS, INDEX_DTYPE, RESTRICTED_TENSORS, check_restricted_values,
                               decode_index_tensor, restricted_shapes)

# Agreement the tests demand (tests/test_reference_llama.py; docs/reference_model.md explains).
REFERENCE_TOLERANCES = {
    "vs_hf_float64_abs": 1e-9,        # max |logit diff| vs HF run entirely in float64
    "vs_hf_float32_abs": 1e-4,        # max |logit diff| vs stock HF float32
    "block_vs_single_rel": 1e-12,     # n-token block vs n single-token calls, relative to max |logit|
}

# LlamaReference(matmul=...) -> the function's name and version as reported (docs/quant_kernels.md)
MATMUL_FUNCTIONS = {"f32": "f32", "q8act": "q8act-v1"}

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


def _refuse_in(path: str, message: str, tensor: str):
    raise _load_error(f"{path}: {message}", tensor=tensor, file=path)


def _tensor_to_float32(name: str, tensor, path: str) -> np.ndarray:
    """Decode one safetensors tensor (F32/F16/BF16) to a float32 array of its declared shape."""
    shape = tuple(int(d) for d in tensor.shape)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    itemsize = 4 if str(tensor.dtype).upper() == "F32" else 2
    if str(tensor.dtype).upper() in ("F32", "F16", "BF16") and len(tensor.data) != count * itemsize:
        raise _load_error(f"tensor {name!r} in {path} holds {len(tensor.data) // itemsize} values, shape {shape} "
                          f"needs {count}", tensor=name, file=path)
    return decode_float32(name, tensor.dtype, shape, tensor.data, path).astype(np.float32, copy=False)


def q8_product(q8_bytes, rows: int, cols: int, scale: np.ndarray) -> np.ndarray:
    """The float32 weights of a q8 linear: int8 (rows, cols) times scale[:, None], in float32."""
    return np.frombuffer(q8_bytes, dtype=np.int8).reshape(rows, cols).astype(np.float32) * scale[:, None]


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
        if len(t.data) != rows * cols:
            raise _load_error(f"tensor {name!r} in {path} holds {len(t.data)} values, shape {t.shape} "
                              f"needs {rows * cols}", tensor=name, file=path)
        tensors[base] = q8_product(t.data, rows, cols, scale)
    return tensors


def _q8_fetcher(ckpt, path: str):
    """name -> float32 array over an open q8 artifact, one tensor at a time: ``<n>.q8`` int8
    (out, in) times ``<n>.scale`` float32 (out,) in float32 (as _dequantise_q8), else decoded."""
    def fetch(name: str) -> np.ndarray:
        if name + ".q8" not in ckpt:
            return ckpt.read_float32(name)
        rows, cols = ckpt.entry(name + ".q8")[1]
        return q8_product(ckpt.read_bytes(name + ".q8"), rows, cols, ckpt.read_float32(name + ".scale"))
    return fetch


def _q8_blocks(ckpt, path: str):
    """name -> block_linear.BlockLinear over an open q8 artifact (ROWQ8: ``<n>.q8`` int8 as stored,
    ``<n>.scale`` its row scales), or None for a tensor stored as floats (matmul="q8act")."""
    from .block_linear import BlockLinear
    def blocks(name: str):
        if name + ".q8" not in ckpt:
            return None
        rows, cols = ckpt.entry(name + ".q8")[1]
        return BlockLinear("ROWQ8", ckpt.read_bytes(name + ".q8"), rows, cols, ckpt.read_float32(name + ".scale"),
                           name=name + ".q8", source=path)
    return blocks


def _parse_config(config: dict, path: str) -> dict:
    """Validate config.json (exactspec.formats.config, shared with the browser) and return the derived
    hyper-parameters the forward pass uses."""
    c = validate_config(config, source=path)
    return {
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_layers": c.num_hidden_layers, "num_heads": c.num_attention_heads,
        "num_kv_heads": c.num_key_value_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
        "max_context": c.max_position_embeddings, "tie_word_embeddings": c.tie_word_embeddings,
        "rope_theta": c.rope_theta, "qkv_bias": c.qkv_bias, "config": c,
    }


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
        if hp["qkv_bias"]:   # Qwen2: q/k/v projections carry a bias (o_proj and the MLP do not)
            shapes.update({p + "self_attn.q_proj.bias": (q_dim,), p + "self_attn.k_proj.bias": (kv_dim,),
                           p + "self_attn.v_proj.bias": (kv_dim,)})
    if not hp["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    return shapes


_FLOAT_DTYPES = ("F32", "F16", "BF16")


ROLES = ("champion", "draft")


def _check_header(entries: dict, hp: dict, path: str, quantised: bool, *, role: str) -> None:
    """Tensor names, dtypes and shapes against the config, before any tensor byte is read.

    entries: name -> {"dtype", "shape"} (a safetensors header). With quantised=True a tensor
    may instead be stored as ``<n>.q8`` (I8, its shape) plus ``<n>.scale`` (float, (rows,)).
    role "draft" (float weights only) also accepts the restricted-vocabulary tensors
    (exactspec.reference.restricted_vocab); for a champion they are unexpected tensors."""
    if role not in ROLES:
        raise ExactSpecError(E_BAD_ARGUMENT, f"role must be one of {ROLES}, got {role!r}")
    stored: dict[str, str] = {}   # base name -> the entry that provides it

    def refuse(message: str, name: str):
        raise _load_error(f"{path}: {message}", tensor=name, file=path)

    expected = _expected_shapes(hp)
    if role == "draft" and not quantised:
        expected.update(restricted_shapes(entries, hp, refuse))

    for name, info in entries.items():
        dtype, shape = str(info["dtype"]).upper(), tuple(int(d) for d in info["shape"])
        if name.endswith(".bias") and name not in expected:
            refuse(f"bias tensor {name!r} is not supported", name)
        base, form = name, "float"
        if quantised and name.endswith(".q8"):
            base, form = name[:-3], "q8"
        elif quantised and name.endswith(".scale") and name[:-6] + ".q8" in entries:
            base, form = name[:-6], "scale"
        want = expected.get(base)
        if want is None and base == "lm_head.weight" and hp["tie_word_embeddings"]:
            want = (hp["vocab_size"], hp["hidden_size"])  # a tied checkpoint may still carry a copy
        if want is None:
            if name.endswith(_IGNORED_SUFFIXES) and len(shape) == 1 and shape[0] <= hp["head_dim"]:
                continue
            refuse(f"unexpected tensor {name!r}", name)
        if form == "q8":
            want_dtype, want_shape = ("I8",), want
            if len(want) != 2:
                refuse(f"tensor {name!r} must be 2-D I8", name)
            if base + ".scale" not in entries:
                refuse(f"{name!r} has no {base + '.scale'!r}", name)
        elif base in RESTRICTED_TENSORS:
            want_dtype, want_shape = (INDEX_DTYPE,), want
        else:
            want_dtype, want_shape = _FLOAT_DTYPES, (want if form == "float" else want[:1])
        if dtype not in want_dtype:
            refuse(f"tensor {name!r} has dtype {dtype}, expected one of {', '.join(want_dtype)}", name)
        if shape != want_shape:
            refuse(f"tensor {name!r} has shape {shape}, expected {want_shape}", name)
        if form != "scale":
            if base in stored:
                refuse(f"tensor {base!r} is stored twice ({stored[base]!r} and {name!r})", name)
            stored[base] = name
    for name in expected:
        if name not in stored:
            refuse(f"missing tensor {name!r}", name)


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


def _apply(x: np.ndarray, w) -> np.ndarray:
    """x (n, in) float64 times a linear: a float64 (in, out) matrix (one BLAS call), or a tuple of
    parts whose outputs lie side by side, each such a matrix or a block_linear.BlockLinear
    (q8act-v1 on float32(x), float32 results)."""
    if isinstance(w, np.ndarray):
        return x @ w
    parts = [x @ part if isinstance(part, np.ndarray) else part.matmul(x) for part in w]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------

class LlamaReference:
    """Float64 Llama forward pass with a positional KV cache (see module docstring)."""

    def __init__(self, config: dict, tensors, identity: str, source: str = "<memory>", present=(),
                 role: str = "draft", matmul: str = "f32", blocks=None):
        """tensors: name -> float32-valued array (the restricted-vocabulary tensors: integer
        arrays), or a callable name -> array (read on demand, one tensor at a time: from_dir
        passes the checkpoint's reader and the names its header lists as `present`).
        matmul: "f32" (every linear a float64 matmul of its float32 values) or "q8act" (with
        blocks, a callable name -> block_linear.BlockLinear, or None for a float tensor: those
        linears and the embedding gather use their blocks; see the module docstring)."""
        if matmul not in MATMUL_FUNCTIONS:
            raise ExactSpecError(E_BAD_ARGUMENT, f"matmul must be one of {', '.join(MATMUL_FUNCTIONS)}, got {matmul!r}")
        if (matmul == "q8act") != (blocks is not None):
            raise ExactSpecError(E_BAD_ARGUMENT, "matmul='q8act' needs the blocks reader, and only it")
        self.matmul = matmul
        self.matmul_function = MATMUL_FUNCTIONS[matmul]    # the function's name and version, as reported
        self._blocks = blocks or (lambda name: None)
        hp = _parse_config(config, source)
        self.config = dict(config)
        self.identity = identity
        self.vocab_size = hp["vocab_size"]
        self.max_context = hp["max_context"]
        self._hp = hp
        self._source = source
        if callable(tensors):
            self._load_weights(tensors, frozenset(present))
        else:
            _check_header({name: {"dtype": INDEX_DTYPE if np.issubdtype(np.asarray(t).dtype, np.integer) else "F32",
                                  "shape": np.shape(t)} for name, t in tensors.items()},
                          hp, source, quantised=False, role=role)
            self._load_weights(tensors.__getitem__, frozenset(tensors))
        self._inv_freq = np.array(config_rope_inv_freq(hp["config"]), dtype=np.float64)  # (head_dim/2,)
        self._scale = hp["head_dim"] ** -0.5   # same Python expression HF uses
        self._blocks = None                    # the reader is not kept (it may hold the file open)
        self.reset()

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_dir(cls, model_dir, weights: str = "f32", role: str = "draft", matmul: str = "f32") -> "LlamaReference":
        """Load a Hugging Face folder: config.json + its weights as published (model.safetensors
        or the shards of model.safetensors.index.json; F32, F16 or BF16), or with weights="q8"
        model.q8.safetensors dequantised as the browser champion sees it (``W = q8 *
        scale[:, None]`` in float32). Weights are read one tensor at a time. role "champion"
        refuses the drafts-only restricted-vocabulary tensors (q8 weights are a champion's).
        matmul="q8act" (with weights="q8"): the int8 linears stay int8 + row scale (ROWQ8) and are
        computed with q8act-v1; a folder with no int8 tensor has nothing it changes."""
        if weights not in ("f32", "q8"):
            raise ExactSpecError(E_BAD_ARGUMENT, f"weights must be 'f32' or 'q8', got {weights!r}")
        if matmul not in MATMUL_FUNCTIONS:
            raise ExactSpecError(E_BAD_ARGUMENT, f"matmul must be one of {', '.join(MATMUL_FUNCTIONS)}, got {matmul!r}")
        model_dir = os.fspath(model_dir)
        config_path = os.path.join(model_dir, CONFIG_FILE)
        # Config first (bounded JSON, every size checked), then the weights headers against it:
        # nothing is sized from the files and no tensor byte is read until both agree.
        config = read_json_file(config_path)
        hp = _parse_config(config, config_path)
        if weights == "q8":
            weights_path = os.path.join(model_dir, Q8_WEIGHTS_FILE)
            ckpt = open_safetensors_files([weights_path])
        else:
            ckpt = open_checkpoint(model_dir)
            weights_path = ckpt.index_path or ckpt.files[0]
        with ckpt:
            header = ckpt.header()
            _check_header(header, hp, weights_path, quantised=weights == "q8", role=role)
            fetch_float = _q8_fetcher(ckpt, weights_path) if weights == "q8" else ckpt.read_float32

            def fetch(name: str) -> np.ndarray:
                if name not in RESTRICTED_TENSORS:
                    return fetch_float(name)
                return decode_index_tensor(name, ckpt.read_bytes(name), int(header[name]["shape"][0]),
                                           lambda message, tensor: _refuse_in(weights_path, message, tensor))
            blocks = None
            if matmul == "q8act":                 # float weights hold no blocks: nothing changes
                blocks = _q8_blocks(ckpt, weights_path) if weights == "q8" else (lambda name: None)
            return cls(config, fetch, checkpoint_digest(ckpt)[0], source=weights_path, present=header,
                       matmul=matmul, blocks=blocks)

    def _load_weights(self, fetch, present: frozenset) -> None:
        """Weights in float64 (the compute dtype: 8 bytes per parameter), each built from one
        float32-valued tensor at a time, pre-transposed to (in, out) and fused. present: the
        tensor names the checkpoint holds (the restricted-vocabulary ones are optional)."""
        hp = self._hp

        def w64(name: str) -> np.ndarray:
            return np.asarray(fetch(name), dtype=np.float32).astype(np.float64)

        def linear(name: str) -> np.ndarray:
            # HF stores (out, in); keep (in, out) contiguous so x @ W is one BLAS call.
            return np.ascontiguousarray(w64(name).T)

        def weight(*names: str):
            """The linear of the names' outputs side by side: one fused float64 (in, out) matrix
            (matmul "f32", or no name in blocks), else a tuple of parts, each a BlockLinear or a
            float64 (in, out) matrix (see _apply)."""
            parts = [self._blocks(name) for name in names]
            if all(part is None for part in parts):
                return np.concatenate([linear(name) for name in names], axis=1) if len(names) > 1 else linear(names[0])
            return tuple(linear(name) if part is None else part for name, part in zip(names, parts))

        # The embedding is only gathered from, so it is not kept in float64: tied, the rows are
        # read from the (D, V) head (one copy of the vocabulary matrix); untied, it stays float32
        # (its values exactly; gathered rows are widened). Same float64 values either way.
        # matmul "q8act": an embedding held in blocks is gathered through them (BlockLinear.rows_float32)
        # and, tied, is the LM head's blocks too.
        self._final_norm = w64("model.norm.weight")                         # (D,)
        embed_blocks = self._blocks("model.embed_tokens.weight")
        if hp["tie_word_embeddings"]:
            self._lm_head = weight("model.embed_tokens.weight")             # (D, V) or (BlockLinear,)
            self._embed = embed_blocks
        else:
            self._lm_head = weight("lm_head.weight")                        # (D, V), or (D, N) restricted
            self._embed = (embed_blocks if embed_blocks is not None         # (V, D) or (M, D)
                           else np.asarray(fetch("model.embed_tokens.weight"), dtype=np.float32))
        # restricted vocabulary (drafts): values checked before any use; None when absent
        refuse = lambda message, tensor: _refuse_in(self._source, message, tensor)  # noqa: E731
        self._head_ids = (check_restricted_values(HEAD_IDS, fetch(HEAD_IDS), hp["vocab_size"], refuse)
                          if HEAD_IDS in present else None)                 # (N,) ascending ids
        self._embed_rows = (check_restricted_values(EMBED_ROWS, fetch(EMBED_ROWS), np.shape(self._embed)[0], refuse)
                            if EMBED_ROWS in present else None)             # (V,) rows of the embedding
        self._layers = []
        for i in range(hp["num_layers"]):
            p = f"model.layers.{i}."
            # q|k|v and gate|up are fused column-wise: one BLAS call each, same dot products.
            layer = {
                "attn_norm": w64(p + "input_layernorm.weight"),            # (D,)
                "mlp_norm": w64(p + "post_attention_layernorm.weight"),    # (D,)
                "w_qkv": weight(p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                                p + "self_attn.v_proj.weight"),            # (D, (H+2KV)*hd)
                "w_o": weight(p + "self_attn.o_proj.weight"),              # (H*hd, D)
                "w_gate_up": weight(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),   # (D, 2F)
                "w_down": weight(p + "mlp.down_proj.weight"),              # (F, D)
                "b_qkv": None,
            }
            if hp["qkv_bias"]:
                layer["b_qkv"] = np.concatenate([w64(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
            self._layers.append(layer)

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
        rows = ids if self._embed_rows is None else self._embed_rows[ids]  # (n,) embedding rows
        if self._embed is None:                                            # (n, D) float64
            x = self._lm_head[:, ids].T
        elif isinstance(self._embed, np.ndarray):
            x = self._embed[rows].astype(np.float64)
        else:                                                              # a BlockLinear (q8act)
            x = self._embed.rows_float32(rows).astype(np.float64)
        for layer, w in enumerate(self._layers):
            qkv = _apply(rms_norm(x, w["attn_norm"], eps), w["w_qkv"])       # (n, (H+2KV)*hd)
            if w["b_qkv"] is not None:
                qkv = qkv + w["b_qkv"]                                        # Qwen2 q/k/v biases
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
            x = x + _apply(attn, w["w_o"])
            gate_up = _apply(rms_norm(x, w["mlp_norm"], eps), w["w_gate_up"])  # (n, 2F)
            x = x + _apply(silu(gate_up[:, :f_dim]) * gate_up[:, f_dim:], w["w_down"])
        self.length = end   # positions beyond end from earlier calls are forgotten
        head = _apply(rms_norm(x, self._final_norm, eps), self._lm_head)  # (n, V), or (n, N) restricted
        if self._head_ids is None:
            return head
        logits = np.full((n, self.vocab_size), -np.inf)                  # (n, V): -inf off the head
        logits[:, self._head_ids] = head
        return logits
