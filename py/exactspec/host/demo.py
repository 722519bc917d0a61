"""`exactspec demo`: a chat with the real model, SmolLM2-135M-Instruct from its GGUF file, when
set-up fetched it (build/models/status.json); else, or with --toy-pair, the browser engine in
headless Chromium on the shipped toy pair (demo_browser.py); the CPython reference demo here with
--reference or --toy, or when no browser can start.

The chat (chat_demo) runs a short conversation in the browser engine (the page reads the GGUF
itself), or on the CPython reference when no browser can start: each turn in the model's chat
template, greedy, champion alone, with the draft web/models/manifest.json binds to the file (when
there is one) and with prompt lookup; the answers must be token-identical. The reference demo runs the shipped champion/draft pair (or
NumPy toy models) champion-alone, speculative with the draft and with prompt lookup; checks greedy
outputs are token-identical; reports acceptance and timings of every mode, and a sampled run's
acceptance curve.
"""
from __future__ import annotations

import json
import os
import sys

from ..core.errors import E_BAD_ARGUMENT, ExactSpecError
from ..core.orchestrator import GenerationConfig
from ..reference.processors import SamplingPolicy

DEMO_PROMPTS = ["In the beginning", "To be, or not to be,", "And the LORD said unto Moses,",
                "What light through yonder window"]
MODES = [("none", 0), ("auto", 4), ("draft", 4), ("lookup", 4)]   # auto: the default (k is its own)
# turns SmolLM2-135M answers right under both matmul functions (the browser's q8act-v1 and the reference's
# float one): its answer to "What is the capital of France?" turns on a 0.08 logit margin (docs/champion_wasm.md)
CHAT_TURNS = ["Name the capital of France.", "And what is the capital of Italy?"]
STATUS_FILE = "status.json"     # written by tools/fetch_models.py


def real_model():
    """(path of the real model's GGUF, None) when $EXACTSPEC_BUILD_MODELS/status.json (default
    build/models of the source checkout) says set-up fetched it, else (None, why not)."""
    from ..formats.config import read_json_file
    from .server import REPO_ROOT
    folder = os.environ.get("EXACTSPEC_BUILD_MODELS") or os.path.join(str(REPO_ROOT), "build", "models")
    path = os.path.join(folder, STATUS_FILE)
    if not os.path.exists(path):
        return None, f"{path} does not exist: run bash tools/setup.sh"
    status = read_json_file(path)
    if not isinstance(status, dict) or status.get("available") is not True or not isinstance(status.get("path"), str):
        return None, str(status.get("reason") if isinstance(status, dict) else "") or f"{path} says it is unavailable"
    return os.path.join(folder, status["path"]), None


def _setup(toy: bool, weights: str):
    from ..reference.models import default_models_dir, load_pair
    from ..reference.reference_llama import Q8_WEIGHTS_FILE, WEIGHTS_FILE
    base = default_models_dir()
    if not toy and os.path.exists(os.path.join(base, "champion", "model.safetensors")):
        pair = load_pair(os.path.join(base, "champion"), os.path.join(base, "draft"), champion_weights=weights)
        encode = lambda text: pair.tokenizer.encode(text)
        artifact = Q8_WEIGHTS_FILE if weights == "q8" else WEIGHTS_FILE
        label = f"shipped pair ({base}): champion {artifact}, draft {WEIGHTS_FILE}"
        return label, pair.orchestrator, encode, pair.stop_token_ids, DEMO_PROMPTS
    from ..core.backends import RunnerChampion, RunnerDraft
    from ..core.orchestrator import Orchestrator
    from ..reference.toy import ToyRunner, toy_draft
    champion = ToyRunner(64, seed=0, hidden=32)
    orch = Orchestrator(RunnerChampion(champion), RunnerDraft(toy_draft(champion, 0.8)),
                        decode=lambda ids: " ".join(f"t{t}" for t in ids))
    encode = lambda text: [1 + (ord(c) % 63) for c in text]
    return "NumPy toy models (vocab 64)", orch, encode, (), DEMO_PROMPTS


def _survival(hist):
    """S_i: fraction of rounds whose first i proposals were all accepted."""
    total = sum(hist)
    return [round(sum(hist[i:]) / total, 3) if total else None for i in range(len(hist))]


def run_demo(toy: bool = False, as_json: bool = False, max_new_tokens: int = 48, weights: str = "q8",
             reference: bool = False, toy_pair: bool = False) -> int:
    """The chat with the real model unless `toy_pair`, `reference` or `toy` (or it is unavailable:
    said in one line); else the browser engine on the shipped pair unless `reference` or `toy` (or
    no browser starts). weights: the reference champion's artifact, "q8" (what the browser runs)
    or "f32" (reference only)."""
    if not (toy or reference or toy_pair or weights != "q8"):
        gguf, why = real_model()
        if gguf is not None:
            return chat_demo(gguf, as_json)
        print(f"exactspec demo: the real model is unavailable ({why}); running the shipped toy pair instead",
              file=sys.stderr, flush=True)
    if not (toy or reference):
        if weights != "q8":
            raise ExactSpecError(E_BAD_ARGUMENT, "--weights f32: the browser engine runs the q8 champion; "
                                                 "add --reference for the CPython reference")
        code = _browser_demo(as_json, max_new_tokens)
        if code is not None:
            return code
    return _reference_demo(toy, as_json, max_new_tokens, weights)


