"""Property-based fuzzing of every parser that reads outside input: the safetensors header, the
bounded JSON loader and config validator, tokenizer.json and the worker envelope. Each example
must end in a valid result or a coded ExactSpecError, never another exception, and allocate at
most PEAK_BYTES. Settings are derandomized (no example database) so every run is the same."""
from __future__ import annotations

import json
import math
import os
import struct
import tempfile
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config_cases import CHAMPION_CONFIG, ROOT
from exactspec.formats.config import INT_BOUNDS, LlamaConfig, json_nesting_depth, load_json_bounded, validate_config
from exactspec.core.errors import E_BAD_ARGUMENT, E_MODEL_LOAD, E_PROTOCOL, ExactSpecError
from exactspec.core.protocol import KINDS, SCHEMA, Inbox, validate_envelope
from exactspec.formats.safetensors import DTYPES, load_safetensors, parse_header, tensor_values
from exactspec.formats.tokenizer import Tokenizer

PEAK_BYTES = 64 << 20


def fuzz_settings(n: int):
    return settings(derandomize=True, database=None, max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


REFUSED = object()   # what coded_or_value returns for a coded refusal


def coded_or_value(fn, codes=(E_MODEL_LOAD,)):
    """fn()'s value, or REFUSED when it raised an ExactSpecError with one of codes; any other
    exception, or a peak allocation over PEAK_BYTES, fails the example."""
    tracemalloc.start()
    try:
        try:
            value = fn()
        except ExactSpecError as err:
            assert err.code in codes, err
            assert err.message and "\n" not in err.message, err.message
            value = REFUSED
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"peak allocation {peak} bytes"
    return value


# Any JSON value, weighted toward the edges: huge and negative integers, non-finite floats,
# bools where numbers belong, numeric strings, nested containers.
SCALARS = (st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.integers(-3, 2048)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["256", "llama", "silu", "default", "linear", "ByteLevel", "BPE", "Sequence",
                              "NFC", "Lowercase", "TemplateProcessing", "Split", "<|bos|>", "a b", ""]))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


# ---------------------------------------------------------------------------------------------
# safetensors header
# ---------------------------------------------------------------------------------------------

DTYPE_NAMES = st.sampled_from(sorted(DTYPES)) | st.sampled_from(["F33", "f32", "", "F4"]) | JSON_VALUES


@st.composite
def safetensors_images(draw):
    """A file image: a mostly-consistent header (tiling offsets) with random damage."""
    n_tensors = draw(st.integers(0, 4))
    header, offset = {}, 0
    for i in range(n_tensors):
        dtype = draw(st.sampled_from(sorted(DTYPES)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        size = math.prod(shape) * DTYPES[dtype][0]
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if header and draw(st.booleans()):          # damage one field of one entry
        name = draw(st.sampled_from(sorted(header)))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra"]))
        header[name][field] = draw(DTYPE_NAMES if field == "dtype" else JSON_VALUES
                                   | st.lists(st.integers(-(1 << 66), 1 << 66), max_size=3))
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=4), st.one_of(SCALARS, JSON_VALUES),
                                                      min_size=1, max_size=2) | JSON_VALUES)
    raw = json.dumps(header).encode() + b" " * draw(st.integers(0, 7))
    data = draw(st.binary(min_size=offset, max_size=offset)) + draw(st.binary(max_size=3))
    blob = struct.pack("<Q", len(raw)) + raw + data
    if not draw(st.integers(0, 3)):             # truncation, 1 time in 4
        blob = blob[:draw(st.integers(0, len(blob)))]
    if blob and not draw(st.integers(0, 3)):    # one overwritten byte (length, JSON or data), 1 in 4
        at = draw(st.integers(0, len(blob) - 1))
        blob = blob[:at] + bytes([draw(st.integers(0, 255))]) + blob[at + 1:]
    return blob


def _check_image(blob: bytes):
    parsed = coded_or_value(lambda: parse_header(blob))
    if parsed is REFUSED:
        return
    entries, metadata, start = parsed
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    cursor = 0
    for dtype, shape, begin, end in sorted(entries.values(), key=lambda e: (e[2], e[3])):
        assert begin == cursor and end - begin == math.prod(shape) * DTYPES[dtype][0]
        cursor = end
    assert start + cursor == len(blob)


@fuzz_settings(400)
@given(safetensors_images())
def test_fuzz_safetensors_header_images(blob):
    _check_image(blob)


@fuzz_settings(200)
@given(st.binary(max_size=64), st.integers(0, 80), st.binary(max_size=64))
def test_fuzz_safetensors_random_bytes(header_bytes, declared, data):
    _check_image(struct.pack("<Q", declared) + header_bytes + data)
    _check_image(header_bytes)


_SCRATCH = tempfile.mkdtemp(prefix="exactspec-fuzz-")


