"""auto_ab.py — speculate "auto" against champion alone on ONE engine, interleaved, dev split only.

A tuning instrument, not the preregistered evaluation (that is `exactspec bench`): both modes run
on the same loaded engine, prompt by prompt, in alternating order, so the ratio is free of the
difference between two engines (threads, warm-up). It also measures the machine's noise floor:
`--same` runs one prompt many times in champion-alone mode and reports how much identical requests
differ. Prints a table and writes JSON (default build/bench/auto_ab-<pair>.json).

    .venv/bin/python tools/bench/auto_ab.py --pair toy [--passes 2] [--threads auto]
    .venv/bin/python tools/bench/auto_ab.py --pair real --same 8
    .venv/bin/python tools/bench/auto_ab.py --pair toy --backend webgpu   (the WebGPU champion: SwiftShader here)
    .venv/bin/python tools/bench/auto_ab.py --pair toy --backend webgpu --compare auto,draft-k4   (the best fixed arm there)
    .venv/bin/python tools/bench/auto_ab.py --pair toy --compare none,none-unchained   (chains of baseline steps)
Run it under the browser lock (README), on a quiet machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from pairs import PAIRS, ROOT, pair_paths, write_result  # noqa: E402  (sets up py/ on sys.path)

from exactspec.evaluation.corpus import load_corpus  # noqa: E402
from exactspec.evaluation.metrics import geo_mean  # noqa: E402
from exactspec.host.browser_run import BrowserRuntime  # noqa: E402



def dev_prompts():
    """The corpus's dev split only: the locked test split is read by `exactspec bench --split test` alone."""
    prompts, _ = load_corpus(os.path.join(ROOT, "eval", "corpus"), os.path.join(ROOT, "eval", "corpus.lock.json"), "dev")
    assert all(p["split"] == "dev" for p in prompts), "auto_ab reads the dev split only"
    return prompts


# the modes --compare names: a speculate mode, or one with its baseline steps one call each
MODES = {"none": {"speculate": "none"}, "auto": {"speculate": "auto"},
         "none-unchained": {"speculate": "none", "chain_steps": False},
         "auto-unchained": {"speculate": "auto", "chain_steps": False},
         "draft-k4": {"speculate": "draft", "scheduler": "static", "k": 4}}


def payload(prompt: dict, mode: str, temperature: float) -> dict:
    config = {**MODES[mode], "temperature": temperature, "max_new_tokens": prompt["max_new_tokens"],
              "seed": prompt["seed"], "prefix_reuse": False}   # both modes prefill the whole prompt
    if prompt.get("chat"):
        return {"messages": [{"role": "user", "content": prompt["prompt"]}], "config": config}
    return {"prompt": prompt["prompt"], "config": config}


def measure(rt: BrowserRuntime, body: dict) -> dict:
    """One request -> {ms_per_token (page clock, request start to result, prefill included: as
    `exactspec bench` times it; the driver's clock would add the event log's transfer, larger for
    auto's events), overhead_ms a round (outside the champion and the draft), verify_ms a round (the champion's),
    prefill_ms, n_tokens, rounds_by_method, events: the tokens events (one a call: a chain's steps are one)}."""
    out = rt.generate(body)
    result, ms = out["result"], out["page_ms"]
    timing, stats = result["timing_ms"], result["stats"]
    n = len(result["token_ids"])
    rounds = stats["rounds"] + stats["baseline_steps"]
    other = timing["total"] - timing["prefill"] - timing["verify"] - timing["draft"]
    return {"ms_per_token": ms / max(n, 1), "overhead_ms": other / max(rounds, 1), "n_tokens": n,
            "verify_ms": timing["verify"] / max(rounds, 1), "prefill_ms": timing["prefill"],
            "rounds_by_method": (stats.get("auto") or {}).get("rounds_by_method"),
            "events": sum(1 for e in out["events"] if e["kind"] == "tokens")}