def _start_chromium(instead: str):
    """(playwright, browser), or None after one line on stderr saying why none could start and
    what the demo does `instead`."""
    from .browser_run import launch_chromium
    try:
        return launch_chromium()
    except Exception as exc:   # no Chromium, no Playwright driver, a sandbox refusing it, ...
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"exactspec demo: no browser could start ({why}); {instead}", file=sys.stderr, flush=True)
        return None


def _browser_demo(as_json: bool, max_new_tokens: int):
    """The browser demo's exit code, or None when no browser can start (said on stderr)."""
    from .browser_run import BrowserRuntime
    from .demo_browser import run_browser_demo, shipped_pair_dirs
    started = _start_chromium("running the CPython reference instead")
    if started is None:
        return None
    pw, browser = started
    champion, draft = shipped_pair_dirs()
    try:
        return run_browser_demo(lambda progress: BrowserRuntime(champion, draft, browser=browser, champion_backend="auto",
                                                                on_progress=progress),
                                DEMO_PROMPTS, as_json, max_new_tokens)
    finally:
        browser.close()
        pw.stop()


def chat_demo(gguf: str, as_json: bool, max_new_tokens: int = 32, reference: bool = False) -> int:
    """CHAT_TURNS as one conversation with the GGUF champion (see module docstring): in the browser
    engine, or on the CPython reference when `reference` or when no browser can start (said)."""
    from ..reference.models import known_draft
    draft = known_draft(gguf)
    modes = [mode for mode, _ in MODES if draft or mode != "draft"]
    started = None if reference else _start_chromium("chatting on the CPython reference instead")
    if started is not None:
        from .browser_run import BrowserRuntime
        pw, browser = started
        try:
            from .demo_browser import ProgressLine
            progress = ProgressLine()
            with BrowserRuntime(gguf, draft, browser=browser, champion_backend="auto", on_progress=progress) as rt:
                progress.done(rt.ready)
                engine = f"the browser engine (champion on {rt.ready['info']['champion']['backend']})"
                return _chat(engine, gguf, draft, modes, as_json, max_new_tokens,
                             lambda messages, config: rt.generate({"messages": messages, "config": config})["result"])
        finally:
            browser.close()
            pw.stop()
    from ..formats.chat import encode_chat_prompt
    from ..reference.models import load_pair
    pair = load_pair(gguf, draft)

    def generate(messages, config):
        ids = encode_chat_prompt(pair.tokenizer, pair.tokenizer_config, messages)
        return pair.orchestrator.generate(ids, GenerationConfig(
            max_new_tokens=config["max_new_tokens"], policy=SamplingPolicy(temperature=0), speculate=config["speculate"],
            k=config["k"], stop_token_ids=pair.stop_token_ids, prefix_reuse=config["prefix_reuse"])).to_dict()
    return _chat("the CPython reference", gguf, draft, modes, as_json, max_new_tokens, generate)


def _chat(engine: str, gguf: str, draft, modes, as_json: bool, max_new_tokens: int, generate) -> int:
    """The conversation; generate(messages, config) -> a result dict (text, token_ids, stats, timing_ms)."""
    say = (lambda *a: None) if as_json else print
    label = (f"chat with {os.path.basename(gguf)} in {engine}, greedy; draft: "
             f"{draft or 'none bound to it in web/models/manifest.json'}")
    say(f"exactspec demo: {label}")
    out = {"engine": "browser" if engine.startswith("the browser") else "reference", "models": label, "turns": [],
           "all_greedy_identical": True}
    messages = []
    for question in CHAT_TURNS:
        messages.append({"role": "user", "content": question})
        turn, answer = {"user": question, "modes": {}}, None
        say(f"\nyou: {question}")
        for mode in modes:
            r = generate(messages, {"speculate": mode, "k": 4, "temperature": 0, "max_new_tokens": max_new_tokens,
                                    "prefix_reuse": False})   # the modes are compared cold
            same = answer is None or r["token_ids"] == answer["token_ids"]
            answer = answer or r
            out["all_greedy_identical"] &= same
            rounds = r["stats"]["rounds"] + r["stats"]["baseline_steps"]
            turn["modes"][mode] = {"tokens": len(r["token_ids"]), "rounds": rounds, "identical": same,
                                   "total_ms": round(r["timing_ms"]["total"], 1), "finish_reason": r["finish_reason"]}
            if mode == "none":
                say(f"model: {r['text']}")
            say(f"  {mode:7} {len(r['token_ids']):3d} tokens, {rounds:3d} rounds, {r['timing_ms']['total']:8.1f} ms, "
                f"same as champion alone: {'yes' if same else 'NO'}")
        turn["assistant"] = answer["text"]
        messages.append({"role": "assistant", "content": answer["text"]})
        out["turns"].append(turn)
    say("\ngreedy outputs identical across modes: " + ("yes" if out["all_greedy_identical"] else "NO"))
    if as_json:
        print(json.dumps(out))
    return 0 if out["all_greedy_identical"] else 1


def _reference_demo(toy: bool, as_json: bool, max_new_tokens: int, weights: str) -> int:
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
