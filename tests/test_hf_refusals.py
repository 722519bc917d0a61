"""What a Hugging Face folder may not be: each unsupported feature is E_MODEL_LOAD naming the field.

Config features go through the one validator (exactspec.formats.config.validate_config, also run by the
browser) and, for a sample, through the loader and `convert` on a real folder; weights-file
problems (shards, biases, dtypes) through the loader.
"""
import json
import os
import shutil

import pytest

from exactspec.formats.config import validate_config
from exactspec.reference.convert import convert
from exactspec.core.errors import E_MODEL_LOAD, ExactSpecError
from exactspec.reference.models import stop_ids_from
from exactspec.reference.reference_llama import LlamaReference
from exactspec.formats.safetensors import load_safetensors, write_safetensors
from synthetic_models import synth_models_dirs  # noqa: F401  (a fixture)

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}
QWEN2 = dict(LLAMA, model_type="qwen2", architectures=["Qwen2ForCausalLM"], use_sliding_window=False,
             sliding_window=4096, max_window_layers=2)
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}

# (case, base config, changed fields, text the message must contain)
REFUSED = [
    ("sliding window", QWEN2, {"use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ("sliding layer", QWEN2, {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ("unknown model_type", LLAMA, {"model_type": "mistral", "architectures": None}, "model_type 'mistral'"),
    ("other architecture", LLAMA, {"architectures": ["LlamaForSequenceClassification"]}, "architectures"),
    ("architecture of the other type", QWEN2, {"architectures": ["LlamaForCausalLM"]}, "architectures"),
    ("rope dynamic (legacy key)", LLAMA, {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "rope_scaling.type='dynamic' is not supported"),
    ("rope yarn", LLAMA, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type='yarn'"),
    ("rope longrope (new layout)", LLAMA, {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     "rope_parameters.rope_type='longrope'"),
    ("llama3 without low_freq_factor", LLAMA, {"rope_scaling": {k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}},
     "rope_scaling.low_freq_factor"),
    ("llama3 high <= low", LLAMA, {"rope_scaling": dict(LLAMA3, high_freq_factor=1.0)}, "high_freq_factor"),
    ("llama3 original context a float", LLAMA, {"rope_scaling": dict(LLAMA3, original_max_position_embeddings=8192.0)},
     "original_max_position_embeddings"),
    ("linear factor below 1", LLAMA, {"rope_scaling": {"rope_type": "linear", "factor": 0.5}}, "rope_scaling.factor"),
    ("linear with attention_factor", LLAMA, {"rope_scaling": {"rope_type": "linear", "factor": 2.0,
                                                             "attention_factor": 0.5}}, "rope_scaling.attention_factor"),
    ("both rope objects", LLAMA, {"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                                  "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_scaling"),
    ("partial rotary", LLAMA, {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("llama attention_bias", LLAMA, {"attention_bias": True}, "attention_bias=true is not supported"),
    ("mlp_bias", LLAMA, {"mlp_bias": True}, "mlp_bias=true is not supported"),
    ("hidden_act gelu", QWEN2, {"hidden_act": "gelu"}, "hidden_act"),
]
ACCEPTED = [
    ("llama3 legacy rope_scaling", LLAMA, {"rope_scaling": LLAMA3}, ("llama3", 32.0)),
    ("llama3 rope_parameters", LLAMA, {"rope_theta": None, "rope_parameters": dict(LLAMA3, rope_theta=5e5)}, ("llama3", 32.0)),
    ("linear, legacy 'type'", LLAMA, {"rope_scaling": {"type": "linear", "factor": 4.0}}, ("linear", 4.0)),
    ("qwen2 sliding_window set but off", QWEN2, {"layer_types": ["full_attention"] * 2}, ("default", 1.0)),
]


def _changed(base: dict, fields: dict) -> dict:
    cfg = dict(base)
    for key, value in fields.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


@pytest.mark.parametrize("case,base,fields,text", REFUSED, ids=[c[0] for c in REFUSED])
def test_config_refused_naming_the_field(case, base, fields, text):
    validate_config(base)   # the base itself is fine
    with pytest.raises(ExactSpecError) as info:
        validate_config(_changed(base, fields), source="config.json")
    assert info.value.code == E_MODEL_LOAD and text in info.value.message, (case, info.value.message)
    assert info.value.message.startswith("config.json: ")


@pytest.mark.parametrize("case,base,fields,want", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_config_accepted(case, base, fields, want):
    c = validate_config(_changed(base, fields))
    assert (c.rope_type, c.rope_factor) == want and c.qkv_bias == (base is QWEN2)


def _folder(synth_models_dirs, tmp_path, shape="qwen2.5-draft"):
    folder = tmp_path / shape
    shutil.copytree(synth_models_dirs[shape], folder)
    return folder


def _edit_config(folder, **fields):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(fields)
    (folder / "config.json").write_text(json.dumps(cfg))


def _refused(fn, *texts):
    with pytest.raises(ExactSpecError) as info:
        fn()
    assert info.value.code == E_MODEL_LOAD and all(t in info.value.message for t in texts), info.value.message


def test_loader_and_convert_refuse_a_sliding_window(synth_models_dirs, tmp_path):
    folder = _folder(synth_models_dirs, tmp_path)
    _edit_config(folder, use_sliding_window=True)
    _refused(lambda: LlamaReference.from_dir(folder), "config.json", "use_sliding_window=true")
    _refused(lambda: convert(folder, tmp_path / "out"), "use_sliding_window=true")
    assert not (tmp_path / "out" / "model.q8.safetensors").exists()


def _rewrite_weights(folder, change):
    path = folder / "model.safetensors"
    tensors, metadata = load_safetensors(path, with_metadata=True)
    tensors = {n: (t.dtype, t.shape, bytes(t.data)) for n, t in tensors.items()}
    change(tensors)
    write_safetensors(path, tensors, metadata)


def test_weights_refused_naming_the_tensor(synth_models_dirs, tmp_path):
    qwen = _folder(synth_models_dirs, tmp_path)
    _rewrite_weights(qwen, lambda t: t.pop("model.layers.0.self_attn.k_proj.bias"))
    _refused(lambda: LlamaReference.from_dir(qwen), "missing tensor", "k_proj.bias")

    llama = _folder(synth_models_dirs, tmp_path, "smollm2-draft")
    _rewrite_weights(llama, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": ("BF16", (32,), bytes(64))}))
    _refused(lambda: LlamaReference.from_dir(llama), "bias tensor", "q_proj.bias")

    f64 = _folder(synth_models_dirs, tmp_path, "tinyllama-draft")
    _rewrite_weights(f64, lambda t: t.update({"model.norm.weight": ("F64", (32,), bytes(256))}))
    _refused(lambda: LlamaReference.from_dir(f64), "model.norm.weight", "F64")
    _refused(lambda: convert(f64, tmp_path / "out"), "model.norm.weight", "F64")


def _shard(folder, split_at=5):
    """Turn one file into two shards + index (by hand, so each case can break one part)."""
    tensors, metadata = load_safetensors(folder / "model.safetensors", with_metadata=True)
    names = sorted(tensors)
    parts = {"model-00001-of-00002.safetensors": names[:split_at], "model-00002-of-00002.safetensors": names[split_at:]}
    for shard, members in parts.items():
        write_safetensors(folder / shard, {n: (tensors[n].dtype, tensors[n].shape, bytes(tensors[n].data))
                                           for n in members}, metadata)
    os.remove(folder / "model.safetensors")
    weight_map = {n: shard for shard, members in parts.items() for n in members}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_shards_refused_when_the_index_lies(synth_models_dirs, tmp_path):
    folder = _folder(synth_models_dirs, tmp_path, "smollm2-draft")
    weight_map = _shard(folder)
    LlamaReference.from_dir(folder)   # the honest index loads
    index = folder / "model.safetensors.index.json"
    first = sorted(weight_map)[0]
    for bad_name, text in [("../model-00001-of-00002.safetensors", "is not a shard file name"),
                           ("/etc/passwd", "is not a shard file name"), ("weights.bin", "is not a shard file name")]:
        index.write_text(json.dumps({"weight_map": dict(weight_map, **{first: bad_name})}))
        _refused(lambda: LlamaReference.from_dir(folder), "model.safetensors.index.json", text)
    index.write_text(json.dumps({"weight_map": dict(weight_map, **{first: "model-00002-of-00002.safetensors"})}))
    _refused(lambda: LlamaReference.from_dir(folder), first)
    index.write_text(json.dumps({"weight_map": {n: s for n, s in weight_map.items() if n != first}}))
    _refused(lambda: LlamaReference.from_dir(folder), first, "does not map")
    index.write_text(json.dumps({"weight_map": weight_map}))
    os.rename(folder / "model-00002-of-00002.safetensors", tmp_path / "elsewhere")
    _refused(lambda: LlamaReference.from_dir(folder), "model-00002-of-00002.safetensors", "file not found")
    index.write_text("[]")
    _refused(lambda: LlamaReference.from_dir(folder), "weight_map")
    os.remove(index)
    _refused(lambda: LlamaReference.from_dir(folder), "has neither model.safetensors nor model.safetensors.index.json")


@pytest.mark.parametrize("eos,want", [(2, (2,)), ([128001, 128008, 128009, 128001], (128001, 128008, 128009)),
                                      (None, ()), ("2", None), ([2, True], None), (-1, None), ([[2]], None)])
def test_generation_config_eos(eos, want, tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": eos}))
    if want is not None:
        assert stop_ids_from(str(tmp_path)) == want
    else:
        _refused(lambda: stop_ids_from(str(tmp_path)), "generation_config.json", "eos_token_id")
