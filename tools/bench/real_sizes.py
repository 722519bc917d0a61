"""Real sizes: our WASM champion alone, llama.cpp (wllama) on the same GGUF file, and ours with a draft at
k = 2..4, greedy, in one headless Chromium (tools/bench/peer.py's server, page and helpers).

    flock /tmp/browser.lock python tools/bench/real_sizes.py [--make] [--champion FILE.gguf] [--draft FILE.gguf|FOLDER|none] [--gguf FILE]
        [--prompts 2] [--max-new-tokens 24] [--ks 2,3,4] [--wllama-threads 1,2] [--engine-options JSON]
        [--no-wllama] [--json build/bench/real_sizes.json]

Default pair (--make builds what is missing of it first, docs/models.md "Real sizes"): the shipped champion widened to
SmolLM2-1.7B's shape (tools/widen.py --shape smollm2-1.7b) and exported as GGUF Q4_1
(tools/export_gguf.py --type q4_1: ~1.1 GB), and the shipped draft widened to smollm2-1.7b-draft and
exported F32 (a GGUF draft pairs with a GGUF champion: the same tokenizer metadata).
Run at most one such job at a time (flock /tmp/browser.lock): the page holds ~1.1 GB per runner.

Runners, one after another, each in a fresh browser context (so each one's memory is its own):
wllama (llama.cpp's WASM build) at each of --wllama-threads, our engine with the champion alone (WASM champion,
Engine.create's options from --engine-options, e.g. '{"threads": 2}'), then our engine with the draft,
every k of --ks. Each runner first answers one untimed request (the warm-up; wllama's also gives its
greedy token ids), then every prompt once, timed in the page (peer.mjs's clock: ms/token after the
first token). Reported per runner: load time (Engine.create / wllama load, page clock), memory (ours:
the WASM memory of the champion and of the draft as Engine.memory() reports it, and the ratio of the
champion's to the weight file; every runner: the growth of the browser's proportional set size, the
sum of Pss over its processes, from its fresh page before loading (once the last runner's processes
have let go) to the largest seen after a request; a draft inside the champion's WASM instance is
shown as such, its bytes being the same memory), ms/token,
tokens per round, and for the draft runs the draft's ms per proposal as a share of the champion
alone's ms per token and the verification's ms per round against the champion alone's per step
(V(k+1)/V(1)). Greedy tokens: every draft run must equal the champion alone's (a difference is
reported as an exactness failure, exit status 1); wllama's are compared with ours and reported.
Prints a table, writes the JSON and a Markdown table beside it. Numbers, not assertions: the machine
is shared and noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import peer  # noqa: E402  (also puts py/ and tools/ on the path)
from exactspec.host.safe_files import write_file  # noqa: E402

WIDENED = os.path.join("build", "widened")
DEFAULT_CHAMPION = os.path.join(WIDENED, "champion-1.7b.q4_1.gguf")
DEFAULT_DRAFT = os.path.join(WIDENED, "draft-1.7b.f32.gguf")
DEFAULT_JSON = os.path.join("build", "bench", "real_sizes.json")


# ---- the models (--make) ----

def make_models(log=print) -> dict:
    """build/widened/: the 1.7B-shaped champion and draft folders (float32) and their GGUF files (the
    champion Q4_1, the draft F32: the WASM draft's own format), each made only when missing. Both
    GGUF files carry the same tokenizer metadata, so the engine pairs them (a GGUF champion with a
    folder draft fails the pair check on the tokenizer's post-processor and flags).
    -> {champion, draft} (the two GGUF paths)."""
    import widen
    from export_gguf import export_gguf
    models = os.path.join(REPO, "web", "models")
    made = {}
    for role, shape, out, export_type in (("champion", "smollm2-1.7b", DEFAULT_CHAMPION, "q4_1"),
                                          ("draft", "smollm2-1.7b-draft", DEFAULT_DRAFT, "f32")):
        folder = os.path.join(REPO, WIDENED, f"{role}-1.7b")
        if not os.path.isfile(os.path.join(folder, "model.safetensors")):
            widen.widen_folder(os.path.join(models, role), folder, log=log, **widen.SHAPES[shape])
        made[role] = os.path.join(REPO, out)
        if not os.path.isfile(made[role]):
            t0 = time.perf_counter()
            summary = export_gguf(folder, made[role], export_type)
            log(f"export_gguf: {made[role]}: {summary['bytes']:,} bytes, {summary['formats']}, {time.perf_counter() - t0:.0f} s")
    return made


# ---- pure: memory of a process tree, the numbers of a run, the table ----

def descendants(parents: dict, root: int) -> list:
    """Every pid below root in a {pid: parent pid} map (root excluded)."""
    children: dict = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def browser_pss_bytes(root: int | None = None) -> int:
    """The proportional set size of every process below root (default: this one), in bytes: the
    browser Playwright started, its renderers, workers and GPU process, each shared page counted
    once across them (/proc/PID/smaps_rollup). 0 where /proc has no smaps_rollup."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    total = 0
    for pid in descendants(parents, os.getpid() if root is None else root):
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except (OSError, ValueError, IndexError):
            continue
    return total


def wllama_thread_counts(text: str) -> list:
    """--wllama-threads "1,2" -> [1, 2] (SystemExit naming the value when one is not a count >= 1)."""
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise SystemExit(f"E_BAD_ARGUMENT: --wllama-threads {text!r}: thread counts >= 1, comma-separated")
    return counts


def median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def draft_inline(runner: dict) -> bool:
    """Whether the runner's draft lives in the WASM champion's own instance (placement "inline"):
    then Engine.memory()'s draft bytes are that one instance's memory again, not more of it."""
    draft = (((runner.get("ready") or {}).get("info") or {}).get("draft") or {})
    return draft.get("placement") == "inline"


def summarise(runners: list) -> list:
    """One row per runner from its records: medians of ms/token, first token, tokens/round, draft ms
    per proposal, verification ms per round; then the draft's share and V(k+1)/V(1) against the
    champion alone (the runner named ours:none)."""
    rows = []
    for r in runners:
        recs = r["records"]
        row = {"runner": r["name"], "requests": len(recs), "load_s": round(r["load_ms"] / 1000, 2),
               "ms_per_token": median(x["ms_per_token"] for x in recs),
               "first_token_ms": median(x["first_token_ms"] for x in recs),
               "tokens_per_round": median(x.get("tokens_per_round") for x in recs),
               "draft_ms_per_proposal": median(x.get("draft_ms_per_proposal") for x in recs),
               "verify_ms_per_round": median(x.get("verify_ms_per_round") for x in recs),
               "browser_pss_growth_mb": round(r["browser_pss_growth"] / 1e6, 1),
               "wasm_champion_mb": round(r["memory"]["wasm_champion_bytes"] / 1e6, 1) if r.get("memory") else None,
               "wasm_draft_mb": round(r["memory"]["wasm_draft_bytes"] / 1e6, 1) if r.get("memory") else None,
               "draft_inline": draft_inline(r)}
        rows.append(row)
    alone = next((row for row in rows if row["runner"] == "ours:none"), None)
    wllamas = [row for row in rows if row["runner"].startswith("wllama") and row["ms_per_token"]]
    wllama = min(wllamas, key=lambda row: row["ms_per_token"]) if wllamas else None    # its best thread count
    for row in rows:
        row["vs_alone"] = (round(alone["ms_per_token"] / row["ms_per_token"], 3)
                           if alone and alone["ms_per_token"] and row["ms_per_token"] else None)
        row["vs_wllama"] = (round(wllama["ms_per_token"] / row["ms_per_token"], 3)
                            if wllama and wllama["ms_per_token"] and row["ms_per_token"] else None)
        is_draft = row["runner"].startswith("ours:draft")
        row["draft_share"] = (round(row["draft_ms_per_proposal"] / alone["ms_per_token"], 3)
                              if is_draft and alone and row["draft_ms_per_proposal"] and alone["ms_per_token"] else None)
        row["v_ratio"] = (round(row["verify_ms_per_round"] / alone["verify_ms_per_round"], 3)
                          if is_draft and alone and row["verify_ms_per_round"] and alone["verify_ms_per_round"] else None)
    return rows


def markdown_table(rows: list) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)
    lines = ["| runner | ms/token | vs champion alone | vs wllama | tokens/round | draft ms/proposal (share of a champion token) "
             "| V(k+1)/V(1) | first token ms | load s | WASM MB: champion + draft | browser Pss growth MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = f"{f(r['draft_ms_per_proposal'], '.1f')} ({f(r['draft_share'], '.3f')})" if r["draft_ms_per_proposal"] else "-"
        wasm = ("-" if r["wasm_champion_mb"] is None else f"{r['wasm_champion_mb']:.0f} (draft inside)" if r.get("draft_inline")
                else f"{r['wasm_champion_mb']:.0f} + {f(r['wasm_draft_mb'], '.0f')}")
        lines.append(f"| {r['runner']} | {f(r['ms_per_token'], '.1f')} | {f(r['vs_alone'], '.2f')}x | {f(r['vs_wllama'], '.2f')}x | "
                     f"{f(r['tokens_per_round'], '.2f')} | {share} | {f(r['v_ratio'], '.2f')} | {f(r['first_token_ms'], '.0f')} | "
                     f"{r['load_s']:.1f} | {wasm} | {r['browser_pss_growth_mb']:.0f} |")
    return "\n".join(lines)


def request_record(prompt_index: int, r: dict) -> dict:
    """One timed request of our engine (the page's {result, first_token_ms, total_ms}) as a record."""
    res = r["result"]
    n, stats, timing = len(res["token_ids"]), res["stats"], res["timing_ms"]
    steps = (stats.get("rounds") or 0) + (stats.get("baseline_steps") or 0)
    return {"prompt": prompt_index, "n_tokens": n, "token_ids": res["token_ids"], "first_token_ms": r["first_token_ms"],
            "ms_per_token": peer.decode_ms_per_token(r["first_token_ms"], r["total_ms"], n),
            "tokens_per_round": stats.get("tokens_per_round") or 1.0, "timing_ms": timing,
            "draft_ms_per_proposal": timing["draft"] / stats["proposed"] if stats.get("proposed") else None,
            "verify_ms_per_round": timing["verify"] / steps if steps else None}


# ---- I/O: the run ----

def run(args, browser=None) -> dict:
    """The run (main's args); browser: a Playwright browser to use (tests), else one is launched."""
    os.chdir(REPO)
    mounts: dict = {}
    models = peer.bench_models(args.champion, args.draft, args.gguf, mounts)
    if models["gguf"] is None and not args.no_wllama:
        raise SystemExit("E_BAD_ARGUMENT: a model folder champion: give --gguf FILE for wllama (or --no-wllama)")
    prompts = peer.PROMPTS[:args.prompts]
    ks = [int(k) for k in args.ks.split(",") if k]
    engine_options = {"championBackend": "wasm", **json.loads(args.engine_options)}
    champion_file = models["local"] if models["local"].endswith(".gguf") else None
    out = {"args": vars(args), "command": args.command, "models": models, "prompts": prompts,
           "weight_file_bytes": os.path.getsize(champion_file) if champion_file else None,
           "engine_options": engine_options, "runners": []}
    server = peer.PeerServer(mounts=mounts)
    pw = None
    if browser is None:
        from playwright.sync_api import sync_playwright
        from exactspec.host.browser_run import CHROMIUM, CHROMIUM_ARGS
        pw = sync_playwright().start()
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    out["machine"] = peer.machine_facts(browser)

    def page_for(runner: str):
        """A fresh context on the bench page, once the last runner's processes have let go of their
        memory (the browser's Pss stops falling: a closed context's renderer ends asynchronously)."""
        last, deadline = browser_pss_bytes(), time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = browser_pss_bytes()
            if now >= last - (1 << 20):
                break
            last = now
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(args.timeout_s * 1000)
        page.goto(server.url + "/web/bench/real_sizes.html")
        page.wait_for_function("() => window.peerReady === true && window.realSizesReady === true")
        print(f"{runner}: loading", flush=True)
        return context, page

    def measured(runner: dict, pss0: int) -> None:
        runner["pss_peak"] = max(runner.get("pss_peak", 0), browser_pss_bytes())
        runner["browser_pss_growth"] = runner["pss_peak"] - pss0

    try:
        for threads in ([] if args.no_wllama else wllama_thread_counts(args.wllama_threads)):
            name = f"wllama:{threads}t"
            context, page = page_for(name)
            pss0 = browser_pss_bytes()
            call = lambda fn, *a: page.evaluate(f"(a) => window.peerBench.{fn}(...a)", list(a))
            w = call("loadWllama", models["gguf"], {"nThreads": threads, "timeoutMs": args.timeout_s * 1000})
            runner = {"name": name, "load_ms": w["load_ms"], "libllama": w["libllama"], "n_threads": w["n_threads"],
                      "records": []}
            measured(runner, pss0)
            warm = call("wllamaGenerate", prompts[0], {"maxTokens": args.max_new_tokens, "temperature": 0, "withIds": True})
            runner["warmup_token_ids"] = warm["token_ids"]
            for i, prompt in enumerate(prompts):
                w = call("wllamaGenerate", prompt, {"maxTokens": args.max_new_tokens, "temperature": 0})
                runner["records"].append({"prompt": i, "n_tokens": w["n_tokens"], "first_token_ms": w["first_token_ms"],
                                          "ms_per_token": peer.decode_ms_per_token(w["first_token_ms"], w["total_ms"], w["n_tokens"]),
                                          "tokens_per_round": 1.0, "llama_timings": w["timings"]})
                measured(runner, pss0)
                print(f"{name}: prompt {i}: {runner['records'][-1]['ms_per_token']} ms/token", flush=True)
            call("unload")
            context.close()
            out["runners"].append(runner)

        plans = [("ours:none", {"champion": models["champion"]}, ["none"])]
        if models["draft"]:
            plans.append(("ours:draft", {"champion": models["champion"], "draft": models["draft"]}, [f"draft@{k}" for k in ks]))
        for name, engine_models, modes in plans:
            context, page = page_for(name)
            pss0 = browser_pss_bytes()
            call = lambda fn, *a: page.evaluate(f"(a) => window.realSizes.{fn}(...a)", list(a))
            loaded = call("load", engine_models, engine_options)
            if "refused" in loaded:
                raise peer.refusal(name, loaded["refused"])
            print(f"{name}: loaded in {loaded['load_ms'] / 1000:.1f} s, memory {json.dumps(loaded['memory'])}", flush=True)
            for mode in modes:
                runner = {"name": "ours:none" if mode == "none" else f"ours:{mode}", "load_ms": loaded["load_ms"],
                          "ready": loaded["ready"], "cross_origin_isolated": loaded["cross_origin_isolated"],
                          "memory": loaded["memory"], "records": []}
                measured(runner, pss0)
                cfg = {"max_new_tokens": args.max_new_tokens, "temperature": 0, "seed": 0, **peer.mode_config(mode, 4)}
                warm = call("generate", {"prompt": prompts[0], "chat": False, "config": cfg})
                if "refused" in warm:
                    raise peer.refusal(f"{name} {mode}", warm["refused"])
                runner["warmup"] = request_record(0, warm)
                for i, prompt in enumerate(prompts):
                    r = call("generate", {"prompt": prompt, "chat": False, "config": cfg})
                    if "refused" in r:
                        raise peer.refusal(f"{name} {mode}", r["refused"])
                    runner["records"].append(request_record(i, r))
                    runner["memory"] = r["memory"]
                    measured(runner, pss0)
                    rec = runner["records"][-1]
                    print(f"{runner['name']}: prompt {i}: {rec['ms_per_token']} ms/token, {rec['tokens_per_round']} tokens/round",
                          flush=True)
                out["runners"].append(runner)
            call("unload")
            context.close()
    finally:
        if pw is not None:
            browser.close()
            pw.stop()
        server.close()
    out["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out["rows"] = summarise(out["runners"])
    out["agreement"] = agreement(out["runners"])
    return out


def agreement(runners: list) -> dict:
    """Greedy tokens per prompt: every draft run against the champion alone (must be equal), and
    wllama's warm-up answer (prompt 0) against ours."""
    alone = next((r for r in runners if r["name"] == "ours:none"), None)
    out = {"draft_vs_alone": {}, "wllama_vs_alone": None}
    if alone is None:
        return out
    want = {rec["prompt"]: rec["token_ids"] for rec in alone["records"]}
    for r in runners:
        if r["name"].startswith("ours:draft"):
            out["draft_vs_alone"][r["name"]] = [peer.first_divergence(rec["token_ids"], want[rec["prompt"]]) for rec in r["records"]]
    wllama = next((r for r in runners if r["name"].startswith("wllama")), None)
    if wllama and wllama.get("warmup_token_ids") is not None and 0 in want:
        out["wllama_vs_alone"] = peer.first_divergence(wllama["warmup_token_ids"], want[0])
    return out


def report(out: dict) -> str:
    m, a = out["machine"], out["args"]
    lines = [f"Run: {m['date']}, commit `{m['commit']}`, {m['cpus']} CPUs, Chromium {m['chromium']}, load average "
             f"{' / '.join(map(str, m['load_1_5_15']))} before, {' / '.join(map(str, m['load_after']))} after; champion "
             f"`{out['models']['champion']}`" + (f" ({out['weight_file_bytes']:,} bytes)" if out["weight_file_bytes"] else "")
             + (f", draft `{out['models']['draft']}`" if out["models"]["draft"] else "") + f"; engine options "
             f"`{json.dumps(out['engine_options'])}`; wllama at {a['wllama_threads']} thread(s) (vs wllama: against its fastest).",
             "", f"`{out['command']}`: greedy, medians over {len(out['prompts'])} prompts, {a['max_new_tokens']} new tokens at most.",
             "", markdown_table(out["rows"]), ""]
    alone = next((r for r in out["runners"] if r["name"] == "ours:none"), None)
    if alone:
        info = ((alone.get("ready") or {}).get("info") or {}).get("champion") or {}
        lines.append(f"Our champion: matmul {info.get('matmul')}, SIMD {info.get('simd')}, {info.get('threads')} thread(s) "
                     f"({info.get('threads_why')}); load (ms): {json.dumps(alone['ready'].get('timing_ms'))}.")
    if alone and out["weight_file_bytes"]:
        mem, file_bytes = alone["memory"], out["weight_file_bytes"]
        lines.append(f"Champion alone against its weight file ({file_bytes:,} bytes): WASM memory "
                     f"{mem['wasm_champion_bytes'] / file_bytes:.2f}x" + (
                         f", weights held {mem['champion_weight_bytes'] / file_bytes:.2f}x" if mem.get("champion_weight_bytes") else "") + ".")
    ag = out["agreement"]
    bad = {k: v for k, v in ag["draft_vs_alone"].items() if any(d is not None for d in v)}
    lines.append("Greedy tokens, draft runs against the champion alone: " + (
        "identical in every run." if not bad else "DIFFERENT: " + ", ".join(f"{k} at {v}" for k, v in bad.items()) + "."))
    if ag["wllama_vs_alone"] is not None or any(r["name"].startswith("wllama") for r in out["runners"]):
        lines.append("wllama's greedy answer to the first prompt against ours: " + (
            "identical." if ag["wllama_vs_alone"] is None else f"differs from token {ag['wllama_vs_alone']}."))
    return "\n".join(lines)


def parse_args(argv=None):
    """main's arguments, the paths absolute and the default pair filled in (after --make)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make", action="store_true", help="first build what is missing of the default 1.7B-shaped pair under build/widened/")
    ap.add_argument("--champion", help=f"a .gguf file (or a model folder, then --gguf) (default {DEFAULT_CHAMPION})")
    ap.add_argument("--draft", help=f"a draft: .gguf file or model folder (default {DEFAULT_DRAFT} with the default champion; "
                                    "'none': no draft)")
    ap.add_argument("--gguf", help="the GGUF file wllama runs (default: the champion's own)")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--ks", default="2,3,4", help="the draft's k values, comma-separated")
    ap.add_argument("--wllama-threads", default="1,2", help="wllama's thread counts, comma-separated: one runner each "
                                                            "(more than 1 needs the cross-origin isolated page peer.py's server makes)")
    ap.add_argument("--engine-options", default="{}", help="Engine.create options as JSON (championBackend is wasm)")
    ap.add_argument("--no-wllama", action="store_true")
    ap.add_argument("--timeout-s", type=int, default=1800, help="per page call (a 1.7B load or request is slow)")
    ap.add_argument("--json", help=f"where the JSON goes, its Markdown beside it (default {DEFAULT_JSON})")
    args = ap.parse_args(argv)
    args.command = "python tools/bench/real_sizes.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    wllama_thread_counts(args.wllama_threads)
    default_pair = args.champion is None
    args.champion = args.champion or os.path.join(REPO, DEFAULT_CHAMPION)
    args.draft = None if args.draft == "none" else (args.draft or (os.path.join(REPO, DEFAULT_DRAFT) if default_pair else None))
    args.json = args.json or os.path.join(REPO, DEFAULT_JSON)
    for key in ("champion", "draft", "gguf", "json"):
        value = getattr(args, key)
        if value and not value.startswith("/"):
            setattr(args, key, os.path.abspath(value))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.make:
        print(f"real_sizes: models ready: {make_models()}", flush=True)
    for key in ("champion", "draft"):
        if getattr(args, key) and not os.path.exists(getattr(args, key)):
            raise SystemExit(f"E_BAD_ARGUMENT: --{key} {getattr(args, key)}: not found (the default pair: --make)")
    try:
        out = run(args)
    except peer.ExactSpecError as exc:
        raise SystemExit(str(exc)) from None
    text = report(out)
    print(text)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    write_file(args.json, json.dumps(out, indent=1))
    write_file(os.path.splitext(args.json)[0] + ".md", text + "\n")
    return 1 if any(any(d is not None for d in v) for v in out["agreement"]["draft_vs_alone"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
