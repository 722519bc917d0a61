#!/usr/bin/env python3
"""Synthetic Hugging Face checkpoints at real shapes (random weights, fixed seed), made by transformers.

    python tools/synth_models.py OUT_DIR [SHAPE ...]        # default: every mid-size shape
    python tools/synth_models.py --list

Each folder is what `save_pretrained` writes for `AutoModelForCausalLM.from_config(config)`
initialised with torch.manual_seed(seed), in bf16 (sharded by `max_shard_size` when large), plus
`generation_config.json`, a `tokenizer.json` of the family's real kind and exact size built with
the `tokenizers` library, and a `tokenizer_config.json`. Nothing is downloaded: the published
shapes below are written from the models' config.json files on the Hugging Face hub (named per
entry). Random weights give meaningless text; these folders test formats, shapes and numerics.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys

FAMILIES = {
    # vocab size, tokenizer kind, special tokens (id -> content), bos/eos ids, model_type
    "smollm2": dict(vocab=49152, kind="byte_level", model_type="llama", bos=0, eos=[0],
                    specials={0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>"}),
    "qwen2.5": dict(vocab=151936, kind="byte_level_split", model_type="qwen2", bos=151643, eos=[151643],
                    specials={151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}),
    "llama3.2": dict(vocab=128256, kind="byte_level_split", model_type="llama", bos=128000,
                     eos=[128001, 128008, 128009],
                     specials={128000: "<|begin_of_text|>", 128001: "<|end_of_text|>",
                               128008: "<|eom_id|>", 128009: "<|eot_id|>"}),
    "tinyllama": dict(vocab=32000, kind="metaspace", model_type="llama", bos=1, eos=[2],
                      specials={0: "<unk>", 1: "<s>", 2: "</s>"}),
}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}

# Published shapes (config.json of each model on the Hugging Face hub).
PUBLISHED = {
    # HuggingFaceTB/SmolLM2-135M
    "smollm2-135m": ("smollm2", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                     rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    # HuggingFaceTB/SmolLM2-360M
    "smollm2-360m": ("smollm2", dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                                     num_attention_heads=15, num_key_value_heads=5, max_position_embeddings=8192,
                                     rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    # Qwen/Qwen2.5-0.5B
    "qwen2.5-0.5b": ("qwen2.5", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                     num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                     use_sliding_window=False, sliding_window=32768, max_window_layers=24)),
    # Qwen/Qwen2.5-1.5B (its config.json says tie_word_embeddings: true, as the Qwen2.5 report's
    # table does for 0.5B-3B; issue 10 calls it untied: the untied Qwen2 case is the mid-size one)
    "qwen2.5-1.5b": ("qwen2.5", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                     num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=131072,
                                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                     use_sliding_window=False, sliding_window=131072, max_window_layers=28)),
    # meta-llama/Llama-3.2-1B
    "llama3.2-1b": ("llama3.2", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                     num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                     max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                                     rope_scaling=LLAMA3_ROPE, tie_word_embeddings=True)),
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T
    "tinyllama-1.1b": ("tinyllama", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                         num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                                         rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
}
# Mid-size shapes for CI: the family's vocabulary and features, few layers, small hidden. Each
# family also has a smaller "-draft" of the same family (same tokenizer) for speculative tests.
MID = {
    "smollm2-mid": ("smollm2", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                                    rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "smollm2-draft": ("smollm2", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
                                      rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "qwen2.5-mid": ("qwen2.5", dict(hidden_size=56, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=7, num_key_value_heads=1, max_position_embeddings=32768,
                                    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                    use_sliding_window=False, sliding_window=32768, max_window_layers=2)),
    "qwen2.5-mid-untied": ("qwen2.5", dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32768,
                                           rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                           use_sliding_window=False, sliding_window=32768, max_window_layers=2)),
    "qwen2.5-draft": ("qwen2.5", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32768,
                                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                      use_sliding_window=False, sliding_window=32768, max_window_layers=1)),
    "llama3.2-mid": ("llama3.2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                      max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                                      rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False)),
    "llama3.2-draft": ("llama3.2", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                                        rope_scaling=LLAMA3_ROPE, tie_word_embeddings=True)),
    "tinyllama-mid": ("tinyllama", dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "tinyllama-draft": ("tinyllama", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                                          rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
}
SHAPES = {**PUBLISHED, **MID}
SHARD_ABOVE_PARAMS = 200_000_000       # larger models are saved in shards of MAX_SHARD_SIZE
MAX_SHARD_SIZE = "500MB"

# The pre-tokenizer split patterns of the Qwen2 and Llama 3 tokenizer.json files.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def hf_config(shape: str) -> dict:
    """The config.json fields of a shape (transformers fills in the rest)."""
    family, fields = SHAPES[shape]
    fam = FAMILIES[family]
    eos = fam["eos"] if len(fam["eos"]) > 1 else fam["eos"][0]
    return dict(fields, vocab_size=fam["vocab"], model_type=fam["model_type"], hidden_act="silu",
                bos_token_id=fam["bos"], eos_token_id=eos)


# ---------------------------------------------------------------------------------------------
# Tokenizers of the real kind and size (vocabulary and merges synthetic, deterministic)
# ---------------------------------------------------------------------------------------------


def _byte_alphabet() -> list:
    """GPT-2's bytes_to_unicode characters, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def _grow_merges(alphabet: list, vocab: dict, count: int, seed: int) -> list:
    """`count` merges (a, b) adding new tokens a+b to vocab: level by level, each new token is an
    existing token extended by one alphabet symbol, in a seeded random order (deterministic)."""
    rng = random.Random(seed)
    merges, frontier = [], list(alphabet)
    while len(merges) < count:
        grown = []
        for prefix in frontier:
            for symbol in rng.sample(alphabet, min(len(alphabet), 64)):
                token = prefix + symbol
                if token not in vocab:
                    grown.append((prefix, symbol))
        rng.shuffle(grown)
        for a, b in grown[:count - len(merges)]:
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append((a, b))
        frontier = [a + b for a, b in grown]
    return merges


