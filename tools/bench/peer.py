"""Side by side with llama.cpp: wllama (llama.cpp compiled to WASM, CPU, 1 and 2 threads) on a GGUF file,
and our engine with each champion backend in every mode, on the same prompts, in one headless
Chromium page, interleaved over rounds so machine noise hits all alike.

    python tools/bench/peer.py [--champion FOLDER|FILE.gguf|/URL.gguf] [--draft FOLDER] [--gguf FILE|/URL]
                               [--rounds 3] [--prompts 3] [--corpus-strata dialogue,summary,extraction]
                               [--corpus-only] [--max-new-tokens 40] [--k 4] [--backends webgpu,wasm]
                               [--modes none,draft,lookup] [--chat auto|on|off] [--no-doc] [--baseline COMMIT]
                               [--wllama-threads 1,2]
                               [--tfjs ONNX_FOLDER [--tfjs-dtypes fp32,int8] [--tfjs-threads 1,2]]

Modes: none | draft | lookup (at --k), NAME@K (draft@2: at k = 2), or NAME-adaptive (the
adaptive scheduler, k <= 8 chosen per round).

Without --champion: the shipped toy pair, and wllama on its GGUF exported from model.q8.safetensors
dequantised (export_gguf --weights q8): the function our browser champion computes. With a GGUF
--champion, wllama runs the very same file (unless --gguf names another). A champion with a chat
template gets every prompt as one user message in that template on both sides (--chat auto):
ours with chat: true, wllama with the same template rendered here as text (llama.cpp parses its
special tokens); the prompt's token count is checked equal on both sides. Greedy tokens are
compared one for one. Prints the tables, writes build/bench/ (JSON and Markdown) and replaces the
generated section of docs/performance.md (and, for a --champion, the "real model" sections of
docs/performance.md and docs/models.md), with the exact command, date, load and commit. Numbers,
not assertions: the machine is shared and noisy.

--wllama-threads: one wllama runner per thread count (wllama, wllama@2t, ...), each its own Wllama
instance (worker) in the page; a runner that does not really run its thread count (wllama falls back
to 1 thread without cross-origin isolation) stops the run. "vs wllama" and the doc's comparisons are
against wllama's fastest runner per temperature (llama.cpp at its best thread count).

--tfjs adds transformers.js (onnxruntime-web WASM) on an ONNX export of the same champion
(tools/bench/onnx_export.py; bench-only install: tools/bench/setup_onnx.sh): one runner per dtype
and thread count, each in an iframe of the page, timed with the page clock, its greedy tokens
compared with ours, and our champion alone set against its fastest runner (docs/performance.md).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "py"))
sys.path.insert(0, os.path.join(REPO, "tools"))
from exactspec.host import server as static_server  # noqa: E402
from exactspec.core.errors import E_INTERNAL, ExactSpecError, message_without_code  # noqa: E402
from exactspec.host.safe_files import copy_file, write_file  # noqa: E402

WLLAMA_PREFIX = "/node_modules/@wllama/wllama/"
WLLAMA_DIR = os.path.join(REPO, "node_modules", "@wllama", "wllama")
# transformers.js and onnxruntime-web (--tfjs): a bench-only install, build/tfjs/ (tools/bench/setup_onnx.sh)
TFJS_MODULES = os.path.join(REPO, "build", "tfjs", "node_modules")
TFJS_MOUNTS = {"/node_modules/@huggingface/transformers/": os.path.join(TFJS_MODULES, "@huggingface", "transformers"),
               "/node_modules/onnxruntime-web/": os.path.join(TFJS_MODULES, "onnxruntime-web")}
TFJS_DTYPES = ("fp32", "int8")           # onnx/model.onnx, onnx/model_int8.onnx (tools/bench/onnx_export.py)
# wllama starts its worker from a blob: URL, which the app's `worker-src 'self'` forbids; each
# transformers.js runner lives in a same-origin iframe of the bench page (web/bench/peer_tfjs.mjs)
BENCH_CSP = (static_server.CONTENT_SECURITY_POLICY.replace("worker-src 'self'", "worker-src 'self' blob:")
             .replace("frame-ancestors 'none'", "frame-ancestors 'self'"))
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
    cfg = {"speculate": name, "k": int(at) if at else (ADAPTIVE_K_MAX if adaptive else k),
           "prefix_reuse": False}   # every mode prefills the whole prompt, as the peer's fresh request does
    if adaptive:
        cfg["scheduler"] = "adaptive"
    return cfg
MODELS = {"champion": "/web/models/champion/", "draft": "/web/models/draft/"}
GGUF_PATH = os.path.join("build", "gguf", "champion.q8src.f32.gguf")
DOC_PATH = os.path.join("docs", "performance.md")
SECTION_BEGIN, SECTION_END = "<!-- peer.py:begin -->", "<!-- peer.py:end -->"
# a run with --champion (the real model) writes its own section, in both docs
REAL_DOC_PATHS = (os.path.join("docs", "performance.md"), os.path.join("docs", "models.md"))
REAL_BEGIN, REAL_END = "<!-- peer.py:real-model:begin -->", "<!-- peer.py:real-model:end -->"
CORPUS_DIR = os.path.join("eval", "corpus")
DEFAULT_STRATUM = "default"


def refusal(who: str, refused: dict) -> ExactSpecError:
    """The page's {code, message} as one coded error that names `who` (the code once)."""
    return ExactSpecError(refused["code"], f"{who}: {message_without_code(refused['code'], refused['message'])}")


