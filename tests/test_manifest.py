"""Champion/draft compatibility check: accept identical token languages, refuse each mismatch."""
from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from exactspec.errors import E_MANIFEST_MISMATCH, E_MODEL_LOAD, ExactSpecError
from exactspec.manifest import MAY_DIFFER, MUST_MATCH, check_pair, load_model_identity
from exactspec.safetensors import write_safetensors

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
TEXT = ("The quick brown fox jumps over the lazy dog. It's a test, isn't it? "
        "Ελληνικά και Русский текст, 中文 and emoji 😀👍🏽. 0123456789\n\tcode(x) = y;\n") * 40


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory) -> str:
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers
    tok = tokenizers.Tokenizer(models.BPE(dropout=None, unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=400, min_frequency=2, show_progress=False, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", 0)])
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    tok.save(path, pretty=True)
    return path


def make_model_dir(root, name: str, tokenizer_json: str, seed: int = 0, **config_overrides) -> str:
    d = os.path.join(str(root), name)
    os.makedirs(d)
    shutil.copy(tokenizer_json, os.path.join(d, "tokenizer.json"))
    import tokenizers
    vocab = tokenizers.Tokenizer.from_file(tokenizer_json).get_vocab_size()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
              "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
              "rope_theta": 10000.0, "rope_scaling": None, "bos_token_id": 0, "eos_token_id": 1,
              "pad_token_id": 2, "tie_word_embeddings": True, "torch_dtype": "float32"}
    config.update(config_overrides)
    _dump(os.path.join(d, "config.json"), config)
    _dump(os.path.join(d, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
        "pad_token": "<|pad|>", "additional_special_tokens": SPECIAL_TOKENS[3:], "add_bos_token": True,
        "add_eos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": 64,
        "chat_template": CHAT_TEMPLATE})
    _dump(os.path.join(d, "generation_config.json"), {"bos_token_id": 0, "eos_token_id": [1, 6], "pad_token_id": 2})
    n = vocab * config["hidden_size"]
    write_safetensors(os.path.join(d, "model.safetensors"),
                      {"model.embed_tokens.weight": ("F32", (vocab, config["hidden_size"]),
                                                     struct.pack(f"<{n}f", *[(i * 7 + seed) % 13 / 13 for i in range(n)]))})
    return d


def _dump(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)


def _edit(path, fn):
    with open(path, encoding="utf-8") as f:
        value = json.load(f)
    fn(value)
    _dump(path, value)


@pytest.fixture
def pair_dirs(tmp_path, tokenizer_json):
    return (make_model_dir(tmp_path, "champion", tokenizer_json),
            make_model_dir(tmp_path, "draft", tokenizer_json, seed=1))


# ---------------------------------------------------------------------------------------------
# Acceptance
# ---------------------------------------------------------------------------------------------


def test_identical_token_language_is_accepted(pair_dirs):
    champion, draft = pair_dirs
    manifest = check_pair(champion, draft)
    assert set(manifest["shared"]) == set(MUST_MATCH)
    assert manifest["shared"]["stop_token_ids"] == [1, 6]
    assert (manifest["shared"]["bos_token_id"], manifest["shared"]["eos_token_id"],
            manifest["shared"]["pad_token_id"]) == (0, 1, 2)
    assert manifest["differs"] == ["weights_sha256"]        # different weights, same shapes
    json.dumps(manifest)                                    # serialisable as it is


def test_sizes_context_and_rope_may_differ(tmp_path, tokenizer_json):
    champion = make_model_dir(tmp_path, "champion", tokenizer_json)
    draft = make_model_dir(tmp_path, "draft", tokenizer_json, seed=3, hidden_size=4, intermediate_size=8,
                           num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                           max_position_embeddings=32, rope_theta=500000.0,
                           rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_word_embeddings=False)
    _edit(os.path.join(draft, "tokenizer_config.json"), lambda c: c.update(model_max_length=32))
    manifest = check_pair(champion, draft)
    assert set(manifest["differs"]) == {
        "weights_sha256", "weights_bytes", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "max_position_embeddings", "model_max_length", "rope_theta", "rope_scaling",
        "tie_word_embeddings"}
    assert manifest["draft"]["rope_theta"] == 500000.0 and set(manifest["draft"]) == set(MAY_DIFFER)


def test_stop_ids_accept_an_int_or_a_list(pair_dirs):
    champion, draft = pair_dirs
    for d in pair_dirs:
        _edit(os.path.join(d, "generation_config.json"), lambda g: g.update(eos_token_id=1))
    _edit(os.path.join(draft, "generation_config.json"), lambda g: g.update(eos_token_id=[1]))
    assert check_pair(champion, draft)["shared"]["stop_token_ids"] == [1]


# ---------------------------------------------------------------------------------------------
# Refusals, one field at a time (a mutation may also move fields derived from it)
# ---------------------------------------------------------------------------------------------


def _tok(fn):
    return "tokenizer.json", fn


def _cfg(fn):
    return "config.json", fn


def _tcfg(fn):
    return "tokenizer_config.json", fn


def _gen(fn):
    return "generation_config.json", fn


def _swap_two_ids(t):
    vocab = t["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _add_token(t):
    n = max(t["model"]["vocab"].values()) + 1
    t["added_tokens"].append({"id": n, "content": "<|tool|>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})


MUTATIONS = {
    "tokenizer_sha256": ("tokenizer.json", None),              # same JSON, other formatting
    "tokenizer_vocab_size": _tok(_add_token),
    "config_vocab_size": _cfg(lambda c: c.update(vocab_size=c["vocab_size"] + 64)),
    "token_map_sha256": _tok(_swap_two_ids),
    "added_tokens": _tok(lambda t: t["added_tokens"][2].update(special=False)),
    "merges_sha256": _tok(lambda t: t["model"].update(merges=t["model"]["merges"][:-1])),
    "model_options_sha256": _tok(lambda t: t["model"].update(ignore_merges=True)),
    "normalizer_sha256": _tok(lambda t: t.update(normalizer={"type": "NFC"})),
    "pre_tokenizer_sha256": _tok(lambda t: t["pre_tokenizer"].update(add_prefix_space=True)),
    "post_processor_sha256": _tok(lambda t: t.update(post_processor=None)),
    "decoder_sha256": _tok(lambda t: t["decoder"].update(trim_offsets=False)),
    "tokenizer_flags": _tcfg(lambda c: c.update(add_eos_token=True)),
    "chat_template_sha256": _tcfg(lambda c: c.update(chat_template=CHAT_TEMPLATE.replace("\n", " "))),
    "bos_token_id": _tcfg(lambda c: c.update(bos_token="<|system|>")),
    "eos_token_id": _tcfg(lambda c: c.update(eos_token={"content": "<|end|>", "special": True})),
    "pad_token_id": _tcfg(lambda c: c.update(pad_token="<|eos|>")),
    "stop_token_ids": _gen(lambda g: g.update(eos_token_id=1)),
}


def test_every_refused_field_has_a_mutation():
    assert set(MUTATIONS) == set(MUST_MATCH)


@pytest.mark.parametrize("field", list(MUTATIONS))
def test_mismatch_is_refused_naming_the_field(pair_dirs, field):
    champion, draft = pair_dirs
    name, fn = MUTATIONS[field]
    path = os.path.join(draft, name)
    if fn is None:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(value, f, separators=(",", ":"), ensure_ascii=False)
    else:
        _edit(path, fn)
    with pytest.raises(ExactSpecError) as err:
        check_pair(champion, draft)
    assert err.value.code == E_MANIFEST_MISMATCH
    assert f"field {field!r}" in err.value.message
    assert field in err.value.detail["fields"]
    if fn is None:
        assert err.value.detail["fields"] == ["tokenizer_sha256"]   # nothing semantic moved


def test_config_vocab_size_must_equal_tokenizer_size_on_both_sides(pair_dirs):
    # Both configs agree with each other, but not with the tokenizer: still refused.
    for d in pair_dirs:
        _edit(os.path.join(d, "config.json"), lambda c: c.update(vocab_size=c["vocab_size"] + 64))
    with pytest.raises(ExactSpecError) as err:
        check_pair(*pair_dirs)
    assert err.value.code == E_MANIFEST_MISMATCH
    assert "field 'config_vocab_size' of champion" in err.value.message
    assert "field 'config_vocab_size' of draft" in err.value.message


# ---------------------------------------------------------------------------------------------
# Missing or malformed files
# ---------------------------------------------------------------------------------------------

FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors"]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("side", ["champion", "draft"])
def test_missing_file_is_a_load_error(pair_dirs, name, side):
    d = pair_dirs[0] if side == "champion" else pair_dirs[1]
    os.remove(os.path.join(d, name))
    with pytest.raises(ExactSpecError) as err:
        check_pair(*pair_dirs)
    assert err.value.code == E_MODEL_LOAD
    assert os.path.join(d, name) in err.value.message


@pytest.mark.parametrize("content", [b"{broken", b"[1, 2]", b"\xff\xfe{}"])
@pytest.mark.parametrize("name", FILES[:4])
def test_malformed_json_is_a_load_error(pair_dirs, name, content):
    path = os.path.join(pair_dirs[1], name)
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(ExactSpecError) as err:
        load_model_identity(pair_dirs[1])
    assert err.value.code == E_MODEL_LOAD and path in err.value.message


@pytest.mark.parametrize("edit", [
    ("tokenizer.json", lambda t: t.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer 'Whitespace'"),
    ("tokenizer_config.json", lambda c: c.update(bos_token="<|nope|>"), "not in the vocabulary"),
    ("generation_config.json", lambda g: g.update(eos_token_id="1"), "eos_token_id"),
    ("config.json", lambda c: c.pop("vocab_size"), "vocab_size"),
])
def test_unusable_contents_are_load_errors(pair_dirs, edit):
    name, fn, needle = edit
    path = os.path.join(pair_dirs[0], name)
    _edit(path, fn)
    with pytest.raises(ExactSpecError) as err:
        load_model_identity(pair_dirs[0])
    assert err.value.code == E_MODEL_LOAD and path in err.value.message and needle in err.value.message


def test_merge_format_does_not_change_the_merges_identity(pair_dirs):
    champion, draft = pair_dirs
    _edit(os.path.join(draft, "tokenizer.json"),
          lambda t: t["model"].update(merges=[" ".join(m) for m in t["model"]["merges"]]))
    a, b = load_model_identity(champion), load_model_identity(draft)
    assert a["merges_sha256"] == b["merges_sha256"] and a["tokenizer_sha256"] != b["tokenizer_sha256"]


def test_shipped_pair_is_compatible():
    models_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "web", "models")
    champion, draft = os.path.join(models_dir, "champion"), os.path.join(models_dir, "draft")
    manifest = check_pair(champion, draft)
    shared = manifest["shared"]
    assert shared["tokenizer_vocab_size"] == shared["config_vocab_size"] == 4096
    assert (shared["bos_token_id"], shared["eos_token_id"], shared["pad_token_id"]) == (0, 1, 2)
    assert shared["stop_token_ids"] == [1, 6]
    assert "weights_sha256" in manifest["differs"]
