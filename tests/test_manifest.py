"""Champion/draft compatibility check: accept identical token languages, refuse each mismatch."""
from __future__ import annotations

import json
import os
import shutil
import struct
import sys

import pytest

from exactspec.core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, E_MODEL_LOAD, ExactSpecError
from exactspec.formats.manifest import (MAY_DIFFER, MUST_MATCH, check_pair, check_pair_identities, check_run_artifact,
                                check_served_files, check_served_pair, check_weights_metadata, listed_files,
                                load_model_identity, model_identity_from_files, run_artifact, sha256_bytes)
from exactspec.formats.safetensors import write_safetensors

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
    assert manifest["differs"] == ["weights_sha256", "run_weights_sha256"]   # other weights, same shapes
    assert manifest["champion"]["run_weights_file"] == "model.safetensors"
    assert manifest["champion"]["quantization"] == "f32"
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
        "weights_sha256", "weights_bytes", "run_weights_sha256", "run_weights_bytes", "hidden_size",
        "num_hidden_layers", "num_attention_heads",
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


def test_config_vocab_size_may_pad_past_the_tokenizer_on_both_sides_alike(pair_dirs):
    # Both configs agree with each other and have rows past the tokenizer's ids (vocabulary
    # padding, suppressed by every request): accepted. Fewer rows than ids: refused on each side.
    for d in pair_dirs:
        _edit(os.path.join(d, "config.json"), lambda c: c.update(vocab_size=c["vocab_size"] + 64))
    shared = check_pair(*pair_dirs)["shared"]
    assert shared["config_vocab_size"] == shared["tokenizer_vocab_size"] + 64
    for d in pair_dirs:
        _edit(os.path.join(d, "config.json"), lambda c: c.update(vocab_size=c["vocab_size"] - 65))
    with pytest.raises(ExactSpecError) as err:
        check_pair(*pair_dirs)
    assert err.value.code == E_MANIFEST_MISMATCH
    assert "field 'config_vocab_size' of champion" in err.value.message and "is smaller than" in err.value.message
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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "web", "models")


def test_shipped_pair_is_compatible():
    champion, draft = os.path.join(MODELS_DIR, "champion"), os.path.join(MODELS_DIR, "draft")
    manifest = check_pair(champion, draft)
    shared = manifest["shared"]
    assert shared["tokenizer_vocab_size"] == shared["config_vocab_size"] == 4096
    assert (shared["bos_token_id"], shared["eos_token_id"], shared["pad_token_id"]) == (0, 1, 2)
    assert shared["stop_token_ids"] == [1, 6]
    assert "weights_sha256" in manifest["differs"]


# ---------------------------------------------------------------------------------------------
# In memory (the browser's path): identities from bytes and digests, served files
# ---------------------------------------------------------------------------------------------

IDENTITY_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def shipped():
    """role -> (identity file bytes, digests of every shipped file) of web/models, as a browser
    would have them after fetching and hashing; and the committed manifest.json."""
    out = {}
    for role in ("champion", "draft"):
        d = os.path.join(MODELS_DIR, role)
        served = {}
        for name in sorted(os.listdir(d)):
            data = _read(os.path.join(d, name))
            served[name] = (sha256_bytes(data), len(data))
        out[role] = ({name: _read(os.path.join(d, name)) for name in IDENTITY_FILES}, served)
    with open(os.path.join(MODELS_DIR, "manifest.json"), encoding="utf-8") as f:
        return out, json.load(f)


def _without_dir(identity: dict) -> dict:
    return {k: v for k, v in identity.items() if k != "model_dir"}


@pytest.mark.parametrize("run_weights", ["model.safetensors", "model.q8.safetensors"])
@pytest.mark.parametrize("role", ["champion", "draft"])
def test_in_memory_identity_equals_the_directory_identity(shipped, role, run_weights):
    (files, served), _ = shipped[0][role], shipped[1]
    d = os.path.join(MODELS_DIR, role)
    from_dir = load_model_identity(d, run_weights=run_weights)
    weights = {name: served[name] for name in ("model.safetensors", run_weights)}
    from_memory = model_identity_from_files(files, weights, source=role, run_weights=run_weights)
    assert "model_dir" not in from_memory and from_dir["model_dir"] == os.path.abspath(d)
    assert from_memory == _without_dir(from_dir)
    assert set(from_memory) == set(MUST_MATCH) | set(MAY_DIFFER)
    assert from_memory["run_weights_sha256"] == served[run_weights][0]
    assert from_memory["quantization"] == {"model.safetensors": "f32", "model.q8.safetensors": "q8-sym-row-v1"}[run_weights]


