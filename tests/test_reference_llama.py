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


# ---------------------------------------------------------------------------------------------
# matmul="q8act": the quantised linears on their blocks (docs/quant_kernels.md)
# ---------------------------------------------------------------------------------------------

from exactspec.reference import block_linear                                     # noqa: E402
from exactspec.reference.reference_llama import apply_rope, rms_norm, silu, softmax_rows  # noqa: E402
from exactspec.twins import qmatmul_twins as twin                                # noqa: E402

Q8ACT_GGUF_TYPES = {"token_embd.weight": "Q8_0", "output.weight": "Q6_K", "attn_q.weight": "Q4_K",
                    "attn_k.weight": "Q4_1", "attn_v.weight": "Q4_0", "attn_output.weight": "F16",
                    "ffn_gate.weight": "Q8_0", "ffn_up.weight": "Q4_1", "ffn_down.weight": "Q6_K"}


def q8act_model(directory: Path, layers: int = 2, seed: int = 8) -> Path:
    """A q8 artifact written directly: every linear and the tied embedding int8 + row scale,
    V = 301 (not a multiple of 4), GQA 4/2, head_dim 16, non-unit norms, default RoPE."""
    from safetensors.numpy import save_file as save_numpy
    V, D, F, H, KV, hd = 301, 64, 96, 4, 2, 16
    rs = np.random.default_rng(seed)
    t = {"model.norm.weight": 1 + 0.3 * rs.normal(size=D)}
    t["model.embed_tokens.weight.q8"], t["model.embed_tokens.weight.scale"] = \
        synthetic_models.quantize_rows(rs.normal(0, 0.6, (V, D)))
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = 1 + 0.3 * rs.normal(size=D)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.3 * rs.normal(size=D)
        for name, shape in synthetic_models._linear_shapes(D, F, H, KV, hd):
            t[p + name + ".weight.q8"], t[p + name + ".weight.scale"] = \
                synthetic_models.quantize_rows(rs.normal(0, 0.25, shape))
    config = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
              "num_hidden_layers": layers, "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": hd,
              "max_position_embeddings": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": True, "hidden_act": "silu"}
    directory.mkdir(parents=True, exist_ok=True)
    save_numpy({k: np.ascontiguousarray(v, dtype=np.int8 if v.dtype == np.int8 else np.float32) for k, v in t.items()},
               str(directory / "model.q8.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def composed_q8act_forward(directory: Path, ids) -> np.ndarray:
    """The q8act-v1 forward of q8act_model's folder composed by hand from twin calls: the gather
    through twin.dequantize_rows, every linear and the tied head through twin.qmatmul on the
    int8 rows as stored, everything else float64 (the reference's functions)."""
    from exactspec.formats.safetensors import load_safetensors
    raw = load_safetensors(str(directory / "model.q8.safetensors"))
    c = json.loads((directory / "config.json").read_text())
    H, KV, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]

    def f64(name):
        return np.frombuffer(raw[name].data, dtype="<f4").astype(np.float64)

    def lin(name, x):
        rows, cols = raw[name + ".q8"].shape
        return twin.qmatmul("ROWQ8", raw[name + ".q8"].data, x.astype(np.float32), rows, cols,
                            row_scale=np.frombuffer(raw[name + ".scale"].data, "<f4")).astype(np.float64)

    ids = np.asarray(ids)
    n = ids.size
    embed_q8 = np.frombuffer(raw["model.embed_tokens.weight.q8"].data, np.int8).reshape(c["vocab_size"], -1)
    embed_scale = np.frombuffer(raw["model.embed_tokens.weight.scale"].data, "<f4")
    x = twin.dequantize_rows("ROWQ8", embed_q8[ids].tobytes(), n, c["hidden_size"], embed_scale[ids]).astype(np.float64)
    inv_freq = 1.0 / (c["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    angles = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate((angles, angles), axis=-1)[:, None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    mask = np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], 0.0, -np.inf)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, f64(p + "input_layernorm.weight"), eps)
        q = apply_rope(lin(p + "self_attn.q_proj.weight", h).reshape(n, H, hd), cos, sin)
        k = apply_rope(lin(p + "self_attn.k_proj.weight", h).reshape(n, KV, hd), cos, sin)
        v = lin(p + "self_attn.v_proj.weight", h).reshape(n, KV, hd)
        qg = q.reshape(n, KV, H // KV, hd).transpose(1, 2, 0, 3)
        keys, values = k.transpose(1, 0, 2)[:, None], v.transpose(1, 0, 2)[:, None]
        scores = (qg @ keys.transpose(0, 1, 3, 2)) * hd ** -0.5 + mask
        attn = (softmax_rows(scores) @ values).transpose(2, 0, 1, 3).reshape(n, H * hd)
        x = x + lin(p + "self_attn.o_proj.weight", attn)
        h = rms_norm(x, f64(p + "post_attention_layernorm.weight"), eps)
        x = x + lin(p + "mlp.down_proj.weight",
                    silu(lin(p + "mlp.gate_proj.weight", h)) * lin(p + "mlp.up_proj.weight", h))
    return lin("model.embed_tokens.weight", rms_norm(x, f64("model.norm.weight"), eps))


def test_q8act_reference_is_the_composition_of_twin_calls(tmp_path):
    """from_dir(weights="q8", matmul="q8act") computes every linear, the gather and the tied head
    with the twin on the stored int8 rows: the logits are the hand composition's (float64
    elsewhere, same functions), and visibly not the float function's."""
    directory = q8act_model(tmp_path / "m")
    ids = np.random.default_rng(1).integers(0, 301, 23)
    ref = LlamaReference.from_dir(directory, weights="q8", matmul="q8act")
    assert (ref.matmul, ref.matmul_function) == ("q8act", "q8act-v1")
    got, want = ref.forward(ids, 0), composed_q8act_forward(directory, ids)
    assert np.array_equal(got, want), np.abs(got - want).max()
    assert np.array_equal(got.astype(np.float32).astype(np.float64), got)        # the head's float32 outputs
    f32 = LlamaReference.from_dir(directory, weights="q8").forward(ids, 0)
    assert np.abs(f32 - got).max() > 1e-4                                       # another function
    # incremental decode with a rollback: each position's logits as in one block
    ref.reset()
    rows = [ref.forward(ids[:9], 0), ref.forward(ids[9:10], 9), ref.forward(ids[5:23], 5)]
    assert np.allclose(np.concatenate([rows[0][:5], rows[2]]), want, rtol=0, atol=1e-9)


def element_magnitudes(lin) -> tuple:
    """(exact float64 weights, |d q| + |m| per element) of a BlockLinear from its decoded blocks."""
    q, dw, mw, sub = twin.decode_blocks(lin.fmt, lin.raw, lin.rows, lin.cols)
    scale = np.repeat(dw.astype(np.float64), 32, axis=1)
    if sub is not None:                                                           # Q6_K sub-scales
        scale = scale * np.repeat(sub, 16, axis=1)
    dq = scale * q
    m = np.zeros_like(dq) if mw is None else np.repeat(mw.astype(np.float64), 32, axis=1)
    rs = np.ones(lin.rows) if lin.row_scale is None else lin.row_scale.astype(np.float64)
    return (dq + m) * rs[:, None], (np.abs(dq) + np.abs(m)) * np.abs(rs)[:, None]


def q8act_bound(lin, x32) -> np.ndarray:
    """|q8act(x) - W x| <= sum_j |w_j| |x_j - dx qx_j| (the activations' rounding, half a step at
    >= 64 levels) + (blocks + 4) u sum_j (|d q_j| + |m_j|) |dx qx_j| (float32 rounding: one per
    block term and its min term, one per accumulation, one for the row scale; u = 2^-24)."""
    w, mag = element_magnitudes(lin)
    qx, dx, _ = twin.quantize_activations(x32)
    xq = qx.astype(np.float64) * np.repeat(dx.astype(np.float64), 32, axis=1)
    x = x32.astype(np.float64)
    return np.abs(x - xq) @ np.abs(w).T + (lin.cols // 32 + 4) * 2.0 ** -24 * (np.abs(xq) @ mag.T) + 1e-300


def test_q8act_linears_within_the_quantisation_error_of_the_float_ones(tmp_path):
    """Every linear call of a q8act forward (the activations the model really makes): the q8act
    output within the derived bound of the exact float64 product of its weights; the whole
    model's logits then close to the float function's (same argmax where the margin is clear)."""
    directory = q8act_model(tmp_path / "m", layers=3, seed=9)
    ref = LlamaReference.from_dir(directory, weights="q8", matmul="q8act")
    calls = []
    original = block_linear.BlockLinear.matmul

    def checked(self, x):
        out = original(self, x)
        x32 = np.asarray(x).astype(np.float32)
        w, _ = element_magnitudes(self)
        err = np.abs(out - x32.astype(np.float64) @ w.T)
        bound = q8act_bound(self, x32)
        assert np.all(err <= bound), (self.fmt, self.rows, self.cols, float((err - bound).max()))
        calls.append(float((err / bound).max()))
        return out

    ids = np.random.default_rng(2).integers(0, 301, 30)
    mp = pytest.MonkeyPatch()
    mp.setattr(block_linear.BlockLinear, "matmul", checked)
    try:
        got = ref.forward(ids, 0)
    finally:
        mp.undo()
    assert len(calls) == 3 * 7 + 1 and max(calls) > 0.05                       # every linear; the bound is not slack
    assert np.isfinite(got).all()


def test_q8act_on_the_shipped_champion_is_close_to_the_float_function():
    """On the trained champion the activations' int8 rounding moves the logits about as much as
    the weights' int8 rounding does (measured 0.28 against 0.11, logits to ~17): at most 4x, and
    the same argmax wherever the float function's top-2 margin exceeds twice the difference."""
    from tokenizers import Tokenizer
    directory = SHIPPED / "champion"
    ids = Tokenizer.from_file(str(directory / "tokenizer.json")).encode(SHIPPED_PROMPTS[1]).ids
    got = LlamaReference.from_dir(directory, weights="q8", matmul="q8act").forward(ids, 0)
    want = LlamaReference.from_dir(directory, weights="q8").forward(ids, 0)
    weights_error = np.abs(want - LlamaReference.from_dir(directory).forward(ids, 0)).max()
    diff = np.abs(got - want).max()
    print(f"[err] q8act vs f32 matmul on the shipped champion: {diff:.3g}; q8 vs f32 weights: {weights_error:.3g}")
    assert 0 < diff <= 4 * weights_error, (diff, weights_error)
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * diff
    assert clear.sum() >= len(ids) // 2 and np.array_equal(got.argmax(1)[clear], want.argmax(1)[clear])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_q8act_reads_blocks_in_hf_order(tmp_path, arch):
    """load_reference(gguf, matmul="q8act"): the block tensors stay in their blocks, their rows in
    HF order (llama's q/k un-permuted: a row's blocks move whole), the gather and the element
    formula the float reader's bits; the forward is another function than the float one."""
    from gguf import GGMLQuantizationType as Q
    from exactspec.formats.gguf_model import GGUFModel, load_reference
    path = str(tmp_path / f"{arch}.gguf")
    synthetic_models.write_tiny_model(path, arch=arch, types={k: Q[v] for k, v in Q8ACT_GGUF_TYPES.items()})
    with GGUFModel(path) as model:
        formats = {}
        for name in model.names:
            lin = model.read_blocks(name)
            formats[model.names[name].split(".", 2)[-1] if name.startswith("model.layers.") else model.names[name]] = \
                None if lin is None else lin.fmt
            if lin is not None:
                dense = lin.rows_float32(np.arange(lin.rows))
                assert np.array_equal(dense.view(np.uint32), model.read_float32(name).view(np.uint32)), name
                x = np.random.default_rng(0).normal(size=(3, lin.cols)).astype(np.float32)
                err = np.abs(lin.matmul(x) - x.astype(np.float64) @ model.read_float32(name).astype(np.float64).T)
                assert np.all(err <= q8act_bound(lin, x) * 1.01 + 1e-6), name   # + the float reader's element rounding
    want = {k: (v if v != "F16" else None) for k, v in Q8ACT_GGUF_TYPES.items()}
    assert {k: formats[k] for k in want} == want
    ref, f32 = load_reference(path, matmul="q8act"), load_reference(path)
    assert ref.identity == f32.identity and ref.matmul_function == "q8act-v1"
    ids = np.random.default_rng(3).integers(0, ref.vocab_size, 12)
    got, want_logits = ref.forward(ids, 0), f32.forward(ids, 0)
    assert np.array_equal(got.astype(np.float32).astype(np.float64), got)      # untied Q6_K head: float32 outputs
    assert 0 < np.abs(got - want_logits).max() < 0.05 * np.abs(want_logits).max()


def test_q8act_refusals(tmp_path):
    """A width that is not a multiple of the 32-block, a non-finite f16 scale and an unknown
    matmul are refused, coded and named."""
    _expect(E_BAD_ARGUMENT, lambda: LlamaReference.from_dir(q8act_model(tmp_path / "m"), weights="q8",
                                                            matmul="int4"), "matmul")
    _expect(E_MODEL_LOAD, lambda: LlamaReference.from_dir(synthetic_models.odd_q8(), weights="q8", matmul="q8act"),
            "model.layers.0.mlp.down_proj.weight.q8", "176 columns", "multiple")
    raw = bytearray(twin.random_blocks("Q4_1", 2, 64, np.random.default_rng(0)))
    raw[20 + 2:20 + 4] = np.array([np.inf], "<f2").tobytes()                    # block 1's min: inf
    _expect(E_MODEL_LOAD, lambda: block_linear.BlockLinear("Q4_1", bytes(raw), 2, 64, name="blk.0.ffn_up.weight",
                                                           source="x.gguf"), "blk.0.ffn_up.weight", "non-finite")
    _expect(E_MODEL_LOAD, lambda: block_linear.BlockLinear("Q4_1", bytes(raw[:-1]), 2, 64, name="t", source="x"),
            "bytes")


def test_load_pair_takes_the_champion_matmul(tmp_path):
    """models.load_pair(..., champion_matmul="q8act"): the champion reference computes q8act-v1,
    a folder (q8 artifact) and a GGUF file alike; the default stays the float function."""
    from gguf import GGMLQuantizationType as Q
    from exactspec.reference.models import load_pair
    folder = load_pair(str(SHIPPED / "champion"), champion_weights="q8", champion_matmul="q8act")
    assert folder.orchestrator.champion.runner.matmul_function == "q8act-v1"
    assert load_pair(str(SHIPPED / "champion"), champion_weights="q8").orchestrator.champion.runner.matmul_function == "f32"
    path = str(tmp_path / "tiny.gguf")
    synthetic_models.write_tiny_model(path, types={"attn_q.weight": Q.Q4_0, "token_embd.weight": Q.Q8_0})
    gguf = load_pair(path, champion_matmul="q8act")
    assert gguf.orchestrator.champion.runner.matmul_function == "q8act-v1"
