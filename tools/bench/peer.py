"""Side by side with llama.cpp: wllama (llama.cpp compiled to WASM, 1 thread, CPU) on an F32 GGUF
export of the champion, and our engine with each champion backend in every mode, on the same
prompts, in one headless Chromium page, interleaved over rounds so machine noise hits all alike.

    python tools/bench/peer.py [--rounds 3] [--prompts 3] [--max-new-tokens 40] [--k 4]
                               [--backends webgpu,wasm] [--modes none,draft,lookup] [--no-doc]

Modes: none | draft | lookup (at --k), NAME@K (draft@2: at k = 2), or NAME-adaptive (the
adaptive scheduler, k <= 8 chosen per round).

The GGUF is exported from model.q8.safetensors dequantised (export_gguf --weights q8): the function
our browser champion computes, so greedy tokens can be compared one for one. Prints a table,
writes build/bench/peer.json and replaces the generated section of docs/performance.md (date,
load, machine, commit). Numbers, not assertions: the machine is shared and noisy.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "py"))
sys.path.insert(0, os.path.join(REPO, "tools"))
from exactspec import server as static_server  # noqa: E402
from exactspec.safe_files import write_file  # noqa: E402

WLLAMA_PREFIX = "/node_modules/@wllama/wllama/"
WLLAMA_DIR = os.path.join(REPO, "node_modules", "@wllama", "wllama")
# wllama starts its worker from a blob: URL, which the app's `worker-src 'self'` forbids
BENCH_CSP = static_server.CONTENT_SECURITY_POLICY.replace("worker-src 'self'", "worker-src 'self' blob:")
PROMPTS = ["In the beginning God created", "To be, or not to be,", "And the LORD said unto Moses,",
           "What light through yonder window breaks?", "Blessed are the poor in spirit:"]
MODES = ("none", "draft", "lookup")
ADAPTIVE_K_MAX = 8


def mode_config(mode: str, k: int) -> dict:
    """'draft', 'draft@3', 'draft-adaptive', 'none', ... -> the engine config fields it sets."""
    name, _, at = mode.partition("@")
    adaptive = name.endswith("-adaptive")
    name = name.removesuffix("-adaptive")
    if name not in MODES:
        raise SystemExit(f"peer.py: unknown mode {mode!r}")
    cfg = {"speculate": name, "k": int(at) if at else (ADAPTIVE_K_MAX if adaptive else k)}
    if adaptive:
        cfg["scheduler"] = "adaptive"
    return cfg
MODELS = {"champion": "/web/models/champion/", "draft": "/web/models/draft/"}
GGUF_PATH = os.path.join("build", "gguf", "champion.q8src.f32.gguf")
DOC_PATH = os.path.join("docs", "performance.md")
SECTION_BEGIN, SECTION_END = "<!-- peer.py:begin -->", "<!-- peer.py:end -->"


class PeerServer(static_server.StaticServer):
    """The app's static server plus wllama's package folder, with a CSP that allows blob: workers:
    for this benchmark and its test only (`exactspec serve` never serves wllama)."""

    def __init__(self, mounts=None):
        super().__init__(mounts=mounts)
        handler = self.httpd.RequestHandlerClass   # a class made for this server alone (StaticServer)
        handler.mounts = {**handler.mounts, WLLAMA_PREFIX: os.path.realpath(WLLAMA_DIR)}
        handler.end_headers = _bench_end_headers


def _bench_end_headers(handler):
    for name, value in static_server.SECURITY_HEADERS:
        handler.send_header(name, BENCH_CSP if name == "Content-Security-Policy" else value)
    static_server.http.server.BaseHTTPRequestHandler.end_headers(handler)


def open_bench_page(browser, server, timeout_s: float = 600):
    """A fresh context + page on web/bench/peer.html, ready (window.peerBench)."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(timeout_s * 1000)
    page.goto(server.url + "/web/bench/peer.html")
    page.wait_for_function("() => window.peerReady === true")
    return context, page


# ---- pure: per-request numbers, summaries, the Markdown table ----