def test_weights_sha256_is_none_when_only_the_run_artifact_was_fetched(shipped):
    files, served = shipped[0]["champion"]
    ident = model_identity_from_files(files, {"model.q8.safetensors": served["model.q8.safetensors"]},
                                      source="champion")
    assert ident["weights_sha256"] is None and ident["weights_bytes"] is None
    assert ident["run_weights_file"] == "model.q8.safetensors" and ident["quantization"] == "q8-sym-row-v1"


def test_the_shipped_pair_passes_the_whole_browser_check(shipped):
    (roles, manifest) = shipped
    pair = check_served_pair(manifest, *roles["champion"], *roles["draft"])
    assert pair["champion"]["run_weights_file"] == "model.q8.safetensors"
    assert pair["champion"]["quantization"] == "q8-sym-row-v1"
    assert pair["champion"]["run_weights_sha256"] == manifest["models"]["champion"]["run_artifact"]["sha256"]
    assert pair["draft"]["run_weights_file"] == "model.safetensors" and pair["draft"]["quantization"] == "f32"
    assert pair["shared"]["stop_token_ids"] == [1, 6]
    json.dumps(pair)


def _tokenizer_without_last_merge(raw: bytes) -> bytes:
    spec = json.loads(raw)
    spec["model"]["merges"] = spec["model"]["merges"][:-1]
    return json.dumps(spec).encode()


def _other_eos(raw: bytes) -> bytes:
    config = json.loads(raw)
    config["eos_token"] = "<|end|>"
    return json.dumps(config).encode()


def _manifest_for(roles: dict) -> dict:
    """A web/models/manifest.json that lists exactly these served digests (a deployment whose
    files are intact but whose pair is incompatible)."""
    files = [{"path": f"{role}/{name}", "sha256": sha, "bytes": n}
             for role, (_, served) in roles.items() for name, (sha, n) in sorted(served.items())]
    models = {}
    for role, (_, served) in roles.items():
        name = "model.q8.safetensors" if role == "champion" else "model.safetensors"
        models[role] = {"dir": role, "run_artifact": {"file": name, "sha256": served[name][0], "bytes": served[name][1],
                                                      "quantization": "q8-sym-row-v1" if role == "champion" else "f32"}}
    return {"version": 2, "total_bytes": sum(f["bytes"] for f in files), "files": files, "models": models}


@pytest.mark.parametrize("field, name, mutate", [
    ("merges_sha256", "tokenizer.json", _tokenizer_without_last_merge),
    ("eos_token_id", "tokenizer_config.json", _other_eos),
])
def test_an_incompatible_draft_is_refused_in_memory_naming_the_field(shipped, field, name, mutate):
    roles = {role: (dict(files), dict(served)) for role, (files, served) in shipped[0].items()}
    draft_files, draft_served = roles["draft"]
    draft_files[name] = mutate(draft_files[name])
    draft_served[name] = (sha256_bytes(draft_files[name]), len(draft_files[name]))
    champion = model_identity_from_files(*roles["champion"], source="champion")
    draft = model_identity_from_files(draft_files, draft_served, source="draft", run_weights="model.safetensors")
    for refuse in (lambda: check_pair_identities(champion, draft),
                   lambda: check_served_pair(_manifest_for(roles), *roles["champion"], *roles["draft"])):
        with pytest.raises(ExactSpecError) as err:
            refuse()
        assert err.value.code == E_MANIFEST_MISMATCH
        assert f"field {field!r} differs" in err.value.message and field in err.value.detail["fields"]


