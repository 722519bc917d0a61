"""Drive headless Chromium through a run (I/O): engines per pair, champion backend and topology,
wllama, cold and warm requests in interleaved order, the distribution samples, checkpoints per arm
in build/eval/<run>/arms/ so that an interrupted run resumes where it stopped."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from ..core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, E_MODEL_LOAD, ExactSpecError
from ..host.safe_files import append_text, write_file
from ..host.server import REPO_ROOT
from . import arms as arms_mod
from .corpus import load_corpus, record_test_run, select
from .gates import GATES_V4_PATH, check_same_gates, load_gates

MODELS = {"champion": arms_mod.PAIRS["toy"]["champion"], "draft": arms_mod.PAIRS["toy"]["draft"]}
CORPUS_DIR = os.path.join("eval", "corpus")
LOCK_PATH = os.path.join("eval", "corpus.lock.json")
GATES_PATH = GATES_V4_PATH
# The distribution samples (the gate's data): prompts chosen by this rule, applied to the DEV split
# before any v2 test run (tests/test_eval_arms.py recomputes it), never for a result.
SAMPLE_RULE = ("three dev-split prompts from three strata: in corpus order, the first prompt of each stratum whose "
               "champion first-token distribution at T = 1 (CPython float64 reference on the toy pair's q8 champion) "
               "has at least 3 tokens above 5%, for the first three strata that have one; the real pair samples the "
               "same prompts")
SAMPLE_PROMPTS = ("adversarial-1", "casual-1", "code-3")
SAMPLE_POSITIONS = 4       # the first 4 answer tokens of every sample are recorded
# new tokens of a sample: enough that auto's first rounds are speculative (its probes need
# probe_min_remaining = 8 tokens left: with 5, test run #1's auto samples were champion-alone rounds,
# identical to champion alone's by construction, so their test could not fail)
SAMPLE_NEW_TOKENS = 12
# seconds the page idles before each timed load: champion alone's engine has just served its cold
# request when the spec engine's first load starts, and its idle-time work would share the CPU with
# that load (runs #6-#8: the spec engine's first Pyodide start 1.0-1.4 s, 0.5 s in its repeats)
LOAD_SETTLE_S = 3.0
# the real pair on the WebGPU champion: SwiftShader here runs it at ~2 s a token (docs/gpu.md)
REAL_WEBGPU_NOT_RUN = ("not run: the WebGPU champion is SwiftShader (software) here, ~2 s a token for SmolLM2-135M "
                       "(docs/gpu.md): its arms would take over an hour against the run's 20 min; "
                       "--real-backends wasm,webgpu runs it where a hardware GPU makes it fit")


def _peer():
    """tools/bench/peer.py (the lead's side-by-side bench): its server, GGUF export and machine facts."""
    path = os.path.join(REPO_ROOT, "tools", "bench")
    if path not in sys.path:
        sys.path.insert(0, path)
    import peer
    return peer


class Checkpoints:
    """build/eval/<run>/: run.json (identity of the run) and arms/<name>.jsonl (one record a line)."""

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
    """A request's checkpoint key; a v1 record (no topology) is keyed by its backend."""
    return (rec.get("topology") or rec["backend"], rec["arm"], rec["prompt_id"], rec["temperature"], rec.get("rep", 0))


def _sample_key(rec: dict) -> tuple:
    return (rec["topology"], rec["arm"], rec["prompt_id"], rec["seed"])


def _record(topo, arm, prompt, temperature, out, rep: int = 0, max_new_tokens: int | None = None,
            seed: int | None = None) -> dict:
    """What a request leaves in the checkpoint (ids, not text; times; rounds; auto's choices; memory; identities)."""
    pair, backend = arms_mod.split_topology(topo)
    res = out["result"]
    st, receipt = res["stats"], res.get("receipt") or {}
    return {"pair": pair, "backend": backend, "topology": topo, "engine": f"{topo}-{arms_mod.arm_spec(arm)['engine']}",
            "arm": arm, "prompt_id": prompt["id"], "stratum": prompt["stratum"], "split": prompt.get("split"),
            "temperature": temperature, "rep": rep, "seed": prompt["seed"] if seed is None else seed,
            "max_new_tokens": max_new_tokens or prompt["max_new_tokens"], "token_ids": res["token_ids"],
            "n_tokens": len(res["token_ids"]),
            "prompt_ids_sha256": hashlib.sha256(json.dumps(res["prompt_ids"]).encode()).hexdigest(),
            "prompt_len": len(res["prompt_ids"]), "finish_reason": res["finish_reason"], "error": res["error"],
            "first_token_ms": out["first_token_ms"], "total_ms": out["total_ms"], "timing_ms": res["timing_ms"],
            "stats": {k: st.get(k) for k in ("rounds", "proposed", "accepted", "baseline_steps", "tokens_per_round",
                                              "accepted_count_histogram", "mode", "fallback_code", "structured")},
            "rounds": [[r.get("proposed", 0), r.get("accepted", 0), r["n"], r.get("draft_ms", 0), r.get("verify_ms", 0),
                        r.get("steps", 1)] for r in out["rounds"]],      # steps: a chain's baseline steps
            "auto": st.get("auto"),
            "auto_rounds": ([[(r.get("auto") or {}).get("method"), (r.get("auto") or {}).get("k"),
                              (r.get("auto") or {}).get("reason")] for r in out["rounds"]] if arm == "auto" else None),
            "sources": [s for r in out["rounds"] for s in r["sources"]],
            "memory": out["memory"], "page_heap": out["page_heap"],
            # the calibration this request's drift made due, measured after it (web/bench/eval.mjs)
            "recalibration": out.get("recalibration"),
            "peak_resident_bytes": receipt.get("peak_resident_bytes"),
            "identity": {k: receipt.get(k) for k in ("champion_artifact_hash", "draft_artifact_hash", "tokenizer_hash",
                                                     "chat_template_hash", "sampling_policy_hash", "scheduler_policy_hash",
                                                     "browser_version", "runtime_version", "champion_backend",
                                                     "hardware_class")}}


def _load_entry(topo: str, role: str, r: dict) -> dict:
    """run_info["loads"][<topology>-<role>]: the page-clock load, its breakdown, ready.info, and
    the load's calibration and batch-invariance check (ready.info's, null when the engine has none)."""
    pair, backend = arms_mod.split_topology(topo)
    info = r["ready"].get("info") or {}
    return {"pair": pair, "backend": backend, "topology": topo, "role": role, "load_ms": r["load_ms"],
            "timing_ms": r["ready"].get("timing_ms"), "info": info,
            "calibration": info.get("calibration"), "batch_check": info.get("batch_check"),
            "champion_fallback": info.get("champion_fallback"),
            # the draft in the background (as every user-facing default loads it): ready came with the
            # champion alone (load_ms); the draft arrived draft_ready_ms and its calibration ended
            # draft_calibrated_ms after the load began, while the engine was idle (eval.mjs waits)
            **{k: r[k] for k in ("draft_ready_ms", "draft_calibrated_ms", "draft_load_ms", "draft_error") if k in r}}


def versions() -> dict:
    """The policy and scheduler versions this tree runs (name and version of each)."""
    from ..core.scheduler import AdaptiveK
    out = {"scheduler": {"name": AdaptiveK.name, "version": AdaptiveK.version}, "policy": None}
    try:
        from ..core.auto_policy import AutoPolicy
        out["policy"] = {"name": AutoPolicy.name, "version": AutoPolicy.version}
    except ImportError:
        pass
    return out


def plan_run(opts, prompts: list) -> dict:
    """What the run will do (pure, given the split's prompts): topologies with their arms and
    prompt ids, the request keys, the sample keys and the prior time estimate."""
    # quick (the CI smoke): the toy pair on WASM, no wllama, 2 prompts, champion alone and auto
    pairs = ["toy"] if opts.quick else [p for p in opts.pairs.split(",") if p]
    backends = ["wasm"] if opts.quick else [b for b in opts.backends.split(",") if b]
    real_backends = [b for b in opts.real_backends.split(",") if b]
    per_stratum = 1 if opts.quick else opts.per_stratum
    prompts = select(prompts, per_stratum)
    if opts.strata:
        prompts = [p for p in prompts if p["stratum"] in opts.strata.split(",")]
    if opts.quick:
        prompts = prompts[:2]
    arms_by_topo, ids_by_topo, not_run = {}, {}, []
    for pair in pairs:
        for backend in backends:
            if pair == "real" and backend not in real_backends:
                not_run.append({"pair": pair, "backend": backend, "why": REAL_WEBGPU_NOT_RUN if backend == "webgpu"
                                else f"not run: --real-backends {opts.real_backends}"})
                continue
            topo = arms_mod.topology(pair, backend)
            arms_by_topo[topo] = list(arms_mod.arms_for(pair, backend, opts.quick))
            n = opts.webgpu_per_stratum if backend == "webgpu" else (opts.real_per_stratum if pair == "real" else per_stratum)
            ids_by_topo[topo] = [p["id"] for p in select(prompts, n)]
    wllama = opts.wllama and not opts.quick and "toy" in pairs and "wasm" in backends
    keys = arms_mod.schedule(prompts, [float(t) for t in opts.temperatures.split(",")], arms_by_topo,
                             {t: set(ids) for t, ids in ids_by_topo.items()}, wllama, opts.repeats,
                             {t: gate_repeats_of(opts, t) for t in arms_by_topo})
    seeds = {}
    for topo in arms_by_topo:
        pair, backend = arms_mod.split_topology(topo)
        n = {("toy", "wasm"): opts.samples, ("toy", "webgpu"): opts.webgpu_samples}.get((pair, backend), opts.real_samples)
        if n:
            seeds[topo] = n
    engine_pairs = {t: arms_mod.engine_pairs_of(t, opts.engine_pairs, max(opts.repeats, gate_repeats_of(opts, t)))
                    for t in arms_by_topo}
    return {"prompts": prompts, "pairs": pairs, "arms": arms_by_topo, "prompt_ids": ids_by_topo, "not_run": not_run,
            "wllama": wllama, "keys": keys, "sample_seeds": seeds, "engine_pairs": engine_pairs}


def gate_repeats_of(opts, topo: str) -> int:
    """The topology's --gate-repeats: --webgpu-gate-repeats on WebGPU (gates v4), the toy pair's own
    --toy-gate-repeats when given (its requests are short and noisy: its cells need more of them),
    else --gate-repeats."""
    if arms_mod.split_topology(topo)[1] == "webgpu":
        return opts.webgpu_gate_repeats
    toy = opts.toy_gate_repeats
    return toy if toy is not None and arms_mod.split_topology(topo)[0] == "toy" else opts.gate_repeats


def estimate_ms(keys: list, by_id: dict, sample_keys: list, sample_prompts: dict, max_new_tokens: int | None) -> float:
    """The prior estimate of the requests' and samples' page-clock time (arms.COST_PRIOR)."""
    total = sum(arms_mod.prior_ms(topo, by_id[pid], max_new_tokens or by_id[pid]["max_new_tokens"])
                for topo, _arm, pid, _t, _rep in keys)
    return total + sum(arms_mod.prior_ms(topo, sample_prompts[pid], SAMPLE_NEW_TOKENS) for topo, _a, pid, _s in sample_keys)


def _check_pair_files(pairs: list) -> None:
    for pair in pairs:
        f = arms_mod.PAIRS[pair]["file"]
        if f and not os.path.isfile(os.path.join(REPO_ROOT, f)):
            raise ExactSpecError(E_MODEL_LOAD, f"--pairs {pair}: the real pair's champion {f} is absent: fetch it with "
                                 "`python tools/fetch_models.py`, or run --pairs toy")


def run_bench(opts) -> str:
    """Run (or resume) the evaluation; returns the run directory. opts: see cli `bench`."""
    from playwright.sync_api import sync_playwright
    from ..host.browser_run import CHROMIUM, CHROMIUM_ARGS
    from ..reference.models import default_models_dir
    peer = _peer()

    os.chdir(REPO_ROOT)
    split_prompts, split_hash = load_corpus(CORPUS_DIR, LOCK_PATH, opts.split)
    gates, g_hash = load_gates(GATES_PATH)
    pl = plan_run(opts, split_prompts)
    _check_pair_files(pl["pairs"])
    prompts, keys = pl["prompts"], pl["keys"]
    by_id = {p["id"]: p for p in prompts}
    temperatures = [float(t) for t in opts.temperatures.split(",")]
    sample_prompts = {}
    if pl["sample_seeds"]:   # dev prompts by the stated rule; a test run reads them from the dev split
        dev = {p["id"]: p for p in (split_prompts if opts.split == "dev" else load_corpus(CORPUS_DIR, LOCK_PATH, "dev")[0])}
        sample_prompts = {pid: dev[pid] for pid in SAMPLE_PROMPTS}
    s_keys = arms_mod.sample_keys(pl["sample_seeds"], list(sample_prompts))

    run_dir = os.path.join("build", "eval", opts.run)
    ck = Checkpoints(run_dir)
    run_path = os.path.join(run_dir, "run.json")
    plan = {"split": opts.split, "split_sha256": split_hash, "corpus_sha256": split_hash, "gates_path": GATES_PATH,
            "gates_sha256": g_hash, "gates_version": gates["version"], "pairs": pl["pairs"],
            "prompts": [p["id"] for p in prompts], "temperatures": temperatures, "arms": pl["arms"],
            "prompts_by_topology": pl["prompt_ids"],
            "strata_by_topology": {t: sorted({by_id[i]["stratum"] for i in ids}) for t, ids in pl["prompt_ids"].items()},
            "strata": sorted({p["stratum"] for p in prompts}), "wllama": pl["wllama"], "max_new_tokens": opts.max_new_tokens,
            "samples": opts.samples, "sample_seeds": pl["sample_seeds"], "quick": opts.quick, "repeats": opts.repeats}
    if opts.gate_repeats > opts.repeats:     # absent otherwise: earlier runs' plans stay equal
        plan["gate_repeats"] = opts.gate_repeats
    if opts.toy_gate_repeats is not None:
        plan["toy_gate_repeats"] = opts.toy_gate_repeats
    if not opts.quick:                       # runs before it had none (a quick run's plan is unchanged)
        plan["load_settle_s"] = LOAD_SETTLE_S
    if any(n > 1 for n in pl["engine_pairs"].values()):   # gates v3: repeat r on engine pair r mod n
        plan["engine_pairs"] = pl["engine_pairs"]
    if opts.webgpu_gate_repeats > 1 and any(arms_mod.split_topology(t)[1] == "webgpu" for t in pl["arms"]):
        plan["webgpu_gate_repeats"] = opts.webgpu_gate_repeats     # gates v4 (absent: earlier runs' plans stay equal)
    if gates.get("constraint_warmup") and not opts.quick:           # gates v4: constraints compiled before timing
        plan["constraint_warmup"] = True
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
    run_info["versions"] = versions()
    run_info["not_run"] = pl["not_run"]
    run_info["distribution"] = {"rule": SAMPLE_RULE, "prompts": list(sample_prompts), "positions": SAMPLE_POSITIONS,
                                "new_tokens": SAMPLE_NEW_TOKENS, "arms": list(arms_mod.SAMPLE_ARMS),
                                "arms_by_topology": {t: list(arms_mod.sample_arms(t)) for t in pl["sample_seeds"]},
                                "temperature": 1.0, "seeds": pl["sample_seeds"]}
    everything = ck.load_all()
    done = {_key(r) for r in everything if r.get("kind") == "request"}
    done_samples = {_sample_key(r) for r in everything if r.get("kind") == "sample"}
    todo = [k for k in keys if k not in done]
    todo_samples = [k for k in s_keys if k not in done_samples]
    est = estimate_ms(todo, by_id, todo_samples, sample_prompts, opts.max_new_tokens) / 1000
    # warm-up, then alone and spec once per engine pair and load_repeats - 1 times more each
    est_loads = sum((1 + 2 * (pl["engine_pairs"][t] + opts.load_repeats - 1)) * arms_mod.LOAD_PRIOR_MS.get(t, 5000.0)
                    for t in pl["arms"]) / 1000
    run_info["estimate_s"] = {"requests_and_samples": round(est), "loads": round(est_loads)}

    if pl["wllama"]:
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
        run_info["commit"] = run_info["machine"]["commit"]     # git describe --always --dirty
        if opts.split == "test" and "test_split_runs" not in run_info:   # counted once, at the run's start
            run_info["test_split_runs"] = record_test_run(opts.run, run_info["commit"], run_info["started"])
        run_info.setdefault("loads", {})
        timeline = run_info.setdefault("memory_timeline", [])

        def sample(label, engine, out):
            timeline.append({"t_s": round(time.perf_counter() - t_start, 3), "label": label, "engine": engine,
                             "memory": out.get("memory"), "page_heap": out.get("page_heap")})

        settle_s = plan.get("load_settle_s", 0.0)

        def load(topo, role, models, backend, pinned=None, repeat=0, pair=0):
            # the default options (warm-up, calibration, batch check: what a user's load pays); the timed
            # loads measure their own calibration as a first visit does ("force": the throwaway load's,
            # measured in a cold browser and cached under the same key, is not read back); `pinned`:
            # the WASM champion's thread count the throwaway load chose, for both timed engines
            # `repeat` > 0: a further load of the same engine, timed and unloaded (load_ms_repeats);
            # `pair` > 0: the engine of a further engine pair (gates v3), which serves requests too
            name = arms_mod.engine_name(topo, role, pair) + (f"-again{repeat}" if repeat else "")
            if role != "warmup":
                time.sleep(settle_s)        # every timed load starts on an idle page (LOAD_SETTLE_S)
            # a draft loads in the background, as the page, createEngine and the CLI load it: ready with the
            # champion alone, the draft while the engine is idle (the bench waits for it: a user typing)
            r = call("load", name, models, {"championBackend": backend, **(pinned or {}),
                                            **({"draftInBackground": True} if models.get("draft") else {}),
                                            **({} if role == "warmup" else {"calibrate": "force"})})
            if "refused" in r:
                raise ExactSpecError(r["refused"]["code"], f"{name}: {r['refused']['message']}")
            if repeat:   # its total, and its breakdown (which stage a slower engine loses time in)
                run_info["loads"][f"{topo}-{role}"]["load_ms_repeats"].append(r["load_ms"])
                run_info["loads"][f"{topo}-{role}"]["timing_ms_repeats"].append(r["ready"].get("timing_ms"))
            else:
                run_info["loads"][name] = {**_load_entry(topo, role, r), "load_ms_repeats": [], "timing_ms_repeats": [],
                                           **({"engine_pair": pair} if pair else {})}
            late = f" (its draft in the background: in at {r['draft_ready_ms']:.0f} ms)" if r.get("draft_ready_ms") else ""
            print(f"load {name}: {r['load_ms']:.0f} ms{late}", flush=True)
            return r

        print(f"bench {opts.run}: {len(keys)} requests planned, {len(keys) - len(todo)} already done; "
              f"{len(s_keys)} samples planned, {len(s_keys) - len(todo_samples)} already done; "
              f"estimate ~{(est + est_loads) / 60:.1f} min ({est_loads / 60:.1f} of it loads)", flush=True)
        for topo in pl["arms"]:
            pair, backend = arms_mod.split_topology(topo)
            models = {"champion": arms_mod.PAIRS[pair]["champion"], "draft": arms_mod.PAIRS[pair]["draft"]}
            models_of = lambda role: models if role == "spec" else {**models, "draft": None}   # champion alone: no draft
            # a throwaway load first, so that both engines start "cold engine, warm browser" (Pyodide
            # and the WASM modules compiled, the files in the HTTP cache), whichever loads first
            warm = load(topo, "warmup", models, backend)
            call("unload", f"{topo}-warmup")
            # both timed engines run the thread count the throwaway load's calibration chose: left to
            # their own (noisy) load-time choice they differed (test-split run #3, toy-wasm: V(1) 1.76
            # ms champion alone, 0.96 ms auto's engine), and the gates compared thread counts, not modes
            threads = ((warm["ready"].get("info") or {}).get("champion") or {}).get("threads")
            pinned = {"threads": threads} if backend == "wasm" and isinstance(threads, int) else None
            first = by_id[pl["prompt_ids"][topo][0]]
            for role in ("alone", "spec"):
                r = load(topo, role, models_of(role), backend, pinned)
                sample(f"after load {topo}-{role}", f"{topo}-{role}", r)
                # the cold request: the first one this engine serves (its first prompt, T = 0, the default mode)
                arm = "none" if role == "alone" else "auto"
                cold = call("generate", f"{topo}-{role}", {"prompt": first["prompt"], "chat": first["chat"],
                                                           "config": arms_mod.request_config(arm, first, 0.0, opts.max_new_tokens)})
                if "refused" in cold:
                    raise ExactSpecError(cold["refused"]["code"], f"{topo}-{role} cold request: {cold['refused']['message']}")
                run_info.setdefault("cold", {})[f"{topo}-{role}"] = _record(topo, arm, first, 0.0, cold, 0, opts.max_new_tokens)
                sample(f"after cold request {topo}-{role}", f"{topo}-{role}", cold)
            # the further engine pairs (gates v3), loaded the same way and kept: their requests are
            # warm ones (each engine's warm-up ran at its load; the cold request is the first pair's)
            for j in range(1, pl["engine_pairs"][topo]):
                for role in ("alone", "spec"):
                    r = load(topo, role, models_of(role), backend, pinned, pair=j)
                    sample(f"after load {arms_mod.engine_name(topo, role, j)}", arms_mod.engine_name(topo, role, j), r)
            if plan.get("constraint_warmup"):
                warm_constraints(call, topo, pl, by_id, run_info)
            # further loads of both engines, alternating, each unloaded at once: one load per engine is
            # noisy here (run #6: the same Python boot 480 ms in one engine, 1440 in the other); the
            # gate uses the timed engine's own load as gates_v2.json says, the report adds the median's
            for again in range(1, opts.load_repeats):
                for role in ("alone", "spec"):
                    load(topo, role, models_of(role), backend, pinned, again)
                    call("unload", f"{topo}-{role}-again{again}")
        if pl["wllama"]:
            w = page.evaluate("(a) => window.peerBench.loadWllama(...a)", ["/" + peer.GGUF_PATH.replace(os.sep, "/"), {"nThreads": 1}])
            run_info["loads"]["toy-wllama"] = {"pair": "toy", "backend": "wllama", "topology": "toy-wllama", "role": "alone",
                                               "load_ms": w["load_ms"], "libllama": w["libllama"]}
        _write_json(run_path, run_info)

        t0 = time.perf_counter()
        prior_done = 0.0
        for i, (topo, arm, pid, t, rep) in enumerate(todo):
            p = by_id[pid]
            if arm == "wllama":
                try:
                    w = page.evaluate("(a) => window.peerBench.wllamaGenerate(...a)", [p["prompt"], {
                        "maxTokens": opts.max_new_tokens or p["max_new_tokens"], "temperature": t, "seed": p["seed"], "withIds": t == 0}])
                except Exception as exc:   # the external arm failing is a result, not the run's end
                    ck.append("toy-wllama:wllama", {"kind": "failure", "pair": "toy", "backend": "wllama", "topology": topo,
                                                    "arm": "wllama", "prompt_id": pid, "temperature": t, "rep": rep,
                                                    "error": str(exc)[:300]})
                    print(f"[{i + 1}/{len(todo)}] wllama {pid} T={t:g} failed: {str(exc)[:120]}", flush=True)
                    page.evaluate("(a) => window.peerBench.loadWllama(...a)", ["/" + peer.GGUF_PATH.replace(os.sep, "/"), {"nThreads": 1}])
                    continue
                rec = {"pair": "toy", "backend": "wllama", "topology": topo, "engine": "toy-wllama", "arm": "wllama",
                       "prompt_id": pid, "stratum": p["stratum"], "split": p.get("split"), "temperature": t, "rep": rep,
                       "seed": p["seed"], "max_new_tokens": opts.max_new_tokens or p["max_new_tokens"],
                       "token_ids": w["token_ids"], "n_tokens": w["n_tokens"], "prompt_len": w["prompt_tokens"],
                       "first_token_ms": w["first_token_ms"], "total_ms": w["total_ms"], "finish_reason": w["finish_reason"]}
            else:
                n_pairs = pl["engine_pairs"][topo]
                pair_j = arms_mod.pair_of_repeat(rep, n_pairs)
                engine = arms_mod.engine_name(topo, arms_mod.arm_spec(arm)["engine"], pair_j)
                seed = arms_mod.repeat_seed(topo, p, t, rep)
                out = call("generate", engine, {"prompt": p["prompt"], "chat": p["chat"],
                                                "config": arms_mod.request_config(arm, p, t, opts.max_new_tokens, seed)})
                if "refused" in out:
                    raise ExactSpecError(out["refused"]["code"], f"{topo}:{arm} {pid}: {out['refused']['message']}")
                rec = _record(topo, arm, p, t, out, rep, opts.max_new_tokens, seed)
                if n_pairs > 1:
                    rec["engine_pair"] = pair_j
                if i % 25 == 0:
                    sample(f"request {i}", engine, out)
            rec["kind"] = "request"
            ck.append(f"{topo}:{arm}", rec)
            prior_done += arms_mod.prior_ms(topo, p, opts.max_new_tokens or p["max_new_tokens"]) / 1000
            print(f"[{i + 1}/{len(todo)}] {topo}:{arm} {pid} T={t:g} #{rep} {rec['total_ms']:.0f} ms, "
                  f"elapsed {time.perf_counter() - t0:.0f} s, left ~{_left_s(time.perf_counter() - t0, prior_done, est):.0f} s",
                  flush=True)

        for j, (topo, arm, pid, seed) in enumerate(todo_samples):
            s = distribution_sample(call, topo, arm, sample_prompts[pid], seed)
            s["kind"] = "sample"
            ck.append(f"samples:{topo}", s)
            prior_done += arms_mod.prior_ms(topo, sample_prompts[pid], SAMPLE_NEW_TOKENS) / 1000
            if j % 50 == 0 or j == len(todo_samples) - 1:
                print(f"[sample {j + 1}/{len(todo_samples)}] {topo}:{arm} {pid} seed {seed}, elapsed "
                      f"{time.perf_counter() - t0:.0f} s, left ~{_left_s(time.perf_counter() - t0, prior_done, est):.0f} s",
                      flush=True)
        for topo in pl["arms"]:
            for j in range(pl["engine_pairs"][topo]):
                for role in ("alone", "spec"):
                    call("unload", arms_mod.engine_name(topo, role, j))
        context.close()
    finally:
        browser.close()
        pw.stop()
        server.close()
    run_info["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    run_info["wall_s"] = round(time.perf_counter() - t_start, 1)
    _write_json(run_path, run_info)
    return run_dir


def warm_constraints(call, topo: str, pl: dict, by_id: dict, run_info: dict) -> None:
    """Gates v4: every engine of the topology (every pair, both roles) compiles each planned prompt's
    constraint before the first timed request, by a throwaway one-token request (T = 0, no
    speculation). A constraint's first use on an engine pays its compile (~0.2 s toy, ~0.5-1 s
    SmolLM2's 49k-token vocabulary, any mode alike); left in, it landed on whichever arm that engine
    served first (run #20). Recorded in run_info["constraint_warmup"][engine]: the compile each paid."""
    prompts = [by_id[i] for i in pl["prompt_ids"][topo] if by_id[i].get("response_format") is not None]
    seen = run_info.setdefault("constraint_warmup", {})
    for j in range(pl["engine_pairs"][topo]):
        for role in ("alone", "spec"):
            engine = arms_mod.engine_name(topo, role, j)
            out_rows = seen[engine] = []     # a resumed run's engines are loaded again: their compiles are these
            for p in prompts:
                out = call("generate", engine, {"prompt": p["prompt"], "chat": p["chat"],
                                                "config": arms_mod.request_config("none", p, 0.0, 1)})
                if "refused" in out:
                    raise ExactSpecError(out["refused"]["code"], f"{engine} constraint warm-up {p['id']}: {out['refused']['message']}")
                st = out["result"]["stats"].get("structured") or {}
                out_rows.append({"prompt_id": p["id"], "compile_ms": st.get("compile_ms"), "cached": st.get("cached"),
                                 "total_ms": out["total_ms"]})
            if prompts:
                print(f"constraint warm-up {engine}: " + ", ".join(f"{r['prompt_id']} {r['compile_ms'] or 0:.0f} ms"
                                                                 for r in out_rows), flush=True)


def _left_s(elapsed_s: float, prior_done_s: float, prior_total_s: float) -> float:
    """Time left: the prior estimate of what is left, scaled by how the work done so far compared with its prior."""
    return max(prior_total_s - prior_done_s, 0.0) * (elapsed_s / prior_done_s if prior_done_s > 0 else 1.0)


def distribution_sample(call, topo: str, arm: str, prompt: dict, seed: int) -> dict:
    """One distribution sample: the first SAMPLE_POSITIONS answer ids at T = 1 of `arm` under `seed`
    (SAMPLE_NEW_TOKENS new tokens; fewer ids when the answer ended sooner)."""
    pair, backend = arms_mod.split_topology(topo)
    engine = f"{topo}-{arms_mod.arm_spec(arm)['engine']}"
    cfg = {**arms_mod.request_config(arm, prompt, 1.0, SAMPLE_NEW_TOKENS), "seed": seed}
    r = call("generate", engine, {"prompt": prompt["prompt"], "chat": prompt["chat"], "config": cfg})
    if "refused" in r:
        raise ExactSpecError(r["refused"]["code"], f"{topo}:{arm} sample {prompt['id']} seed {seed}: {r['refused']['message']}")
    return {"pair": pair, "backend": backend, "topology": topo, "arm": arm, "prompt_id": prompt["id"],
            "stratum": prompt["stratum"], "temperature": 1.0, "seed": seed,
            "token_ids": r["result"]["token_ids"][:SAMPLE_POSITIONS]}


def choose_sample_prompts(dev_prompts: list, first_token_probs, n: int = 3, min_tokens: int = 3,
                          min_p: float = 0.05) -> list:
    """SAMPLE_RULE: in corpus order, the first prompt of each stratum whose first-token distribution
    (first_token_probs(prompt) -> {id: p}) has at least min_tokens tokens above min_p, n strata."""
    out, strata = [], set()
    for p in dev_prompts:
        if len(out) == n:
            break
        if p["stratum"] not in strata and sum(q > min_p for q in first_token_probs(p).values()) >= min_tokens:
            out.append(p["id"])
            strata.add(p["stratum"])
    return out


def _write_json(path: str, obj) -> None:
    write_file(path, json.dumps(obj, indent=1))


def check_args(opts) -> None:
    for b in opts.backends.split(",") + opts.real_backends.split(","):
        if b and b not in ("wasm", "webgpu"):
            raise ExactSpecError(E_BAD_ARGUMENT, f"--backends/--real-backends: {b!r} is not a champion backend (wasm, webgpu)")
    pairs = [p for p in opts.pairs.split(",") if p]
    if not pairs or any(p not in arms_mod.PAIRS for p in pairs):
        raise ExactSpecError(E_BAD_ARGUMENT, f"--pairs {opts.pairs}: a comma-separated list of {', '.join(arms_mod.PAIRS)}")
    if opts.split not in ("dev", "test"):
        raise ExactSpecError(E_BAD_ARGUMENT, f"--split {opts.split}: dev or test")
    if opts.load_repeats < 1:
        raise ExactSpecError(E_BAD_ARGUMENT, "--load-repeats must be >= 1")
    if opts.engine_pairs < 1:
        raise ExactSpecError(E_BAD_ARGUMENT, "--engine-pairs must be >= 1")
    if opts.webgpu_gate_repeats < 1:
        raise ExactSpecError(E_BAD_ARGUMENT, "--webgpu-gate-repeats must be >= 1")
    if opts.split == "test" and not opts.quick and not opts.report_only:   # preregistered: a test run does not choose
        gates = load_gates(GATES_PATH)[0]
        wanted = gates["engine_pairs"]["count"]
        if opts.engine_pairs != wanted:
            raise ExactSpecError(E_BAD_ARGUMENT, f"--engine-pairs {opts.engine_pairs}: a test-split run loads the "
                                 f"{wanted} engine pairs that {GATES_PATH} names (any other count: --split dev)")
        wanted = gates.get("webgpu_gate_repeats", {}).get("count", 1)
        if "webgpu" in opts.backends.split(",") and opts.webgpu_gate_repeats != wanted:
            raise ExactSpecError(E_BAD_ARGUMENT, f"--webgpu-gate-repeats {opts.webgpu_gate_repeats}: a test-split run "
                                 f"runs the {wanted} WebGPU repeats that {GATES_PATH} names (any other: --split dev)")
    if opts.gate_repeats < 0 or (opts.toy_gate_repeats is not None and opts.toy_gate_repeats < 0):
        raise ExactSpecError(E_BAD_ARGUMENT, "--gate-repeats and --toy-gate-repeats must be >= 0")
    if min(opts.samples, opts.webgpu_samples, opts.real_samples) < 0 or min(opts.per_stratum, opts.repeats,
                                                                             opts.real_per_stratum) < 1:
        raise ExactSpecError(E_BAD_ARGUMENT, "--samples, --webgpu-samples and --real-samples must be >= 0; "
                             "--per-stratum, --real-per-stratum and --repeats >= 1")
    if not opts.report_only:
        _check_pair_files(pairs)
