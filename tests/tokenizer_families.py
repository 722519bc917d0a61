"""Tokenizers of the real families' kind and size, built here with `tokenizers` (no downloads).

Merges are trained on the repository's own docs; the pre-tokenizer, normalizer, decoder,
post-processor and added-token layout are transcribed from the published tokenizer.json files
of each family (from memory of their structure, not downloaded); the vocabulary is padded to
the real size with extra model tokens that no merge can produce.
"""
from __future__ import annotations

import glob
import json
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METASPACE = "\u2581"

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SMOL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
                 "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
                 "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>",
                 "<jupyter_script>", "<empty_output>"]
QWEN_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
              "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
              "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
              "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>"]
LLAMA3_NAMED = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>",
                7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>", 10: "<|python_tag|>"}


def corpus() -> list[str]:
    lines = []
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))) + [os.path.join(REPO, "README.md")]:
        with open(path, encoding="utf-8") as f:
            lines += [ln for ln in f.read().split("\n") if ln.strip()]
    return lines


def _added(i, content, special=True, normalized=False):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": special}


def _pad(vocab: dict, size: int) -> None:
    n = len(vocab)
    for i in range(n, size):
        vocab[f"<extra_{i}>"] = i


def _trained_spec(tok: Tokenizer) -> dict:
    return json.loads(tok.to_str())


def byte_level_base(vocab_size: int = 5000) -> dict:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    return _trained_spec(tok)


def _renumber(trained_vocab: dict, first_tokens: list[str]) -> dict:
    vocab = {t: i for i, t in enumerate(first_tokens)}
    for t, _ in sorted(trained_vocab.items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    return vocab


def _byte_level_family(base: dict, first: list[str], size: int) -> dict:
    spec = json.loads(json.dumps(base))
    spec["model"]["vocab"] = _renumber(base["model"]["vocab"], first)
    _pad(spec["model"]["vocab"], size)
    return spec


def smollm2(base: dict) -> dict:
    spec = _byte_level_family(base, SMOL_SPECIALS, 49152)
    spec["added_tokens"] = [_added(i, t) for i, t in enumerate(SMOL_SPECIALS)]
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return spec


def qwen2(base: dict) -> dict:
    spec = _byte_level_family(base, [], 151643)
    spec["added_tokens"] = [_added(151643 + i, t, special=not t.endswith("tool_call>"))
                            for i, t in enumerate(QWEN_ADDED)]
    spec["normalizer"] = {"type": "NFC"}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return spec


def llama3(base: dict) -> dict:
    spec = _byte_level_family(base, [], 128000)
    spec["model"]["ignore_merges"] = True
    names = [LLAMA3_NAMED.get(k, f"<|reserved_special_token_{k}|>") for k in range(256)]
    spec["added_tokens"] = [_added(128000 + k, t) for k, t in enumerate(names)]
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    spec["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                                   "tokens": ["<|begin_of_text|>"]}}}]}
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return spec


def llama2(form: str = "legacy", vocab_size: int = 4000) -> dict:
    """TinyLlama / Llama 2 kind: BPE with byte fallback, 32000 tokens. form "legacy" is the
    normalizer form (Prepend + Replace, no pre-tokenizer) of the published TinyLlama file;
    "metaspace" is what newer transformers conversions write (Metaspace, prepend "first")."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(METASPACE), normalizers.Replace(" ", METASPACE)])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=120)
    tok.train_from_iterator(corpus(), trainer=trainer)
    spec = _trained_spec(tok)
    first = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    spec["model"]["vocab"] = _renumber(spec["model"]["vocab"], first)
    _pad(spec["model"]["vocab"], 32000)
    spec["added_tokens"] = [_added(0, "<unk>"), _added(1, "<s>"), _added(2, "</s>")]
    spec["model"].update(unk_token="<unk>", byte_fallback=True, fuse_unk=True, ignore_merges=False)
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": METASPACE}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    if form == "legacy":
        spec["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": METASPACE}, {"type": "Replace", "pattern": {"String": " "}, "content": METASPACE}]}
        spec["pre_tokenizer"] = None
    else:
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": METASPACE, "prepend_scheme": "first", "split": False}
    return spec