@fuzz_settings(60)
@given(safetensors_images())
def test_fuzz_safetensors_files_load_or_refuse(blob):
    path = os.path.join(_SCRATCH, "m.safetensors")
    with open(path, "wb") as f:
        f.write(blob)
    tensors = coded_or_value(lambda: load_safetensors(path))
    for t in ({} if tensors is REFUSED else tensors).values():
        values = coded_or_value(lambda: tensor_values(t), codes=(E_BAD_ARGUMENT,))
        assert values is REFUSED or len(values) == t.numel


# ---------------------------------------------------------------------------------------------
# Bounded JSON and config.json
# ---------------------------------------------------------------------------------------------

CONFIG_FIELDS = sorted(set(CHAMPION_CONFIG) | {"rope_parameters", "rope_scaling", "head_dim"})
SIZE_LIKE = st.integers(-2, 70000) | st.sampled_from([0, 1, 2, 4, 64, 256, 1 << 20, (1 << 20) + 1, 10 ** 9])
FIELD_VALUES = st.one_of(SIZE_LIKE, st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
                         st.text(max_size=6), st.none(), JSON_VALUES)


@fuzz_settings(500)
@given(st.dictionaries(st.sampled_from(CONFIG_FIELDS), FIELD_VALUES, max_size=3),
       st.lists(st.sampled_from(CONFIG_FIELDS), max_size=2))
def test_fuzz_config_fields(replaced, removed):
    cfg = {k: v for k, v in {**CHAMPION_CONFIG, **replaced}.items() if k not in removed}
    c = coded_or_value(lambda: validate_config(cfg))
    if c is REFUSED:
        return
    assert isinstance(c, LlamaConfig)
    for key, (low, high) in INT_BOUNDS.items():
        value = getattr(c, key)
        assert type(value) is int and low <= value <= high, (key, value)
    assert c.num_attention_heads % c.num_key_value_heads == 0 and c.head_dim % 2 == 0
    assert math.isfinite(c.rms_norm_eps) and 0 < c.rms_norm_eps < 1 and math.isfinite(c.rope_theta)
    assert type(c.tie_word_embeddings) is bool
    # the same config through its JSON bytes gives the same answer, when JSON can carry it (a
    # non-finite number in a field the validator ignores has no JSON form: the loader refuses
    # Infinity/NaN literals, so no config.json can hold one)
    try:
        raw = json.dumps(cfg, allow_nan=False).encode()
    except ValueError:
        return
    assert coded_or_value(lambda: validate_config(load_json_bounded(raw))) == c


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@fuzz_settings(300)
@given(JSON_VALUES)
def test_fuzz_json_roundtrip_depth_and_finiteness(value):
    text = json.dumps(value, allow_nan=True)
    assert json_nesting_depth(text) == _depth(value)
    loaded = coded_or_value(lambda: load_json_bounded(text.encode(), max_depth=64))
    if loaded is REFUSED:
        assert "NaN" in text or "Infinity" in text
    else:
        assert json.dumps(loaded) == text


@fuzz_settings(300)
@given(st.binary(max_size=80) | st.text(alphabet='[]{}"\\:,0123456789.eE+-aNIfinty ', max_size=80).map(str.encode))
def test_fuzz_json_loader_on_garbage(raw):
    value = coded_or_value(lambda: load_json_bounded(raw, max_depth=8))
    if value is not REFUSED:
        assert _depth(value) <= 8


# ---------------------------------------------------------------------------------------------
# tokenizer.json
# ---------------------------------------------------------------------------------------------

with open(os.path.join(ROOT, "web", "models", "champion", "tokenizer.json"), encoding="utf-8") as _f:
    SHIPPED_TOKENIZER = json.load(_f)


def _mini_tokenizer(spec: dict, max_id: int = 400) -> dict:
    """The shipped tokenizer cut to ids < max_id and the merges among them (fast to build)."""
    spec = json.loads(json.dumps(spec))
    vocab = {t: i for t, i in spec["model"]["vocab"].items() if i < max_id}
    merges = [m for m in spec["model"]["merges"]
              if all(p in vocab for p in (m.split(" ") if isinstance(m, str) else m))
              and "".join(m.split(" ") if isinstance(m, str) else m) in vocab]
    spec["model"].update(vocab=vocab, merges=merges)
    return spec


MINI_TOKENIZER = _mini_tokenizer(SHIPPED_TOKENIZER)


def _paths(value, prefix=(), depth=0):
    """Mutable places: every key/index down to depth 3 (vocab and merges: a few samples)."""
    out = [prefix]
    if depth >= 3:
        return out
    if isinstance(value, dict):
        keys = list(value)[:6] if prefix[-1:] == ("vocab",) else list(value)
        for k in keys:
            out += _paths(value[k], prefix + (k,), depth + 1)
    elif isinstance(value, list):
        for i in range(min(len(value), 4)):
            out += _paths(value[i], prefix + (i,), depth + 1)
    return out


