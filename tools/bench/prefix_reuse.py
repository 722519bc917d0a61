"""prefix_reuse.py — a chat's next turn with and without prefix reuse, on one engine, in the browser.

A conversation of about `--history` tokens is sent (turn 1); its answer joins the history with a new
question (turn 2), which runs twice in alternating order: with prefix reuse (the engine's K/V of
turn 1's ids is reused) and cold (`prefix_reuse: false`: the whole prompt is prefilled), each after
a fresh turn 1 so that the reuse has something to reuse. Prints and writes (default
build/bench/prefix_reuse-<pair>.json) the time to first token and the prefill of each, their
medians and the ratio warm / cold (issue 21's goal: <= 0.30 at a 400-token history on SmolLM2).

    .venv/bin/python tools/bench/prefix_reuse.py --pair real [--reps 3] [--speculate auto]
Run it under the browser lock (README), on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from pairs import PAIRS, ROOT, pair_paths  # noqa: E402  (sets up py/ on sys.path)

from exactspec.host.browser_run import BrowserRuntime  # noqa: E402
from exactspec.host.safe_files import write_file  # noqa: E402

# a fixed conversation (no corpus prompt: this measures prefill, not answers); repeated to length
EXCHANGE = [
    ("user", "I am planning a week of walking in the hills near a small town. What should I pack for "
             "changeable weather, and how heavy should the bag be for a full day out?"),
    ("assistant", "Pack layers: a base layer that dries quickly, a warm fleece, a waterproof jacket and "
                  "trousers, a hat and gloves, spare socks, a map and compass, a small first-aid kit, water "
                  "and food for the day. Keep the bag under about a tenth of your body weight."),
    ("user", "Thanks. Which of those would you leave behind if the forecast were dry and warm all week?"),
    ("assistant", "On dry, warm days you could leave the waterproof trousers and the gloves, and carry a "
                  "lighter fleece, but keep the jacket, the map, the first-aid kit and plenty of water."),
]
QUESTION = "And how should I plan the first day so that I do not overdo it?"


def history(rt: BrowserRuntime, target: int) -> list:
    """Messages of at least `target` prompt tokens (the exchange repeated), ending with a user turn."""
    messages = []
    while True:
        messages += [{"role": r, "content": c} for r, c in EXCHANGE]
        ids = rt.generate({"messages": messages[:-1], "config": {"max_new_tokens": 1, "prefix_reuse": False}})
        if len(ids["result"]["prompt_ids"]) >= target:
            return messages[:-1]


def turn(rt: BrowserRuntime, messages: list, speculate: str, reuse: bool, max_new_tokens: int) -> dict:
    out = rt.generate({"messages": messages, "config": {"speculate": speculate, "temperature": 0,
                                                         "max_new_tokens": max_new_tokens, "prefix_reuse": reuse}})
    r = out["result"]
    return {"prompt_tokens": len(r["prompt_ids"]), "first_token_ms": r["timing_ms"]["first_token"],
            "prefill_ms": r["timing_ms"]["prefill"], "reused": r["stats"]["prompt_reused"], "text": r["text"],
            "token_ids": r["token_ids"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", choices=sorted(PAIRS), default="real")
    ap.add_argument("--history", type=int, default=400, help="prompt tokens of turn 1")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--speculate", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", default="auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    champion, draft = pair_paths(args.pair)
    threads = args.threads if args.threads == "auto" else int(args.threads)
    rt = BrowserRuntime(champion, draft, champion_backend="wasm", threads=threads)
    rows = []
    try:
        first_messages = history(rt, args.history)
        for rep in range(args.reps):
            for reuse in ((True, False) if rep % 2 == 0 else (False, True)):
                first = turn(rt, first_messages, args.speculate, False, args.max_new_tokens)   # what the engine then holds
                second_messages = first_messages + [{"role": "assistant", "content": first["text"]},
                                                    {"role": "user", "content": QUESTION}]
                second = turn(rt, second_messages, args.speculate, reuse, args.max_new_tokens)
                rows.append({"rep": rep, "reuse": reuse, "turn1_prompt_tokens": first["prompt_tokens"],
                             **{k: v for k, v in second.items() if k not in ("text", "token_ids")},
                             "token_ids": second["token_ids"]})
                print(f"  rep {rep} reuse={reuse!s:5} prompt {second['prompt_tokens']} reused "
                      f"{second['reused']['champion']}: first token {second['first_token_ms']:.0f} ms, "
                      f"prefill {second['prefill_ms']:.0f} ms", flush=True)
    finally:
        rt.close()
    med = lambda reuse, key: statistics.median(r[key] for r in rows if r["reuse"] == reuse)
    same = len({tuple(r["token_ids"]) for r in rows}) == 1
    summary = {"prompt_tokens": rows[0]["prompt_tokens"], "turn1_prompt_tokens": rows[0]["turn1_prompt_tokens"],
               "reused_champion": [r["reused"]["champion"] for r in rows if r["reuse"]],
               "first_token_ms": {"reuse": med(True, "first_token_ms"), "cold": med(False, "first_token_ms")},
               "prefill_ms": {"reuse": med(True, "prefill_ms"), "cold": med(False, "prefill_ms")},
               "answers_identical": same}
    summary["first_token_ratio"] = summary["first_token_ms"]["reuse"] / summary["first_token_ms"]["cold"]
    print(f"turn 2 ({summary['prompt_tokens']} prompt tokens, turn 1 {summary['turn1_prompt_tokens']}): first token "
          f"{summary['first_token_ms']['reuse']:.0f} ms with reuse vs {summary['first_token_ms']['cold']:.0f} ms cold "
          f"(ratio {summary['first_token_ratio']:.3f}); prefill {summary['prefill_ms']['reuse']:.0f} vs "
          f"{summary['prefill_ms']['cold']:.0f} ms; answers identical: {same}")
    out = {"summary": summary, "rows": rows, "pair": args.pair, "speculate": args.speculate,
           "argv": [a for a in sys.argv[1:]], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    path = args.out or os.path.join(ROOT, "build", "bench", f"prefix_reuse-{args.pair}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_file(path, (json.dumps(out, indent=1) + "\n").encode("utf-8"))
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
