"""A GGUF model (architectures llama and qwen2) as a Hugging Face model: config, tensor names, weights.

`GGUFModel(path)` opens the file (gguf.GGUFFile), maps its metadata to the config.json dict that
exactspec.formats.config validates (`config`, `llama_config`), and checks the tensor table against that
config (every tensor known, none missing, every shape right) before any weight is read.
`read_float32(hf_name)` returns a weight under its Hugging Face name in HF layout, dequantised to
float32; for llama, q/k rows are put back from llama.cpp's RoPE order (convert_hf_to_gguf.py's
`permute`: within each head, HF row j and j + head_dim/2 become rows 2j and 2j+1) to HF's
rotate-half order. qwen2 files are stored unpermuted (llama.cpp runs them with NEOX RoPE).
FLOAT32 metadata (rms_norm_eps, rope_theta) is read back as the shortest decimal that rounds to
the same float32, the value config.json held (1e-05, not 9.999999747378752e-06).
`read_blocks(hf_name)` returns a quantised matrix (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) as its raw blocks
(reference.block_linear.BlockLinear, q/k rows put back the same way, a row's blocks moving whole),
or None for a float tensor. `load_reference(path)` is the NumPy reference model
(reference_llama.LlamaReference) on the file's dequantised weights, its identity the file's sha256;
`load_reference(path, matmul="q8act")` computes the block tensors with q8act-v1 on their blocks
(docs/quant_kernels.md) instead. Refusals: `E_MODEL_LOAD: <file>:
<field>: what is wrong`, the field being the GGUF metadata key or tensor name.
"""
from __future__ import annotations

import math
import re
import struct

from .config import ARCHITECTURES, validate_config
from ..core.errors import ExactSpecError
from .gguf import GGUFFile, refuse

INTEGER_TYPES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64")
FLOAT_TYPES = ("FLOAT32", "FLOAT64")

# HF config field -> GGUF metadata key under the architecture's prefix ("llama.", "qwen2.")
CONFIG_KEYS = {"hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
               "num_hidden_layers": "block_count", "num_attention_heads": "attention.head_count",
               "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
               "max_position_embeddings": "context_length", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
               "rope_theta": "rope.freq_base", "vocab_size": "vocab_size"}

GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
_LAYER_TENSOR = re.compile(r"blk\.(0|[1-9][0-9]{0,5})\.([a-z_]+)\.(weight|bias)")


