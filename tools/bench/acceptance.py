"""Measure acceptance of the shipped pair on the CPython reference: mean accepted tokens per round
and per-position survival S_i, at temperature 0 and 1, by kind of prompt. Prints a table and
writes build/bench/acceptance.json.

    python tools/bench/acceptance.py [--k 4] [--max-new-tokens 48] [--seeds 3]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "py"))
from exactspec.reference.models import default_models_dir, load_pair  # noqa: E402
from exactspec.core.orchestrator import GenerationConfig  # noqa: E402
from exactspec.reference.processors import SamplingPolicy  # noqa: E402
from exactspec.host.safe_files import write_file  # noqa: E402

KINDS = {
    "scripture": ["In the beginning God created", "And the LORD spake unto Moses, saying,", "Blessed are the"],
    "drama": ["To be, or not to be,", "Enter HAMLET and HORATIO.", "O Romeo, Romeo, wherefore"],
    "chat": ["<chat>Tell me about the sea.", "<chat>Who was Moses?", "<chat>Say something kind."],
    "repetitive": ["the king, the king, the king, the king, the", "one two three one two three one two"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    base = default_models_dir()
    pair = load_pair(os.path.join(base, "champion"), os.path.join(base, "draft"))
    from exactspec.formats.chat import render_chat
    rows = []
    for kind, prompts in KINDS.items():
        for temperature in (0.0, 1.0):
            for mode in ("draft", "lookup"):
                hist = [0] * (args.k + 1)
                tokens = rounds = 0
                for text in prompts:
                    if text.startswith("<chat>"):
                        rendered = render_chat([{"role": "user", "content": text[6:]}], pair.tokenizer_config["bos_token"])
                        ids = pair.tokenizer.encode(rendered, add_special_tokens=False)
                    else:
                        ids = pair.tokenizer.encode(text)
                    for seed in range(args.seeds if temperature else 1):
                        r = pair.orchestrator.generate(ids, GenerationConfig(
                            max_new_tokens=args.max_new_tokens, policy=SamplingPolicy(temperature=temperature),
                            speculate=mode, k=args.k, seed=seed, stop_token_ids=pair.stop_token_ids))
                        hist = [a + b for a, b in zip(hist, r.stats["accepted_count_histogram"])]
                        tokens += len(r.token_ids)
                        rounds += r.stats["rounds"] + r.stats["baseline_steps"]
                n = sum(hist)
                survival = [round(sum(hist[i:]) / n, 3) if n else None for i in range(args.k + 1)]
                mean_acc = sum(i * h for i, h in enumerate(hist)) / n if n else 0.0
                rows.append({"kind": kind, "temperature": temperature, "mode": mode, "k": args.k,
                             "rounds": rounds, "tokens": tokens, "mean_accepted_per_round": round(mean_acc, 3),
                             "tokens_per_round": round(tokens / max(rounds, 1), 3), "survival": survival})
                print(f"{kind:11} T={temperature:.0f} {mode:6} k={args.k} tokens/round {tokens / max(rounds, 1):5.2f} "
                      f"accepted/round {mean_acc:5.2f} S_i {survival}")
    os.makedirs("build/bench", exist_ok=True)
    write_file("build/bench/acceptance.json", json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
