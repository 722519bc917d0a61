"""WebGPU champion at real-model features and sizes (web/gpu/champion*.mjs) in headless Chromium.

Mid-size random checkpoints (synthetic_models.FAMILIES, made by transformers), one per family
feature: Qwen2 (q/k/v biases, untied f32 head), Llama with llama3 RoPE (tied q8
embedding), Llama with linear RoPE (untied q8 head, GQA 14/2). Each is converted to
model.q8.safetensors and compared with transformers itself run in float64 on the dequantised
weights; tensors are forced into several row pieces (a lowered split threshold) and checked bit for
bit against one piece; blocks bit for bit against single positions. The real-size plan (which
tensors split at the adapter's actual binding limit, what is refused and why) needs no weights.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from browser_fixture import chromium_browser, http_server  # noqa: F401
from exactspec.twins import gpu_twins
from test_gpu_champion import (b64, forward_blocks, gpu_page, run_kernel, split,  # noqa: F401
                               unb64, url_of)
import synthetic_models
from synthetic_models import FAMILIES, quantize_rows
from tolerances import TOLERANCES, max_error, within

TINY_SPLIT = 16384                 # bytes per binding that force every big tensor into pieces


# ----------------------------------------------------------------------------- checkpoints
def dequantised_state(model_dir: Path) -> dict:
    """The q8 file as float32 tensors under HF names (W = q8 * scale[:, None] in float32)."""
    from safetensors.numpy import load_file
    raw = load_file(str(model_dir / "model.q8.safetensors"))
    out = {}
    for name, t in raw.items():
        if name.endswith(".q8"):
            out[name[:-3]] = t.astype(np.float32) * raw[name[:-3] + ".scale"][:, None]
        elif not (name.endswith(".scale") and name[:-6] + ".q8" in raw):
            out[name] = t
    return out


def hf_float64_logits(model_dir: Path, ids) -> np.ndarray:
    """transformers in float64 on the dequantised q8 weights: (len(ids), V)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    state = {k: torch.from_numpy(np.ascontiguousarray(v)).double() for k, v in dequantised_state(model_dir).items()}
    if model.config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(m.endswith("rotary_emb.inv_freq") for m in missing), (missing, unexpected)
    with torch.no_grad():
        return model(torch.tensor([list(map(int, ids))])).logits[0].numpy()


@pytest.fixture(scope="module")
def families() -> dict:
    return {name: synthetic_models.family(name) for name in FAMILIES}


def load(page, model_dir: Path, max_context=0, **options):
    return page.evaluate("([u, c, o]) => window.harness.loadChampion(u, 9, c, o)", [url_of(model_dir), max_context, options])


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


# ----------------------------------------------------------------------------- new kernels
def test_embed_gather_q8_and_bias_add_kernels(gpu_page):
    """embed_gather_q8 equals the reference's float32 dequantisation exactly, per row piece;
    bias_add_f32 is one float32 add."""
    rng = np.random.default_rng(4)
    V, H, n = 1001, 96, 9
    q8, scale = quantize_rows(rng.standard_normal((V, H)).astype(np.float32))
    ids = rng.integers(0, V, n).astype(np.uint32)
    ids[:2] = [0, V - 1]
    (x,) = run_kernel(gpu_page, "embed_gather_q8", {"n": n, "hidden": H, "vocab": V},
                      [{"b64": b64(q8)}, {"b64": b64(scale)}, {"b64": b64(ids)}, {"bytes": n * H * 4}], [3])
    want = gpu_twins.embed_gather_q8(q8, scale, ids).astype(np.float32)
    assert np.array_equal(unb64(x, np.float32, n * H).reshape(n, H), want)
    (x,) = run_kernel(gpu_page, "embed_gather_q8", {"n": n, "hidden": H, "vocab": V - 500, "row0": 500},
                      [{"b64": b64(q8[500:])}, {"b64": b64(scale[500:])}, {"b64": b64(ids)}, {"bytes": n * H * 4}], [3])
    x = unb64(x, np.float32, n * H).reshape(n, H)
    mine = ids >= 500                                    # this piece copies only its own rows
    assert np.array_equal(x[mine], want[mine]) and not x[~mine].any()
    y = rng.standard_normal((n, 200)).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    (out,) = run_kernel(gpu_page, "bias_add_f32", {"n": n, "rows": 200}, [{"b64": b64(bias)}, {"b64": b64(y)}], [1])
    assert np.array_equal(unb64(out, np.float32, n * 200).reshape(n, 200), (y + bias).astype(np.float32))
    assert np.array_equal((y + bias).astype(np.float32), gpu_twins.bias_add_f32(y, bias).astype(np.float32))