def run_ab(rt, prompts, passes: int, temperatures, compare=("auto", "none")) -> dict:
    """Each prompt in both modes, alternating which runs first; speedup = the second mode's ms a
    token over the first's (auto against none by default: auto_speedup_geo)."""
    a, b = compare
    rows = []
    for rep in range(passes):
        for i, prompt in enumerate(prompts):
            for t in temperatures:
                order = (b, a) if (rep + i) % 2 else (a, b)
                got = {mode: measure(rt, payload(prompt, mode, t)) for mode in order}
                rows.append({"prompt_id": prompt["id"], "temperature": t, "pass": rep,
                             "speedup": got[b]["ms_per_token"] / got[a]["ms_per_token"], a: got[a], b: got[b]})
                print(f"  {prompt['id']:16s} T={t} {a}/{b} {rows[-1]['speedup']:.3f}", flush=True)
    summary = {}
    for t in temperatures:
        sel = [r for r in rows if r["temperature"] == t]
        summary[str(t)] = {
            "requests": len(sel), "auto_speedup_geo": geo_mean([r["speedup"] for r in sel]), "compare": [a, b],
            "ms_per_token_median": {m: statistics.median(r[m]["ms_per_token"] for r in sel) for m in (a, b)},
            "overhead_ms_median": {m: statistics.median(r[m]["overhead_ms"] for r in sel) for m in (a, b)},
            "events_mean": {m: statistics.mean(r[m]["events"] for r in sel) for m in (a, b)}}
    return {"rows": rows, "summary": summary}


def run_same(rt, prompt, times: int) -> dict:
    per_token = [measure(rt, payload(prompt, "none", 0.0))["ms_per_token"] for _ in range(times)]
    spread = max(per_token) / min(per_token)
    adjacent = [b / a for a, b in zip(per_token, per_token[1:])]
    return {"prompt_id": prompt["id"], "ms_per_token": per_token, "max_over_min": spread,
            "adjacent_ratio_range": [min(adjacent), max(adjacent)] if adjacent else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", choices=sorted(PAIRS), default="toy")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--threads", default="auto")
    ap.add_argument("--backend", choices=["wasm", "webgpu"], default="wasm", help="the champion backend")
    ap.add_argument("--compare", default="auto,none",
                    help=f"two of {', '.join(MODES)}: the first against the second (default auto,none)")
    ap.add_argument("--same", type=int, default=0, help="noise floor: one dev prompt this many times, champion alone")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    compare = tuple(args.compare.split(","))
    if len(compare) != 2 or not set(compare) <= set(MODES) or compare[0] == compare[1]:
        ap.error(f"--compare takes two different modes of {', '.join(MODES)}")
    champion, draft = pair_paths(args.pair)
    prompts = dev_prompts()
    threads = args.threads if args.threads == "auto" else int(args.threads)
    rt = BrowserRuntime(champion, draft, champion_backend=args.backend, threads=threads)
    info = rt.ready["info"]["champion"]
    cal = rt.ready["info"].get("calibration") or {}
    print(f"auto_ab {args.pair} on {info.get('backend')}: threads {info.get('threads')} ({info.get('threads_why')}); "
          f"calibration timed n = {cal.get('measured_n')}", flush=True)
    try:
        if args.same:
            chat = next(p for p in prompts if p.get("chat") and p["max_new_tokens"] >= 32)
            out = {"same": run_same(rt, chat, args.same)}
            s = out["same"]
            print(f"noise floor: {args.same} identical requests, {min(s['ms_per_token']):.1f}-"
                  f"{max(s['ms_per_token']):.1f} ms a token (max/min {s['max_over_min']:.3f})")
        else:
            temps = [float(t) for t in args.temperatures.split(",")]
            a, b = compare
            out = run_ab(rt, prompts, args.passes, temps, compare)
            for t, s in out["summary"].items():
                ms, oh = s["ms_per_token_median"], s["overhead_ms_median"]
                print(f"T={t}: {a} / {b} (same engine) {s['auto_speedup_geo']:.3f} over {s['requests']} prompts; "
                      f"ms a token {a} {ms[a]:.3f}, {b} {ms[b]:.3f}; overhead a round: {a} {oh[a]:.3f} ms, "
                      f"{b} {oh[b]:.3f} ms; events a request {a} {s['events_mean'][a]:.1f}, {b} {s['events_mean'][b]:.1f}")
    finally:
        rt.close()
    out.update({"pair": args.pair, "backend": info.get("backend"), "threads": info.get("threads"),
                "calibration_measured_n": cal.get("measured_n")})
    suffix = ("-same" if args.same else "") + ("-webgpu" if args.backend == "webgpu" else "")
    write_result(out, os.path.join(ROOT, "build", "bench", f"auto_ab-{args.pair}{suffix}.json"), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