def bench_models(champion, draft, gguf, mounts: dict) -> dict:
    """The URLs the page loads ({champion, draft, gguf}) and the champion's local file or folder.
    champion/draft/gguf: a folder or file here (mounted, or its path under web/), or a URL path the
    bench server already serves (/web/models/...). None: the shipped toy pair and its GGUF export."""
    from exactspec.host.browser_run import _url_for
    from exactspec.host.model_cache import browser_ready
    from exactspec.reference.models import default_models_dir

    def where(arg, name, role=None):
        if os.path.exists(arg):
            path = arg if arg.endswith(".gguf") or role is None else browser_ready(arg, role)
            return _url_for(path, name, mounts), os.path.realpath(arg)
        local = static_server.resolve_request_path(arg, REPO, mounts=mounts) if arg.startswith("/") else None
        if local is None:
            raise SystemExit(f"E_BAD_ARGUMENT: --{name} {arg}: neither a file or folder here nor a path the bench server serves")
        return arg, local

    if champion is None:
        toy = os.path.join(default_models_dir(), "champion")
        return {"champion": MODELS["champion"], "draft": MODELS["draft"], "local": toy,
                "gguf": where(gguf, "gguf")[0] if gguf else None}
    url, local = where(champion, "champion", "champion")
    if not local.endswith(".gguf") and not os.path.isfile(os.path.join(local, "config.json")):
        raise SystemExit(f"E_BAD_ARGUMENT: --champion {champion}: neither a .gguf file nor a model folder (no config.json)")
    return {"champion": url, "draft": where(draft, "draft", "draft")[0] if draft else None, "local": local,
            "gguf": where(gguf, "gguf")[0] if gguf else (url if local.endswith(".gguf") else None)}


def wllama_runners(threads: str) -> list:
    """--wllama-threads "1,2" -> [(runner name, threads)]: [("wllama", 1), ("wllama@2t", 2)]."""
    out = []
    for t in (t for t in threads.split(",") if t):
        if not t.isdigit() or int(t) < 1:
            raise SystemExit(f"E_BAD_ARGUMENT: --wllama-threads {t}: a thread count (1, 2, ...)")
        name = "wllama" if int(t) == 1 else f"wllama@{int(t)}t"
        if name not in (n for n, _ in out):
            out.append((name, int(t)))
    if not out:
        raise SystemExit("E_BAD_ARGUMENT: --wllama-threads: at least one thread count")
    return out


def is_wllama(runner: str) -> bool:
    return runner == "wllama" or runner.startswith("wllama@")


def wllama_best(rows: list) -> dict:
    """temperature -> the fastest wllama row (lowest ms/token) of that temperature."""
    best: dict = {}
    for r in rows:
        if is_wllama(r["runner"]) and (r["temperature"] not in best or r["ms_per_token"] < best[r["temperature"]]["ms_per_token"]):
            best[r["temperature"]] = r
    return best


def tfjs_runners(dtypes: str, threads: str) -> list:
    """--tfjs-dtypes "fp32,int8" and --tfjs-threads "1,2" -> [(runner name, dtype, threads)]:
    tfjs-fp32-t1, tfjs-fp32-t2, tfjs-int8-t1, ..."""
    out = []
    for dtype in (d for d in dtypes.split(",") if d):
        if dtype not in TFJS_DTYPES:
            raise SystemExit(f"E_BAD_ARGUMENT: --tfjs-dtypes {dtype}: one of {', '.join(TFJS_DTYPES)}")
        for t in (t for t in threads.split(",") if t):
            if not t.isdigit() or int(t) < 1:
                raise SystemExit(f"E_BAD_ARGUMENT: --tfjs-threads {t}: a thread count (1, 2, ...)")
            out.append((f"tfjs-{dtype}-t{int(t)}", dtype, int(t)))
    return out


def tfjs_model_url(folder: str, dtypes: list, mounts: dict) -> str:
    """The URL of the ONNX model folder transformers.js loads (tools/bench/onnx_export.py's output,
    mounted as /models/tfjs/ unless under web/), after checking it and build/tfjs/ hold what the
    runners need."""
    from exactspec.host.browser_run import _url_for
    files = ["config.json", "tokenizer.json", "tokenizer_config.json"]
    files += [os.path.join("onnx", "model.onnx" if d == "fp32" else f"model_{d}.onnx") for d in dtypes]
    missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise SystemExit(f"E_BAD_ARGUMENT: --tfjs {folder}: no {', '.join(missing)} (build/onnx_venv/bin/python "
                         "tools/bench/onnx_export.py MODEL.gguf FOLDER writes them)")
    if not all(os.path.isdir(path) for path in TFJS_MOUNTS.values()):
        raise SystemExit("E_BAD_ARGUMENT: --tfjs: transformers.js is not installed in build/tfjs/ "
                         "(bash tools/bench/setup_onnx.sh installs it)")
    return _url_for(folder, "tfjs", mounts)


