"""Benchmark the browser engine (headless Chromium: WebGPU champion, WASM draft, Pyodide):
decode time per token of champion-alone vs speculative modes, compared within one run.
Prints a table and writes build/bench/browser.json. Numbers, not assertions: machines are noisy.

    python tools/bench/browser.py [--max-new-tokens 48] [--k 4] [--prompts 4]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "py"))
from exactspec.host.browser_run import BrowserRuntime  # noqa: E402
from exactspec.reference.models import default_models_dir  # noqa: E402
from exactspec.host.safe_files import write_file  # noqa: E402

PROMPTS = ["In the beginning God created", "To be, or not to be,", "And the LORD said unto Moses,",
           "What light through yonder window breaks?", "Blessed are the poor in spirit:", "Enter HAMLET."]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    args = ap.parse_args()
    base = default_models_dir()
    rt = BrowserRuntime(os.path.join(base, "champion"), os.path.join(base, "draft"))
    rows = []
    try:
        print("load (ms):", json.dumps({k: round(v) for k, v in rt.ready["timing_ms"].items()}))
        for temperature in (0.0, 1.0):
            per_mode = {}
            for mode in ("none", "draft", "lookup"):
                ms_per_token, tpr = [], []
                for i, prompt in enumerate(PROMPTS[:args.prompts]):
                    r = rt.generate({"prompt": prompt, "config": {"max_new_tokens": args.max_new_tokens,
                                     "temperature": temperature, "speculate": mode, "k": args.k, "seed": i,
                                     "prefix_reuse": False}})["result"]
                    n = max(len(r["token_ids"]), 1)
                    ms_per_token.append(r["timing_ms"]["decode"] / n)
                    if r["stats"]["tokens_per_round"]:
                        tpr.append(r["stats"]["tokens_per_round"])
                per_mode[mode] = statistics.median(ms_per_token)
                row = {"temperature": temperature, "mode": mode, "k": args.k, "median_ms_per_token": round(per_mode[mode], 2),
                       "speedup_vs_alone": round(per_mode["none"] / per_mode[mode], 3),
                       "median_tokens_per_round": round(statistics.median(tpr), 3) if tpr else 1.0}
                rows.append(row)
                print(json.dumps(row))
    finally:
        rt.close()
    os.makedirs("build/bench", exist_ok=True)
    write_file("build/bench/browser.json", json.dumps({"load_ms": rt.ready["timing_ms"], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