@functools.lru_cache(maxsize=None)
def tokenizer_json(family: str, seed: int = 0) -> str:
    """build_tokenizer(family, seed) serialised (built once per process: the larger take seconds)."""
    return build_tokenizer(family, seed).to_str()


def build_tokenizer(family: str, seed: int = 0):
    """A tokenizers.Tokenizer of the family's kind with exactly its vocabulary size."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    fam = FAMILIES[family]
    size, specials = fam["vocab"], fam["specials"]
    if fam["kind"] == "metaspace":   # Llama 2 / TinyLlama: <unk> <s> </s>, <0x00>..<0xFF>, then pieces
        vocab = {specials[i]: i for i in sorted(specials)}
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = len(vocab)
        alphabet = ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + \
                   [chr(c) for c in range(ord("A"), ord("Z") + 1)] + list("0123456789.,;:!?'\"-()[]") + \
                   ["é", "è", "ü", "ö", "ß", "ç", "ñ", "и", "е", "а", "中", "日"]
        for ch in alphabet:
            vocab[ch] = len(vocab)
        merges = _grow_merges(alphabet, vocab, size - len(vocab), seed)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tok.add_special_tokens([AddedToken(specials[i], special=True, normalized=False) for i in sorted(specials)])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        return tok
    # byte-level BPE: ids below the first special at the end, or after the leading specials
    leading = {i: t for i, t in specials.items() if i < 256}
    trailing = {i: t for i, t in specials.items() if i >= 256}
    n_bpe = (min(trailing) if trailing else size) - len(leading)
    alphabet = _byte_alphabet()
    vocab = {leading[i]: i for i in sorted(leading)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    merges = _grow_merges(alphabet, vocab, n_bpe + len(leading) - len(vocab), seed)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    if fam["kind"] == "byte_level":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pattern = QWEN2_PATTERN if family == "qwen2.5" else LLAMA3_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        if family == "qwen2.5":
            tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if family == "llama3.2":   # Llama 3 prepends <|begin_of_text|> in its post-processor
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", fam["bos"])])])
    added = [AddedToken(specials[i], special=True, normalized=False) for i in sorted(leading)]
    # trailing specials fill every id up to the vocabulary size (reserved ones as Llama 3 does)
    for i in range(len(vocab), size):
        added.append(AddedToken(trailing.get(i, f"<|reserved_special_token_{i - len(vocab)}|>"),
                                special=True, normalized=False))
    tok.add_special_tokens(added)
    return tok


def tokenizer_config(family: str) -> dict:
    fam = FAMILIES[family]
    eos = fam["specials"][fam["eos"][0]]
    bos = fam["specials"][fam["bos"]]
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
           "model_max_length": 131072, "clean_up_tokenization_spaces": False}
    if family == "tinyllama":
        cfg.update(add_bos_token=True, add_eos_token=False, unk_token="<unk>", legacy=False)
    return cfg


# ---------------------------------------------------------------------------------------------
# Writing a folder
# ---------------------------------------------------------------------------------------------


def make_model(shape: str, out_dir: str, seed: int = 0, dtype: str = "bfloat16", init_std=None) -> str:
    """Write the folder of `shape` into out_dir/shape (returned). Same seed, same weights.
    init_std: initializer_range (default transformers' 0.02; tests use larger weights so that
    attention, RoPE and biases visibly shape the logits)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    family = SHAPES[shape][0]
    fields = hf_config(shape)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    if init_std is not None:
        config.initializer_range = init_std
    config.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[config.model_type]]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    if config.model_type == "qwen2":   # transformers initialises biases to zero: make them count
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0.0, 0.5 if init_std is None else 25 * init_std)
    path = os.path.join(out_dir, shape)
    params = sum(p.numel() for p in model.parameters())
    shard = MAX_SHARD_SIZE if params > SHARD_ABOVE_PARAMS else "100GB"
    model.save_pretrained(path, safe_serialization=True, max_shard_size=shard)
    fam = FAMILIES[family]
    GenerationConfig(bos_token_id=fam["bos"], eos_token_id=fam["eos"] if len(fam["eos"]) > 1 else fam["eos"][0]
                     ).save_pretrained(path)
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tokenizer_json(family, seed))
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(family), f, indent=2)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("shapes", nargs="*", help=f"default: {' '.join(MID)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=None, help="initializer_range (default 0.02)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list or not args.out_dir:
        for name, (family, fields) in SHAPES.items():
            print(f"{name:20s} {family:9s} hidden {fields['hidden_size']}, {fields['num_hidden_layers']} layers")
        return 0
    for shape in args.shapes or list(MID):
        if shape not in SHAPES:
            ap.error(f"unknown shape {shape!r} (see --list)")
        print(make_model(shape, args.out_dir, seed=args.seed, init_std=args.init_std), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
