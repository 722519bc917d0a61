"""First request after load against the tenth: ms/token of each of N identical requests in one
freshly loaded browser engine (headless Chromium, the page's runner), and the load phases.
Prints a table and writes build/bench/first_request.json. Numbers, not assertions.

    python tools/bench/first_request.py [--champion DIR|FILE.gguf] [--draft DIR] [--modes none,lookup,draft]
        [--champion-backend wasm] [--threads auto|N] [--requests 10] [--max-new-tokens 32] [--repeat 1] [--no-warmup]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "py"))
from exactspec.host.browser_run import BrowserRuntime  # noqa: E402
from exactspec.host.safe_files import write_file  # noqa: E402
from exactspec.reference.models import default_models_dir  # noqa: E402

PROMPT = "In the beginning God created"


def one_load(args, mode):
    """One fresh engine: N identical requests in `mode` -> {load_ms, ms_per_token: [...], ...}."""
    base = default_models_dir()
    champion = args.champion or os.path.join(base, "champion")
    draft = None if mode != "draft" else (args.draft or os.path.join(base, "draft"))
    rt = BrowserRuntime(champion, draft, champion_backend=args.champion_backend, threads=args.threads,
                        warm_up=not args.no_warmup)
    try:
        per = []
        for _ in range(args.requests):
            r = rt.generate({"prompt": PROMPT, "config": {"max_new_tokens": args.max_new_tokens, "temperature": 0.0,
                                                          "speculate": mode, "k": args.k, "seed": 0,
                                                          "prefix_reuse": False}})["result"]
            n = max(len(r["token_ids"]), 1)
            per.append({"decode_ms_per_token": r["timing_ms"]["decode"] / n, "prefill_ms": r["timing_ms"]["prefill"],
                        "total_ms": r["timing_ms"]["total"], "tokens": n})
        ready = rt.ready
    finally:
        rt.close()
    first, tenth = per[0]["decode_ms_per_token"], per[-1]["decode_ms_per_token"]
    later = statistics.median(p["decode_ms_per_token"] for p in per[1:]) if len(per) > 1 else tenth
    return {"mode": mode, "load_ms": {k: round(v, 1) for k, v in ready["timing_ms"].items()},
            "threads": ready["info"]["champion"].get("threads"), "backend": ready["info"]["champion"]["backend"],
            "requests": per, "first_ms_per_token": round(first, 3), "last_ms_per_token": round(tenth, 3),
            "first_over_last": round(first / tenth, 3), "later_median_ms_per_token": round(later, 3),
            "first_over_later_median": round(first / later, 3),
            "first_total_over_last": round(per[0]["total_ms"] / per[-1]["total_ms"], 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--champion", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--modes", default="none,lookup")
    ap.add_argument("--champion-backend", default="auto", choices=["auto", "webgpu", "wasm"])
    ap.add_argument("--threads", default="auto")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1, help="fresh loads per mode")
    ap.add_argument("--no-warmup", action="store_true", help="load without the engine's warm-up (the before)")
    ap.add_argument("--out", default="build/bench/first_request.json")
    args = ap.parse_args()
    args.threads = args.threads if args.threads == "auto" else int(args.threads)
    rows = []
    for mode in args.modes.split(","):
        for _ in range(args.repeat):
            row = one_load(args, mode)
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("mode", "backend", "threads", "first_ms_per_token", "last_ms_per_token",
                                                   "later_median_ms_per_token", "first_over_last", "first_over_later_median")}
                             | {"load_warmup_ms": row["load_ms"].get("warmup")}))
    summary = {mode: {key: round(statistics.median(r[key] for r in rows if r["mode"] == mode), 3)
                      for key in ("first_ms_per_token", "last_ms_per_token", "later_median_ms_per_token",
                                  "first_over_last", "first_over_later_median")}
               for mode in args.modes.split(",")}
    for mode, m in summary.items():
        print(f"{mode}: first {m['first_ms_per_token']} ms/token, tenth {m['last_ms_per_token']}, "
              f"2nd..{args.requests}th median {m['later_median_ms_per_token']}; first/tenth {m['first_over_last']}, "
              f"first/later median {m['first_over_later_median']} (medians over {args.repeat} loads)")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    write_file(args.out, json.dumps({"args": vars(args), "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
