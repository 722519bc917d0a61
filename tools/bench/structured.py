"""structured.py — schema-constrained answers of a real pair in the browser: validity and forced batching.

Runs the 20 schema prompts of tests/data/structured_prompts.jsonl (each a chat message with its own
JSON Schema) through one engine, greedy, in the arms asked for (default: champion alone with forced
batching, champion alone without it, and auto). Every answer that ended on its stop id is parsed and
validated with `jsonschema`; the table gives validity, tokens per champion call (the forced-batching
gain) and ms per token (page clock; each schema compiled by a one-token request first, whose
compile time is reported on its own). Writes JSON (default build/bench/structured-<pair>-<backend>.json).

    .venv/bin/python tools/bench/structured.py --pair real --backend wasm
    .venv/bin/python tools/bench/structured.py --pair real --backend webgpu --arms none --prompts 20
Run it under the browser lock (README), on a quiet machine; WebGPU here is SwiftShader (slow).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from pairs import PAIRS, ROOT, pair_paths  # noqa: E402  (sets up py/ on sys.path)

import jsonschema  # noqa: E402

from exactspec.host.browser_run import BrowserRuntime  # noqa: E402
from exactspec.host.safe_files import write_file  # noqa: E402

PROMPTS = os.path.join(ROOT, "tests", "data", "structured_prompts.jsonl")
ARMS = {   # arm -> request config
    "none": {"speculate": "none"},
    "none-unbatched": {"speculate": "none", "forced_batching": False},
    "auto": {"speculate": "auto"},
    "draft-k4": {"speculate": "draft", "k": 4},
    "draft-k4-unbatched": {"speculate": "draft", "k": 4, "forced_batching": False},
}


def load_prompts(n: int) -> list:
    with open(PROMPTS, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()][:n]


def check(schema: dict, result: dict) -> tuple:
    """(valid, why): the answer parses and fits its schema (only an answer that ended on its stop id)."""
    if result["error"] is not None:
        return False, f"{result['error']['code']}"
    if result["finish_reason"] != "eos":
        return False, f"ended {result['finish_reason']}"
    try:
        jsonschema.validate(json.loads(result["text"]), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return False, str(exc).splitlines()[0][:120]
    return True, ""


def run(rt, prompts, arms, max_new_tokens: int) -> list:
    rows = []
    for p in prompts:
        # compile the schema once first (one token): the arms' times are then the answers' alone;
        # the compile's own time is reported from this request
        fmt = {"type": "json_schema", "schema": p["schema"]}
        warm = rt.generate({"messages": [{"role": "user", "content": p["prompt"]}],
                            "config": {"max_new_tokens": 1, "temperature": 0, "response_format": fmt}})["result"]
        compile_ms = warm["stats"]["structured"]["compile_ms"]
        for arm in arms:
            config = {"temperature": 0, "max_new_tokens": max_new_tokens, "prefix_reuse": False,
                      "response_format": {"type": "json_schema", "schema": p["schema"]}, **ARMS[arm]}
            out = rt.generate({"messages": [{"role": "user", "content": p["prompt"]}], "config": config})
            r = out["result"]
            valid, why = check(p["schema"], r)
            st = r["stats"]
            rows.append({"prompt_id": p["id"], "arm": arm, "valid": valid, "why": why, "text": r["text"],
                         "n_tokens": len(r["token_ids"]), "target_calls": st["target_calls"], "forced": st["forced"],
                         "ms_per_token": out["page_ms"] / max(len(r["token_ids"]), 1),
                         "compile_ms": compile_ms, "token_ids": r["token_ids"]})
            print(f"  {p['id']} {arm:18s} {'valid' if valid else 'INVALID ' + why:24s} {len(r['token_ids']):3d} tokens "
                  f"{st['target_calls']:3d} calls {st['forced']:3d} forced  {r['text'][:60]!r}", flush=True)
    return rows


def summary(rows: list, arms: list) -> dict:
    out = {}
    for arm in arms:
        sel = [r for r in rows if r["arm"] == arm]
        tokens, calls = sum(r["n_tokens"] for r in sel), sum(r["target_calls"] for r in sel)
        out[arm] = {"answers": len(sel), "valid": sum(r["valid"] for r in sel), "tokens": tokens,
                    "champion_calls": calls, "forced": sum(r["forced"] for r in sel),
                    "tokens_per_champion_call": round(tokens / max(calls, 1), 3),
                    "ms_per_token_median": round(statistics.median(r["ms_per_token"] for r in sel), 2),
                    "compile_ms_median": round(statistics.median(r["compile_ms"] for r in sel), 2)}
    ids = {arm: {r["prompt_id"]: r["token_ids"] for r in rows if r["arm"] == arm} for arm in arms}
    out["same_ids_as_" + arms[0]] = {arm: all(ids[arm][k] == ids[arms[0]][k] for k in ids[arm]) for arm in arms[1:]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="real", choices=sorted(PAIRS))
    ap.add_argument("--backend", default="wasm", choices=["wasm", "webgpu"])
    ap.add_argument("--arms", default="none,none-unbatched,auto")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    arms = args.arms.split(",")
    champion, draft = pair_paths(args.pair)
    t0 = time.perf_counter()
    with BrowserRuntime(champion, draft, champion_backend=args.backend, timeout_s=3600) as rt:
        info = rt.ready["info"]["champion"]
        print(f"{args.pair} on {info['backend']} ({info.get('matmul')}), load {(time.perf_counter() - t0):.1f} s", flush=True)
        rows = run(rt, load_prompts(args.prompts), arms, args.max_new_tokens)
    result = {"pair": args.pair, "backend": args.backend, "arms": arms, "max_new_tokens": args.max_new_tokens,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average": os.getloadavg(),
              "summary": summary(rows, arms), "rows": rows}
    print(json.dumps(result["summary"], indent=1))
    path = args.json or os.path.join(ROOT, "build", "bench", f"structured-{args.pair}-{args.backend}.json")
    write_file(path, json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0 if all(v["valid"] == v["answers"] for k, v in result["summary"].items() if k in arms) else 1


if __name__ == "__main__":
    sys.exit(main())
