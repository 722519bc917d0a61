"""Training data: tokenised documents plus ~10% chat-formatted continuation examples.

Plain document:   <|bos|> text <|eos|>
Chat example:     <|bos|>[<|system|>\\n...<|end|>\\n]<|user|>\\n{prompt}<|end|>\\n<|assistant|>\\n{next lines}<|end|>\\n
(exactly what the chat template in tokenizer_config.json renders, plus the reply).
All elements are shuffled (seeded) and concatenated into one token stream; batches are
random windows drawn with a generator seeded by (seed, step) so resumption is exact.
"""
from __future__ import annotations

import hashlib
import json
import os
import random

import torch

BOS, EOS, PAD, SYSTEM, USER, ASSISTANT, END = range(7)

SYSTEM_PROMPTS = [
    "You continue passages from the King James Bible and the plays and poems of Shakespeare.",
    "You are a helpful assistant.",
]
USER_TEMPLATES = [
    "Continue this passage:\n{p}",
    "{p}",
    "What comes next?\n{p}",
    "Please continue:\n{p}",
    "Give the next lines after:\n{p}",
]


def render_chat(messages, reply=None):
    s = "<|bos|>"
    for m in messages:
        s += f"<|{m['role']}|>\n{m['content']}<|end|>\n"
    s += "<|assistant|>\n"
    if reply is not None:
        s += reply + "<|end|>\n"
    return s


def make_chat_examples(docs, n, seed):
    rng = random.Random(seed)
    out = []
    tries = 0
    while len(out) < n and tries < n * 20:
        tries += 1
        text = docs[rng.randrange(len(docs))]
        lines = [l for l in text.split("\n") if l.strip()]
        if len(lines) < 4:
            continue
        k = rng.randint(1, 3)
        m = rng.randint(1, 4)
        i = rng.randrange(0, max(1, len(lines) - k - m))
        prompt = "\n".join(lines[i:i + k])
        reply = "\n".join(lines[i + k:i + k + m])
        if not reply:
            continue
        msgs = []
        if rng.random() < 0.15:
            msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        msgs.append({"role": "user", "content": rng.choice(USER_TEMPLATES).format(p=prompt)})
        out.append(render_chat(msgs, reply))
    return out


def _load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l)["text"] for l in f]


def build_stream(corpus_dir, tokenizer_path, split, seed, chat_frac, cache_dir):
    """Return a 1-D int16/int32 token tensor for the split (cached)."""
    from tokenizers import Tokenizer

    src = os.path.join(corpus_dir, f"{split}.jsonl")
    h = hashlib.sha256()
    for p in (src, tokenizer_path):
        with open(p, "rb") as f:
            h.update(f.read())
    h.update(f"{seed}:{chat_frac}:v1".encode())
    key = h.hexdigest()[:16]
    cache = os.path.join(cache_dir, f"stream_{split}_{key}.pt")
    if os.path.exists(cache):
        return torch.load(cache)

    tok = Tokenizer.from_file(tokenizer_path)
    tok.no_padding()
    tok.no_truncation()
    docs = _load_docs(src)
    plain = [[BOS] + e.ids + [EOS]
             for e in tok.encode_batch(docs, add_special_tokens=False)]
    n_plain_tokens = sum(len(x) for x in plain)
    elems = list(plain)
    if chat_frac > 0:
        # estimate tokens per chat example, then generate enough for chat_frac of the stream
        probe = make_chat_examples(docs, 200, seed + 1)
        per = sum(len(e.ids) for e in tok.encode_batch(probe, add_special_tokens=False)) / len(probe)
        n_chat = int(chat_frac / (1 - chat_frac) * n_plain_tokens / per)
        chats = make_chat_examples(docs, n_chat, seed + 2)
        elems += [e.ids for e in tok.encode_batch(chats, add_special_tokens=False)]
    random.Random(seed + 3).shuffle(elems)
    stream = torch.tensor([t for e in elems for t in e], dtype=torch.int16)
    os.makedirs(cache_dir, exist_ok=True)
    torch.save(stream, cache + ".tmp")
    os.replace(cache + ".tmp", cache)
    return stream


def get_batch(stream, step, batch_size, seq_len, seed):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    ix = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=g)
    offs = torch.arange(seq_len + 1)
    chunk = stream[ix[:, None] + offs[None, :]].long()
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def eval_windows(stream, seq_len, max_windows=None):
    """Non-overlapping windows over a stream, in order (for held-out evaluation)."""
    n = (stream.numel() - 1) // seq_len
    if max_windows:
        n = min(n, max_windows)
    for i in range(n):
        c = stream[i * seq_len: i * seq_len + seq_len + 1].long()
        yield c[:-1][None], c[1:][None]