# ----------------------------------------------------------------------------- whole model
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_vs_transformers_split_and_blocks(gpu_page, families, name):
    """Logits vs transformers float64 on the same q8 weights; every big tensor split in pieces
    gives the same bits as one piece; blocks give the same bits as single positions."""
    model_dir = families[name]
    vocab = FAMILIES[name]["cfg"]["vocab_size"]
    ids = np.random.default_rng(len(name)).integers(0, vocab, 70)
    want = hf_float64_logits(model_dir, ids)
    whole = load(gpu_page, model_dir)
    assert set(whole["pieces"].values()) <= {1, None}
    single = np.concatenate(forward_blocks(gpu_page, split(ids, [1]), vocab))
    err = max_error(single, want, "champion_logits_vs_reference")
    print(f"[err] {name}: champion vs transformers float64 max abs {err:.3e}")
    assert within(single, want, "champion_logits_vs_reference"), (name, err, TOLERANCES["champion_logits_vs_reference"])
    blocks = np.concatenate(forward_blocks(gpu_page, split(ids, [9, 2, 7, 5]), vocab))
    assert np.array_equal(bits(blocks), bits(single)), f"{name}: blocks differ from single positions"
    pieces = load(gpu_page, model_dir, maxBindingBytes=TINY_SPLIT)
    assert pieces["pieces"]["embed"] > 1 and pieces["pieces"]["gateUp"] > 1, pieces["pieces"]
    if pieces["pieces"]["head"] is not None:
        assert pieces["pieces"]["head"] > 1
    split_logits = np.concatenate(forward_blocks(gpu_page, split(ids, [8, 1, 9]), vocab))
    assert np.array_equal(bits(split_logits), bits(single)), f"{name}: split tensors change the bits"


def test_rope_inv_freq_is_the_references_and_transformers(gpu_page, families):
    """The page's RoPE frequencies equal exactspec.formats.config.rope_inv_freq (float64, what the reference
    and the WASM champion use) to 1 ulp, and transformers' inv_freq (computed in float32, so a few
    float32 ulps apart) within 5e-7 relative."""
    import json

    import torch
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from exactspec.formats.config import rope_inv_freq, validate_config
    llama32 = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
               "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
               "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": True,
               "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}}
    configs = [json.loads((families[n] / "config.json").read_text()) for n in ("llama3_rope_tied_q8", "linear_rope_untied_q8")]
    for cfg in configs + [llama32]:
        got = np.array(gpu_page.evaluate("(c) => window.harness.ropeInvFreq(c)", cfg), np.float64)
        ours = np.array(rope_inv_freq(validate_config(cfg)), np.float64)
        assert np.allclose(got, ours, rtol=4e-16, atol=0), (cfg.get("rope_parameters") or cfg.get("rope_scaling"), got - ours)
        config = AutoConfig.for_model(**cfg)
        config.standardize_rope_params()
        want, _ = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, torch.device("cpu"))
        assert np.allclose(got, want.numpy().astype(np.float64), rtol=5e-7, atol=0), got / want.numpy() - 1


