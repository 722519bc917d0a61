"""Hostile and broken GGUF files are refused before any data is read: one E_MODEL_LOAD naming file and field.

Container fields are written by hand (gguf_builders.raw_gguf), model and tokenizer fields with
gguf's GGUFWriter on a tiny model (synthetic_models.write_tiny_model); every refusal must be
`E_MODEL_LOAD: <file>: <field>: ...` with the code once, and a file that claims gigabytes must be
refused in a few KB of memory.
"""
from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest
from gguf import GGUFValueType as V

from exactspec.core.errors import ExactSpecError
from exactspec.formats.gguf import GGUFFile
from exactspec.formats.gguf_model import GGUFModel, load_reference
from exactspec.formats.gguf_tokenizer import load_tokenizer, stop_token_ids, tokenizer_config
from gguf_builders import gstr, kv, kv_str, kv_u32, one_tensor_gguf, raw_gguf, tensor_record
from synthetic_models import write_tiny_model


def refused(path, opener=GGUFFile, *fields) -> str:
    with pytest.raises(ExactSpecError) as info:
        result = opener(str(path))
        if hasattr(result, "close"):
            result.close()
    e = info.value
    assert e.code == "E_MODEL_LOAD"
    assert str(e).startswith(f"E_MODEL_LOAD: {path}: ") and str(e).count("E_MODEL_LOAD") == 1, str(e)
    assert "Traceback" not in str(e) and "\n" not in str(e)
    for field in fields:
        assert field in e.message, (field, e.message)
    return e.message


