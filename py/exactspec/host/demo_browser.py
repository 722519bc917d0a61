"""The main job: the browser engine in headless Chromium on the shipped pair (champion backend
auto), every mode on a few prompts: the generated text of each mode, the greedy-equality check,
and the speed-ups measured in this run. `exactspec demo` runs this; demo.py falls back to the
CPython reference only when no browser can start."""
from __future__ import annotations

import json
import os
import sys
import time

MODES = [("none", "champion alone"), ("auto", "speculate auto (the default)"), ("draft", "speculative, draft k=4"), ("lookup", "speculative, prompt lookup k=4")]


class ProgressLine:
    """The load's progress on stderr: one line rewritten in place on a terminal, else one line per
    stage (never a line per chunk)."""

    STAGES = {"prepare": "preparing WebGPU pipelines", "python": "starting Python (Pyodide)",
              "check": "checking the model files", "models": "loading the champion and the draft",
              "warmup": "warming up (a few small requests in every mode)",
              "calibrate": "calibrating this device (verification and draft costs, <= 300 ms)"}

    def __init__(self, stream=sys.stderr):
        self.stream, self.live, self.stage, self.bytes = stream, stream.isatty(), "starting", {}

    def __call__(self, p: dict) -> None:
        if p.get("stage") == "fetch":
            self.bytes[p["url"]] = (p["loaded"], p["total"] or p["loaded"])
            if not self.live:
                return
        elif p.get("stage") in self.STAGES:
            self.stage = self.STAGES[p["stage"]]
        else:
            return
        loaded = sum(b[0] for b in self.bytes.values()) / 1e6
        total = sum(b[1] for b in self.bytes.values()) / 1e6
        line = f"exactspec demo: loading: {self.stage}; {loaded:.1f} of {total:.1f} MB fetched"
        print(("\r" + line.ljust(90)) if self.live else line, end="" if self.live else "\n", file=self.stream, flush=True)

    def done(self, ready: dict) -> None:
        t = ready["timing_ms"]
        if self.live:
            print(file=self.stream)
        print(f"exactspec demo: loaded in {t['total'] / 1000:.1f} s (Pyodide {t.get('pyodide', 0) / 1000:.1f} s, "
              f"champion {t.get('champion_load', 0) / 1000:.1f} s, draft {t.get('draft_load', 0) / 1000:.1f} s, "
              f"warm-up {(t.get('champion_warmup', 0) + t.get('warmup', 0)) / 1000:.1f} s)",
              file=self.stream, flush=True)


def _speedups(rows) -> dict:
    """Decode tokens/s of each mode over all prompts, and its ratio to champion alone."""
    rate = {}
    for mode, _ in MODES:
        tokens = sum(r["greedy"][mode]["tokens"] for r in rows)
        ms = sum(r["greedy"][mode]["decode_ms"] for r in rows)
        rate[mode] = 1000 * tokens / ms if ms > 0 else None
    base = rate["none"]
    return {mode: {"tokens_per_s": round(r, 1) if r else None,
                   "speedup": round(r / base, 2) if r and base else None} for mode, r in rate.items()}


def _first_request(rows) -> dict:
    """The first request after load (the first prompt, champion alone: the engine warmed up at
    load, web/orchestrator/warmup.mjs) against the median of the same mode's later requests."""
    per = [r["greedy"][MODES[0][0]] for r in rows]
    rate = [p["decode_ms"] / p["tokens"] for p in per if p["tokens"]]
    if not rate:
        return {"ms_per_token": None, "later_median_ms_per_token": None, "ratio": None}
    later = sorted(rate[1:])
    median = later[len(later) // 2] if later else None
    return {"ms_per_token": round(rate[0], 2), "later_median_ms_per_token": round(median, 2) if median else None,
            "ratio": round(rate[0] / median, 2) if median else None}


def run_browser_demo(runtime_factory, prompts, as_json: bool, max_new_tokens: int = 48) -> int:
    """runtime_factory(on_progress) -> a loaded BrowserRuntime (may raise ExactSpecError)."""
    say = (lambda *a: None) if as_json else print
    progress = ProgressLine()
    t0 = time.perf_counter()
    with runtime_factory(progress) as rt:
        progress.done(rt.ready)
        champ = rt.ready["info"]["champion"]
        draft = rt.ready["info"].get("draft")
        label = (f"the browser engine in headless Chromium: champion on {champ['backend']} ({champ['backend_why']}), "
                 f"draft {draft['placement'] if draft else 'not loaded'}; shipped pair, champion model.q8.safetensors")
        say(f"exactspec demo: {label}")
        out = {"engine": "browser", "models": label, "champion_backend": champ["backend"], "prompts": [],
               "load_ms": round(rt.ready["timing_ms"]["total"], 1), "all_greedy_identical": True}
        for text in prompts:
            row, reference = {"prompt": text, "greedy": {}}, None
            say(f"\nprompt: {text!r}")
            for mode, name in MODES:
                payload = {"prompt": text, "config": {"speculate": mode, "k": 4, "temperature": 0,
                                                      "max_new_tokens": max_new_tokens, "prefix_reuse": False}}
                r = rt.generate(payload)["result"]
                same = reference is None or r["token_ids"] == reference
                reference = reference if reference is not None else r["token_ids"]
                out["all_greedy_identical"] &= same
                st = r["stats"]
                rounds = st["rounds"] + st["baseline_steps"]
                row["greedy"][mode] = {"text": r["text"], "tokens": len(r["token_ids"]), "rounds": rounds,
                                       "identical": same, "decode_ms": round(r["timing_ms"]["decode"], 1),
                                       "finish_reason": r["finish_reason"]}
                say(f"  {name:31} {len(r['token_ids']):3d} tokens, {rounds:3d} rounds, "
                    f"{r['timing_ms']['decode']:7.1f} ms, same as champion: {'yes' if same else 'NO'}")
                say(f"    {r['text']!r}")
            out["prompts"].append(row)
        out["speedups"] = _speedups(out["prompts"])
        out["first_request"] = _first_request(out["prompts"])
        out["wall_s"] = round(time.perf_counter() - t0, 1)
    first = out["first_request"]
    say(f"\nfirst request after load: {first['ms_per_token']} ms/token ({MODES[0][1]}); the same mode's later "
        f"requests: median {first['later_median_ms_per_token']} ms/token ({first['ratio']}x)")
    say("greedy outputs identical across modes: " + ("yes" if out["all_greedy_identical"] else "NO"))
    say("speed-ups measured in this run (decode tokens/s vs champion alone): " + ", ".join(
        f"{name} {out['speedups'][m]['tokens_per_s']} tok/s ({out['speedups'][m]['speedup']}x)" for m, name in MODES))
    if as_json:
        print(json.dumps(out))
    return 0 if out["all_greedy_identical"] else 1


def shipped_pair_dirs():
    from ..reference.models import default_models_dir
    base = default_models_dir()
    return os.path.join(base, "champion"), os.path.join(base, "draft")