TOKENIZER_PATHS = [p for p in _paths(MINI_TOKENIZER) if p]
SHALLOW_PATHS = [p for p in TOKENIZER_PATHS if len(p) <= 2]   # components and their fields


def _mutate(spec: dict, path: tuple, action: str, value):
    parent = spec
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "delete" and isinstance(parent, dict):
        del parent[last]
    elif action == "extra" and isinstance(parent, dict):
        parent["zz_" + str(last)] = value
    else:
        parent[last] = value


@st.composite
def mutated_tokenizers(draw, base):
    spec = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(SHALLOW_PATHS) | st.sampled_from(TOKENIZER_PATHS))
        try:
            _mutate(spec, path, draw(st.sampled_from(["replace", "delete", "extra"])), draw(FIELD_VALUES))
        except (KeyError, IndexError, TypeError):   # an earlier mutation removed the place
            pass
    return spec


def _check_tokenizer(build):
    tok = coded_or_value(build)
    if tok is REFUSED:
        return
    ids = coded_or_value(lambda: tok.encode("Hello, wörld <|bos|> 12 ïï"), codes=(E_MODEL_LOAD, E_BAD_ARGUMENT))
    if ids is not REFUSED:
        assert all(type(i) is int for i in ids)
        text = coded_or_value(lambda: tok.decode(ids), codes=(E_BAD_ARGUMENT,))
        assert text is REFUSED or isinstance(text, str)


@fuzz_settings(300)
@given(mutated_tokenizers(MINI_TOKENIZER))
def test_fuzz_tokenizer_structure(spec):
    _check_tokenizer(lambda: Tokenizer(spec))


WRONG_TYPES = [None, True, 0, -1, 1 << 40, 1.5, float("nan"), "", "x", [], [1], {}, {"type": "ByteLevel"}]


def test_every_component_and_field_with_every_wrong_type():
    """Exhaustive where random sampling is thin: each place at depth <= 2, each action, each type."""
    for path in SHALLOW_PATHS:
        for action in ("replace", "delete"):
            for value in (WRONG_TYPES if action == "replace" else [None]):
                spec = json.loads(json.dumps(MINI_TOKENIZER))
                _mutate(spec, path, action, value)
                _check_tokenizer(lambda: Tokenizer(spec))


@fuzz_settings(150)
@given(mutated_tokenizers(MINI_TOKENIZER), st.integers(0, 1 << 16), st.sampled_from(["", "[", "{", '"', "]]"]))
def test_fuzz_tokenizer_json_text(spec, cut, junk):
    text = json.dumps(spec)
    _check_tokenizer(lambda: Tokenizer.from_json_str(text[:cut] + junk))


@pytest.mark.parametrize("text", ["[" * 100_000, '{"model": ' + "[" * 100_000, "", "null", "[]", '"x"'])
def test_tokenizer_json_hostile_text_is_coded(text):
    assert coded_or_value(lambda: Tokenizer.from_json_str(text)) is REFUSED


# ---------------------------------------------------------------------------------------------
# worker envelope
# ---------------------------------------------------------------------------------------------

@st.composite
def envelopes(draw):
    """Mostly-valid envelopes: each field valid or random, then keys added or removed."""
    def mostly(valid):   # the valid strategy 4 times in 5, else any JSON value
        return draw(valid) if draw(st.integers(0, 4)) else draw(JSON_VALUES)

    kind = mostly(st.sampled_from(sorted(KINDS)))
    fields = KINDS.get(kind, []) if isinstance(kind, str) else []
    payload = {f: draw(JSON_VALUES) for f in fields if draw(st.integers(0, 9))}
    env = {"kind": kind, "request_id": mostly(st.text(max_size=3)), "seq": mostly(st.integers(-1, 5)),
           "epoch": mostly(st.integers(-1, 2)), "payload": payload if draw(st.integers(0, 5)) else draw(JSON_VALUES)}
    for key in draw(st.lists(st.sampled_from(SCHEMA["envelope"] + ["extra"]), max_size=2)):
        if key in env and draw(st.booleans()):
            del env[key]
        else:
            env[key] = draw(JSON_VALUES)
    return env


@fuzz_settings(500)
@given(envelopes() | JSON_VALUES)
def test_fuzz_envelope(env):
    if coded_or_value(lambda: validate_envelope(env), codes=(E_PROTOCOL,)) is not REFUSED:
        assert set(env) == set(SCHEMA["envelope"]) and env["kind"] in KINDS
        assert isinstance(env["request_id"], str) and isinstance(env["payload"], dict)
        assert all(type(env[k]) is int and env[k] >= 0 for k in ("seq", "epoch"))
        assert all(f in env["payload"] for f in KINDS[env["kind"]])
        inbox = Inbox(env["request_id"], epoch=env["epoch"])   # same request: seq is compared
        assert inbox.offer(env) is True and inbox.offer(env) is False
