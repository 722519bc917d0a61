"""GGUF models against their peers, without the downloaded model.

- Tiny random llama and qwen2 GGUFs (every tensor type): the reference on our reader's weights
  against transformers loading the same file (its own GGUF loader: gguf's dequantisation and
  its own q/k un-permute), logits within the hf_reference_vs_transformers_f32 tolerance.
- The shipped champion exported to GGUF (tools/export_gguf.py, F32, q/k permuted, tokenizer as
  metadata): its logits through our reader equal the folder's bit for bit, and the tokenizer
  rebuilt from the metadata gives the shipped tokenizer.json's ids and text.
- A SentencePiece-style (tokenizer.ggml.model "llama") vocabulary: our tokenizer from the GGUF
  against the one transformers builds from the same file.
"""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q, GGUFWriter

import tokenizer_families as families
from exactspec.formats.gguf import GGUFFile
from exactspec.formats.gguf_model import GGUFModel, load_reference
from exactspec.formats.gguf_tokenizer import load_tokenizer, tokenizer_config
from exactspec.reference.models import default_models_dir
from exactspec.reference.reference_llama import LlamaReference
from exactspec.formats.tokenizer import Tokenizer
from gguf_builders import REPO
from synthetic_models import write_tiny_model
from test_tokenizer_families import HOSTILE
from tolerances import TOLERANCES

ALL_TYPES = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K, "attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q4_1,
             "attn_v.weight": Q.F16, "attn_output.weight": Q.Q4_0, "ffn_gate.weight": Q.BF16,
             "ffn_up.weight": Q.Q8_0, "ffn_down.weight": Q.Q4_K}
PROMPT = [3, 17, 250, 9, 42, 7, 101, 0, 399]


def transformers_logits(path: str, ids: list) -> np.ndarray:
    """transformers on the GGUF: config from the file, weights from its own GGUF loader (what
    from_pretrained(gguf_file=...) does, minus accelerate's device placement)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    folder, name = os.path.split(path)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in tensors.items()}, strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_logits_equal_transformers(tmp_path, arch):
    path = str(tmp_path / f"tiny-{arch}.gguf")
    expected = write_tiny_model(path, arch=arch, types=ALL_TYPES)
    with GGUFModel(path) as model:
        for name, values in expected.items():   # our weights: gguf's values, HF row order
            assert np.array_equal(model.read_float32(name), values), name
    ours = load_reference(path).forward(PROMPT, 0)
    theirs = transformers_logits(path, PROMPT)
    tol = TOLERANCES["hf_reference_vs_transformers_f32"]
    err = np.abs(ours - theirs).max()
    print(f"tiny {arch}: max |logit diff| {err:.3g}, max |logit| {np.abs(theirs).max():.3g}")
    assert err <= tol.max_abs + tol.max_rel * np.abs(theirs).max()
    assert np.abs(theirs).max() > 1e-2   # a model whose logits say something


# ---- the shipped champion, exported ----------------------------------------------------------

@pytest.fixture(scope="module")
def champion_gguf(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("export_gguf", os.path.join(REPO, "tools", "export_gguf.py"))
    export_gguf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export_gguf)
    out = str(tmp_path_factory.mktemp("gguf") / "champion.f32.gguf")
    export_gguf.export_gguf(os.path.join(default_models_dir(), "champion"), out, "f32", "f32")
    return out


def test_exported_champion_logits_bitwise(champion_gguf):
    folder = LlamaReference.from_dir(os.path.join(default_models_dir(), "champion"))
    ours = load_reference(champion_gguf)
    ids = [1, 50, 300, 7, 999, 12]
    assert np.array_equal(ours.forward(ids, 0), folder.forward(ids, 0))


def test_exported_champion_tokenizer(champion_gguf):
    import tokenizers
    folder = os.path.join(default_models_dir(), "champion")
    shipped = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    with GGUFFile(champion_gguf) as f:
        ours = load_tokenizer(f)
        config = tokenizer_config(f)
    for text in HOSTILE + families.corpus()[:200]:
        want = shipped.encode(text).ids
        assert ours.encode(text) == want, text
        assert ours.decode(want) == shipped.decode(want, skip_special_tokens=False), text
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        shipped_config = json.load(f)
    for key in ("add_bos_token", "bos_token", "eos_token", "chat_template"):
        assert config.get(key) == shipped_config.get(key), key


# ---- SentencePiece-style vocabulary ----------------------------------------------------------

def test_sentencepiece_vocabulary_equals_transformers(tmp_path):
    from transformers import AutoTokenizer
    spec = families.llama2("metaspace", vocab_size=1200)
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])][:1200]
    tokens = [t for t in tokens if not t.startswith("<extra_")]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]   # earlier merges score higher
    path = str(tmp_path / "spm.gguf")
    w = GGUFWriter(path, "llama")
    for key, value in (("llama.context_length", 64), ("llama.embedding_length", 32), ("llama.block_count", 1),
                       ("llama.feed_forward_length", 64), ("llama.attention.head_count", 2)):
        w.add_uint32(key, value)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    with GGUFFile(path) as f:
        ours = load_tokenizer(f)
    assert isinstance(ours, Tokenizer)
    for text in HOSTILE + families.corpus()[:100]:
        want = theirs(text)["input_ids"]
        assert ours.encode(text) == want, text
        assert ours.decode(want) == theirs.decode(want), text


# ---- byte-level families: the GGUF llama.cpp writes for each, against its tokenizer.json -----

@pytest.fixture(scope="module")
def byte_level_base():
    return families.byte_level_base()


@pytest.mark.parametrize("family, pre", [("smollm2", "smollm"), ("qwen2", "qwen2"), ("llama3", "llama-bpe")])
def test_byte_level_family_equals_its_tokenizer_json(tmp_path, byte_level_base, family, pre):
    """The family's tokenizer.json layout (tests/tokenizer_families.py) run by `tokenizers`, against
    our tokenizer rebuilt from a GGUF holding what llama.cpp's converter stores for it: tokens
    by id, merges, CONTROL for special added tokens, USER_DEFINED for the others, the pre name."""
    import tokenizers
    spec = getattr(families, family)(byte_level_base)
    vocab = spec["model"]["vocab"]   # a whole word no merge makes: one id where merges are ignored (Llama 3)
    vocab["\u0120qzxvq"] = vocab.pop(max(vocab, key=vocab.get))
    theirs = tokenizers.Tokenizer.from_str(json.dumps(spec))
    by_id = {i: t for t, i in spec["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in spec["added_tokens"]})
    kinds = {a["id"]: 3 if a["special"] else 4 for a in spec["added_tokens"]}
    assert sorted(by_id) == list(range(len(by_id)))
    path = str(tmp_path / f"{family}.gguf")
    w = GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list([by_id[i] for i in range(len(by_id))])
    w.add_token_types([kinds.get(i, 1) for i in range(len(by_id))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    if family == "llama3":
        w.add_bos_token_id(128000)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f:
        ours = load_tokenizer(f)
    assert (len(theirs.encode(" qzxvq", add_special_tokens=False).ids) == 1) == (family == "llama3")
    for text in HOSTILE + families.corpus()[:100] + [" qzxvq", "a qzxvq b"]:
        for add_special in (True, False):
            want = theirs.encode(text, add_special_tokens=add_special).ids
            assert ours.encode(text, add_special_tokens=add_special) == want, (family, text)
        assert ours.decode(want) == theirs.decode(want, skip_special_tokens=False), (family, text)
