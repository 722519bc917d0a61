"""GGUF dequantisers against the `gguf` package's own (gguf.quants.dequantize), bit for bit.

Random bytes cover every bit pattern a block can hold (float16 scales included: inf, NaN and
subnormals); files written by gguf's GGUFWriter are read back through GGUFFile row by row, in
blocks smaller than a tensor, and must equal gguf's values of the same bytes.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q, GGML_QUANT_SIZES, GGUFReader, quants

from exactspec.formats import gguf as gguf_module
from exactspec.formats.gguf import GGUFFile, TENSOR_TYPES
from exactspec.reference.gguf_dequant import dequantize
from synthetic_models import write_tiny_model

TYPES = [name for name, _, _ in TENSOR_TYPES.values()]


def test_every_type_is_tested():
    assert sorted(TYPES) == sorted(["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"])


@pytest.mark.parametrize("type_name", TYPES)
def test_random_blocks_bitwise(type_name):
    rng = np.random.default_rng(sum(map(ord, type_name)))
    block, size = GGML_QUANT_SIZES[Q[type_name]]
    raw = rng.integers(0, 256, size=(257, size), dtype=np.uint8)     # every byte pattern, odd count
    with np.errstate(all="ignore"):
        theirs = np.asarray(quants.dequantize(raw.reshape(-1), Q[type_name]), dtype=np.float32).reshape(-1)
        ours = dequantize(raw.tobytes(), type_name)
    assert ours.dtype == np.float32 and ours.shape == (257 * block,)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"])
def test_scale_sign_and_extremes(type_name):
    """Blocks whose scales are +-0, +-max float16 and subnormal: the products' signs and rounding."""
    block, size = GGML_QUANT_SIZES[Q[type_name]]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(6, size), dtype=np.uint8)
    at = {"Q6_K": [208]}.get(type_name, [0, 2] if type_name in ("Q4_1", "Q4_K") else [0])
    for row, bits in enumerate([0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x0001, 0x8001]):
        for a in at:
            raw[row, a:a + 2] = np.array([bits], dtype="<u2").view(np.uint8)
    theirs = np.asarray(quants.dequantize(raw.reshape(-1), Q[type_name]), dtype=np.float32).reshape(-1)
    assert np.array_equal(dequantize(raw.tobytes(), type_name).view(np.uint32), theirs.view(np.uint32))


def test_file_rows_in_small_blocks_equal_gguf(tmp_path, monkeypatch):
    """Every tensor of a file holding all eight types, read by row ranges through blocks of 3 rows,
    equals gguf's GGUFReader + dequantize of the same tensor."""
    path = str(tmp_path / "all_types.gguf")
    write_tiny_model(path, types={"token_embd.weight": Q.Q8_0, "attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q6_K,
                                  "attn_v.weight": Q.F16, "ffn_gate.weight": Q.BF16, "ffn_up.weight": Q.Q4_0,
                                  "ffn_down.weight": Q.Q4_1})
    reader = GGUFReader(path)
    with GGUFFile(path) as f:
        assert {t.type_name for t in f.tensors.values()} == set(TYPES)
        for t in reader.tensors:
            ours = f.tensors[t.name]
            monkeypatch.setattr(gguf_module, "ROW_BLOCK_BYTES", 3 * ours.row_bytes)
            theirs = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(ours.shape)
            assert np.array_equal(f.read_float32(t.name), theirs), t.name
            if ours.rows > 5:
                assert np.array_equal(f.read_rows_float32(t.name, 2, 5), theirs.reshape(ours.rows, -1)[2:5])