def write(tmp_path, data: bytes, name: str = "x.gguf"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# ---- the container ---------------------------------------------------------------------------

def test_valid_base_file_reads(tmp_path):
    with GGUFFile(write(tmp_path, one_tensor_gguf())) as f:
        assert f.tensors["t"].shape == (2, 32)
        assert np.array_equal(f.read_float32("t").reshape(-1), np.arange(64, dtype=np.float32))


def test_every_truncation_is_refused(tmp_path):
    """Each prefix of a valid file (header, metadata, tensor table, data) is refused as such."""
    data = one_tensor_gguf()
    for cut in range(len(data)):
        refused(write(tmp_path, data[:cut]))


@pytest.mark.parametrize("data, field", [
    (b"", "magic"), (b"GGML" + b"\0" * 60, "magic"), (b"\x7fELF" + b"\0" * 60, "magic"),
    (one_tensor_gguf(version=1), "version"),
    (b"GGUF" + struct.pack(">IQQ", 3, 1, 1) + b"\0" * 64, "big-endian"),
])
def test_not_a_gguf_or_wrong_version(tmp_path, data, field):
    refused(write(tmp_path, data), GGUFFile, field)


def test_huge_counts_refused_in_bounded_memory(tmp_path):
    cases = [
        (raw_gguf([], [], n_tensors=1 << 40), "tensor_count"),
        (raw_gguf([], [], n_kv=1 << 40), "kv_count"),
        (raw_gguf([], [], n_kv=1000), "metadata key #0"),                                  # counts past the end
        (raw_gguf([struct.pack("<Q", 1 << 62)], []), "metadata key #0"),                    # key length
        (raw_gguf([kv("k", 8, struct.pack("<Q", 1 << 40))], []), "metadata['k']"),          # string length
        (raw_gguf([kv("k", 9, struct.pack("<IQ", 10, 1 << 23))], []), "metadata['k']"),     # u64 array > file
        (raw_gguf([kv("k", 9, struct.pack("<IQ", 10, 1 << 30))], []), "over the limit"),    # array length
        (raw_gguf([kv("k", 9, struct.pack("<IQ", 8, 1 << 20))], []), "strings cannot fit"),
        (raw_gguf([kv_str("general.architecture", "llama")],
                  [tensor_record("t", (1 << 20, 1 << 20, 1 << 10), 0, 0)]), "over the limit"),
    ]
    for data, field in cases:
        path = write(tmp_path, data)
        tracemalloc.start()
        refused(path, GGUFFile, field)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 2 << 20, (field, peak)


@pytest.mark.parametrize("kvs, field", [
    ([kv("k", 13, b"")], "value type 13"),
    ([kv("k", 9, struct.pack("<IQ", 99, 1))], "element type 99"),
    ([kv("k", 9, struct.pack("<IQ", 9, 1))], "arrays of arrays"),
    ([kv("k", 7, b"\x02")], "bool byte is 2"),
    ([kv("k", 9, struct.pack("<IQ", 7, 2) + b"\x01\x05")], "neither 0 nor 1"),
    ([kv("k", 8, gstr(b"\xff\xfe"))], "not UTF-8"),
    ([kv_u32("k", 1), kv_u32("k", 2)], "appears twice"),
    ([kv_u32("general.alignment", 24)], "power of two"),
    ([kv_u32("general.alignment", 0)], "power of two"),
    ([kv_str("general.alignment", "32")], "must be a UINT32"),
])
def test_bad_metadata(tmp_path, kvs, field):
    refused(write(tmp_path, raw_gguf(kvs, [])), GGUFFile, field)


@pytest.mark.parametrize("records, data, field", [
    ([tensor_record("t", (), 0, 0)], b"", "n_dims 0"),
    ([tensor_record("t", (32, 1, 1, 1, 1), 0, 0)], b"\0" * 128, "n_dims 5"),
    ([tensor_record("t", (32, 0), 0, 0)], b"", "zero dimension"),
    ([tensor_record("t", (32,), 13, 0)], b"\0" * 128, "Q5_K) is not supported"),
    ([tensor_record("t", (32,), 77, 0)], b"\0" * 128, "ggml type 77 is not supported"),
    ([tensor_record("t", (48,), 8, 0)], b"\0" * 128, "multiple of 32"),
    ([tensor_record("t", (32,), 0, 4)], b"\0" * 256, "not a multiple of the alignment"),
    ([tensor_record("t", (32,), 0, 1 << 60)], b"\0" * 128, "run past its end"),
    ([tensor_record("t", (64,), 0, 0)], b"\0" * 128, "run past its end"),
    ([tensor_record("a", (32,), 0, 0), tensor_record("b", (32,), 0, 160)], b"\0" * 256, "'b'"),
    ([tensor_record("a", (32,), 0, 0), tensor_record("b", (32,), 0, 64)], b"\0" * 256, "overlaps tensor 'a'"),
    ([tensor_record("a", (32,), 0, 0), tensor_record("a", (32,), 0, 128)], b"\0" * 256, "appears twice"),
    ([tensor_record("", (32,), 0, 0)], b"\0" * 128, "is empty"),
    ([gstr(b"t\xff") + struct.pack("<IQIQ", 1, 32, 0, 0)], b"\0" * 128, "not UTF-8"),
    ([gstr("x" * 300) + struct.pack("<IQIQ", 1, 32, 0, 0)], b"\0" * 128, "256-byte limit"),
])
def test_bad_tensor_table(tmp_path, records, data, field):
    message = refused(write(tmp_path, raw_gguf([kv_str("general.architecture", "llama")], records, data)),
                      GGUFFile, field)
    if field == "'b'":   # 'b' ends 32 bytes past the data section: bounds, not overlap
        assert "run past its end" in message


def test_non_finite_weight_names_tensor_and_row(tmp_path):
    values = np.zeros((3, 32), dtype=np.float32)
    values[2, 7] = np.inf
    path = write(tmp_path, one_tensor_gguf(dims=(32, 3), data=values.tobytes()))
    with GGUFFile(path) as f:
        with pytest.raises(ExactSpecError, match=r"tensor 't': row 2 holds a value that is inf or NaN"):
            f.read_float32("t")
        assert f.read_rows_float32("t", 0, 2).shape == (2, 32)


def test_fifo_is_refused_without_blocking(tmp_path):
    import os
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    assert "FIFO" in refused(fifo)


# ---- the model -------------------------------------------------------------------------------

def tiny(tmp_path, name="m.gguf", **kw):
    path = tmp_path / name
    write_tiny_model(str(path), **kw)
    return path


def replace(key, value, vtype):
    return lambda w: w.add_key_value(key, value, vtype)


def delete(key):
    def run(w):
        del w.kv_data[0][key]
    return run


@pytest.mark.parametrize("kw, fields", [
    ({"edit": replace("general.architecture", "gemma", V.STRING)}, ["general.architecture", "'gemma' is not supported"]),
    ({"edit": delete("llama.block_count")}, ["llama.block_count", "is missing"]),
    ({"edit": replace("llama.attention.head_count", "4", V.STRING)}, ["llama.attention.head_count", "not STRING"]),
    ({"edit": replace("llama.attention.head_count_kv", 3, V.UINT32)}, ["llama.attention.head_count_kv", "divide"]),
    ({"edit": replace("llama.embedding_length", 1 << 20, V.UINT32)}, ["llama.embedding_length", "outside"]),
    ({"edit": replace("llama.vocab_size", 7, V.UINT32)}, ["llama.vocab_size", "disagrees"]),
    ({"edit": replace("llama.rope.dimension_count", 32, V.UINT32)}, ["llama.rope.dimension_count", "partial"]),
    ({"edit": replace("llama.rope.freq_base", float("nan"), V.FLOAT32)}, ["llama.rope.freq_base", "not finite"]),
    ({"edit": replace("llama.rope.scaling.type", "yarn", V.STRING)}, ["llama.rope.scaling.type", "'yarn'"]),
    ({"edit": replace("llama.attention.layer_norm_rms_epsilon", 2.0, V.FLOAT32)},
     ["llama.attention.layer_norm_rms_epsilon", "must be > 0 and < 1"]),
    ({"omit": ("blk.1.ffn_up.weight",)}, ["tensor 'blk.1.ffn_up.weight'", "is missing"]),
    ({"omit": ("token_embd.weight",)}, ["tensor 'token_embd.weight'", "is missing"]),
    ({"omit": ("token_embd.weight",), "edit": lambda w: w.add_tensor("token_embd.weight", np.zeros(256, np.float32))},
     ["tensor 'token_embd.weight'", "has shape [256], not"]),
    ({"edit": lambda w: w.add_tensor("blk.2.attn_q.weight", np.zeros((256, 256), np.float32))},
     ["tensor 'blk.2.attn_q.weight'", "not a tensor of this llama model"]),
    ({"edit": lambda w: w.add_tensor("blk.0.attn_q.bias", np.zeros(256, np.float32))},
     ["tensor 'blk.0.attn_q.bias'", "no biases"]),
    ({"edit": lambda w: w.add_tensor("rope_freqs.weight", np.ones(32, np.float32))}, ["rope_freqs.weight", "RoPE"]),
    ({"edit": replace("llama.feed_forward_length", 256, V.UINT32)},
     ["tensor 'blk.0.ffn_gate.weight'", "has shape [512, 256], expected [256, 256]"]),
    ({"arch": "qwen2", "omit": ("blk.0.attn_k.bias",)}, ["tensor 'blk.0.attn_k.bias'", "is missing"]),
])
def test_bad_model(tmp_path, kw, fields):
    refused(tiny(tmp_path, **kw), GGUFModel, *fields)


def test_tiny_model_loads_as_reference(tmp_path):
    ref = load_reference(str(tiny(tmp_path)))
    logits = ref.forward([5, 6, 7], 0)
    assert logits.shape == (3, ref.vocab_size) and np.isfinite(logits).all()


# ---- the tokenizer ---------------------------------------------------------------------------

def tokenizer_refused(path, *fields):
    with GGUFFile(str(path)) as f:
        with pytest.raises(ExactSpecError) as info:
            load_tokenizer(f)
            tokenizer_config(f)
            stop_token_ids(f)
    assert info.value.code == "E_MODEL_LOAD" and str(info.value).startswith(f"E_MODEL_LOAD: {path}: ")
    for field in fields:
        assert field in info.value.message, (field, info.value.message)


@pytest.mark.parametrize("edit, fields", [
    (replace("tokenizer.ggml.model", "bert", V.STRING), ["tokenizer.ggml.model", "'bert' is not supported"]),
    (delete("tokenizer.ggml.model"), ["tokenizer.ggml.model", "is missing"]),
    (replace("tokenizer.ggml.pre", "deepseek-llm", V.STRING), ["tokenizer.ggml.pre", "'deepseek-llm'"]),
    (replace("tokenizer.ggml.token_type", [1, 1], V.ARRAY), ["tokenizer.ggml.token_type", "2 entries"]),
    (lambda w: w.kv_data[0]["tokenizer.ggml.tokens"].value.__setitem__(9, "<|im_start|>"),
     ["tokenizer.ggml.tokens", "token 9 '<|im_start|>' repeats token 1"]),
    (replace("tokenizer.ggml.tokens", [1, 2], V.ARRAY), ["tokenizer.ggml.tokens", "ARRAY[STRING]"]),
    (replace("tokenizer.ggml.merges", ["a zzz"], V.ARRAY), ["tokenizer.ggml.*", "merge #1"]),
    (replace("tokenizer.ggml.eos_token_id", 1 << 20, V.UINT32), ["tokenizer.ggml.eos_token_id", "outside"]),
    (replace("tokenizer.ggml.add_bos_token", 1, V.UINT8), ["tokenizer.ggml.add_bos_token", "must be BOOL"]),
])
def test_bad_tokenizer(tmp_path, edit, fields):
    tokenizer_refused(tiny(tmp_path, edit=edit), *fields)


def test_header_and_tokenizer_need_no_numpy(tmp_path):
    """gguf.py and gguf_tokenizer.py parse and build with the standard library only (Pyodide)."""
    import subprocess
    import sys
    path = tiny(tmp_path)
    script = ("import sys; sys.modules['numpy'] = None\n"
              "from exactspec.formats.gguf import GGUFFile\nfrom exactspec.formats.gguf_tokenizer import load_tokenizer\n"
              f"f = GGUFFile({str(path)!r})\nprint(len(f.tensors), load_tokenizer(f).encode('hello world'))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("21 ["), done.stderr


def test_header_size_limit(tmp_path, monkeypatch):
    from exactspec.formats import gguf as gguf_module
    monkeypatch.setattr(gguf_module, "MAX_HEADER_BYTES", 4096)
    big = kv("k", 8, gstr("y" * 5000))
    refused(write(tmp_path, raw_gguf([big], [])), GGUFFile, "metadata['k']", "4096 bytes of header")