def tfjs_comparison(rows: list) -> list:
    """Per temperature, our champion alone (every ours-BACKEND:none row) against transformers.js at
    its best (the fastest tfjs-* row): [{temperature, ours, tfjs, ours_ms, tfjs_ms, speedup}],
    speedup = tfjs ms/token / ours ms/token (2.0: ours twice as fast)."""
    out = []
    for t in sorted({r["temperature"] for r in rows}):
        tfjs = [r for r in rows if r["temperature"] == t and r["runner"].startswith("tfjs-")]
        if not tfjs:
            continue
        best = min(tfjs, key=lambda r: r["ms_per_token"])
        for r in rows:
            if r["temperature"] == t and r["runner"].startswith("ours-") and r["runner"].endswith(":none"):
                out.append({"temperature": t, "ours": r["runner"], "tfjs": best["runner"], "ours_ms": r["ms_per_token"],
                            "tfjs_ms": best["ms_per_token"], "speedup": round(best["ms_per_token"] / r["ms_per_token"], 3)})
    return out


def prompt_set(n: int, strata: list, corpus_only: bool = False) -> list:
    """[{stratum, text}]: the first n default prompts (none with corpus_only), then the first n of
    each eval/corpus stratum's dev split (the test split is read only by `exactspec bench --split test`)."""
    out = [] if corpus_only else [{"stratum": DEFAULT_STRATUM, "text": p} for p in PROMPTS[:n]]
    for stratum in strata:
        path = os.path.join(REPO, CORPUS_DIR, f"{stratum}.jsonl")
        if not os.path.isfile(path):
            raise SystemExit(f"E_BAD_ARGUMENT: --corpus-strata {stratum}: no {CORPUS_DIR}/{stratum}.jsonl")
        with open(path, encoding="utf-8") as f:
            items = [json.loads(line) for line in f if line.strip()]
        items = [item for item in items if item.get("split") != "test"]
        out += [{"stratum": stratum, "text": item["prompt"]} for item in items[:n]]
    return out


def chat_renderer(local: str):
    """text -> (the chat template's rendering of it as one user message, its token ids as our
    engine encodes it), for the champion at `local` (a .gguf file or a model folder); None when
    the champion has no chat template."""
    from exactspec.formats.chat import encode_chat_prompt, render_template, special_token_strings, template_of
    if local.endswith(".gguf"):
        from exactspec.formats.gguf import GGUFFile
        from exactspec.formats.gguf_tokenizer import load_tokenizer, tokenizer_config
        with GGUFFile(local) as f:
            tokenizer, tok_config = load_tokenizer(f), tokenizer_config(f)
    else:
        from exactspec.reference.models import read_tokenizer_config
        from exactspec.formats.tokenizer import Tokenizer
        tokenizer, tok_config = Tokenizer.from_file(os.path.join(local, "tokenizer.json")), read_tokenizer_config(local)
    if not tok_config.get("chat_template"):
        return None

    def render(text):
        messages = [{"role": "user", "content": text}]
        return (render_template(template_of(tok_config), messages, special_token_strings(tok_config)),
                encode_chat_prompt(tokenizer, tok_config, messages))
    return render


BASELINE_PREFIX = "/build/peer_baseline/"     # build/ is served: the checkout needs no mount


def baseline_tree(rev: str) -> str:
    """build/peer_baseline/REV: a checkout of REV with its WASM built and Pyodide beside it (made once,
    reused), served at /build/peer_baseline/REV/ so that its engine runs as it ran at that commit."""
    if not rev.isalnum():
        raise SystemExit(f"peer.py: --baseline {rev!r}: a commit id (hex) please")
    tree = os.path.join(REPO, "build", "peer_baseline", rev)
    if not os.path.isdir(tree):
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", tree, rev], check=True, timeout=120)
    if not os.path.isdir(os.path.join(tree, "web", "build")):
        subprocess.run(["bash", os.path.join(tree, "wasm", "build.sh")], check=True, timeout=600)
    pyodide = os.path.join(tree, "node_modules", "pyodide")
    if not os.path.isdir(pyodide):            # the server serves real files only: a copy, not a link
        source = os.path.join(REPO, "node_modules", "pyodide")
        for root, _dirs, names in os.walk(source):
            into = os.path.join(pyodide, os.path.relpath(root, source))
            os.makedirs(into, exist_ok=True)
            for name in names:
                copy_file(os.path.join(root, name), os.path.join(into, name))
    return os.path.realpath(tree)


class PeerServer(static_server.StaticServer):
    """The app's static server plus wllama's package folder and transformers.js's (build/tfjs/), with a
    CSP that allows blob: workers and same-origin frames: for this benchmark and its tests only
    (`exactspec serve` never serves wllama or transformers.js)."""

    def __init__(self, mounts=None):
        super().__init__(mounts=mounts)
        handler = self.httpd.RequestHandlerClass   # a class made for this server alone (StaticServer)
        handler.mounts = {**handler.mounts, WLLAMA_PREFIX: os.path.realpath(WLLAMA_DIR),
                          **{prefix: os.path.realpath(path) for prefix, path in TFJS_MOUNTS.items()}}
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


def median_or_none(values, digits: int = 2):
    """The median of the values that are not None, rounded; None when there are none (a runner
    without a clock of its own: transformers.js has no own ms/token)."""
    values = [v for v in values if v is not None]
    return round(statistics.median(values), digits) if values else None


