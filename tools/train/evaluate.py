#!/usr/bin/env python3
"""Held-out evaluation of the exported champion and draft.

  python3 tools/train/evaluate.py --models web/models --out build/train/eval.json

For each model (fp32 model.safetensors and int8 model.q8.safetensors dequantised): mean
next-token NLL, perplexity and bits per byte over the held-out documents (build/corpus/
heldout.jsonl, plain `<|bos|> text <|eos|>` form, non-overlapping 256-token windows).
For the pair: mean per-position acceptance sum_v min(p_target, p_draft) = 1 - TV at
temperature 1 (the expected acceptance rate of one speculative token), and greedy top-1
agreement.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import build_stream, eval_windows  # noqa: E402
from model import Llama, LlamaConf  # noqa: E402

CONF_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "head_dim",
             "max_position_embeddings", "rope_theta", "rms_norm_eps"]


def load_exported(d, q8=False):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    conf = LlamaConf(**{k: cfg[k] for k in CONF_KEYS})
    m = Llama(conf)
    if q8:
        from export_hf import dequantize_state
        sd = dequantize_state(load_file(os.path.join(d, "model.q8.safetensors")))
    else:
        sd = load_file(os.path.join(d, "model.safetensors"))
    m.load_state_dict(sd)
    m.eval()
    return m


def batched(windows, bs):
    buf = []
    for x, y in windows:
        buf.append((x, y))
        if len(buf) == bs:
            yield torch.cat([b[0] for b in buf]), torch.cat([b[1] for b in buf])
            buf = []
    if buf:
        yield torch.cat([b[0] for b in buf]), torch.cat([b[1] for b in buf])


@torch.no_grad()
def nll(model, stream, seq_len=256, max_windows=None, bs=8):
    tot, n = 0.0, 0
    for x, y in batched(eval_windows(stream, seq_len, max_windows), bs):
        logits = model(x)
        tot += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
        n += y.numel()
    return tot / n, n


@torch.no_grad()
def acceptance(target, draft, stream, seq_len=256, max_windows=None, bs=8, temperature=1.0):
    acc, agree, n = 0.0, 0, 0
    for x, _y in batched(eval_windows(stream, seq_len, max_windows), bs):
        p = F.softmax(target(x) / temperature, dim=-1)
        q = F.softmax(draft(x) / temperature, dim=-1)
        acc += torch.minimum(p, q).sum(-1).sum().item()
        agree += (p.argmax(-1) == q.argmax(-1)).sum().item()
        n += x.numel()
    return acc / n, agree / n, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="web/models")
    ap.add_argument("--corpus", default="build/corpus")
    ap.add_argument("--tokenizer", default="build/tokenizer/tokenizer.json")
    ap.add_argument("--cache", default="build/train/cache")
    ap.add_argument("--out", default="build/train/eval.json")
    ap.add_argument("--max-windows", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    torch.set_num_threads(2)

    stream = build_stream(args.corpus, args.tokenizer, "heldout", args.seed, 0.0, args.cache)
    with open(os.path.join(args.corpus, "heldout.jsonl")) as f:
        n_bytes = sum(len(json.loads(l)["text"].encode()) + 0 for l in f)
    n_stream = stream.numel()
    res = {"heldout_tokens": n_stream, "heldout_text_bytes": n_bytes, "seq_len": 256, "models": {}}
    models = {}
    for name in ("champion", "draft"):
        d = os.path.join(args.models, name)
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            continue
        for q8 in (False, True):
            t0 = time.time()
            m = load_exported(d, q8)
            loss, n = nll(m, stream, max_windows=args.max_windows)
            key = name + (".q8" if q8 else "")
            # bits per byte: scale total bits by scored fraction of the stream
            bpb = loss / 0.6931471805599453 * n / (n_bytes * n / n_stream)
            res["models"][key] = {"params": m.num_params(), "nll": loss, "ppl": float(torch.tensor(loss).exp()),
                                  "bits_per_byte": bpb, "tokens_scored": n}
            print(f"{key:14s} params {m.num_params():>9d}  nll {loss:.4f}  ppl {res['models'][key]['ppl']:.2f}  "
                  f"bpb {bpb:.4f}  ({n} tokens, {time.time() - t0:.0f}s)", flush=True)
            models[key] = m
    if "champion" in models and "draft" in models:
        for suffix in ("", ".q8"):
            a, g, n = acceptance(models["champion" + suffix], models["draft" + suffix], stream,
                                 max_windows=args.max_windows)
            res["pair" + suffix] = {"mean_accept_T1": a, "greedy_top1_agreement": g, "positions": n}
            print(f"pair{suffix:4s} mean sum(min(p,q)) @T=1: {a:.4f}   greedy top-1 agreement: {g:.4f}  ({n} positions)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
