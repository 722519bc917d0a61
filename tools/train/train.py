#!/usr/bin/env python3
"""Train the champion (next-token LM) or distil the draft from the champion, on CPU.

  python3 tools/train/train.py --role champion --budget-min 60          # fresh
  python3 tools/train/train.py --role champion --budget-min 60 --resume # continue
  python3 tools/train/train.py --role draft --budget-min 20 \\
      --teacher build/train/champion/ckpt.pt

Learning-rate schedule: linear warmup then cosine to lr*min_lr_frac. Progress is
step/max_steps when --max-steps is given (exactly reproducible), otherwise the fraction
of the wall-clock budget used (training stops when the budget is spent; the step count
reached is logged and can be passed as --max-steps to reproduce the run step for step).
Checkpoints (atomic) every --ckpt-min minutes and at the end: build/train/<role>/ckpt.pt.
Log: build/train/<role>.log (loss, lr, tokens/s).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

# Shared 2-core machine: passive OpenMP waiting degrades far less under oversubscription
# (spinning threads burn the time slices the other thread needs). Must precede `import torch`.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import build_stream, get_batch  # noqa: E402
from model import PRESETS, Llama, LlamaConf  # noqa: E402


def log(fh, msg):
    line = time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + msg
    print(line, flush=True)
    fh.write(line + "\n")
    fh.flush()


def load_ckpt_model(path):
    ck = torch.load(path, map_location="cpu", weights_only=False)
    m = Llama(LlamaConf(**ck["conf"]))
    m.load_state_dict(ck["model"])
    return m, ck


def save_ckpt(path, **kw):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(kw, path + ".tmp")
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["champion", "draft"], required=True)
    ap.add_argument("--corpus", default="build/corpus")
    ap.add_argument("--tokenizer", default="build/tokenizer/tokenizer.json")
    ap.add_argument("--outdir", default="build/train")
    ap.add_argument("--teacher", default="build/train/champion/ckpt.pt")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="wall-clock budget (default 60 champion, 20 draft)")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--chat-frac", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ckpt-min", type=float, default=5.0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--eval-windows", type=int, default=64,
                    help="held-out 256-token windows for the draft's final acceptance print")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    budget_s = 60 * (args.budget_min if args.budget_min is not None else (60 if args.role == "champion" else 20))
    lr_max = args.lr if args.lr is not None else (2e-3 if args.role == "champion" else 3e-3)

    rdir = os.path.join(args.outdir, args.role)
    os.makedirs(rdir, exist_ok=True)
    ckpt_path = os.path.join(rdir, "ckpt.pt")
    fh = open(os.path.join(args.outdir, f"{args.role}.log"), "a")

    stream = build_stream(args.corpus, args.tokenizer, "train", args.seed, args.chat_frac,
                          os.path.join(args.outdir, "cache"))
    log(fh, f"role={args.role} train tokens={stream.numel()} args={json.dumps(vars(args))}")

    torch.manual_seed(args.seed)
    conf = PRESETS[args.role]
    model = Llama(conf)
    teacher = None
    if args.role == "draft":
        teacher, tck = load_ckpt_model(args.teacher)
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        log(fh, f"teacher {args.teacher} step={tck['step']} params={teacher.num_params()}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr_max, betas=(0.9, 0.95), eps=1e-8)
    step, elapsed, tokens_seen = 0, 0.0, 0
    if args.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed, tokens_seen = ck["step"], ck["elapsed"], ck["tokens_seen"]
        budget_s = ck.get("budget_s", budget_s) if args.budget_min is None else budget_s
        log(fh, f"resumed from {ckpt_path} step={step} elapsed={elapsed:.0f}s")
    log(fh, f"params={model.num_params()} conf={json.dumps(conf.to_dict())} budget_s={budget_s:.0f} lr={lr_max}")

    fwd = model
    tfwd = teacher
    if args.compile:
        fwd = torch.compile(model)
        if teacher is not None:
            tfwd = torch.compile(teacher)

    def progress():
        if args.max_steps:
            return min(1.0, step / args.max_steps)
        return min(1.0, elapsed / budget_s)

    def lr_at():
        if step < args.warmup_steps:
            return lr_max * (step + 1) / args.warmup_steps
        p = progress()
        return lr_max * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    def checkpoint(tag=""):
        save_ckpt(ckpt_path, model=model.state_dict(), opt=opt.state_dict(), step=step,
                  elapsed=elapsed, tokens_seen=tokens_seen, conf=conf.to_dict(),
                  budget_s=budget_s, args=vars(args))
        log(fh, f"checkpoint {ckpt_path} step={step} elapsed={elapsed:.0f}s {tag}")

    model.train()
    last_ckpt = elapsed
    win_t, win_tok, win_loss, win_n = time.time(), 0, 0.0, 0
    while True:
        if args.max_steps and step >= args.max_steps:
            break
        if not args.max_steps and elapsed >= budget_s:
            break
        t0 = time.time()
        x, y = get_batch(stream, step, args.batch_size, args.seq_len, args.seed)
        lr = lr_at()
        for g in opt.param_groups:
            g["lr"] = lr
        logits = fwd(x)
        if teacher is None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        else:
            with torch.no_grad():
                tlogp = F.log_softmax(tfwd(x).float(), dim=-1)
            logq = F.log_softmax(logits, dim=-1)
            # KL(teacher || draft), mean over positions
            loss = (tlogp.exp() * (tlogp - logq)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        elapsed += time.time() - t0
        win_tok += x.numel()
        win_loss += loss.item()
        win_n += 1
        if step % args.log_every == 0:
            dt = time.time() - win_t
            log(fh, f"step {step} loss {win_loss / win_n:.4f} lr {lr:.2e} gnorm {gn:.2f} "
                    f"tok/s {win_tok / dt:.0f} tokens {tokens_seen} elapsed {elapsed:.0f}s "
                    f"progress {progress():.3f}")
            win_t, win_tok, win_loss, win_n = time.time(), 0, 0.0, 0
        if elapsed - last_ckpt >= args.ckpt_min * 60:
            checkpoint()
            last_ckpt = elapsed
    checkpoint("final")
    log(fh, f"done steps={step} tokens={tokens_seen} elapsed={elapsed:.0f}s")
    if teacher is not None:
        from evaluate import acceptance
        model.eval()
        held = build_stream(args.corpus, args.tokenizer, "heldout", args.seed, 0.0,
                            os.path.join(args.outdir, "cache"))
        a, g, n = acceptance(teacher, model, held, max_windows=args.eval_windows)
        log(fh, f"held-out mean sum(min(p_champion, p_draft)) @T=1 = {a:.4f}; "
                f"greedy top-1 agreement = {g:.4f} ({n} positions)")


if __name__ == "__main__":
    main()