# ----------------------------------------------------------------------------- plans at real sizes
def real_config(vocab, hidden, inter, layers, heads, kv_heads, tied, model_type="llama", **extra):
    return {"model_type": model_type, "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "max_position_embeddings": 32768, "rope_theta": 1e6, "tie_word_embeddings": tied, **extra}


QWEN25_15B = real_config(151936, 1536, 8960, 28, 12, 2, False, "qwen2")
LLAMA32_3B = real_config(128256, 3072, 8192, 28, 24, 8, True)


def plan(page, config, forms, max_context=0, binding=0):
    return page.evaluate("([c, f, x, b]) => window.harness.planFor(c, f, 9, x, b)", [config, forms, max_context, binding])


def test_real_size_tensors_split_at_the_adapters_limit(gpu_page):
    """At the adapter's actual maxStorageBufferBindingSize / maxBufferSize: Llama 3.2 3B's f32
    embedding (1.5 GiB) splits, Qwen2.5 1.5B's q8 head (233 MB) splits only below 233 MB; the
    KV cache defaults to 4096 positions, one buffer per layer, and is accounted."""
    p = plan(gpu_page, LLAMA32_3B, {"embed": "f32", "head": "tied"})
    limit = p["limit"]
    assert limit == min(p["maxStorageBufferBindingSize"], p["maxBufferSize"]) // 4 * 4
    embed_bytes = 128256 * 3072 * 4
    assert len(p["pieces"]["embed"]) == math.ceil(embed_bytes / (limit // (3072 * 4) * 3072 * 4)) >= 2
    assert sum(r for _, r in p["pieces"]["embed"]) == 128256
    assert p["pieces"]["embed"][1][0] == p["pieces"]["embed"][0][1]            # contiguous row ranges
    assert p["bytes"]["kvCache"] == 4096 * 2 * 28 * 8 * 128 * 4                 # min(32768, 4096) positions
    q = plan(gpu_page, QWEN25_15B, {"embed": "q8", "head": "q8"})
    assert len(q["pieces"]["head"]) == math.ceil(151936 * 1536 / limit)
    q = plan(gpu_page, QWEN25_15B, {"embed": "q8", "head": "q8"}, max_context=8192, binding=128 << 20)
    assert len(q["pieces"]["head"]) == 2 and len(q["pieces"]["embed"]) == 2
    assert q["bytes"]["kvCache"] == 8192 * 2 * 28 * 2 * 128 * 4


def test_refusals_name_the_field_or_what_fits(gpu_page):
    def refusal(config, forms=None, max_context=0, binding=0, budget=0):
        try:
            gpu_page.evaluate("""async ([c, f, x, b, m]) => {
              const { gpuHyperParameters, resolveMaxContext } = await import('/web/formats/model_config.mjs');
              const { validateConfig } = await import('/web/formats/model_checks.mjs');   // the validator's port
              const { planChampion } = await import('/web/gpu/champion_plan.mjs');
              const hp = gpuHyperParameters(validateConfig(c));
              planChampion(hp, f, { maxBlock: 9, maxContext: resolveMaxContext(hp, x), limit: b, budgetBytes: m });
            }""", [config, forms or {"embed": "q8", "head": "q8"}, max_context, binding or (1 << 30), budget])
        except Exception as err:
            return str(err)
        return ""
    qwen = dict(QWEN25_15B)
    for bad, field in ((dict(use_sliding_window=True), "use_sliding_window"),
                       (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_type"),
                       (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}), "low_freq_factor"),
                       (dict(model_type="llama", mlp_bias=True), "mlp_bias"), (dict(model_type="mistral"), "model_type"),
                       (dict(hidden_act="gelu"), "hidden_act"), (dict(num_key_value_heads=5), "num_attention_heads"),
                       (dict(layer_types=["sliding_attention"] * 28), "layer_types")):
        message = refusal({**qwen, **bad})
        assert message.count("E_MODEL_LOAD") and field in message, (bad, message)
    assert "E_BAD_ARGUMENT" in refusal(qwen, max_context=40000)
    message = refusal(qwen, max_context=8192, binding=4 << 20)   # one layer's K: 8192 x 2 x 128 x 4 = 8 MiB
    assert "E_OUT_OF_MEMORY" in message and "maxContext <= 4096 would fit" in message, message
    message = refusal(qwen, max_context=8192, budget=2_000_000_000)
    assert "E_OUT_OF_MEMORY" in message and "memory budget" in message and "maxContext <= " in message, message
    fits = int(message.split("maxContext <= ")[1].split()[0])
    assert 0 < fits < 8192 and refusal(qwen, max_context=fits, budget=2_000_000_000) == ""
    assert "weights alone" in refusal(qwen, budget=500_000_000)
    assert "E_OUT_OF_MEMORY" in refusal(qwen, binding=1000)      # a row wider than a binding cannot split


def test_champion_load_refuses_over_budget(gpu_page, families):
    """createChampion refuses before allocating (and says what context would fit)."""
    full = load(gpu_page, families["qwen2_bias_untied"], max_context=128)["memoryPlan"]
    budget = full["total"] - full["kvCache"] // 2
    with pytest.raises(Exception, match=r"E_OUT_OF_MEMORY.*maxContext <= \d+ would fit"):
        load(gpu_page, families["qwen2_bias_untied"], max_context=128, memoryBudgetBytes=budget)
    assert load(gpu_page, families["qwen2_bias_untied"], max_context=64, memoryBudgetBytes=budget)["maxContext"] == 64