def decode_ms_per_token(first_token_ms, total_ms, n_tokens):
    """Page-clock time per token after the first (the first carries the prefill)."""
    return (total_ms - first_token_ms) / (n_tokens - 1) if n_tokens > 1 and first_token_ms is not None else None


def first_divergence(a: list, b: list):
    """Index of the first position where two token lists differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarise(records: list, load_ms: dict) -> list:
    """One row per (runner, temperature): medians over every prompt and round."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["runner"], r["temperature"]), []).append(r)
    rows = []
    for (runner, temperature), rs in groups.items():
        med = lambda key: round(statistics.median(v for v in (x[key] for x in rs) if v is not None), 2)
        rows.append({"runner": runner, "temperature": temperature, "requests": len(rs),
                     "ms_per_token": med("ms_per_token"), "own_ms_per_token": med("own_ms_per_token"),
                     "first_token_ms": med("first_token_ms"),
                     "tokens_per_round": med("tokens_per_round"), "tokens": med("n_tokens"),
                     "load_ms": round(load_ms[runner.rsplit(":", 1)[0]])})
    base = {row["temperature"]: row["ms_per_token"] for row in rows if row["runner"] == "wllama"}
    for row in rows:
        row["vs_wllama"] = round(base[row["temperature"]] / row["ms_per_token"], 3) if row["temperature"] in base else None
    return rows


def markdown_table(rows: list) -> str:
    lines = ["| runner | T | ms/token | vs wllama | own ms/token | first token ms | tokens/round | load s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        vs = f"{r['vs_wllama']:.2f}x" if r["vs_wllama"] is not None else "-"
        lines.append(f"| {r['runner']} | {r['temperature']:g} | {r['ms_per_token']:.1f} | {vs} | {r['own_ms_per_token']:.1f} | "
                     f"{r['first_token_ms']:.0f} | {r['tokens_per_round']:.2f} | {r['load_ms'] / 1000:.1f} |")
    return "\n".join(lines)


def replace_section(doc: str, section: str) -> str:
    """doc with the text between the bench markers replaced (appended when the markers are absent)."""
    block = f"{SECTION_BEGIN}\n{section.strip()}\n{SECTION_END}"
    if SECTION_BEGIN in doc and SECTION_END in doc:
        head, rest = doc.split(SECTION_BEGIN, 1)
        return head + block + rest.split(SECTION_END, 1)[1]
    return doc.rstrip("\n") + "\n\n" + block + "\n"


# ---- I/O: the run ----

def machine_facts(browser) -> dict:
    load = os.getloadavg()
    try:
        commit = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=30).stdout.strip()
    except OSError:
        commit = "unknown"
    return {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
            "load_1_5_15": [round(x, 2) for x in load], "cpus": os.cpu_count(), "machine": platform.machine(),
            "chromium": browser.version, "commit": commit}


