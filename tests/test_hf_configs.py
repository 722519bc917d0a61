"""The published configs of every family through our validator and against transformers' own reading.

For each shape of tools/synth_models.py (published numbers and mid-size), the config.json that
transformers writes (`rope_parameters` layout) and the one the hub publishes (legacy
`rope_scaling` + top-level `rope_theta`) validate to the same LlamaConfig; head_dim, biases and
tying agree with transformers' config object; and `rope_inv_freq` equals the inverse frequencies
transformers' RotaryEmbedding builds (it computes them in float32: equal to float32 rounding).
"""
import json

import numpy as np
import pytest
import torch

from exactspec.formats.config import rope_inv_freq, validate_config
from synthetic_models import synth_models

RELATIVE_F32 = 2.0 ** -22      # two float32 ulps: transformers' float32 formula vs ours in float64


def _transformers_config(shape):
    from transformers import AutoConfig
    fields = synth_models.hf_config(shape)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def _published_layout(cfg: dict) -> dict:
    """config.json as the hub publishes it: rope_theta on top, rope_scaling for scaled RoPE."""
    out = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    params = dict(cfg["rope_parameters"])
    out["rope_theta"] = params.pop("rope_theta")
    out["rope_scaling"] = None if params.get("rope_type") == "default" else params
    return out


@pytest.mark.parametrize("shape", sorted(synth_models.SHAPES))
def test_config_reads_as_transformers_reads_it(shape):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
    hf = _transformers_config(shape)
    written = json.loads(hf.to_json_string())
    ours = validate_config(written)
    assert validate_config(_published_layout(written)) == ours
    assert ours.model_type == hf.model_type and ours.architecture == {"llama": "LlamaForCausalLM",
                                                                      "qwen2": "Qwen2ForCausalLM"}[hf.model_type]
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert (ours.head_dim, ours.num_key_value_heads, ours.tie_word_embeddings) == (
        head_dim, hf.num_key_value_heads, hf.tie_word_embeddings)
    assert ours.qkv_bias == (hf.model_type == "qwen2")
    rotary = (Qwen2RotaryEmbedding if hf.model_type == "qwen2" else LlamaRotaryEmbedding)(hf)
    theirs = rotary.inv_freq.to(torch.float64).numpy()
    mine = np.array(rope_inv_freq(ours))
    assert mine.shape == theirs.shape
    assert np.all(np.abs(mine - theirs) <= RELATIVE_F32 * np.abs(mine)), np.max(np.abs(mine - theirs) / mine)
    if ours.rope_type == "llama3":   # the three bands are all present at the published shapes
        plain = np.array(rope_inv_freq(validate_config(dict(written, rope_parameters={
            "rope_type": "default", "rope_theta": ours.rope_theta}))))
        assert np.any(mine == plain) and np.any(np.isclose(mine, plain / ours.rope_factor, rtol=1e-15)) \
            and np.any((mine != plain) & ~np.isclose(mine, plain / ours.rope_factor, rtol=1e-15))


def test_linear_rope_scaling_as_transformers():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    hf = _transformers_config("smollm2-mid")
    hf.rope_parameters = {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0}
    ours = validate_config(json.loads(hf.to_json_string()))
    assert (ours.rope_type, ours.rope_factor) == ("linear", 4.0)
    theirs = LlamaRotaryEmbedding(hf).inv_freq.to(torch.float64).numpy()
    mine = np.array(rope_inv_freq(ours))
    assert np.all(np.abs(mine - theirs) <= RELATIVE_F32 * mine)