def summarise(records: list, load_ms: dict) -> list:
    """One row per (runner, temperature): medians over every prompt and round; vs_wllama against
    wllama's fastest runner of that temperature."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["runner"], r["temperature"]), []).append(r)
    rows = []
    for (runner, temperature), rs in groups.items():
        med = lambda key: median_or_none(x[key] for x in rs)
        rows.append({"runner": runner, "temperature": temperature, "requests": len(rs),
                     "ms_per_token": med("ms_per_token"), "own_ms_per_token": med("own_ms_per_token"),
                     "first_token_ms": med("first_token_ms"),
                     "tokens_per_round": med("tokens_per_round"), "tokens": med("n_tokens"),
                     "load_ms": round(load_ms[runner.rsplit(":", 1)[0]])})
    base = {t: row["ms_per_token"] for t, row in wllama_best(rows).items()}
    for row in rows:
        row["vs_wllama"] = round(base[row["temperature"]] / row["ms_per_token"], 3) if row["temperature"] in base else None
    return rows


def markdown_table(rows: list) -> str:
    lines = ["| runner | T | ms/token | vs wllama | own ms/token | first token ms | tokens/round | load s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        vs = f"{r['vs_wllama']:.2f}x" if r["vs_wllama"] is not None else "-"
        own = f"{r['own_ms_per_token']:.1f}" if r["own_ms_per_token"] is not None else "-"
        lines.append(f"| {r['runner']} | {r['temperature']:g} | {r['ms_per_token']:.1f} | {vs} | {own} | "
                     f"{r['first_token_ms']:.0f} | {r['tokens_per_round']:.2f} | {r['load_ms'] / 1000:.1f} |")
    return "\n".join(lines)


def stratum_rows(records: list) -> list:
    """One row per (runner, temperature, stratum): medians of ms/token and tokens per round."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["runner"], r["temperature"], r["stratum"]), []).append(r)
    med = lambda rs, key: round(statistics.median(v for v in (x[key] for x in rs) if v is not None), 2)
    return [{"runner": runner, "temperature": t, "stratum": stratum, "requests": len(rs),
             "ms_per_token": med(rs, "ms_per_token"), "tokens_per_round": med(rs, "tokens_per_round")}
            for (runner, t, stratum), rs in groups.items()]


def stratum_table(rows: list) -> str:
    lines = ["| runner | T | stratum | ms/token | tokens/round |", "|---|---|---|---|---|"]
    lines += [f"| {r['runner']} | {r['temperature']:g} | {r['stratum']} | {r['ms_per_token']:.1f} | {r['tokens_per_round']:.2f} |"
              for r in rows]
    return "\n".join(lines)


def load_table(load_ms: dict, second_load_ms: dict) -> str:
    lines = ["| runner | first load s | second load s (same page) |", "|---|---|---|"]
    lines += [f"| {name} | {ms / 1000:.1f} | " + (f"{second_load_ms[name] / 1000:.1f} |" if name in second_load_ms else "- |")
              for name, ms in load_ms.items()]
    return "\n".join(lines)


