"""The orchestrator's own cost per round, by phase and mode, over a champion whose rounds cost nothing.

A scripted champion answers every round from a fixed id sequence (greedy semantics: a proposal is
accepted while it equals the script) and reports the verify and draft times a calibration gives,
so speculate="auto" weighs real costs; the only time spent is this side's: choose (auto's policy,
lookup's search), call (building and decoding the round record), commit, emit (text, events
serialised as the browser's worker does) and pause. Pure Python: run it in CPython
(`python tools/bench/round_overhead.py`) or in Pyodide (`node tools/bench/round_overhead.mjs`,
where the browser's orchestrator runs, 3-5x slower). Prints one line per mode and a JSON summary.
"""
from __future__ import annotations

import json
import random
import sys
import time
from types import SimpleNamespace

from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.core.policy import SamplingPolicy
from exactspec.core.round_record import decode, encode

# toy-wasm's spec engine in test-split run #7 (calibration of its load)
CALIBRATION = {"version": 1, "backend": "wasm", "key": "bench", "lookup_ms": None,
               "draft_catchup_ms_per_token": 0.072, "draft_ms_per_proposal": 0.212,
               "measured_n": [1, 9, 5, 3, 2, 7, 4, 6, 8], "verify_sampled_extra_ms_per_row": 0.047,
               "verify_ms": [None, 1.31, 2.07, 2.53, 2.97, 3.335, 3.935, 4.155, 4.87, 4.87]}
VOCAB = 4096
# the scenario main() and the --baseline runner measure: ids lookup rarely predicts (5% repeated
# spans) and a draft right half the time, so auto holds champion alone
SCENARIO = {"repeat": 0.05, "draft_accept": 0.5}


def script(n: int, seed: int, repeat: float) -> list:
    """n ids: random ids, with spans copied from earlier in it at rate `repeat` (lookup's matches)."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        if len(out) > 16 and rng.random() < repeat:
            start = rng.randrange(0, len(out) - 8)
            out += out[start:start + rng.randrange(2, 8)]
        else:
            out.append(rng.randrange(1, VOCAB))
    return out[:n]


class ScriptedChampion:
    """begin() -> a session that answers from `ids` (the prompt, then the answer)."""
    vocab_size, max_context, identity = VOCAB, 1 << 16, "scripted"
    limits = {"max_k": 8, "max_chain": 32}    # chains baseline steps, as the browser's WASM champion does

    def __init__(self, ids, draft_accept: float, seed: int):
        self.ids, self.draft_accept, self.seed = ids, draft_accept, seed

    def begin(self, request, draft=None):
        return ScriptedSession(self, len(request.context_ids))

    def calibration(self, draft=None):
        return CALIBRATION

    def take_counters(self):
        return {}

    def environment(self):
        return {}


class ScriptedSession:
    draft_failure, reused, round_bytes = None, None, 0

    def __init__(self, champion, prompt_len):
        self.champion, self.prompt_len = champion, prompt_len
        self.rng = random.Random(champion.seed)

    def pause(self):
        return None

    def end(self, reason):
        return {}

    def chain(self, h, round_id, remaining, committed):
        """Up to h baseline steps, as the browser's session.chain returns them (one record each)."""
        return [self.round(0, round_id + i, remaining - i, committed + i) for i in range(min(h, remaining))]

    def round(self, k, round_id, remaining, committed, proposals=None):
        ids = self.champion.ids
        truth = ids[committed:committed + k + 1]
        draft_ms = 0.0
        if proposals is None and k > 0:     # the draft: right with probability draft_accept per position
            proposals = [t if self.rng.random() < self.champion.draft_accept else (t % (VOCAB - 1)) + 1
                         for t in truth[:k]]
            draft_ms = CALIBRATION["draft_ms_per_proposal"] * k
        proposals = list(proposals or ())
        n = 0
        while n < len(proposals) and proposals[n] == truth[n]:
            n += 1
        rejected = n if n < len(proposals) else None
        decision = SimpleNamespace(n_accepted=n, next_token=truth[n], rejected_at=rejected, ended_by=None, error=None)
        verify_ms = CALIBRATION["verify_ms"][len(proposals) + 1]
        return decode(encode("verified", proposals, decision, draft_ms, verify_ms))


class CharDecoder:
    """A streaming decoder at the cost floor: one character per id."""

    def push(self, token_id):
        return chr(0x4E00 + token_id % 20000)

    def flush(self):
        return ""


def measure(mode: str, temperature: float, n_tokens: int, requests: int, repeat: float, draft_accept: float,
            post=None) -> dict:
    """Per-round phase times (us, median over requests) and rounds by method, for one mode."""
    post = post or (lambda text: None)
    per_round = {}
    methods = {}
    wall = []
    for r in range(requests):
        ids = script(64 + n_tokens + 16, r, repeat)
        orch = Orchestrator(ScriptedChampion(ids, draft_accept, r),
                            SimpleNamespace(identity="scripted-draft", max_context=1 << 16, vocab_size=VOCAB),
                            stream_decoder=CharDecoder)
        config = GenerationConfig(max_new_tokens=n_tokens, speculate=mode, k=4, seed=r,
                                  policy=SamplingPolicy(temperature=temperature))
        t0 = time.perf_counter()
        result = orch.generate(ids[:64], config, on_event=lambda env: post(json.dumps(env)))
        if result.token_ids != ids[64:64 + n_tokens]:      # every mode answers the script (greedy semantics)
            raise AssertionError(f"{mode}: the answer is not the champion's ({result.finish_reason}, {result.error})")
        wall.append((time.perf_counter() - t0) * 1e6 / len(result.token_ids))
        n_rounds = result.stats["rounds"] + result.stats["baseline_steps"]
        for phase, ms in result.timing_ms["phases"].items():
            per_round.setdefault(phase, []).append(ms * 1000.0 / n_rounds)
        for method, n in ((result.stats.get("auto") or {}).get("rounds_by_method") or {mode: n_rounds}).items():
            methods[method] = methods.get(method, 0) + n
    med = lambda v: sorted(v)[len(v) // 2]
    phases = {p: round(med(v), 2) for p, v in per_round.items()}
    return {"mode": mode, "temperature": temperature, "us_per_round": phases,
            "us_outside_call": round(sum(v for p, v in phases.items() if p != "call"), 2),
            "us_per_token_wall": round(med(wall), 2), "rounds_by_method": methods}


def main(argv=(), post=None) -> list:
    n_tokens = int(argv[0]) if argv else 128
    requests = int(argv[1]) if len(argv) > 1 else 15
    rows = []
    for temperature in (0.0, 1.0):
        for mode in ("none", "auto"):
            row = measure(mode, temperature, n_tokens, requests, **SCENARIO, post=post)
            rows.append(row)
            print(f"{mode:5} T={temperature:g}  outside the call {row['us_outside_call']:8.1f} us/round  "
                  f"{row['us_per_round']}  {row['rounds_by_method']}", flush=True)
    print(json.dumps({"round_overhead": rows}))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
