"""switch_noise.py — how much two identical requests differ when they run on one engine or on two.

The bench (`exactspec bench`) runs champion alone on one engine and auto on another, one after the
other; its toy-wasm cells are noise-limited (docs/evaluation.md, "Noise and power"). This loads the
toy pair's two engines as the bench does (champion alone; champion + draft) in the bench's page and
times one dev-split prompt, champion alone (speculate "none": the same work on both engines), in
pairs of adjacent requests:
  same    both requests on the champion + draft engine;
  switch  one on each engine, the order alternating pair by pair;
  warmed  as switch, each timed request right after an untimed run of itself on its engine.
For each: the log-sd over pairs of log(ms of one / ms of the other) (one engine against the other
for switch and warmed), the geometric mean of that ratio, and of the first request over the second.
Dev split only. Prints a table and writes JSON (default build/bench/switch_noise.json).

    .venv/bin/python tools/bench/switch_noise.py [--threads 2] [--pairs 30]
Run it under the browser lock (README), on a quiet machine.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

from pairs import ROOT, write_result  # noqa: E402  (sets up py/ on sys.path)

from auto_ab import dev_prompts  # noqa: E402
from exactspec.evaluation import arms as arms_mod  # noqa: E402
from exactspec.evaluation.runner import _peer  # noqa: E402
from exactspec.host.browser_run import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

CONDITIONS = (("same", ("spec", "spec"), False), ("switch", ("alone", "spec"), False), ("warmed", ("alone", "spec"), True))


def summarise(pairs: list) -> dict:
    """pairs: [(engine_a, engine_b, ms_a, ms_b)] -> {pairs, log_sd, geo (alone over spec, or the first
    over the second on one engine), first_over_second_geo, median_ms}."""
    engine = [math.log(x / y) if a <= b else math.log(y / x) for a, b, x, y in pairs]
    order = [math.log(x / y) for _a, _b, x, y in pairs]
    return {"pairs": len(pairs), "log_sd": round(statistics.pstdev(engine), 4),
            "geo": round(math.exp(statistics.mean(engine)), 4),
            "first_over_second_geo": round(math.exp(statistics.mean(order)), 4),
            "median_ms": round(statistics.median([x for *_, x, _y in pairs] + [y for *_, y in pairs]), 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="the WASM champion's threads, both engines")
    ap.add_argument("--pairs", type=int, default=30, help="pairs of requests a condition")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright
    peer = _peer()
    prompt = next(p for p in dev_prompts() if p.get("chat") and p["max_new_tokens"] >= 32)
    body = {"prompt": prompt["prompt"], "chat": prompt["chat"], "config": arms_mod.request_config("none", prompt, 0.0)}
    models = {"champion": arms_mod.PAIRS["toy"]["champion"], "draft": arms_mod.PAIRS["toy"]["draft"]}
    server, pw = peer.PeerServer(), sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    out = {"prompt_id": prompt["id"], "threads": args.threads, "conditions": {}}
    try:
        page = browser.new_context().new_page()
        page.set_default_timeout(600_000)
        page.goto(server.url + "/web/bench/eval.html")
        page.wait_for_function("() => window.evalReady === true && window.peerReady === true")

        def call(fn, *a):
            return page.evaluate(f"(a) => window.evalBench.{fn}(...a)", list(a))

        for role in ("alone", "spec"):
            r = call("load", role, models if role == "spec" else {**models, "draft": None},
                     {"championBackend": "wasm", "threads": args.threads, **({"draftInBackground": True} if role == "spec" else {})})
            if "refused" in r:
                print(f"{r['refused']['code']}: load {role}: {r['refused']['message']}", file=sys.stderr)
                return 1
        time.sleep(2.0)

        def timed(engine: str, warmed: bool) -> float:
            if warmed:
                call("generate", engine, body)
            r = call("generate", engine, body)
            if "refused" in r:
                raise RuntimeError(f"{r['refused']['code']}: {r['refused']['message']}")
            return r["total_ms"]

        print(f"switch_noise: toy pair, {prompt['id']}, {args.threads} thread(s), {args.pairs} pairs a condition", flush=True)
        print(f"{'condition':10s} {'log-sd':>7s} {'geo':>6s} {'1st/2nd':>8s} {'median ms':>10s}")
        for label, engines, warmed in CONDITIONS:
            pairs = []
            for i in range(args.pairs):
                a, b = engines if i % 2 else engines[::-1]
                pairs.append((a, b, timed(a, warmed), timed(b, warmed)))
            s = out["conditions"][label] = {**summarise(pairs), "ms": [[x, y] for *_, x, y in pairs]}
            print(f"{label:10s} {s['log_sd']:7.3f} {s['geo']:6.3f} {s['first_over_second_geo']:8.3f} {s['median_ms']:10.1f}", flush=True)
    finally:
        browser.close()
        pw.stop()
        server.close()
    write_result(out, os.path.join(ROOT, "build", "bench", "switch_noise.json"), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