def run(args) -> dict:
    from playwright.sync_api import sync_playwright
    from export_gguf import export_gguf
    from exactspec.browser_run import CHROMIUM, CHROMIUM_ARGS
    from exactspec.models import default_models_dir

    os.chdir(REPO)
    export_gguf(os.path.join(default_models_dir(), "champion"), GGUF_PATH, "f32", weights="q8")
    prompts = PROMPTS[:args.prompts]
    backends = [b for b in args.backends.split(",") if b]
    server = PeerServer()
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    out = {"machine": machine_facts(browser), "args": vars(args), "prompts": prompts, "load_ms": {},
           "unavailable": {}, "agreement": [], "records": []}
    try:
        context, page = open_bench_page(browser, server)
        call = lambda fn, *a: page.evaluate(f"(a) => window.peerBench.{fn}(...a)", list(a))
        w = call("loadWllama", "/" + GGUF_PATH.replace(os.sep, "/"), {"nThreads": 1})
        out["load_ms"]["wllama"], out["libllama"] = w["load_ms"], w["libllama"]
        ours = []
        for backend in backends:
            r = call("loadEngine", f"ours-{backend}", MODELS, {"championBackend": backend})
            if "refused" in r:
                out["unavailable"][backend] = r["refused"]
                print(f"ours-{backend}: unavailable: {r['refused']['code']}: {r['refused']['message']}", flush=True)
                continue
            ours.append(backend)
            out["load_ms"][f"ours-{backend}"] = r["load_ms"]
            out.setdefault("ready", {})[backend] = {k: r["ready"].get(k) for k in ("timing_ms", "champion_backend")}
        print("load ms:", json.dumps({k: round(v) for k, v in out["load_ms"].items()}), flush=True)

        modes = args.modes.split(",")

        def ours_request(backend, mode, temperature, prompt, seed):
            cfg = {"max_new_tokens": args.max_new_tokens, "temperature": temperature, "seed": seed,
                   **mode_config(mode, args.k)}
            r = call("engineGenerate", f"ours-{backend}", {"prompt": prompt, "config": cfg})
            if "refused" in r:
                raise RuntimeError(f"ours-{backend} {mode}: {r['refused']['code']}: {r['refused']['message']}")
            return r

        # untimed pass (warm-up of every runner): greedy tokens of wllama and of ours, every mode
        for prompt in prompts:
            w = call("wllamaGenerate", prompt, {"maxTokens": args.max_new_tokens, "temperature": 0, "withIds": True})
            entry = {"prompt": prompt, "wllama": w["token_ids"], "ours": {}}
            for backend in ours:
                for mode in modes:
                    ids = ours_request(backend, mode, 0, prompt, 0)["result"]["token_ids"]
                    entry["ours"][f"{backend}:{mode}"] = {"token_ids": ids, "first_divergence": first_divergence(ids, w["token_ids"])}
            out["agreement"].append(entry)
            print(f"greedy agreement {prompt!r}: " + ", ".join(
                f"{k} {'same' if v['first_divergence'] is None else 'differs at ' + str(v['first_divergence'])}"
                for k, v in entry["ours"].items()), flush=True)

        # timed rounds, interleaved: every runner and mode once per prompt, then the next round
        temperatures = [float(t) for t in args.temperatures.split(",")]
        for rnd in range(args.rounds):
            for temperature in temperatures:
                for i, prompt in enumerate(prompts):
                    seed = 1000 * rnd + i
                    w = call("wllamaGenerate", prompt, {"maxTokens": args.max_new_tokens, "temperature": temperature, "seed": seed})
                    out["records"].append({"runner": "wllama", "round": rnd, "temperature": temperature, "prompt": i,
                                           "n_tokens": w["n_tokens"], "first_token_ms": w["first_token_ms"],
                                           "ms_per_token": decode_ms_per_token(w["first_token_ms"], w["total_ms"], w["n_tokens"]),
                                           "tokens_per_round": 1.0, "llama_timings": w["timings"],
                                           "own_ms_per_token": (w["timings"] or {}).get("predicted_per_token_ms")})
                    for backend in ours:
                        for mode in modes:
                            r = ours_request(backend, mode, temperature, prompt, seed)
                            res = r["result"]
                            n = len(res["token_ids"])
                            out["records"].append({
                                "runner": f"ours-{backend}:{mode}", "round": rnd, "temperature": temperature, "prompt": i,
                                "n_tokens": n, "first_token_ms": r["first_token_ms"],
                                "ms_per_token": decode_ms_per_token(r["first_token_ms"], r["total_ms"], n),
                                "tokens_per_round": res["stats"].get("tokens_per_round") or 1.0,
                                "engine_timing_ms": res["timing_ms"],
                                "own_ms_per_token": res["timing_ms"]["decode"] / n if n else None})
            print(f"round {rnd + 1}/{args.rounds} done, load {os.getloadavg()[0]:.1f}", flush=True)
        call("unload")
        context.close()
        if "webgpu" in ours:
            out["webgpu_verify"] = webgpu_verify_ratio(browser, server, args.k)
    finally:
        browser.close()
        pw.stop()
        server.close()
    out["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out["rows"] = summarise(out["records"], out["load_ms"])
    return out


def webgpu_verify_ratio(browser, server, k: int, start_pos: int = 64, reps: int = 20) -> dict:
    """V(k+1)/V(1) of the WebGPU champion: round trips forward(n) + readLogits(n) at start_pos,
    timed by the GPU test harness (web/tests/gpu_harness.mjs, timeForward), medians of reps."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(600_000)
        page.goto(server.url + "/web/tests/gpu_harness.html")
        page.wait_for_function("() => !!window.harness")
        page.evaluate("() => window.harness.loadChampion('/web/models/champion/', 9, 512)")
        fill = [[[(7 * i + 3) % 4096 for i in range(s, min(s + 8, start_pos))], s] for s in range(0, start_pos, 8)]
        page.evaluate("(blocks) => window.harness.forwardBlocks(blocks).then(() => null)", fill)   # cache up to start_pos
        page.evaluate("([p]) => window.harness.timeForward([1], p, 2)", [start_pos])   # warm-up
        t = page.evaluate("([ns, p, reps]) => window.harness.timeForward(ns, p, reps)", [[1, k + 1], start_pos, reps])
    finally:
        context.close()
    v1, vk = t["1"]["median"], t[str(k + 1)]["median"]
    return {"k": k, "start_pos": start_pos, "reps": reps, "v1_ms": round(v1, 2), "vk1_ms": round(vk, 2),
            "ratio": round(vk / v1, 3), "min_ms": {"1": round(t["1"]["min"], 2), str(k + 1): round(t[str(k + 1)]["min"], 2)}}


def doc_section(out: dict) -> str:
    m = out["machine"]
    lines = [f"Last run: {m['date']}, commit `{m['commit']}`, {m['cpus']} CPUs ({m['machine']}), Chromium "
             f"{m['chromium']}, load average (1/5/15 min) {' / '.join(map(str, m['load_1_5_15']))} before and "
             f"{' / '.join(map(str, m['load_after']))} after; llama.cpp `{out.get('libllama')}` (wllama 3.13.0). "
             f"`python tools/bench/peer.py --rounds {out['args']['rounds']} --prompts {out['args']['prompts']} "
             f"--max-new-tokens {out['args']['max_new_tokens']} --k {out['args']['k']} --modes {out['args']['modes']}`: medians over "
             f"{len(out['prompts'])} prompts x {out['args']['rounds']} rounds.", "", markdown_table(out["rows"]), ""]
    agree = [(e["prompt"], k, v["first_divergence"]) for e in out["agreement"] for k, v in e["ours"].items()]
    same = sum(d is None for _, _, d in agree)
    lines.append(f"Greedy tokens, ours against wllama: {same} of {len(agree)} (prompt, backend, mode) runs identical"
                 + ("." if same == len(agree) else "; first divergences: " + ", ".join(
                     f"{p[:20]!r} {k} at {d}" for p, k, d in agree if d is not None) + "."))
    for backend, err in out["unavailable"].items():
        lines.append(f"Champion backend `{backend}`: unavailable in this engine ({err['code']}: {err['message']}).")
    if "webgpu_verify" in out:
        v = out["webgpu_verify"]
        lines.append(f"WebGPU verification cost: V({v['k'] + 1})/V(1) = **{v['ratio']:.2f}** ({v['vk1_ms']:.1f} ms / "
                     f"{v['v1_ms']:.1f} ms, medians of {v['reps']} round trips at position {v['start_pos']}).")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--backends", default="webgpu,wasm")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--modes", default="none,draft,lookup", help="none|draft|lookup[@K] or NAME-adaptive, comma-separated")
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite docs/performance.md")
    args = ap.parse_args(argv)
    out = run(args)
    section = doc_section(out)
    print(section)
    os.makedirs(os.path.join("build", "bench"), exist_ok=True)
    write_file(os.path.join("build", "bench", "peer.json"), json.dumps(out, indent=1))
    if not args.no_doc:
        with open(DOC_PATH) as f:
            doc = f.read()
        write_file(DOC_PATH, replace_section(doc, section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
