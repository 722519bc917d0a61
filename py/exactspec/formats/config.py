"""Model-file admission (pure Python, runs in Pyodide): bounded JSON, regular files, config.json.

Everything a model directory declares is checked here before anything is sized from it:
`load_json_bounded` refuses oversized or too-deeply nested JSON and non-finite numbers before
`json.loads` can recurse or allocate; `validate_config` turns a config.json object into a frozen
`LlamaConfig` of exact integers and finite floats within bounds a real Llama fits in;
`open_regular_file` / `read_regular_file` refuse FIFOs, devices and directories without
blocking. Every refusal is `ExactSpecError(E_MODEL_LOAD, "<source>: <what is wrong>")`.
See docs/formats.md ("config.json") for the table of bounds.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass

from ..core.errors import E_MODEL_LOAD, ExactSpecError

MAX_CONFIG_BYTES = 1 << 20        # config.json / generation_config.json: real ones are a few KB
MAX_JSON_DEPTH = 64               # real model JSON nests 6 deep at most

# Inclusive integer bounds. Llama-3.1-405B (hidden 16384, 126 layers, 128 heads, vocab 128256,
# context 131072, intermediate 53248) fits with room; these only stop absurd declarations.
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 20),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 18),
    "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (2, 1024),
    "max_position_embeddings": (1, 1 << 20),
}
RMS_NORM_EPS_RANGE = (0.0, 1.0)   # exclusive: eps must be > 0 and < 1
ROPE_THETA_RANGE = (1.0, 1e12)    # inclusive


def _refuse(source: str, problem: str, **detail) -> ExactSpecError:
    return ExactSpecError(E_MODEL_LOAD, f"{source}: {problem}", **detail)


# ---------------------------------------------------------------------------------------------
# Bounded JSON
# ---------------------------------------------------------------------------------------------

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_nesting_depth(text: str) -> int:
    """Deepest bracket nesting of JSON text, brackets inside strings not counted (a cheap scan:
    one regex pass removes strings, then only bracket characters are visited)."""
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def load_json_bounded(data, *, max_bytes: int = MAX_CONFIG_BYTES, max_depth: int = MAX_JSON_DEPTH,
                      source: str = "config.json"):
    """Parse UTF-8 JSON bytes (or str) refusing: more than max_bytes, nesting deeper than
    max_depth, NaN/Infinity literals, numbers that overflow a float (1e400), integers longer
    than Python converts, and duplicate object keys."""
    if isinstance(data, str):
        text = data
        if len(text) > max_bytes:   # each character is at least one UTF-8 byte
            raise _refuse(source, f"is over {max_bytes} bytes")
    elif isinstance(data, (bytes, bytearray, memoryview)):
        if len(data) > max_bytes:
            raise _refuse(source, f"is {len(data)} bytes, over the {max_bytes}-byte limit")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _refuse(source, f"is not UTF-8 ({e.reason} at byte {e.start})") from None
    else:
        raise _refuse(source, f"JSON input must be bytes or str, not {type(data).__name__}")
    depth = json_nesting_depth(text)
    if depth > max_depth:
        raise _refuse(source, f"JSON nests {depth} deep, over the limit of {max_depth}")

    def no_constant(name):
        raise _refuse(source, f"JSON literal {name} is not allowed (numbers must be finite)")

    def finite_float(s):
        value = float(s)
        if not math.isfinite(value):
            raise _refuse(source, f"number {s[:40]} overflows a float")
        return value

    def no_duplicates(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise _refuse(source, f"duplicate key {k[:80]!r}")
            out[k] = v
        return out

    try:
        return json.loads(text, parse_constant=no_constant, parse_float=finite_float,
                          object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError) as e:   # RecursionError: only if max_depth is huge
        if isinstance(e, ExactSpecError):
            raise
        raise _refuse(source, f"is not valid JSON ({str(e)[:200]})") from None


# ---------------------------------------------------------------------------------------------
# Regular files only (I/O)
# ---------------------------------------------------------------------------------------------

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular_file(path):
    """(binary file, size) of a regular file (symlinks followed). A FIFO, device, directory or
    socket is refused from stat() before open; the open itself is non-blocking and re-checked
    with fstat(), so a file swapped for a FIFO in between cannot block either."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _refuse(path, "file not found") from None
    except OSError as e:
        raise _refuse(path, f"cannot stat ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, f"is {_kind(st.st_mode)}, not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise _refuse(path, f"cannot open ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, f"is {_kind(st.st_mode)}, not a regular file")
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_exact(f, n: int, path) -> bytes:
    """Exactly n bytes from f, or E_MODEL_LOAD if the file ends first (it shrank under us)."""
    try:
        data = f.read(n)
    except OSError as e:
        raise _refuse(os.fspath(path), f"cannot read ({e.strerror or e})") from None
    if len(data) != n:
        raise _refuse(os.fspath(path), f"ended after {len(data)} of {n} expected bytes (changed while read?)")
    return data


def read_regular_file(path, *, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most max_bytes (never reads more than max_bytes + 1, and
    allocates for its stated size, not for max_bytes)."""
    f, size = open_regular_file(path)
    with f:
        if size > max_bytes:
            raise _refuse(os.fspath(path), f"is {size} bytes, over the {max_bytes}-byte limit")
        data = f.read(size + 1)   # one past the stated size: a file that grew is caught below
    if len(data) > size:
        raise _refuse(os.fspath(path), f"grew past its stated {size} bytes while read")
    return data


def read_json_file(path, *, max_bytes: int = MAX_CONFIG_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """load_json_bounded of a regular file's bytes, the file named in every refusal."""
    return load_json_bounded(read_regular_file(path, max_bytes=max_bytes), max_bytes=max_bytes,
                             max_depth=max_depth, source=os.fspath(path))


# ---------------------------------------------------------------------------------------------
# config.json -> LlamaConfig (pure)
# ---------------------------------------------------------------------------------------------


ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}   # model_type -> class
ROPE_TYPES = ("default", "linear", "llama3")
# Keys a rope_scaling / rope_parameters object may hold, per type (anything else is refused: a
# key we do not read, like attention_factor or partial_rotary_factor, would change the maths).
_ROPE_KEYS = {"default": {"rope_type", "type", "rope_theta"},
              "linear": {"rope_type", "type", "rope_theta", "factor"},
              "llama3": {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"}}


@dataclass(frozen=True)
class LlamaConfig:
    """The hyper-parameters every backend sizes itself from, validated (Llama and Qwen2 share
    this shape: Qwen2 is a Llama with biases on the q/k/v projections)."""
    model_type: str                  # "llama" or "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int         # divides num_attention_heads
    head_dim: int                    # even; explicit, or hidden_size // num_attention_heads
    max_position_embeddings: int
    rms_norm_eps: float              # finite, 0 < eps < 1
    rope_theta: float                # finite, 1 <= theta <= 1e12
    tie_word_embeddings: bool
    qkv_bias: bool = False           # q_proj/k_proj/v_proj carry a .bias (qwen2: always)
    rope_type: str = "default"       # one of ROPE_TYPES
    rope_factor: float = 1.0         # linear and llama3: >= 1
    rope_low_freq_factor: float = 0.0            # llama3 only (else 0)
    rope_high_freq_factor: float = 0.0           # llama3 only, > low_freq_factor
    rope_original_max_position_embeddings: int = 0   # llama3 only

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def architecture(self) -> str:
        return ARCHITECTURES[self.model_type]


def rope_inv_freq(c: LlamaConfig) -> list:
    """The (head_dim/2) RoPE inverse frequencies in float64, exactly the formulas of transformers'
    `_compute_default_rope_parameters`, `_compute_linear_scaling_rope_parameters` and
    `_compute_llama3_parameters` (which run them in float32). Pure Python, for every backend."""
    dim = c.head_dim
    inv = [1.0 / (c.rope_theta ** (i / dim)) for i in range(0, dim, 2)]
    if c.rope_type == "linear":
        return [f / c.rope_factor for f in inv]
    if c.rope_type != "llama3":
        return inv
    factor, low, high = c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor
    old_context = c.rope_original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        scaled = f / factor if wavelen > low_freq_wavelen else f
        if not wavelen < high_freq_wavelen and not wavelen > low_freq_wavelen:   # medium band
            smooth = (old_context / wavelen - low) / (high - low)
            scaled = (1 - smooth) * scaled / factor + smooth * scaled
        out.append(scaled)
    return out


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_field(cfg: dict, key: str, source: str, default=None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise _refuse(source, f"missing config field {key!r}", field=key)
        value = default
    if not _is_int(value):   # 256.0 and 256.9 alike: JSON floats are not sizes (docs/formats.md)
        raise _refuse(source, f"{key} must be an integer, got {_describe(value)}", field=key)
    low, high = INT_BOUNDS[key]
    if not low <= value <= high:
        raise _refuse(source, f"{key} {_describe(value)} is outside [{low}, {high}]", field=key)
    return value


def _float_field(value, key: str, source: str) -> float:
    if not _is_number(value):
        raise _refuse(source, f"{key} must be a finite number, got {_describe(value)}", field=key)
    return float(value)


def _bool_field(cfg: dict, key: str, source: str) -> bool:
    value = cfg.get(key, False)
    if value is None:
        value = False
    if not isinstance(value, bool):
        raise _refuse(source, f"{key} must be true or false, got {_describe(value)}", field=key)
    return value


def _rope_object(cfg: dict, source: str):
    """(field name, object) of the RoPE declaration: rope_parameters (transformers >= 5) or the
    legacy rope_scaling (with rope_theta at top level); (None, None) when neither is set."""
    found = [(key, cfg[key]) for key in ("rope_parameters", "rope_scaling") if cfg.get(key) is not None]
    for key, value in found:
        if not isinstance(value, dict):
            raise _refuse(source, f"{key} must be an object or null, got {_describe(value)}", field=key)
    if len(found) == 2:
        raise _refuse(source, "both rope_parameters and rope_scaling are set; give one", field="rope_scaling")
    return found[0] if found else (None, None)


def _rope(cfg: dict, source: str) -> dict:
    """rope_theta and the RoPE scaling fields of LlamaConfig: type default, linear or llama3 (as
    transformers computes them); every other type or an unknown key is refused, named."""
    key, params = _rope_object(cfg, source)
    params = params or {}
    type_key = "rope_type" if "rope_type" in params else "type"
    rope_type = params.get(type_key, "default")
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        raise _refuse(source, f"{key}.{type_key}={_describe(rope_type)} is not supported "
                      f"(supported: {', '.join(ROPE_TYPES)})", field=key)
    unknown = sorted(set(params) - _ROPE_KEYS[rope_type])
    if unknown:
        raise _refuse(source, f"{key}.{unknown[0]} is not supported with rope type {rope_type!r}",
                      field=f"{key}.{unknown[0]}")
    theta = params.get("rope_theta")
    if theta is None:
        theta = cfg.get("rope_theta")
    theta = _float_field(10000.0 if theta is None else theta, "rope_theta", source)
    low, high = ROPE_THETA_RANGE
    if not low <= theta <= high:
        raise _refuse(source, f"rope_theta {theta!r} is outside [{low}, {high}]", field="rope_theta")
    out = {"rope_theta": theta, "rope_type": rope_type}
    if rope_type == "default":
        return out

    def number(name: str, lowest: float, inclusive: bool = True) -> float:
        value = _float_field(params.get(name), f"{key}.{name}", source)
        if not (value >= lowest if inclusive else value > lowest) or value > 1e6:
            raise _refuse(source, f"{key}.{name} {value!r} is outside "
                          f"{'[' if inclusive else '('}{lowest}, 1e6]", field=f"{key}.{name}")
        return value

    out["rope_factor"] = number("factor", 1.0)
    if rope_type == "llama3":
        out["rope_low_freq_factor"] = number("low_freq_factor", 0.0, inclusive=False)
        out["rope_high_freq_factor"] = number("high_freq_factor", 0.0, inclusive=False)
        if not out["rope_high_freq_factor"] > out["rope_low_freq_factor"]:
            raise _refuse(source, f"{key}.high_freq_factor must be greater than low_freq_factor",
                          field=f"{key}.high_freq_factor")
        original = params.get("original_max_position_embeddings")
        if not _is_int(original) or not 1 <= original <= INT_BOUNDS["max_position_embeddings"][1]:
            raise _refuse(source, f"{key}.original_max_position_embeddings must be an integer in "
                          f"[1, {INT_BOUNDS['max_position_embeddings'][1]}], got {_describe(original)}",
                          field=f"{key}.original_max_position_embeddings")
        out["rope_original_max_position_embeddings"] = original
    return out


def _model_type(cfg: dict, source: str) -> str:
    """model_type (absent means llama) and, when given, architectures: the one class of that type."""
    model_type = cfg.get("model_type", "llama")
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise _refuse(source, f"model_type {_describe(model_type)} is not supported "
                      f"(supported: {', '.join(ARCHITECTURES)})", field="model_type")
    archs = cfg.get("architectures")
    if archs is not None and archs != [ARCHITECTURES[model_type]]:
        raise _refuse(source, f"architectures {_describe(archs)} is not supported for model_type "
                      f"{model_type!r} (only [{ARCHITECTURES[model_type]!r}])", field="architectures")
    return model_type


def _check_attention_kind(cfg: dict, model_type: str, source: str) -> None:
    """Features that change the maths and are not implemented: biases on Llama, sliding windows."""
    if model_type == "llama":
        for flag in ("attention_bias", "mlp_bias"):
            if _bool_field(cfg, flag, source):
                raise _refuse(source, f"{flag}=true is not supported", field=flag)
    if _bool_field(cfg, "use_sliding_window", source):
        raise _refuse(source, "use_sliding_window=true is not supported", field="use_sliding_window")
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types):
            raise _refuse(source, f"layer_types {_describe(layer_types)} is not supported "
                          "(only full_attention)", field="layer_types")
    prf = cfg.get("partial_rotary_factor")
    if prf is not None and prf != 1.0:
        raise _refuse(source, f"partial_rotary_factor {_describe(prf)} is not supported",
                      field="partial_rotary_factor")


def validate_config(cfg, *, source: str = "config.json") -> LlamaConfig:
    """Check a parsed config.json (a dict) and return its LlamaConfig, or raise E_MODEL_LOAD.
    Absent or null optional fields take Hugging Face's defaults; unknown fields are ignored."""
    if not isinstance(cfg, dict):
        raise _refuse(source, f"config must be a JSON object, got {type(cfg).__name__}")
    model_type = _model_type(cfg, source)
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise _refuse(source, f"hidden_act {_describe(act)} is not supported (only silu)", field="hidden_act")
    _check_attention_kind(cfg, model_type, source)

    vocab = _int_field(cfg, "vocab_size", source)
    hidden = _int_field(cfg, "hidden_size", source)
    intermediate = _int_field(cfg, "intermediate_size", source)
    layers = _int_field(cfg, "num_hidden_layers", source)
    heads = _int_field(cfg, "num_attention_heads", source)
    kv_heads = _int_field(cfg, "num_key_value_heads", source, default=heads)
    if cfg.get("head_dim") is None and hidden % heads != 0:
        raise _refuse(source, f"num_attention_heads {heads} does not divide hidden_size {hidden} "
                      "(and no head_dim is given)", field="num_attention_heads")
    head_dim = _int_field(cfg, "head_dim", source, default=hidden // heads)
    context = _int_field(cfg, "max_position_embeddings", source)
    if heads % kv_heads != 0:
        raise _refuse(source, f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}",
                      field="num_key_value_heads")
    if head_dim % 2 != 0:
        raise _refuse(source, f"head_dim {head_dim} must be even for RoPE", field="head_dim")
    for key, value in (("hidden_size", hidden), ("intermediate_size", intermediate), ("head_dim", head_dim)):
        if value % 4 != 0:   # the q8 artifact and both browser kernels pack int8 weights 4 to a 32-bit word
            raise _refuse(source, f"{key} {value} must be a multiple of 4 (int8 weights are packed 4 per word)",
                          field=key)
    eps = _float_field(1e-6 if cfg.get("rms_norm_eps") is None else cfg["rms_norm_eps"], "rms_norm_eps", source)
    if not RMS_NORM_EPS_RANGE[0] < eps < RMS_NORM_EPS_RANGE[1]:
        raise _refuse(source, f"rms_norm_eps {eps!r} must be > 0 and < 1", field="rms_norm_eps")
    if layers > 0 and isinstance(cfg.get("layer_types"), list) and len(cfg["layer_types"]) != layers:
        raise _refuse(source, f"layer_types has {len(cfg['layer_types'])} entries for {layers} layers",
                      field="layer_types")
    return LlamaConfig(
        model_type=model_type, vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, max_position_embeddings=context, rms_norm_eps=eps,
        tie_word_embeddings=_bool_field(cfg, "tie_word_embeddings", source), qkv_bias=model_type == "qwen2",
        **_rope(cfg, source))
