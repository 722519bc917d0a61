"""NumPy reference Llama vs Hugging Face LlamaForCausalLM, cache rollback, block/single, errors.

The float64 comparison runs HF with its three float32 islands (RMSNorm upcast, RoPE tables,
softmax dtype) patched to stay in float64, so both sides compute the same maths in float64 and
the only differences are float64 rounding. The float32 comparison runs stock HF.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.models.llama import modeling_llama

import synthetic_models
from exactspec.core.errors import E_BAD_ARGUMENT, E_CONTEXT_OVERFLOW, E_MODEL_LOAD, ExactSpecError
from exactspec.reference.reference_llama import REFERENCE_TOLERANCES, LlamaReference

TOL_F64 = REFERENCE_TOLERANCES["vs_hf_float64_abs"]
TOL_F32 = REFERENCE_TOLERANCES["vs_hf_float32_abs"]
TOL_BLOCK = REFERENCE_TOLERANCES["block_vs_single_rel"]

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "web" / "models"

# Shapes chosen to be awkward: GQA, MQA, head_dim != hidden/heads, vocab not a multiple of 64.
CONFIGS = {
    "mha_untied": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=4, vocab_size=257, rope_theta=10000.0, tie_word_embeddings=False),
    "gqa_tied": dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
                     num_key_value_heads=2, vocab_size=1000, rope_theta=500000.0, tie_word_embeddings=True),
    "mqa_headdim": dict(hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=16, vocab_size=130, rope_theta=10000.0,
                        tie_word_embeddings=True, rms_norm_eps=1e-5),
    "odd_heads": dict(hidden_size=40, intermediate_size=56, num_hidden_layers=1, num_attention_heads=5,
                      num_key_value_heads=5, head_dim=12, vocab_size=67, rope_theta=1000.0,
                      tie_word_embeddings=False),
}


# ---------------------------------------------------------------------------------------------
# HF in float64 throughout
# ---------------------------------------------------------------------------------------------

def _rmsnorm_f64(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rope_f64(self, x, position_ids):
    cfg = self.config
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    base = cfg.rope_parameters["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = position_ids[..., None].to(torch.float64) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _eager_attention_f64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key_states = modeling_llama.repeat_kv(key, module.num_key_value_groups)
    value_states = modeling_llama.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1, dtype=query.dtype)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


@contextlib.contextmanager
def hf_in_float64():
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(modeling_llama.LlamaRMSNorm, "forward", _rmsnorm_f64)
        mp.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", _rope_f64)
        mp.setattr(modeling_llama, "eager_attention_forward", _eager_attention_f64)
        yield
    finally:
        mp.undo()


def hf_logits(model, ids, float64: bool) -> np.ndarray:
    """(n, V) float64 logits of HF for one sequence, no cache."""
    inp = torch.tensor([list(ids)], dtype=torch.long)
    with torch.no_grad():
        if float64:
            with hf_in_float64():
                out = model.double()(input_ids=inp, use_cache=False).logits
        else:
            out = model.float()(input_ids=inp, use_cache=False).logits
    return out[0].to(torch.float64).numpy()


# ---------------------------------------------------------------------------------------------
# Random checkpoints
# ---------------------------------------------------------------------------------------------

make_model = synthetic_models.lively_llama   # peaked, non-uniform logits


def save_model(model, directory: Path) -> Path:
    model.save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    name = request.param
    model = make_model(CONFIGS[name], seed=sorted(CONFIGS).index(name) + 1)
    directory = save_model(model, tmp_path_factory.mktemp(name))
    return name, model, directory


def random_ids(rng, vocab, n):
    return [int(t) for t in rng.integers(0, vocab, size=n)]


# ---------------------------------------------------------------------------------------------
# (1) agreement with HF
# ---------------------------------------------------------------------------------------------

def test_matches_hf_float64_and_float32(checkpoint):
    name, model, directory = checkpoint
    ref = LlamaReference.from_dir(directory)
    assert ref.vocab_size == CONFIGS[name]["vocab_size"] and ref.max_context == 64
    rng = np.random.default_rng(7)
    for n in (1, 5, 40):
        ids = random_ids(rng, ref.vocab_size, n)
        ref.reset()
        ours = ref.forward(ids, 0)
        assert ours.shape == (n, ref.vocab_size) and ours.dtype == np.float64
        diff64 = np.max(np.abs(ours - hf_logits(model, ids, float64=True)))
        diff32 = np.max(np.abs(ours - hf_logits(model, ids, float64=False)))
        assert diff64 < TOL_F64, (name, n, diff64)
        assert diff32 < TOL_F32, (name, n, diff32)
        assert np.ptp(ours, axis=-1).min() > 1.0   # logits are not flat: the test has teeth


@pytest.mark.parametrize("dtype,code", [(torch.float16, "F16"), (torch.bfloat16, "BF16")])
def test_half_precision_checkpoints(tmp_path, dtype, code):
    model = make_model(CONFIGS["gqa_tied"], seed=11).to(dtype)
    save_model(model, tmp_path)
    header_len = int.from_bytes((tmp_path / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((tmp_path / "model.safetensors").read_bytes()[8:8 + header_len])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {code}
    ref = LlamaReference.from_dir(tmp_path)
    ids = random_ids(np.random.default_rng(3), ref.vocab_size, 12)
    diff = np.max(np.abs(ref.forward(ids, 0) - hf_logits(model, ids, float64=True)))
    assert diff < TOL_F64, diff


def test_identity_is_sha256_of_weights(checkpoint):
    import hashlib
    _, _, directory = checkpoint
    ref = LlamaReference.from_dir(directory)
    assert ref.identity == hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    assert ref.config["vocab_size"] == ref.vocab_size


# ---------------------------------------------------------------------------------------------
# (2) incremental decoding with rollback, (3) block == singles
# ---------------------------------------------------------------------------------------------

def test_incremental_decode_with_rollback(tmp_path):
    # max_context 200 so the cache must grow past its first 64-slot allocation mid-run.
    model = make_model(CONFIGS["gqa_tied"], seed=5, max_pos=200)
    ref = LlamaReference.from_dir(save_model(model, tmp_path))
    fresh = LlamaReference.from_dir(tmp_path)
    rng = np.random.default_rng(9)
    V = ref.vocab_size
    prompt = random_ids(rng, V, 50)

    def check(seq, got_rows, start):
        fresh.reset()
        want = fresh.forward(seq, 0)[start:start + len(got_rows)]
        assert np.max(np.abs(got_rows - want)) <= TOL_BLOCK * np.max(np.abs(want))

    ref.forward(prompt, 0)
    seq = list(prompt)
    for _ in range(20):                                  # decode one at a time past 64
        tok = random_ids(rng, V, 1)
        row = ref.forward(tok, len(seq))
        seq += tok
        check(seq, row, len(seq) - 1)
    assert ref.length == 70
    for back_to in (66, 40, 0):                          # rejections at several depths
        seq = seq[:back_to]
        block = random_ids(rng, V, 5)                    # a verification block after rollback
        rows = ref.forward(block, back_to)
        seq += block
        check(seq, rows, back_to)
        tok = random_ids(rng, V, 1)
        row = ref.forward(tok, len(seq))
        seq += tok
        check(seq, row, len(seq) - 1)
        assert ref.length == len(seq)
    # whole-sequence agreement with HF after all that
    np.testing.assert_allclose(ref.forward(seq, 0)[-1], hf_logits(model, seq, True)[-1], rtol=0, atol=TOL_F64)


def test_block_equals_singles(checkpoint):
    _, _, directory = checkpoint
    block_ref = LlamaReference.from_dir(directory)
    single_ref = LlamaReference.from_dir(directory)
    rng = np.random.default_rng(21)
    ids = random_ids(rng, block_ref.vocab_size, 30)
    prefix = 12
    block_ref.forward(ids[:prefix], 0)
    single_ref.forward(ids[:prefix], 0)
    for k_plus_1 in (1, 2, 5, 11):                      # verification blocks of several sizes
        start = prefix
        block = block_ref.forward(ids[start:start + k_plus_1], start)
        singles = np.concatenate([single_ref.forward([ids[p]], p) for p in range(start, start + k_plus_1)])
        scale = np.max(np.abs(singles))
        assert np.max(np.abs(block - singles)) <= TOL_BLOCK * scale


# ---------------------------------------------------------------------------------------------
# (4) errors
# ---------------------------------------------------------------------------------------------

@pytest.fixture()
def small_dir(tmp_path):
    return save_model(make_model(CONFIGS["mqa_headdim"], seed=2, max_pos=16), tmp_path)


def _rewrite_tensors(directory: Path, edit):
    path = directory / "model.safetensors"
    tensors = edit(load_file(str(path)))
    save_file(tensors, str(path), metadata={"format": "pt"})


def _expect(code, fn, *needles):
    with pytest.raises(ExactSpecError) as info:
        fn()
    assert info.value.code == code, info.value
    for needle in needles:
        assert needle in info.value.message, (needle, info.value.message)
    return info.value


def test_missing_tensor_names_tensor_and_file(small_dir):
    name = "model.layers.1.mlp.up_proj.weight"
    _rewrite_tensors(small_dir, lambda t: {k: v for k, v in t.items() if k != name})
    _expect(E_MODEL_LOAD, lambda: LlamaReference.from_dir(small_dir), name, "model.safetensors")


def test_wrong_shape_names_tensor_and_file(small_dir):
    name = "model.layers.0.self_attn.k_proj.weight"
    _rewrite_tensors(small_dir, lambda t: {**t, name: t[name][:-1].contiguous()})
    _expect(E_MODEL_LOAD, lambda: LlamaReference.from_dir(small_dir), name, "model.safetensors")


def test_untied_without_lm_head_refused(tmp_path):
    save_model(make_model(CONFIGS["odd_heads"], seed=3), tmp_path)
    _rewrite_tensors(tmp_path, lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"})
    _expect(E_MODEL_LOAD, lambda: LlamaReference.from_dir(tmp_path), "lm_head.weight")


def test_bias_refused(tmp_path):
    save_model(make_model(dict(CONFIGS["odd_heads"], attention_bias=True), seed=3), tmp_path)
    _expect(E_MODEL_LOAD, lambda: LlamaReference.from_dir(tmp_path), "attention_bias")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["attention_bias"] = False                        # config lies; the tensor still refuses
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _expect(E_MODEL_LOAD, lambda: LlamaReference.from_dir(tmp_path), ".bias")


@pytest.mark.parametrize("rope", [
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}},
])
def test_rope_scaling_refused(small_dir, rope):
    cfg = json.loads((small_dir / "config.json").read_text())
    cfg.update(rope)
    (small_dir / "config.json").write_text(json.dumps(cfg))
    _expect(E_MODEL_LOAD, lambda: LlamaReference.from_dir(small_dir), "rope")


def test_legacy_rope_theta_key(small_dir):
    modern = LlamaReference.from_dir(small_dir)._inv_freq   # rope_parameters.rope_theta
    cfg = json.loads((small_dir / "config.json").read_text())
    theta = cfg.pop("rope_parameters")["rope_theta"]
    cfg.update(rope_theta=theta, rope_scaling=None)
    (small_dir / "config.json").write_text(json.dumps(cfg))
    legacy = LlamaReference.from_dir(small_dir)._inv_freq
    np.testing.assert_array_equal(legacy, modern)
    # the one formula (config.rope_inv_freq, scalar float64 pow); NumPy's vectorised pow may
    # differ from libm's (pow, then the division: 2 ulp seen), so that form is within 4 ulp only
    np.testing.assert_array_equal(legacy, [1.0 / theta ** (i / 16) for i in range(0, 16, 2)])
    np.testing.assert_array_max_ulp(legacy, 1.0 / theta ** (np.arange(0, 16, 2) / 16), maxulp=4)


def test_missing_files_refused(tmp_path):
    _expect(E_MODEL_LOAD, lambda: LlamaReference.from_dir(tmp_path), "config.json")


def test_context_overflow_and_bad_start(small_dir):
    ref = LlamaReference.from_dir(small_dir)   # max_context 16
    ref.forward(list(range(10)), 0)
    _expect(E_CONTEXT_OVERFLOW, lambda: ref.forward(list(range(7)), 10), "16")
    ref.forward(list(range(6)), 10)            # exactly fills the context: allowed
    _expect(E_CONTEXT_OVERFLOW, lambda: ref.forward([1], 16))
    ref.forward([1, 2], 3)                     # rollback to 3, now materialised length is 5
    assert ref.length == 5
    _expect(E_BAD_ARGUMENT, lambda: ref.forward([1], 6), "start_pos")
    _expect(E_BAD_ARGUMENT, lambda: ref.forward([1], -1), "start_pos")
    _expect(E_BAD_ARGUMENT, lambda: ref.forward([], 0))
    _expect(E_BAD_ARGUMENT, lambda: ref.forward([ref.vocab_size], 0))
    _expect(E_BAD_ARGUMENT, lambda: ref.forward([-1], 0))
    assert ref.length == 5                     # failed calls change nothing
    ref.reset()
    _expect(E_BAD_ARGUMENT, lambda: ref.forward([1], 1))


# ---------------------------------------------------------------------------------------------
# (5) the shipped default pair
# ---------------------------------------------------------------------------------------------

SHIPPED_PROMPTS = [
    "Once upon a time",
    "The little robot looked at the sky and said",
    "Q: What is two plus two?\nA:",
    "a",
    "The quick brown fox jumps over the lazy dog. " * 20,   # ~300 tokens: deep RoPE positions
]


@pytest.mark.parametrize("which", ["champion", "draft"])
def test_shipped_models_match_hf(which):
    from tokenizers import Tokenizer
    directory = SHIPPED / which
    tok_path = SHIPPED / "champion" / "tokenizer.json"
    for p in (directory / "config.json", directory / "model.safetensors", tok_path):
        assert p.is_file(), f"shipped model file missing: {p} (export the default pair first)"
    tokenizer = Tokenizer.from_file(str(tok_path))
    ref = LlamaReference.from_dir(directory)
    model = transformers.LlamaForCausalLM.from_pretrained(str(directory), attn_implementation="eager").eval()
    for prompt in SHIPPED_PROMPTS:
        ids = tokenizer.encode(prompt).ids
        assert ids and max(ids) < ref.vocab_size
        ref.reset()
        ours = ref.forward(ids, 0)
        diff64 = np.max(np.abs(ours - hf_logits(model, ids, float64=True)))
        diff32 = np.max(np.abs(ours - hf_logits(model, ids, float64=False)))
        assert diff64 < TOL_F64, (which, prompt, diff64)
        assert diff32 < TOL_F32, (which, prompt, diff32)


def test_shipped_champion_q8_is_dequantised_f32(tmp_path):
    """weights="q8" must equal an F32 checkpoint holding q8 * scale[:, None] (formed in float32)."""
    from safetensors.numpy import save_file as save_numpy
    from exactspec.formats.safetensors import load_safetensors
    directory = SHIPPED / "champion"
    q8_path = directory / "model.q8.safetensors"
    assert q8_path.is_file(), f"shipped model file missing: {q8_path}"
    raw = load_safetensors(str(q8_path))
    dense = {}
    for name, t in raw.items():
        if name.endswith(".q8"):
            q = np.frombuffer(t.data, dtype=np.int8).reshape(t.shape).astype(np.float32)
            scale = np.frombuffer(raw[name[:-3] + ".scale"].data, dtype="<f4")
            dense[name[:-3]] = q * scale[:, None]
        elif not name.endswith(".scale"):
            dense[name] = np.frombuffer(t.data, dtype="<f4").reshape(t.shape)
    save_numpy(dense, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_bytes((directory / "config.json").read_bytes())
    q8_ref = LlamaReference.from_dir(directory, weights="q8")
    dense_ref = LlamaReference.from_dir(tmp_path)
    f32_ref = LlamaReference.from_dir(directory)
    assert q8_ref.identity != f32_ref.identity
    ids = list(range(3, 40))
    np.testing.assert_array_equal(q8_ref.forward(ids, 0), dense_ref.forward(ids, 0))
    assert np.max(np.abs(q8_ref.forward(ids, 0) - f32_ref.forward(ids, 0))) < 1.0   # quantisation, not garbage
    _expect(E_BAD_ARGUMENT, lambda: LlamaReference.from_dir(directory, weights="int4"), "weights")


def test_q8_missing_scale_refused(tmp_path):
    from exactspec.formats.safetensors import load_safetensors
    from safetensors.numpy import save_file as save_numpy
    directory = SHIPPED / "champion"
    raw = load_safetensors(str(directory / "model.q8.safetensors"))
    dropped = "model.layers.0.mlp.up_proj.weight.scale"
    arrays = {n: np.frombuffer(t.data, dtype=np.int8 if t.dtype == "I8" else "<f4").reshape(t.shape)
              for n, t in raw.items() if n != dropped}
    save_numpy(arrays, str(tmp_path / "model.q8.safetensors"))
    (tmp_path / "config.json").write_bytes((directory / "config.json").read_bytes())
    _expect(E_MODEL_LOAD, lambda: LlamaReference.from_dir(tmp_path, weights="q8"), dropped)
