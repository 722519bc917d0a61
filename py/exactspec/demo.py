"""The main job until the browser app exists: the reference generation demo on CPython.

Runs the shipped champion/draft pair (or NumPy toy models) champion-alone, speculative with the
draft and with prompt lookup; checks greedy outputs are token-identical; reports acceptance and
timings of every mode, and a sampled run's acceptance curve.
"""
from __future__ import annotations

import json
import os
import sys

from .orchestrator import GenerationConfig
from .processors import SamplingPolicy

DEMO_PROMPTS = ["In the beginning", "To be, or not to be,", "And the LORD said unto Moses,",
                "What light through yonder window"]
MODES = [("none", 0), ("draft", 4), ("lookup", 4)]


def _setup(toy: bool, weights: str):
    from .models import default_models_dir, load_pair
    from .reference_llama import Q8_WEIGHTS_FILE, WEIGHTS_FILE
    base = default_models_dir()
    if not toy and os.path.exists(os.path.join(base, "champion", "model.safetensors")):
        pair = load_pair(os.path.join(base, "champion"), os.path.join(base, "draft"), champion_weights=weights)
        encode = lambda text: pair.tokenizer.encode(text)
        artifact = Q8_WEIGHTS_FILE if weights == "q8" else WEIGHTS_FILE
        label = f"shipped pair ({base}): champion {artifact}, draft {WEIGHTS_FILE}"
        return label, pair.orchestrator, encode, pair.stop_token_ids, DEMO_PROMPTS
    from .backends import RunnerChampion, RunnerDraft
    from .orchestrator import Orchestrator
    from .toy import ToyRunner, toy_draft
    champion = ToyRunner(64, seed=0, hidden=32)
    orch = Orchestrator(RunnerChampion(champion), RunnerDraft(toy_draft(champion, 0.8)),
                        decode=lambda ids: " ".join(f"t{t}" for t in ids))
    encode = lambda text: [1 + (ord(c) % 63) for c in text]
    return "NumPy toy models (vocab 64)", orch, encode, (), DEMO_PROMPTS


def _survival(hist):
    """S_i: fraction of rounds whose first i proposals were all accepted."""
    total = sum(hist)
    return [round(sum(hist[i:]) / total, 3) if total else None for i in range(len(hist))]


def run_demo(toy: bool = False, as_json: bool = False, max_new_tokens: int = 48, weights: str = "q8") -> int:
    """weights: the champion's artifact, "q8" (what the browser runs) or "f32"."""
    label, orch, encode, stop_ids, prompts = _setup(toy, weights)
    out = {"models": label, "prompts": [], "all_greedy_identical": True}
    say = (lambda *a: None) if as_json else print
    say(f"exactspec demo: {label}")
    say(f"{'prompt':34} {'mode':7} {'tokens':>6} {'rounds':>6} {'tok/round':>9} {'ms':>8} {'same':>5}")
    for text in prompts:
        ids = encode(text)
        row = {"prompt": text, "greedy": {}, "sampled": {}}
        reference = None
        for mode, k in MODES:
            cfg = GenerationConfig(max_new_tokens=max_new_tokens, policy=SamplingPolicy(temperature=0),
                                   speculate=mode, k=max(k, 1), stop_token_ids=stop_ids)
            r = orch.generate(ids, cfg)
            same = reference is None or r.token_ids == reference.token_ids
            reference = reference or r
            out["all_greedy_identical"] &= same
            rounds = r.stats["rounds"] + r.stats["baseline_steps"]
            row["greedy"][mode] = {"tokens": len(r.token_ids), "rounds": rounds, "identical": same,
                                   "total_ms": round(r.timing_ms["total"], 1), "finish_reason": r.finish_reason}
            say(f"{text[:34]:34} {mode:7} {len(r.token_ids):6d} {rounds:6d} "
                f"{len(r.token_ids) / max(rounds, 1):9.2f} {r.timing_ms['total']:8.1f} {'yes' if same else 'NO':>5}")
        row["greedy_text"] = reference.text
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, policy=SamplingPolicy(temperature=1.0),
                               speculate="draft", k=4, seed=7, stop_token_ids=stop_ids)
        r = orch.generate(ids, cfg)
        st = r.stats
        row["sampled"] = {"tokens": len(r.token_ids), "rounds": st["rounds"], "proposed": st["proposed"],
                          "accepted": st["accepted"], "survival": _survival(st["accepted_count_histogram"])}
        say(f"{'':34} sampled T=1, draft k=4: accepted {st['accepted']}/{st['proposed']}, "
            f"survival S_i = {row['sampled']['survival']}")
        out["prompts"].append(row)
    say("greedy outputs identical across modes: " + ("yes" if out["all_greedy_identical"] else "NO"))
    if as_json:
        print(json.dumps(out))
    return 0 if out["all_greedy_identical"] else 1


if __name__ == "__main__":
    sys.exit(run_demo())
