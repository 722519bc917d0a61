"""weight_cache.py — a first load (empty browser profile) against a second (the weight cache and the
thread choice filled by the first), in headless Chromium with a disk-backed profile, over a server
paced to each `--mbps` rate (0: loopback, unpaced; the pacing is one link shared by every file).

Each repetition starts a new profile: load 1 reads everything from the server and stores the weight
files; once they are filed, load 2 (a new page of the same origin) reads them from the cache. The
time is the page's: from opening the runner page to ready (`page_total`: the page, Pyodide, the
model check, both models, the warm-up and the calibration), as a user waits for it. Prints and
writes (default build/bench/weight_cache-<pair>.json) each load, the medians per rate and the ratio
second / first (issue 21's goal: <= 1/3 on SmolLM2).

    .venv/bin/python tools/bench/weight_cache.py --pair real [--mbps 0,100,50] [--reps 2]
Run it under the browser lock (README), on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

from pairs import PAIRS, ROOT, pair_paths  # noqa: E402  (sets up py/ on sys.path)

from exactspec.host.browser_run import CHROMIUM, CHROMIUM_ARGS, BrowserRuntime  # noqa: E402
from exactspec.host.safe_files import write_file  # noqa: E402

PROMPT = {"prompt": "The capital of France is", "config": {"max_new_tokens": 8, "temperature": 0.0,
                                                         "prefix_reuse": False}}


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def one_load(context, port, champion, draft, rate) -> dict:
    """A runtime on the profile's origin -> its times, what the cache did, the answer's ids."""
    progress = []
    rt = BrowserRuntime(champion, draft, context=context, port=port, champion_backend="wasm",
                        rate_bytes_per_s=rate, on_progress=lambda p: progress.append(p))
    try:
        timing = rt.ready["timing_ms"]
        weights = {p["name"]: p.get("cache") for p in progress if p.get("stage") == "fetch" and p.get("done") and p.get("cache")}
        ids = rt.generate(PROMPT)["result"]["token_ids"]
        listed = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:   # the worker files what it stored after ready
            listed = rt.page.evaluate("async () => (await import('/web/weight_cache.mjs')).listCachedModels()")
            if len(listed) >= len(weights):
                break
            time.sleep(0.25)
        return {"page_total_ms": timing["page_total"], "total_ms": timing["total"],
                "timing_ms": {k: round(v, 1) for k, v in timing.items() if isinstance(v, (int, float))},
                "weights": weights, "threads_cache": rt.ready["info"]["champion"].get("warmup_ms", {}).get("threads_cache"),
                "cached_files": len(listed), "token_ids": ids,
                "load_transient": rt.ready["info"]["champion"].get("load_transient")}
    finally:
        rt.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", choices=sorted(PAIRS), default="real")
    ap.add_argument("--mbps", default="0,100,50", help="link rates in Mbit/s, comma-separated (0: unpaced)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    champion, draft = pair_paths(args.pair)
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    rows = []
    try:
        for rep in range(args.reps):
            for mbps in [float(x) for x in args.mbps.split(",")]:
                profile = tempfile.mkdtemp(prefix="exactspec-wc-")
                context = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                                args=CHROMIUM_ARGS)
                try:
                    port, rate = free_port(), int(mbps * 1e6 / 8)
                    first = one_load(context, port, champion, draft, rate)
                    second = one_load(context, port, champion, draft, rate)
                finally:
                    context.close()
                    shutil.rmtree(profile, ignore_errors=True)
                rows.append({"rep": rep, "mbps": mbps, "first": first, "second": second})
                print(f"  rep {rep} {mbps:g} Mbit/s: first {first['page_total_ms'] / 1000:.1f} s {first['weights']}, "
                      f"second {second['page_total_ms'] / 1000:.1f} s {second['weights']} (threads {second['threads_cache']}); "
                      f"load transient {first['load_transient']} / {second['load_transient']}",
                      flush=True)
    finally:
        pw.stop()
    summary = {}
    for mbps in sorted({r["mbps"] for r in rows}):
        at = [r for r in rows if r["mbps"] == mbps]
        first = statistics.median(r["first"]["page_total_ms"] for r in at)
        second = statistics.median(r["second"]["page_total_ms"] for r in at)
        summary[f"{mbps:g}"] = {"first_ms": round(first), "second_ms": round(second), "ratio": round(second / first, 3),
                                "loads": len(at)}
        print(f"{mbps:g} Mbit/s: first load {first / 1000:.1f} s, second {second / 1000:.1f} s, ratio {second / first:.3f}")
    same = len({tuple(r[k]["token_ids"]) for r in rows for k in ("first", "second")}) == 1
    hits = all(set(r["second"]["weights"].values()) == {"hit"} for r in rows)
    print(f"answers identical: {same}; every second load read its weights from the cache: {hits}")
    out = {"summary": summary, "rows": rows, "pair": args.pair, "answers_identical": same, "second_loads_all_hits": hits,
           "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    path = args.out or os.path.join(ROOT, "build", "bench", f"weight_cache-{args.pair}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_file(path, (json.dumps(out, indent=1) + "\n").encode("utf-8"))
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return 0 if same and hits else 1


if __name__ == "__main__":
    sys.exit(main())
