"""config.json admission: the bounded JSON loader, validate_config's table of refusals, and the
reference loader and CLI refusing hostile configs with E_MODEL_LOAD before sizing anything."""
from __future__ import annotations

import json
import math
import os
import tracemalloc

import pytest

from config_cases import BAD_CONFIG_BYTES, BAD_CONFIGS, CHAMPION_CONFIG, DELETE, GOOD_CONFIGS, ROOT, changed
from exactspec.host.cli import main as cli_main
from exactspec.formats.config import (
    INT_BOUNDS, MAX_CONFIG_BYTES, LlamaConfig, json_nesting_depth, load_json_bounded, read_json_file,
    validate_config,
)
from exactspec.core.errors import E_MODEL_LOAD, ExactSpecError
from exactspec.reference.reference_llama import LlamaReference

SHIPPED_CHAMPION = os.path.join(ROOT, "web", "models", "champion")
PEAK_BYTES = 32 << 20   # any refusal here must stay far below what the issue saw (6 GB)


def _refused(fn, code=E_MODEL_LOAD) -> ExactSpecError:
    tracemalloc.start()
    try:
        with pytest.raises(ExactSpecError) as info:
            fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.code == code, info.value
    assert peak < PEAK_BYTES, f"refusal allocated {peak} bytes"
    return info.value


