"""Drive headless Chromium through a run (I/O): engines per champion backend and topology, wllama,
cold and warm requests in interleaved order, the distribution sample, checkpoints per arm in
build/eval/<run>/arms/ so that an interrupted run resumes where it stopped."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from ..core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, ExactSpecError
from ..host.safe_files import append_text, write_file
from ..host.server import REPO_ROOT
from . import arms as arms_mod
from .corpus import load_corpus, select
from .gates import check_same_gates, load_gates

MODELS = {"champion": "/web/models/champion/", "draft": "/web/models/draft/"}
CORPUS_DIR = os.path.join("eval", "corpus")
LOCK_PATH = os.path.join("eval", "corpus.lock.json")
GATES_PATH = os.path.join("eval", "gates.json")
# the distribution test's prompt (T = 1, first token): chosen for the champion's own first-token
# distribution (the reference's: four tokens above 5%, 0.36 at most), so that 150 samples can see a difference
SAMPLE_PROMPT = "extraction-2"


def _peer():
    """tools/bench/peer.py (the lead's side-by-side bench): its server, GGUF export and machine facts."""
    path = os.path.join(REPO_ROOT, "tools", "bench")
    if path not in sys.path:
        sys.path.insert(0, path)
    import peer
    return peer


class Checkpoints:
    """build/eval/<run>/: run.json (identity of the run) and arms/<arm>.jsonl (one record a line)."""

    def __init__(self, run_dir: str):
        self.dir = run_dir
        os.makedirs(os.path.join(run_dir, "arms"), exist_ok=True)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, "arms", name.replace(":", "__") + ".jsonl")

    def load_all(self) -> list:
        out = []
        for name in sorted(os.listdir(os.path.join(self.dir, "arms"))):
            with open(os.path.join(self.dir, "arms", name)) as f:
                out += [json.loads(line) for line in f if line.strip()]
        return out

    def append(self, name: str, record: dict) -> None:
        append_text(self.path(name), json.dumps(record) + "\n")


def _key(rec: dict) -> tuple:
    return (rec["backend"], rec["arm"], rec["prompt_id"], rec["temperature"], rec.get("rep", 0))


def _record(backend, arm, prompt, temperature, out, rep: int = 0) -> dict:
    """What a request leaves in the checkpoint (ids, not text; times; rounds; memory; identities)."""
    res = out["result"]
    st, receipt = res["stats"], res.get("receipt") or {}
    return {"backend": backend, "arm": arm, "prompt_id": prompt["id"], "stratum": prompt["stratum"],
            "temperature": temperature, "rep": rep, "seed": prompt["seed"], "token_ids": res["token_ids"],
            "prompt_ids_sha256": hashlib.sha256(json.dumps(res["prompt_ids"]).encode()).hexdigest(),
            "prompt_len": len(res["prompt_ids"]), "finish_reason": res["finish_reason"], "error": res["error"],
            "first_token_ms": out["first_token_ms"], "total_ms": out["total_ms"], "timing_ms": res["timing_ms"],
            "stats": {k: st.get(k) for k in ("rounds", "proposed", "accepted", "baseline_steps", "tokens_per_round",
                                              "accepted_count_histogram", "mode", "fallback_code")},
            "rounds": [[r.get("proposed", 0), r.get("accepted", 0), r["n"], r.get("draft_ms", 0), r.get("verify_ms", 0)]
                       for r in out["rounds"]],
            "sources": [s for r in out["rounds"] for s in r["sources"]],
            "memory": out["memory"], "page_heap": out["page_heap"],
            "peak_resident_bytes": receipt.get("peak_resident_bytes"),
            "identity": {k: receipt.get(k) for k in ("champion_artifact_hash", "draft_artifact_hash", "tokenizer_hash",
                                                     "chat_template_hash", "sampling_policy_hash", "scheduler_policy_hash",
                                                     "browser_version", "runtime_version", "champion_backend",
                                                     "hardware_class")}}


