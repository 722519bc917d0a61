#!/usr/bin/env python3
"""Train the shared byte-level BPE tokenizer (vocab 4096) on build/corpus/train.jsonl.

Configuration is fixed (the project's pure-Python tokenizer reproduces it):
  normalizer None; pre_tokenizer ByteLevel(add_prefix_space=False, use_regex=True);
  decoder ByteLevel(); BPE (no dropout, no unk, byte_fallback False);
  special tokens first: <|bos|>=0 <|eos|>=1 <|pad|>=2 <|system|>=3 <|user|>=4
  <|assistant|>=5 <|end|>=6; post_processor TemplateProcessing(single="<|bos|> $A",
  pair="<|bos|> $A <|bos|> $B"); initial_alphabet ByteLevel.alphabet().

BPE training in `tokenizers` is deterministic for a fixed input order; documents are fed in
file order. Writes <out>/tokenizer.json, <out>/tokenizer_config.json,
<out>/special_tokens_map.json.
"""
from __future__ import annotations

import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
VOCAB_SIZE = 4096
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
MODEL_MAX_LENGTH = 512


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="build/corpus/train.jsonl")
    ap.add_argument("--out", default="build/tokenizer")
    args = ap.parse_args()

    docs = []
    with open(args.corpus, encoding="utf-8") as f:
        for line in f:
            docs.append(json.loads(line)["text"])

    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", 0)])

    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"), pretty=True)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>",
                   "additional_special_tokens": SPECIAL_TOKENS[3:]}, f, indent=2)
        f.write("\n")
    enc = tok.encode("In the beginning God created the heaven and the earth.")
    print("vocab", tok.get_vocab_size(), "example ids", enc.ids[:16])
    print("decoded:", tok.decode(enc.ids))


if __name__ == "__main__":
    main()
