#!/usr/bin/env python3
"""Summarise training logs + eval + manifest into build/train/summary.json (for docs/training.md).

  python3 tools/train/summarize.py
"""
from __future__ import annotations

import json
import os
import re

LINE = re.compile(r"^(\S+) step (\d+) loss ([\d.]+) lr (\S+) gnorm (\S+) tok/s (\d+) tokens (\d+) "
                  r"elapsed (\d+)s progress (\S+)")


def parse(log):
    rows, last_run = [], []
    extra = {}
    with open(log) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                rows.append({"t": m.group(1), "step": int(m.group(2)), "loss": float(m.group(3)),
                             "tok_s": int(m.group(6)), "tokens": int(m.group(7)),
                             "elapsed": int(m.group(8))})
            if "done steps=" in line:
                extra["done"] = line.strip()
            if "held-out mean" in line:
                extra["acceptance"] = line.strip()
            if " params=" in line:
                extra["params"] = int(re.search(r"params=(\d+)", line).group(1))
    if not rows:
        return extra
    last = rows[-1]
    tail = rows[-10:]
    return dict(extra, steps=last["step"], tokens=last["tokens"], elapsed_s=last["elapsed"],
                mean_tok_s=round(last["tokens"] / max(1, last["elapsed"]), 1),
                median_logged_tok_s=sorted(r["tok_s"] for r in rows)[len(rows) // 2],
                final_loss_mean_last10_logs=round(sum(r["loss"] for r in tail) / len(tail), 4))


def main():
    out = {}
    for role in ("champion", "draft"):
        p = f"build/train/{role}.log"
        if os.path.exists(p):
            out[role] = parse(p)
    for name, p in (("eval", "build/train/eval.json"), ("manifest", "web/models/manifest.json")):
        if os.path.exists(p):
            with open(p) as f:
                out[name] = json.load(f)
    if "manifest" in out:
        out["manifest"] = {"total_bytes": out["manifest"]["total_bytes"],
                           "files": {f["path"]: f["bytes"] for f in out["manifest"]["files"]}}
    with open("build/train/summary.json", "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