def shortest_float32_decimal(value: float) -> float:
    """The shortest decimal that rounds to the same float32 (1e-05 for the float32 nearest 1e-5):
    the value config.json held before the converter narrowed it, as a float64."""
    bits = struct.pack("<f", value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("<f", candidate) == bits:
            return candidate
    return value


def hf_name(gguf_name: str):
    """The Hugging Face name of a llama.cpp tensor name, or None when it is not one we map."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    m = _LAYER_TENSOR.fullmatch(gguf_name)
    if m is None or m.group(2) not in LAYER_NAMES:
        return None
    return f"model.layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def unpermute_rope_rows(w, n_heads: int):
    """llama.cpp's q/k row order (per head: adjacent pairs) back to HF's (per head: halves)."""
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_shapes(c) -> dict:
    """HF name -> HF shape of every tensor a model of LlamaConfig c holds."""
    d, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, d)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (c.q_dim, d), p + "self_attn.k_proj.weight": (c.kv_dim, d),
                       p + "self_attn.v_proj.weight": (c.kv_dim, d), p + "self_attn.o_proj.weight": (d, c.q_dim),
                       p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                       p + "mlp.down_proj.weight": (d, f)})
        if c.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (c.q_dim,), p + "self_attn.k_proj.bias": (c.kv_dim,),
                           p + "self_attn.v_proj.bias": (c.kv_dim,)})
    return shapes


class GGUFModel:
    """See module docstring. Attributes: file (GGUFFile), architecture, config (dict),
    llama_config (LlamaConfig), names (HF name -> GGUF tensor name)."""

    def __init__(self, path, file: GGUFFile | None = None):
        self.file = file if file is not None else GGUFFile(path)   # file: an open one (GGUFFile.from_header)
        try:
            self.path = self.file.path
            self.architecture = self._architecture()
            self.config = self._config()
            self.llama_config = self._validated(self.config)
            self._check_head_sizes()
            self.names = self._check_tensors()
        except BaseException:
            self.file.close()
            raise

    # -- metadata -> config -------------------------------------------------------------------

    def _architecture(self) -> str:
        arch = self._metadata("general.architecture", ("STRING",))
        if arch not in ARCHITECTURES:
            raise refuse(self.path, "metadata['general.architecture']",
                         f"{arch[:80]!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
        return arch

    def _metadata(self, key: str, types: tuple, default=None):
        md = self.file.metadata
        if key not in md:
            if default is None:
                raise refuse(self.path, f"metadata[{key!r}]", "is missing")
            return default
        if self.file.value_types[key] not in types:
            raise refuse(self.path, f"metadata[{key!r}]", f"must be {' or '.join(types)}, "
                         f"not {self.file.value_types[key]}")
        value = md[key]
        if isinstance(value, float) and not math.isfinite(value):
            raise refuse(self.path, f"metadata[{key!r}]", f"{value} is not finite")
        if self.file.value_types[key] == "FLOAT32":
            value = shortest_float32_decimal(value)
        return value

    def _config(self) -> dict:
        a = self.architecture + "."
        integer = lambda field, default=None: self._metadata(a + CONFIG_KEYS[field], INTEGER_TYPES, default)
        number = lambda field, default=None: self._metadata(a + CONFIG_KEYS[field], FLOAT_TYPES + INTEGER_TYPES,
                                                            default)
        heads = integer("num_attention_heads")
        hidden = integer("hidden_size")
        if "token_embd.weight" not in self.file.tensors:
            raise refuse(self.path, "tensor 'token_embd.weight'", "is missing")
        embd = self.file.tensors["token_embd.weight"]
        if len(embd.shape) != 2:
            raise refuse(self.path, "tensor 'token_embd.weight'", f"has shape {list(embd.shape)}, not (vocabulary, "
                         "hidden size)")
        vocab = embd.shape[0]
        if integer("vocab_size", vocab) != vocab:
            raise refuse(self.path, f"metadata[{a + 'vocab_size'!r}]", f"{integer('vocab_size')} disagrees with "
                         f"the {vocab} rows of tensor 'token_embd.weight'")
        head_dim = integer("head_dim", hidden // heads if heads else 0)
        cfg = {"architectures": [ARCHITECTURES[self.architecture]], "model_type": self.architecture,
               "hidden_act": "silu", "torch_dtype": "float32", "vocab_size": vocab, "hidden_size": hidden,
               "intermediate_size": integer("intermediate_size"), "num_hidden_layers": integer("num_hidden_layers"),
               "num_attention_heads": heads, "num_key_value_heads": integer("num_key_value_heads", heads),
               "head_dim": head_dim, "max_position_embeddings": integer("max_position_embeddings"),
               "rms_norm_eps": number("rms_norm_eps"), "rope_theta": number("rope_theta", 10000.0),
               "tie_word_embeddings": "output.weight" not in self.file.tensors}
        cfg.update(self._rope_scaling(a))
        for field in ("bos_token_id", "eos_token_id"):
            key = "tokenizer.ggml." + field
            if key in self.file.metadata:
                cfg[field] = self._metadata(key, INTEGER_TYPES)
        return cfg

    def _check_head_sizes(self) -> None:
        """Value heads and the rotary part as wide as the key heads (all the reference computes)."""
        head_dim = self.llama_config.head_dim
        for key in ("attention.value_length", "rope.dimension_count"):
            key = f"{self.architecture}.{key}"
            value = self._metadata(key, INTEGER_TYPES, head_dim)
            if value != head_dim:
                raise refuse(self.path, f"metadata[{key!r}]", f"{value} differs from the head size {head_dim} "
                             "(partial rotary or unequal key/value sizes are not supported)")

    def _rope_scaling(self, a: str) -> dict:
        kind = self._metadata(a + "rope.scaling.type", ("STRING",), "none")
        factor = self._metadata(a + "rope.scaling.factor", FLOAT_TYPES, 0.0)
        legacy = self._metadata(a + "rope.scale_linear", FLOAT_TYPES, 0.0)
        if kind == "none" and legacy in (0.0, 1.0):
            return {}
        if kind == "none":
            kind, factor = "linear", legacy
        if kind != "linear":
            raise refuse(self.path, f"metadata[{a + 'rope.scaling.type'!r}]",
                         f"{kind[:40]!r} is not supported (supported: none, linear)")
        return {"rope_scaling": {"rope_type": "linear", "factor": factor}}

    def _validated(self, cfg: dict):
        """exactspec.formats.config's LlamaConfig of cfg; a refusal names the GGUF key it came from."""
        try:
            return validate_config(cfg, source="")
        except ExactSpecError as e:
            field = e.detail.get("field", "")
            key = CONFIG_KEYS.get(field)
            where = f"metadata[{self.architecture + '.' + key!r}]" if key else f"config {field or 'value'}"
            raise refuse(self.path, where, e.message.removeprefix(": ")) from None

    # -- tensor table -------------------------------------------------------------------------

    def _check_tensors(self) -> dict:
        """HF name -> GGUF name, after every tensor's name and shape is checked against the config."""
        expected = expected_shapes(self.llama_config)
        names = {}
        for gguf_name, info in self.file.tensors.items():
            field = f"tensor {gguf_name!r}"
            name = hf_name(gguf_name)
            if gguf_name == "rope_freqs.weight":
                raise refuse(self.path, field, "per-frequency RoPE factors (Llama 3.1 scaling) are not supported")
            if name is None or name not in expected:
                raise refuse(self.path, field, f"is not a tensor of this {self.architecture} model "
                             f"({self.llama_config.num_hidden_layers} layers"
                             f"{', no biases' if not self.llama_config.qkv_bias else ''})")
            if info.shape != expected[name]:
                raise refuse(self.path, field, f"has shape {list(info.shape)}, expected {list(expected[name])} "
                             "from the metadata")
            names[name] = gguf_name
        for name in expected:
            if name not in names:
                raise refuse(self.path, f"tensor {_gguf_name(name)!r}", "is missing")
        return names

    # -- weights ------------------------------------------------------------------------------

    def read_float32(self, name: str):
        """The weight `name` (HF name) in HF layout, float32."""
        w = self.file.read_float32(self.names[name])
        if self.architecture == "llama" and name.endswith((".q_proj.weight", ".k_proj.weight")):
            c = self.llama_config
            w = unpermute_rope_rows(w, c.num_attention_heads if ".q_proj." in name else c.num_key_value_heads)
        return w

    def read_blocks(self, name: str):
        """The matrix `name` (HF name) in its GGUF blocks as a BlockLinear in HF row order, or None
        when the tensor is stored as floats (F32/F16/BF16) or is not a matrix."""
        import numpy as np                       # CPython only, as the reference
        from ..reference.block_linear import BLOCK_FORMATS, BlockLinear
        gguf_name = self.names[name]
        t = self.file.tensors[gguf_name]
        if t.type_name not in BLOCK_FORMATS or len(t.shape) != 2:
            return None
        rows, cols = t.shape
        blocks = BlockLinear(t.type_name, self.file.read_raw(gguf_name, 0, rows), rows, cols,
                             name=gguf_name, source=self.path)
        if self.architecture == "llama" and name.endswith((".q_proj.weight", ".k_proj.weight")):
            c = self.llama_config
            heads = c.num_attention_heads if ".q_proj." in name else c.num_key_value_heads
            blocks = blocks.permuted_rows(unpermute_rope_rows(np.arange(rows), heads))
        return blocks

    def close(self) -> None:
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _gguf_name(name: str) -> str:
    """The llama.cpp name of a Hugging Face tensor name (for messages about a missing tensor)."""
    for g, h in GLOBAL_NAMES.items():
        if h == name:
            return g
    _, _, layer, rest = name.split(".", 3)
    base, _, suffix = rest.rpartition(".")
    short = next(k for k, v in LAYER_NAMES.items() if v == base)
    return f"blk.{layer}.{short}.{suffix}"


def load_reference(path, matmul: str = "f32"):
    """reference_llama.LlamaReference on the file's weights (dequantised to float32, read one
    tensor at a time), identified by the file's sha256. matmul="q8act": the block tensors stay in
    their blocks (read_blocks) and are computed with q8act-v1."""
    from .manifest import sha256_file
    from ..reference.reference_llama import LlamaReference
    with GGUFModel(path) as model:
        identity, _ = sha256_file(model.path)
        return LlamaReference(model.config, model.read_float32, identity, source=model.path, matmul=matmul,
                              blocks=model.read_blocks if matmul == "q8act" else None)