@pytest.mark.parametrize("name", ["tokenizer.json", "model.q8.safetensors", "config.json"])
def test_a_served_file_with_one_byte_changed_is_refused_naming_it(shipped, name):
    roles, manifest = shipped
    data = bytearray(_read(os.path.join(MODELS_DIR, "champion", name)))
    data[len(data) // 2] ^= 0x01
    served = dict(roles["champion"][1], **{name: (sha256_bytes(bytes(data)), len(data))})
    with pytest.raises(ExactSpecError) as err:
        check_served_files(manifest, "champion", served)
    assert err.value.code == E_MANIFEST_MISMATCH
    assert err.value.message.startswith(f"champion/{name}: sha256 differs from web/models/manifest.json")
    assert err.value.detail["files"] == [f"champion/{name}"]
    check_served_files(manifest, "champion", roles["champion"][1])          # the intact files pass


def test_a_served_file_of_another_size_is_refused(shipped):
    roles, manifest = shipped
    sha, n = roles["draft"][1]["config.json"]
    with pytest.raises(ExactSpecError) as err:
        check_served_files(manifest, "draft", {"config.json": (sha, n + 1)})
    assert err.value.code == E_MANIFEST_MISMATCH and "draft/config.json: size differs" in err.value.message


def test_a_served_file_the_manifest_lacks_is_refused(shipped):
    roles, manifest = shipped
    served = dict(roles["draft"][1], **{"chat_template.jinja": (sha256_bytes(b"{{ x }}"), 7)})
    with pytest.raises(ExactSpecError) as err:
        check_served_files(manifest, "draft", served)
    assert err.value.code == E_MANIFEST_MISMATCH
    assert err.value.message == "draft/chat_template.jinja: not listed in web/models/manifest.json"


def test_every_bad_served_file_is_named_at_once(shipped):
    roles, manifest = shipped
    served = {"config.json": roles["champion"][1]["tokenizer.json"], "extra.bin": (sha256_bytes(b""), 0)}
    with pytest.raises(ExactSpecError) as err:
        check_served_files(manifest, "champion", served)
    assert err.value.detail["files"] == ["champion/config.json", "champion/extra.bin"]


def test_the_run_artifact_is_bound_by_file_hash_and_size(shipped):
    roles, manifest = shipped
    q8 = roles["champion"][1]["model.q8.safetensors"]
    assert check_run_artifact(manifest, "champion", "model.q8.safetensors", *q8) == "q8-sym-row-v1"
    assert run_artifact(manifest, "champion")["file"] == "model.q8.safetensors"
    refusals = [
        (("model.safetensors", *roles["champion"][1]["model.safetensors"]), "champion runs champion/model.safetensors"),
        (("model.q8.safetensors", roles["draft"][1]["model.q8.safetensors"][0], q8[1]), "run artifact differs"),
        (("model.q8.safetensors", q8[0], q8[1] - 1), "run artifact differs"),
    ]
    for args, needle in refusals:
        with pytest.raises(ExactSpecError) as err:
            check_run_artifact(manifest, "champion", *args)
        assert err.value.code == E_MANIFEST_MISMATCH and needle in err.value.message, err.value.message


def test_identity_bytes_must_be_the_served_bytes(shipped):
    roles, manifest = shipped
    champion_files = dict(roles["champion"][0], **{"config.json": roles["draft"][0]["config.json"]})
    with pytest.raises(ExactSpecError) as err:
        check_served_pair(manifest, champion_files, roles["champion"][1], *roles["draft"])
    assert err.value.code == E_MANIFEST_MISMATCH and err.value.detail["files"] == ["champion/config.json"]
    served = {k: v for k, v in roles["champion"][1].items() if k != "model.q8.safetensors"}
    with pytest.raises(ExactSpecError) as err:
        check_served_pair(manifest, roles["champion"][0], served, *roles["draft"])
    assert err.value.code == E_BAD_ARGUMENT and "champion/model.q8.safetensors" in err.value.message


@pytest.mark.parametrize("weights, code, needle", [
    ({}, E_MODEL_LOAD, "champion/model.q8.safetensors: file not found"),
    ({"model.q8.safetensors": ("ABC", 3)}, E_BAD_ARGUMENT, "weights digest"),
    ({"model.q8.safetensors": ("0" * 64, -1)}, E_BAD_ARGUMENT, "weights digest"),
])
def test_bad_weight_digests_are_refused(shipped, weights, code, needle):
    files = shipped[0]["champion"][0]
    with pytest.raises(ExactSpecError) as err:
        model_identity_from_files(files, weights, source="champion")
    assert err.value.code == code and needle in err.value.message


def test_an_unknown_run_artifact_has_no_scheme(shipped):
    files, served = shipped[0]["champion"]
    with pytest.raises(ExactSpecError) as err:
        model_identity_from_files(files, {"model.q4.bin": served["model.q8.safetensors"]}, source="champion",
                                  run_weights="model.q4.bin")
    assert err.value.code == E_MODEL_LOAD and "no quantisation scheme" in err.value.message


# ---------------------------------------------------------------------------------------------
# web/models/manifest.json itself
# ---------------------------------------------------------------------------------------------


def test_committed_manifest_lists_every_committed_file_with_its_hash(shipped):
    manifest = shipped[1]
    folders = sorted(n for n in os.listdir(MODELS_DIR) if n != "manifest.json")
    assert folders == ["champion", "draft", "smollm2-draft"]
    on_disk = {}
    for folder in folders:
        for name in os.listdir(os.path.join(MODELS_DIR, folder)):
            data = _read(os.path.join(MODELS_DIR, folder, name))
            on_disk[f"{folder}/{name}"] = (sha256_bytes(data), len(data))
    assert listed_files(manifest) == on_disk


def test_committed_manifest_binds_the_made_for_draft_to_its_champion(shipped):
    """web/models/smollm2-draft names the GGUF champion it was made for in its safetensors
    metadata; the manifest lists it as a model (f32 run artifact) and binds it in `drafts`."""
    from exactspec.formats.manifest import draft_for_champion
    from exactspec.formats.safetensors import read_header
    manifest = shipped[1]
    champion_sha = read_header(os.path.join(MODELS_DIR, "smollm2-draft", "model.safetensors"))[1][
        "exactspec_champion_sha256"]
    assert manifest["drafts"] == {champion_sha: {"dir": "smollm2-draft", "champion": "SmolLM2-135M-Instruct.Q4_1.gguf"}}
    assert draft_for_champion(manifest, champion_sha) == "smollm2-draft"
    artifact = run_artifact(manifest, "smollm2-draft")
    assert (artifact["file"], artifact["quantization"]) == ("model.safetensors", "f32")
    assert (artifact["sha256"], artifact["bytes"]) == listed_files(manifest)["smollm2-draft/model.safetensors"]


def test_committed_manifest_binds_what_the_browser_runs(shipped):
    manifest = shipped[1]
    assert {role: (a["file"], a["quantization"]) for role, a in
            ((r, run_artifact(manifest, r)) for r in ("champion", "draft"))} == {
        "champion": ("model.q8.safetensors", "q8-sym-row-v1"), "draft": ("model.safetensors", "f32")}
    for role in ("champion", "draft"):
        artifact = run_artifact(manifest, role)
        assert (artifact["sha256"], artifact["bytes"]) == shipped[0][role][1][artifact["file"]]


def test_export_hf_writes_the_committed_manifest(shipped):
    sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
    try:
        import export_hf
    finally:
        sys.path.pop(0)
    assert export_hf.build_manifest(MODELS_DIR) == shipped[1]


def _drop(key):
    return lambda m: m.pop(key)


@pytest.mark.parametrize("mutate, needle", [
    (lambda m: m.update(version=1), "version is 1"),
    (lambda m: m.update(files={}), "'files' is not a list"),
    (lambda m: m["files"][0].pop("sha256"), "files[0]"),
    (lambda m: m["files"][0].update(sha256=m["files"][0]["sha256"].upper()), "files[0]"),
    (lambda m: m["files"][0].update(bytes=True), "files[0]"),
    (lambda m: m["files"].append(dict(m["files"][0])), "twice"),
    (lambda m: m.update(total_bytes=m["total_bytes"] + 1), "total_bytes"),
    (_drop("models"), "'models'"),
    (lambda m: m["models"]["draft"].pop("dir"), "models.draft"),
    (lambda m: m["models"]["champion"].pop("run_artifact"), "models.champion.run_artifact"),
    (lambda m: m["models"]["champion"]["run_artifact"].update(bytes=1), "does not repeat"),
    (lambda m: m["models"]["champion"]["run_artifact"].update(quantization="f32"), "quantization is 'f32'"),
    (lambda m: m["models"]["champion"]["run_artifact"].update(file="model.q4.bin"), "no quantisation scheme"),
    (lambda m: m["models"].pop("champion"), "has no models.champion"),
    (lambda m: m.update(drafts=[]), "'drafts' is not an object"),
    (lambda m: m.update(drafts={"B" * 64: {"dir": "d"}}), "drafts key"),
    (lambda m: m.update(drafts={"b" * 64: {"dir": "../d"}}), "is not a folder name beside the manifest"),
    (lambda m: m.update(drafts={"b" * 64: {"dir": "a/d"}}), "is not a folder name beside the manifest"),
    (lambda m: m.update(drafts={"b" * 64: "d"}), "is not a folder name beside the manifest"),
])
def test_a_malformed_manifest_is_a_load_error(shipped, mutate, needle):
    manifest = json.loads(json.dumps(shipped[1]))
    mutate(manifest)
    with pytest.raises(ExactSpecError) as err:
        check_served_files(manifest, "champion", shipped[0]["champion"][1])
    assert err.value.code == E_MODEL_LOAD and "web/models/manifest.json" in err.value.message
    assert needle in err.value.message, err.value.message


# ---------------------------------------------------------------------------------------------
# The CPython path reads the run artifact's header: its metadata must state the scheme
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("metadata, ok", [
    ({"quantization": "int8 symmetric per output row; w = q8 * scale[:,None]", "format": "pt"}, True),
    ({"quantization": "int4 per group"}, False),
    ({}, False),
])
def test_q8_header_metadata_must_state_the_scheme(pair_dirs, metadata, ok):
    d = pair_dirs[0]
    write_safetensors(os.path.join(d, "model.q8.safetensors"),
                      {"x.q8": ("I8", (2, 2), b"\x01\x02\x03\x04"), "x.scale": ("F32", (2,), struct.pack("<2f", 1, 2))},
                      metadata)
    if ok:
        assert load_model_identity(d, run_weights="model.q8.safetensors")["quantization"] == "q8-sym-row-v1"
        return
    with pytest.raises(ExactSpecError) as err:
        load_model_identity(d, run_weights="model.q8.safetensors")
    assert err.value.code == E_MODEL_LOAD and "metadata 'quantization'" in err.value.message
    assert os.path.join(d, "model.q8.safetensors") in err.value.message


def test_an_f32_run_artifact_must_carry_no_quantization_metadata():
    check_weights_metadata("model.safetensors", {"format": "pt"}, "x")
    with pytest.raises(ExactSpecError) as err:
        check_weights_metadata("model.safetensors", {"quantization": "int8"}, "x")
    assert err.value.code == E_MODEL_LOAD


@pytest.mark.parametrize("name, make", [
    ("tokenizer.json", lambda p: os.mkfifo(p)),
    ("config.json", lambda p: open(p, "w").write("[" * 100000 + "]" * 100000)),
    ("config.json", lambda p: open(p, "w").write('{"vocab_size": 1e400}')),
    ("generation_config.json", lambda p: os.symlink("/dev/zero", p)),
])
def test_hostile_model_json_is_refused_coded_without_blocking_or_recursing(pair_dirs, name, make):
    champion, draft = pair_dirs
    path = os.path.join(draft, name)
    os.remove(path)
    make(path)
    with pytest.raises(ExactSpecError) as e:
        check_pair(champion, draft)
    assert e.value.code == E_MODEL_LOAD and name in e.value.message


# ---------------------------------------------------------------------------------------------
# Drafts bound to a champion by its sha256; the chat template as transformers takes it
# ---------------------------------------------------------------------------------------------


def test_a_draft_is_found_by_the_champion_sha256(shipped):
    from exactspec.formats.manifest import draft_for_champion
    manifest = json.loads(json.dumps(shipped[1]))
    assert draft_for_champion(manifest, "a" * 64) is None
    manifest["drafts"] = {"a" * 64: {"dir": "smollm2-draft", "champion": "x.gguf"}}
    assert draft_for_champion(manifest, "a" * 64) == "smollm2-draft" and draft_for_champion(manifest, "c" * 64) is None


def test_chat_template_jinja_wins_over_tokenizer_config_as_in_transformers(pair_dirs):
    """transformers: 'independent chat template file(s) ... take priority over template entries in
    the tokenizer config'; the identity hashes the template that runs."""
    from exactspec.formats.manifest import chat_template_of, sha256_json
    assert chat_template_of({"chat_template": "a"}, None) == "a"
    assert chat_template_of({"chat_template": "a"}, b"b") == "b" and chat_template_of({}, b"b") == "b"
    with pytest.raises(ExactSpecError) as err:
        chat_template_of({}, b"\xff", "m/chat_template.jinja")
    assert (err.value.code, err.value.message) == (E_MODEL_LOAD, "m/chat_template.jinja: not UTF-8 text (byte 0)")
    champion = pair_dirs[0]
    with open(os.path.join(champion, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write("{{ messages }}")
    try:
        assert load_model_identity(champion)["chat_template_sha256"] == sha256_json("{{ messages }}")
    finally:
        os.unlink(os.path.join(champion, "chat_template.jinja"))


def test_a_served_folder_is_checked_against_its_own_entry(shipped):
    """The SmolLM2 draft plays the role "draft" beside the GGUF champion, but its served files are
    those of models.smollm2-draft: they pass there and are refused against the toy draft's entry."""
    from exactspec.formats.manifest import check_served_model
    manifest, folder = shipped[1], os.path.join(MODELS_DIR, "smollm2-draft")
    served = {}
    for name in os.listdir(folder):
        data = _read(os.path.join(folder, name))
        served[name] = (sha256_bytes(data), len(data))
    assert check_served_model(manifest, "smollm2-draft", served) == "model.safetensors"
    with pytest.raises(ExactSpecError) as err:
        check_served_model(manifest, "draft", served)
    assert err.value.code == E_MANIFEST_MISMATCH and "draft/model.safetensors: sha256 differs" in err.value.message