def replace_section(doc: str, section: str, begin: str = SECTION_BEGIN, end: str = SECTION_END) -> str:
    """doc with the text between the markers begin/end replaced (appended when they are absent)."""
    block = f"{begin}\n{section.strip()}\n{end}"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
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
    from exactspec.host.browser_run import CHROMIUM, CHROMIUM_ARGS

    os.chdir(REPO)
    mounts: dict = {}
    models = bench_models(args.champion, args.draft, args.gguf, mounts)
    if models["gguf"] is None:                 # a model folder: wllama runs its F32 export
        from export_gguf import export_gguf
        q8 = os.path.isfile(os.path.join(models["local"], "model.q8.safetensors"))
        path = GGUF_PATH if args.champion is None else os.path.join(
            "build", "gguf", os.path.basename(models["local"].rstrip(os.sep)) + (".q8src" if q8 else "") + ".f32.gguf")
        export_gguf(models["local"], path, "f32", weights="q8" if q8 else "f32")
        models["gguf"] = "/" + path.replace(os.sep, "/")
    modes = (args.modes or ("none,draft,lookup" if models["draft"] else "none,lookup")).split(",")
    if models["draft"] is None and any(mode_config(m, args.k)["speculate"] == "draft" for m in modes):
        raise SystemExit(f"E_BAD_ARGUMENT: --modes {','.join(modes)}: draft needs a draft model (--draft FOLDER)")
    render = None if args.chat == "off" or (args.chat == "auto" and args.champion is None) else chat_renderer(models["local"])
    if args.chat == "on" and render is None:
        raise SystemExit(f"E_BAD_ARGUMENT: --chat on: the champion {args.champion or 'toy'} has no chat template")
    strata = [s for s in args.corpus_strata.split(",") if s]
    if args.corpus_only and not strata:
        raise SystemExit("E_BAD_ARGUMENT: --corpus-only needs --corpus-strata")
    prompts = prompt_set(args.prompts, strata, args.corpus_only)
    for p in prompts:
        p["wllama_prompt"], p["prompt_ids"] = render(p["text"]) if render else (p["text"], None)
    backends = [b for b in args.backends.split(",") if b]
    if args.baseline:                          # the same backends from an earlier commit's engine, interleaved
        baseline_tree(args.baseline)
        backends += [f"{b}@{args.baseline}" for b in backends]
    wllamas = wllama_runners(args.wllama_threads)
    tfjs = tfjs_runners(args.tfjs_dtypes, args.tfjs_threads) if args.tfjs else []
    if args.tfjs:
        models["tfjs"] = tfjs_model_url(args.tfjs, [dtype for _, dtype, _ in tfjs], mounts)
    server = PeerServer(mounts=mounts)
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    out = {"machine": machine_facts(browser), "args": vars(args), "command": args.command, "models": models,
           "chat": render is not None, "prompts": prompts, "load_ms": {}, "second_load_ms": {},
           "unavailable": {}, "agreement": [], "records": [], "wllama": {}, "tfjs": {}}
    engine_models = {"champion": models["champion"], "draft": models["draft"]}
    try:
        context, page = open_bench_page(browser, server)
        call = lambda fn, *a: page.evaluate(f"(a) => window.peerBench.{fn}(...a)", list(a))
        tcall = lambda fn, *a: page.evaluate(f"(a) => window.peerTfjs.{fn}(...a)", list(a))

        def tfjs_request(name, prompt, temperature):
            t = tcall("generate", name, prompt["wllama_prompt"], {"maxTokens": args.max_new_tokens, "temperature": temperature,
                                                                   "ids": prompt.get("tfjs_ids"), "chat": render is not None})
            if "refused" in t:
                raise refusal(name, t["refused"])
            return t
        for wname, threads in wllamas:               # one Wllama instance (worker) per runner, side by side
            for key in ("load_ms", "second_load_ms"):    # the second load replaces the first in the same page
                w = call("loadWllama", models["gguf"], {"name": wname, "nThreads": threads})
                out[key][wname], out["libllama"] = w["load_ms"], w["libllama"]
            out["wllama"][wname] = wllama_threads_checked(wname, threads, w)
        ours = []
        for backend in backends:
            name = f"ours-{backend}"
            for key in ("load_ms", "second_load_ms"):   # first load, terminate, second load in the same page
                if key == "second_load_ms":
                    call("unloadEngine", name)
                kind, _, rev = backend.partition("@")
                r = call("loadEngine", name, engine_models, {"championBackend": kind},
                         f"{BASELINE_PREFIX}{rev}/web/engine.mjs" if rev else None)
                if "refused" in r and r["refused"]["code"] != "E_NO_WEBGPU":   # e.g. a draft the pair check refuses
                    raise refusal(name, r["refused"])
                if "refused" in r:
                    out["unavailable"][backend] = r["refused"]
                    print(f"{name}: unavailable: {r['refused']['code']}: {r['refused']['message']}", flush=True)
                    break
                out[key][name] = r["load_ms"]
                out.setdefault("ready", {})[backend] = {k: r["ready"].get(k) for k in ("timing_ms", "champion_backend")}
            else:
                ours.append(backend)
        for name, dtype, threads in tfjs:               # one iframe each: onnxruntime-web's threads are per realm
            r = tcall("open", name, models["tfjs"], dtype, threads)
            if "refused" in r:
                raise refusal(name, r["refused"])
            if r["threads"] != threads:
                raise ExactSpecError(E_INTERNAL, f"{name}: onnxruntime-web runs {r['threads']} threads, not {threads} "
                                                 f"(page cross-origin isolated: {r['cross_origin_isolated']})")
            out["load_ms"][name] = r["load_ms"]
            out["tfjs"][name] = {"dtype": dtype, "threads": threads, "version": r["version"]}
        print("load ms (first):", json.dumps({k: round(v) for k, v in out["load_ms"].items()}),
              "(second):", json.dumps({k: round(v) for k, v in out["second_load_ms"].items()}), flush=True)

        def ours_request(backend, mode, temperature, prompt, seed):
            cfg = {"max_new_tokens": args.max_new_tokens, "temperature": temperature, "seed": seed,
                   **mode_config(mode, args.k)}
            r = call("engineGenerate", f"ours-{backend}", {"prompt": prompt["text"], "chat": render is not None, "config": cfg})
            if "refused" in r:
                raise refusal(f"ours-{backend} {mode}", r["refused"])
            return r

        # untimed pass (warm-up of every runner): greedy tokens of wllama and of ours, every mode; ours
        # and every other wllama runner are compared with the first wllama runner ("wllama": 1 thread)
        for prompt in prompts:
            ws = {wname: call("wllamaGenerate", prompt["wllama_prompt"], {"name": wname, "maxTokens": args.max_new_tokens,
                                                                           "temperature": 0, "withIds": True})
                  for wname, _ in wllamas}
            w = ws[wllamas[0][0]]
            entry = {"prompt": prompt["text"], "stratum": prompt["stratum"], "wllama": w["token_ids"],
                     "wllama_prompt_tokens": w["prompt_tokens"], "wllama_runner": wllamas[0][0], "ours": {},
                     "wllama_runners": {wname: {"token_ids": v["token_ids"], "prompt_tokens": v["prompt_tokens"],
                                                "first_divergence": first_divergence(v["token_ids"], w["token_ids"])}
                                        for wname, v in ws.items()}}
            for backend in ours:
                for mode in modes:
                    res = ours_request(backend, mode, 0, prompt, 0)["result"]
                    entry["ours"][f"{backend}:{mode}"] = {"token_ids": res["token_ids"], "prompt_tokens": len(res["prompt_ids"]),
                                                          "first_divergence": first_divergence(res["token_ids"], w["token_ids"])}
                    if prompt["prompt_ids"] is not None and res["prompt_ids"] != prompt["prompt_ids"]:
                        raise ExactSpecError(E_INTERNAL, f"ours-{backend} {mode}: the engine's chat prompt ids differ from "
                                                         "the template's rendered here")
                    entry.setdefault("ours_prompt_ids", res["prompt_ids"])
            ours_ids = next(iter(entry["ours"].values()))["token_ids"] if entry["ours"] else None
            prompt["tfjs_ids"] = entry.get("ours_prompt_ids")   # transformers.js continues our prompt ids
            for name, _, _ in tfjs:                     # (and tokenizes the same text itself, for the check)
                t = tfjs_request(name, prompt, 0)
                entry.setdefault("tfjs", {})[name] = {
                    "token_ids": t["token_ids"], "prompt_tokens": len(t["prompt_ids"]), "prompt_ids": t["prompt_ids"],
                    "same_prompt_ids": t["prompt_ids"] == entry["ours_prompt_ids"] if "ours_prompt_ids" in entry else None,
                    "compared": ours_ids is not None,       # no ours runner: nothing to compare with
                    "first_divergence": first_divergence(t["token_ids"], ours_ids) if ours_ids is not None else None,
                    "first_divergence_wllama": first_divergence(t["token_ids"], w["token_ids"])}
            out["agreement"].append(entry)
            same_prompt = all(v["prompt_tokens"] == w["prompt_tokens"] for v in entry["ours"].values())
            print(f"greedy agreement {prompt['text'][:40]!r} (prompt tokens {w['prompt_tokens']}"
                  f"{'' if same_prompt else ', NOT the same count as ours'}): " + ", ".join(
                      f"{k} {'same' if v['first_divergence'] is None else 'differs at ' + str(v['first_divergence'])}"
                      for k, v in entry["ours"].items()), flush=True)
            for wname, v in list(entry["wllama_runners"].items())[1:]:
                print(f"  {wname} against {wllamas[0][0]}: {'same' if v['first_divergence'] is None else 'differs at ' + str(v['first_divergence'])}",
                      flush=True)
            for name, v in entry.get("tfjs", {}).items():
                print(f"  {name} against ours: {'same' if v['first_divergence'] is None else 'differs at ' + str(v['first_divergence'])}"
                      f"{'' if v['same_prompt_ids'] is not False else ' (prompt ids NOT the same as ours)'}", flush=True)

        # timed rounds, interleaved: every runner and mode once per prompt, then the next round
        temperatures = [float(t) for t in args.temperatures.split(",")]
        for rnd in range(args.rounds):
            for temperature in temperatures:
                for i, prompt in enumerate(prompts):
                    seed = 1000 * rnd + i
                    common = {"round": rnd, "temperature": temperature, "prompt": i, "stratum": prompt["stratum"]}
                    for wname, _ in wllamas:
                        w = call("wllamaGenerate", prompt["wllama_prompt"], {"name": wname, "maxTokens": args.max_new_tokens,
                                                                             "temperature": temperature, "seed": seed})
                        out["records"].append({"runner": wname, **common,
                                               "n_tokens": w["n_tokens"], "first_token_ms": w["first_token_ms"],
                                               "ms_per_token": decode_ms_per_token(w["first_token_ms"], w["total_ms"], w["n_tokens"]),
                                               "tokens_per_round": 1.0, "llama_timings": w["timings"],
                                               "own_ms_per_token": (w["timings"] or {}).get("predicted_per_token_ms")})
                    for name, _, _ in tfjs:
                        t = tfjs_request(name, prompt, temperature)
                        out["records"].append({"runner": name, **common, "n_tokens": t["n_tokens"],
                                               "first_token_ms": t["first_token_ms"],
                                               "ms_per_token": decode_ms_per_token(t["first_token_ms"], t["total_ms"], t["n_tokens"]),
                                               "tokens_per_round": 1.0, "own_ms_per_token": None})
                    for backend in ours:
                        for mode in modes:
                            r = ours_request(backend, mode, temperature, prompt, seed)
                            res = r["result"]
                            n = len(res["token_ids"])
                            out["records"].append({
                                "runner": f"ours-{backend}:{mode}", **common,
                                "n_tokens": n, "first_token_ms": r["first_token_ms"],
                                "ms_per_token": decode_ms_per_token(r["first_token_ms"], r["total_ms"], n),
                                "tokens_per_round": res["stats"].get("tokens_per_round") or 1.0,
                                "engine_timing_ms": res["timing_ms"],
                                "own_ms_per_token": res["timing_ms"]["decode"] / n if n else None})
            print(f"round {rnd + 1}/{args.rounds} done, load {os.getloadavg()[0]:.1f}", flush=True)
        for name, _, _ in tfjs:
            tcall("close", name)
        call("unload")
        context.close()
        if "webgpu" in ours and args.champion is None:     # the harness loads the toy champion
            out["webgpu_verify"] = webgpu_verify_ratio(browser, server, args.k)
    finally:
        browser.close()
        pw.stop()
        server.close()
    out["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out["rows"] = summarise(out["records"], out["load_ms"])
    out["stratum_rows"] = stratum_rows(out["records"])
    return out


def wllama_threads_checked(name: str, threads: int, loaded: dict) -> dict:
    """The page's account of wllama runner `name` (loadWllama's answer) -> its thread facts, after
    checking that it really runs `threads` threads: wllama's own count, and for more than one its
    worker's pthread pool of that size (wllama quietly runs 1 thread on a page that is not
    cross-origin isolated)."""
    facts = {"threads": threads, **{k: loaded.get(k) for k in ("n_threads", "multithread", "pthread_pool", "cross_origin_isolated")}}
    if loaded.get("n_threads") != threads or (threads > 1 and (not loaded.get("multithread") or loaded.get("pthread_pool") != threads)):
        raise ExactSpecError(E_INTERNAL, f"{name}: wllama runs {loaded.get('n_threads')} thread(s) (pthread pool "
                                         f"{loaded.get('pthread_pool')}), not {threads} (page cross-origin isolated: "
                                         f"{loaded.get('cross_origin_isolated')})")
    return facts


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


def tfjs_doc_lines(out: dict) -> list:
    """The doc's lines on the transformers.js runners (none without --tfjs): what ran, greedy
    agreement with ours, prompt ids, and ours alone against transformers.js at its best."""
    if not out.get("tfjs"):
        return []
    versions = sorted({v["version"] for v in out["tfjs"].values()})
    lines = [f"transformers.js {', '.join(versions)} (onnxruntime-web, WASM backend, each runner in its own iframe of the "
             f"cross-origin-isolated page) on `{out['models']['tfjs']}`: " + ", ".join(
                 f"{name} ({v['dtype']}, {v['threads']} thread{'s' if v['threads'] > 1 else ''})" for name, v in out["tfjs"].items())
             + "; it continues our prompt ids (its own tokenization of the text is checked against them) and "
               "samples with Math.random (no seed)."]
    agree = [(e["prompt"], name, v) for e in out["agreement"] for name, v in e.get("tfjs", {}).items() if v["compared"]]
    same = [a for a in agree if a[2]["first_divergence"] is None]
    lines.append(f"Greedy tokens, transformers.js against ours: {len(same)} of {len(agree)} (prompt, runner) runs identical"
                 + ("." if len(same) == len(agree) else "; first divergences: " + ", ".join(
                     f"{p[:20]!r} {name} at {v['first_divergence']}" for p, name, v in agree if v["first_divergence"] is not None) + "."))
    differ = sorted({name for _, name, v in agree if v["same_prompt_ids"] is False})
    lines.append("Prompt token ids, transformers.js against ours: " + (
        "the same for every prompt." if not differ else "different for " + ", ".join(differ) + "."))
    for c in tfjs_comparison(out["rows"]):
        lines.append(f"T = {c['temperature']:g}: {c['ours']} {c['ours_ms']:.1f} ms/token against transformers.js at its best "
                     f"({c['tfjs']}, {c['tfjs_ms']:.1f}): **{c['speedup']:.2f}x**.")
    return lines


def wllama_doc_lines(out: dict) -> list:
    """The doc's lines on wllama's runners: greedy tokens of each against the first, and wllama at its
    best (the fastest runner, the one every "vs wllama" is against) per temperature."""
    runners = list(out.get("wllama") or {})
    lines = []
    if len(runners) > 1:
        agree = [(e["prompt"], name, v["first_divergence"]) for e in out["agreement"]
                 for name, v in e.get("wllama_runners", {}).items() if name != runners[0]]
        same = sum(d is None for _, _, d in agree)
        lines.append(f"Greedy tokens, {', '.join(runners[1:])} against {runners[0]}: {same} of {len(agree)} (prompt, runner) runs identical"
                     + ("." if same == len(agree) else "; first divergences: " + ", ".join(
                         f"{p[:20]!r} {name} at {d}" for p, name, d in agree if d is not None) + "."))
    best = wllama_best(out["rows"])
    if best:
        lines.append("wllama at its best thread count (the fastest runner: \"vs wllama\" is against it): " + "; ".join(
            f"T = {t:g}: {r['runner']} {r['ms_per_token']:.1f} ms/token" for t, r in sorted(best.items())) + ".")
    return lines


def wllama_threads_text(out: dict) -> str:
    """"1 thread" or "runners wllama (1 thread), wllama@2t (2 threads)" (older JSON: 1 thread)."""
    runners = out.get("wllama") or {"wllama": {"threads": 1}}
    if len(runners) == 1:
        (v,) = runners.values()
        return f"{v['threads']} thread{'s' if v['threads'] > 1 else ''}"
    return "runners " + ", ".join(f"{name} ({v['threads']} thread{'s' if v['threads'] > 1 else ''})" for name, v in runners.items())


def doc_section(out: dict) -> str:
    m, a = out["machine"], out["args"]
    models = out["models"]
    what = (f"champion `{models['champion']}`" + (f", draft `{models['draft']}`" if models["draft"] else ", no draft")
            + f"; wllama on `{models['gguf']}`" + ("; every prompt as one user message in the champion's chat template"
                                                    " on both sides" if out["chat"] else "; raw prompts"))
    lines = [f"Last run: {m['date']}, commit `{m['commit']}`, {m['cpus']} CPUs ({m['machine']}), Chromium "
             f"{m['chromium']}, load average (1/5/15 min) {' / '.join(map(str, m['load_1_5_15']))} before and "
             f"{' / '.join(map(str, m['load_after']))} after; llama.cpp `{out.get('libllama')}` (wllama 3.13.0, "
             f"{wllama_threads_text(out)}); {what}.",
             "", f"`{out['command']}`: medians over {len(out['prompts'])} prompts x {a['rounds']} rounds.",
             "", markdown_table(out["rows"]), "", "Load (page clock):", "", load_table(out["load_ms"], out["second_load_ms"]), ""]
    if len({p["stratum"] for p in out["prompts"]}) > 1:
        lines += ["Per stratum:", "", stratum_table(out["stratum_rows"]), ""]
    agree = [(e["prompt"], k, v["first_divergence"]) for e in out["agreement"] for k, v in e["ours"].items()]
    same = sum(d is None for _, _, d in agree)
    ref = next(iter(out.get("wllama") or {"wllama": None}))
    lines.append(f"Greedy tokens ({a['max_new_tokens']} at most), ours against {ref}: {same} of {len(agree)} (prompt, backend, mode) runs identical"
                 + ("." if same == len(agree) else "; first divergences: " + ", ".join(
                     f"{p[:20]!r} {k} at {d}" for p, k, d in agree if d is not None) + "."))
    counts = [e for e in out["agreement"] if any(v["prompt_tokens"] != e["wllama_prompt_tokens"] for v in e["ours"].values())]
    lines.append("Prompt token counts: " + ("the same on both sides for every prompt." if not counts else
                                            f"different for {len(counts)} prompts: " + ", ".join(repr(e["prompt"][:20]) for e in counts) + "."))
    lines += wllama_doc_lines(out)
    lines += tfjs_doc_lines(out)
    for backend, err in out["unavailable"].items():
        lines.append(f"Champion backend `{backend}`: unavailable in this engine ({err['code']}: {err['message']}).")
    if "webgpu_verify" in out:
        v = out["webgpu_verify"]
        lines.append(f"WebGPU verification cost: V({v['k'] + 1})/V(1) = **{v['ratio']:.2f}** ({v['vk1_ms']:.1f} ms / "
                     f"{v['v1_ms']:.1f} ms, medians of {v['reps']} round trips at position {v['start_pos']}).")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--champion", help="a model folder, a .gguf file, or a URL path the bench server serves "
                                       "(default: the shipped toy pair)")
    ap.add_argument("--draft", help="a draft model folder (default: none with --champion; the toy draft without)")
    ap.add_argument("--gguf", help="the GGUF file wllama runs (default: a GGUF champion itself; else the champion's F32 export)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=3, help="default prompts, and prompts of each corpus stratum")
    ap.add_argument("--corpus-strata", default="", help="eval/corpus strata to add, comma-separated (e.g. dialogue,summary,extraction)")
    ap.add_argument("--corpus-only", action="store_true",
                    help="only the corpus strata's prompts: none of the default prompts (verses the toy pair has memorised)")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--backends", default="webgpu,wasm")
    ap.add_argument("--baseline", help="a commit: its engine runs beside this one, interleaved, as BACKEND@COMMIT "
                                       "(a checkout under build/peer_baseline/, built once)")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--modes", help="none|draft|lookup[@K] or NAME-adaptive, comma-separated "
                                    "(default: none,draft,lookup; none,lookup without a draft)")
    ap.add_argument("--chat", choices=("auto", "on", "off"), default="auto",
                    help="prompts in the champion's chat template (auto: for a --champion that has one)")
    ap.add_argument("--json", help="where the run's JSON goes, its Markdown beside it "
                                         "(default build/bench/peer.json; peer_real_model.json with --champion)")
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite the docs' generated sections")
    ap.add_argument("--wllama-threads", default="1,2",
                    help="wllama thread counts, comma-separated: one runner each (wllama, wllama@2t, ...)")
    ap.add_argument("--tfjs", help="an ONNX model folder (tools/bench/onnx_export.py) of the same champion: adds "
                                   "transformers.js runners (onnxruntime-web WASM; bash tools/bench/setup_onnx.sh)")
    ap.add_argument("--tfjs-threads", default="1,2", help="transformers.js thread counts, comma-separated")
    ap.add_argument("--tfjs-dtypes", default="fp32,int8", help="transformers.js ONNX dtypes: fp32, int8")
    args = ap.parse_args(argv)
    args.command = "python tools/bench/peer.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    for key in ("champion", "draft", "gguf", "json", "tfjs"):    # paths as given from here (run() works from the repository)
        value = getattr(args, key)
        if value and not value.startswith("/"):
            setattr(args, key, os.path.abspath(value))
    try:
        out = run(args)
    except ExactSpecError as exc:                 # one code, one sentence
        raise SystemExit(str(exc)) from None
    except Exception as exc:                      # a page's exception (wllama or our engine refused): its coded line
        from exactspec.host.browser_run import _coded_from
        if type(exc).__module__.startswith("playwright"):
            raise SystemExit(str(_coded_from(exc))) from None
        raise
    section = doc_section(out)
    print(section)
    name = "peer" if args.champion is None else "peer_real_model"
    json_path = args.json or os.path.join("build", "bench", name + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    write_file(json_path, json.dumps(out, indent=1))
    write_file(os.path.splitext(json_path)[0] + ".md", section + "\n")
    if not args.no_doc:
        targets = [(DOC_PATH, SECTION_BEGIN, SECTION_END)] if args.champion is None else [
            (path, REAL_BEGIN, REAL_END) for path in REAL_DOC_PATHS]
        for path, begin, end in targets:
            with open(path, encoding="utf-8") as f:
                doc = f.read()
            write_file(path, replace_section(doc, section, begin, end))
    return 0


if __name__ == "__main__":
    sys.exit(main())