@pytest.mark.parametrize("name,cfg,code", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_refused_with_its_field_named(name, cfg, code):
    err = _refused(lambda: validate_config(cfg, source="x/config.json"), code)
    assert err.message.startswith("x/config.json: "), err.message
    changed_keys = [k for k in set(cfg) | set(CHAMPION_CONFIG)
                    if k not in cfg or k not in CHAMPION_CONFIG or repr(cfg[k]) != repr(CHAMPION_CONFIG[k])]
    assert any(k in err.message or (k.startswith("rope") and "rope" in err.message) for k in changed_keys), (
        changed_keys, err.message)


@pytest.mark.parametrize("name,cfg,code", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_refused_from_its_json_bytes(name, cfg, code):
    raw = json.dumps(cfg).encode()   # inf / nan become the Infinity / NaN literals
    _refused(lambda: validate_config(load_json_bounded(raw), source="config.json"), code)


@pytest.mark.parametrize("name,raw,code", BAD_CONFIG_BYTES, ids=[c[0] for c in BAD_CONFIG_BYTES])
def test_bad_config_bytes_are_refused(name, raw, code):
    err = _refused(lambda: validate_config(load_json_bounded(raw, source="m/config.json"),
                                           source="m/config.json"), code)
    assert err.message.startswith("m/config.json: "), err.message


def test_hostile_literals_are_present_in_the_byte_cases():
    raws = dict((name, raw) for name, raw, _ in BAD_CONFIG_BYTES)
    assert b'"hidden_size": 1e400,' in raws["hidden 1e400 literal"]
    assert b"Infinity" in raws["Infinity literal"] and b"NaN" in raws["NaN literal"]


@pytest.mark.parametrize("name,cfg", GOOD_CONFIGS, ids=[c[0] for c in GOOD_CONFIGS])
def test_good_config_validates_from_dict_and_bytes(name, cfg):
    parsed = validate_config(cfg)
    assert parsed == validate_config(load_json_bounded(json.dumps(cfg).encode()))
    assert parsed.num_attention_heads % parsed.num_key_value_heads == 0 and parsed.head_dim % 2 == 0
    for key, (low, high) in INT_BOUNDS.items():
        assert low <= getattr(parsed, key) <= high


def test_champion_values_exactly():
    assert validate_config(CHAMPION_CONFIG) == LlamaConfig(
        model_type="llama", vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
        rms_norm_eps=1e-05, rope_theta=10000.0, tie_word_embeddings=True)


def test_defaults_follow_hugging_face():
    c = validate_config(changed(head_dim=None, num_key_value_heads=None, rms_norm_eps=None, rope_theta=None,
                                tie_word_embeddings=None))
    assert (c.head_dim, c.num_key_value_heads, c.rms_norm_eps, c.rope_theta, c.tie_word_embeddings) == (
        64, 4, 1e-6, 10000.0, False)
    assert (c.q_dim, c.kv_dim) == (256, 256)
    c = validate_config(changed(rope_theta=DELETE, rope_parameters={"rope_theta": 1000000}))
    assert c.rope_theta == 1e6 and isinstance(c.rope_theta, float)


def test_float_sizes_are_refused_not_truncated():
    for value in (256.9, 256.0):
        err = _refused(lambda: validate_config(changed(hidden_size=value)))
        assert "hidden_size must be an integer" in err.message, err.message


def test_json_nesting_depth_ignores_brackets_in_strings():
    assert json_nesting_depth('{"a": [1, {"b": "[[[[{{{{\\"]]"}]}') == 3
    assert json_nesting_depth("[]") == 1 and json_nesting_depth('"[["') == 0
    assert load_json_bounded(b'{"a": "' + b"[" * 1000 + b'"}', max_depth=1) == {"a": "[" * 1000}
    assert load_json_bounded(b"[" * 8 + b"]" * 8, max_depth=8) == [[[[[[[[]]]]]]]]
    with pytest.raises(ExactSpecError, match="nests 9 deep"):
        load_json_bounded(b"[" * 9 + b"]" * 9, max_depth=8)


@pytest.mark.parametrize("raw,problem", [
    (b'{"x": NaN}', "literal NaN"), (b'{"x": Infinity}', "literal Infinity"),
    (b'{"x": -Infinity}', "literal -Infinity"), (b'{"x": 1e400}', "1e400 overflows"),
    (b'{"x": -1e400}', "-1e400 overflows"), (b'{"x": 1, "x": 1}', "duplicate key 'x'"),
    (b'{"x": ' + b"1" * 5000 + b"}", "not valid JSON"),
])
def test_loader_refuses_non_finite_and_ambiguous_json(raw, problem):
    err = _refused(lambda: load_json_bounded(raw, source="c.json"))
    assert err.message.startswith("c.json: ") and problem in err.message, err.message


def test_loader_size_limit_and_input_types():
    assert load_json_bounded(b"{}" + b" " * (MAX_CONFIG_BYTES - 2)) == {}
    with pytest.raises(ExactSpecError, match="over the"):
        load_json_bounded(b"{}" + b" " * (MAX_CONFIG_BYTES - 1))
    assert load_json_bounded('{"x": 1.5}') == {"x": 1.5}
    with pytest.raises(ExactSpecError, match="bytes or str"):
        load_json_bounded(None)
    with pytest.raises(ExactSpecError) as info:
        validate_config([1, 2])
    assert info.value.code == E_MODEL_LOAD


def test_read_json_file_refuses_a_fifo_and_a_directory(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    err = _refused(lambda: read_json_file(fifo))
    assert "a FIFO, not a regular file" in err.message and str(fifo) in err.message
    err = _refused(lambda: read_json_file(tmp_path))
    assert "a directory" in err.message


# ---------------------------------------------------------------------------------------------
# The reference path and the CLI
# ---------------------------------------------------------------------------------------------


def _model_dir(tmp_path, config_bytes: bytes):
    """The shipped champion with config.json replaced (the other files linked, not copied)."""
    for name in os.listdir(SHIPPED_CHAMPION):
        if name != "config.json":
            os.symlink(os.path.join(SHIPPED_CHAMPION, name), tmp_path / name)
    (tmp_path / "config.json").write_bytes(config_bytes)
    return tmp_path


REFERENCE_CASES = [(n, json.dumps(cfg).encode()) for n, cfg, _ in BAD_CONFIGS if n in {
    "layers 1e9", "layers 1e9 as float", "hidden 1e400 (inf)", "hidden 256.9", "zero heads, no head_dim"}]
REFERENCE_CASES += [(n, raw) for n, raw, _ in BAD_CONFIG_BYTES if n in {"nested 100,000 deep", "hidden 1e400 literal"}]


@pytest.mark.parametrize("name,raw", REFERENCE_CASES, ids=[c[0] for c in REFERENCE_CASES])
def test_reference_loader_refuses_before_sizing(tmp_path, name, raw):
    directory = _model_dir(tmp_path, raw)
    err = _refused(lambda: LlamaReference.from_dir(directory))
    assert str(directory / "config.json") in err.message, err.message


@pytest.mark.parametrize("name,raw", REFERENCE_CASES[:3] + REFERENCE_CASES[-2:],
                         ids=[c[0] for c in REFERENCE_CASES[:3] + REFERENCE_CASES[-2:]])
def test_cli_reports_a_coded_error_not_an_internal_one(tmp_path, capsys, name, raw):
    directory = _model_dir(tmp_path, raw)
    rc = cli_main(["generate", "--prompt", "x", "--champion", str(directory), "--speculate", "none",
                   "--max-new-tokens", "1"])
    err = capsys.readouterr().err
    assert err.startswith("exactspec: E_MODEL_LOAD: "), err
    assert rc not in (0, 70) and "internal error" not in err


def test_generation_config_depth_bomb_is_coded(tmp_path, capsys):
    directory = _model_dir(tmp_path, json.dumps(CHAMPION_CONFIG).encode())
    os.remove(directory / "generation_config.json")
    (directory / "generation_config.json").write_bytes(b"[" * 100_000)
    rc = cli_main(["generate", "--prompt", "x", "--champion", str(directory), "--speculate", "none",
                   "--max-new-tokens", "1"])
    err = capsys.readouterr().err
    assert err.startswith("exactspec: E_MODEL_LOAD: ") and "generation_config.json" in err, err
    assert rc not in (0, 70)


def test_shipped_pair_still_loads():
    ref = LlamaReference.from_dir(SHIPPED_CHAMPION)
    assert ref.vocab_size == 4096 and ref.max_context == 512
    assert math.isclose(ref._hp["rope_theta"], 10000.0)