def run_bench(opts) -> str:
    """Run (or resume) the evaluation; returns the run directory. opts: see cli `bench`."""
    from playwright.sync_api import sync_playwright
    from ..host.browser_run import CHROMIUM, CHROMIUM_ARGS
    from ..reference.models import default_models_dir
    peer = _peer()

    os.chdir(REPO_ROOT)
    prompts, corpus_hash = load_corpus(CORPUS_DIR, LOCK_PATH)
    gates, g_hash = load_gates(GATES_PATH)
    per_stratum = 1 if opts.quick else opts.per_stratum
    prompts = select(prompts, per_stratum)
    if opts.strata:
        prompts = [p for p in prompts if p["stratum"] in opts.strata.split(",")]
    if opts.quick:
        prompts = prompts[:2]
    backends = [b for b in opts.backends.split(",") if b]
    arm_names = arms_mod.QUICK if opts.quick else arms_mod.FULL
    arms_by_backend = {b: [a for a in arm_names if b != "webgpu" or a in arms_mod.WEBGPU_SUBSET] for b in backends}
    webgpu_prompts = set(p["id"] for p in select(prompts, opts.webgpu_per_stratum))
    temperatures = [float(t) for t in opts.temperatures.split(",")]
    keys = arms_mod.schedule(prompts, temperatures, arms_by_backend, webgpu_prompts, opts.wllama, opts.repeats)

    run_dir = os.path.join("build", "eval", opts.run)
    ck = Checkpoints(run_dir)
    run_path = os.path.join(run_dir, "run.json")
    plan = {"corpus_sha256": corpus_hash, "gates_sha256": g_hash, "gates_version": gates["version"],
            "prompts": [p["id"] for p in prompts], "temperatures": temperatures, "arms": arms_by_backend,
            "webgpu_prompts": sorted(webgpu_prompts), "wllama": opts.wllama, "max_new_tokens": opts.max_new_tokens,
            "samples": opts.samples, "quick": opts.quick, "repeats": opts.repeats}
    if os.path.exists(run_path):
        with open(run_path) as f:
            before = json.load(f)
        check_same_gates(before["plan"]["gates_sha256"], g_hash)
        if before["plan"] != plan:
            raise ExactSpecError(E_MANIFEST_MISMATCH, f"build/eval/{opts.run} was started with another plan "
                                 "(corpus, arms, prompts or options): resume it with the same options or name a new --run")
        run_info = before
    else:
        run_info = {"run": opts.run, "plan": plan, "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    done = {_key(r) for r in ck.load_all() if r.get("kind") == "request"}
    by_id = {p["id"]: p for p in prompts}

    if opts.wllama:
        from export_gguf import export_gguf   # tools/ (on the path once peer is imported)
        export_gguf(os.path.join(default_models_dir(), "champion"), peer.GGUF_PATH, "f32", weights="q8")
    server = peer.PeerServer()
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    t_start = time.perf_counter()
    try:
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(600_000)
        page.goto(server.url + "/web/bench/eval.html")
        page.wait_for_function("() => window.evalReady === true && window.peerReady === true")
        call = lambda fn, *a: page.evaluate(f"(a) => window.evalBench.{fn}(...a)", list(a))
        run_info["machine"] = peer.machine_facts(browser)
        run_info.setdefault("loads", {})
        timeline = run_info.setdefault("memory_timeline", [])

        def sample(label, engine, out):
            timeline.append({"t_s": round(time.perf_counter() - t_start, 3), "label": label, "engine": engine,
                             "memory": out.get("memory"), "page_heap": out.get("page_heap")})

        available = []
        for backend in backends:
            # a throwaway load first, so that both topologies start "cold engine, warm browser"
            # (Pyodide and the WASM modules compiled once), whichever loads first
            w = call("load", f"{backend}-warmup", MODELS, {"championBackend": backend})
            if "refused" in w:
                raise ExactSpecError(w["refused"]["code"], f"{backend}: {w['refused']['message']}")
            run_info["loads"][f"{backend}-warmup"] = {"load_ms": w["load_ms"], "timing_ms": w["ready"]["timing_ms"]}
            call("unload", f"{backend}-warmup")
            for topo in ("alone", "spec"):
                name = f"{backend}-{topo}"
                models = MODELS if topo == "spec" else {"champion": MODELS["champion"], "draft": None}
                r = call("load", name, models, {"championBackend": backend})
                if "refused" in r:
                    raise ExactSpecError(r["refused"]["code"], f"{name}: {r['refused']['message']}")
                run_info["loads"][name] = {"load_ms": r["load_ms"], "timing_ms": r["ready"]["timing_ms"],
                                           "info": r["ready"]["info"]}
                sample(f"after load {name}", name, r)
                # the cold request: the first one this engine serves (first prompt, T = 0)
                arm = "none" if topo == "alone" else "draft-adaptive"
                cold = call("generate", name, {"prompt": prompts[0]["prompt"], "chat": prompts[0]["chat"],
                                               "config": arms_mod.request_config(arm, prompts[0], 0.0, opts.max_new_tokens)})
                if "refused" in cold:
                    raise ExactSpecError(cold["refused"]["code"], f"{name} cold request: {cold['refused']['message']}")
                run_info.setdefault("cold", {})[name] = _record(backend, arm, prompts[0], 0.0, cold)
                sample(f"after cold request {name}", name, cold)
            available.append(backend)
        if opts.wllama:
            w = page.evaluate("(a) => window.peerBench.loadWllama(...a)", ["/" + peer.GGUF_PATH.replace(os.sep, "/"), {"nThreads": 1}])
            run_info["loads"]["wllama"] = {"load_ms": w["load_ms"], "libllama": w["libllama"]}
        _write_json(run_path, run_info)

        todo = [k for k in keys if k not in done]
        print(f"bench {opts.run}: {len(keys)} requests planned, {len(keys) - len(todo)} already done", flush=True)
        t0 = time.perf_counter()
        for i, (backend, arm, pid, t, rep) in enumerate(todo):
            p = by_id[pid]
            if backend == "wllama":
                try:
                    w = page.evaluate("(a) => window.peerBench.wllamaGenerate(...a)", [p["prompt"], {
                        "maxTokens": opts.max_new_tokens or p["max_new_tokens"], "temperature": t, "seed": p["seed"], "withIds": t == 0}])
                except Exception as exc:   # the external arm failing is a result, not the run's end
                    ck.append("wllama:wllama", {"kind": "failure", "backend": "wllama", "prompt_id": pid, "temperature": t,
                                                "rep": rep, "error": str(exc)[:300]})
                    print(f"[{i + 1}/{len(todo)}] wllama {pid} T={t:g} failed: {str(exc)[:120]}", flush=True)
                    page.evaluate("(a) => window.peerBench.loadWllama(...a)", ["/" + peer.GGUF_PATH.replace(os.sep, "/"), {"nThreads": 1}])
                    continue
                rec = {"backend": "wllama", "arm": "wllama", "prompt_id": pid, "stratum": p["stratum"], "temperature": t, "rep": rep,
                       "seed": p["seed"], "token_ids": w["token_ids"], "n_tokens": w["n_tokens"], "prompt_len": w["prompt_tokens"],
                       "first_token_ms": w["first_token_ms"], "total_ms": w["total_ms"], "finish_reason": w["finish_reason"]}
            else:
                engine = f"{backend}-{arms_mod.arm_spec(arm)['engine']}"
                out = call("generate", engine, {"prompt": p["prompt"], "chat": p["chat"],
                                                "config": arms_mod.request_config(arm, p, t, opts.max_new_tokens)})
                if "refused" in out:
                    raise ExactSpecError(out["refused"]["code"], f"{backend}:{arm} {pid}: {out['refused']['message']}")
                rec = _record(backend, arm, p, t, out, rep)
                if i % 25 == 0:
                    sample(f"request {i}", engine, out)
            rec["kind"] = "request"
            ck.append(f"{backend}:{arm}", rec)
            el = time.perf_counter() - t0
            print(f"[{i + 1}/{len(todo)}] {backend}:{arm} {pid} T={t:g} #{rep} {rec['total_ms']:.0f} ms, "
                  f"elapsed {el:.0f} s, left ~{el / (i + 1) * (len(todo) - i - 1):.0f} s", flush=True)

        if opts.samples and "wasm" in available:
            run_info["distribution"] = distribution_sample(call, by_id.get(SAMPLE_PROMPT) or prompts[0], opts.samples)
        for backend in available:
            for topo in ("alone", "spec"):
                call("unload", f"{backend}-{topo}")
        context.close()
    finally:
        browser.close()
        pw.stop()
        server.close()
    run_info["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    run_info["wall_s"] = round(time.perf_counter() - t_start, 1)
    _write_json(run_path, run_info)
    return run_dir


def distribution_sample(call, prompt: dict, n: int) -> dict:
    """First tokens at T = 1 of champion alone and of the adaptive draft arm, seeds 0..n-1 (WASM).
    Five new tokens, so that the first comes out of a real speculative round (the adaptive
    scheduler never speculates when one token is left)."""
    out = {"prompt_id": prompt["id"], "n": n, "none": [], "draft-adaptive": []}
    for seed in range(n):
        for arm, engine in (("none", "wasm-alone"), ("draft-adaptive", "wasm-spec")):
            cfg = {**arms_mod.request_config(arm, prompt, 1.0, 5), "seed": seed}
            r = call("generate", engine, {"prompt": prompt["prompt"], "chat": prompt["chat"], "config": cfg})
            if "refused" in r:
                raise ExactSpecError(r["refused"]["code"], r["refused"]["message"])
            out[arm].append(r["result"]["token_ids"][0])
    return out


def _write_json(path: str, obj) -> None:
    write_file(path, json.dumps(obj, indent=1))


def check_args(opts) -> None:
    for b in opts.backends.split(","):
        if b and b not in ("wasm", "webgpu"):
            raise ExactSpecError(E_BAD_ARGUMENT, f"--backends: {b!r} is not a champion backend (wasm, webgpu)")
    if opts.samples < 0 or opts.per_stratum < 1 or opts.repeats < 1:
        raise ExactSpecError(E_BAD_ARGUMENT, "--samples must be >= 0, --per-stratum and --repeats >= 1")
