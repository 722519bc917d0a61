"""The WASM champion's threads by default (issue 19 item 3): "auto" plans min(cores, 4) threads in a
cross-origin isolated page (1 elsewhere) and keeps them only when a calibrated forward is faster;
switching the count never changes a bit; the page `exactspec serve` sends is isolated; greedy and
seeded outputs are the same at 1, 2 and 3 threads (docs/browser.md, docs/champion_wasm.md)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile

import pytest

from browser_fixture import REPO_ROOT, chromium_browser, http_server  # noqa: F401
from engine_loads import FAST_LOAD, browser_runtime
from test_wasm_champion import ensure_wasm

BACKENDS = (REPO_ROOT / "web" / "orchestrator" / "champion_backends.mjs").as_uri()
CHAMPION_WASM = (REPO_ROOT / "web" / "champion_wasm" / "champion_wasm.mjs").as_uri()
MODEL_CONFIG = (REPO_ROOT / "web" / "formats" / "model_config.mjs").as_uri()
CHAMPION = REPO_ROOT / "web" / "models" / "champion"
DRAFT = REPO_ROOT / "web" / "models" / "draft"


def node(script: str) -> dict:
    """Run an ES module script in Node (from a file: worker_threads refuse --input-type); it
    prints one JSON line last."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "script.mjs")
        with open(path, "w") as f:
            f.write(script)
        out = subprocess.run(["node", path], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_auto_plans_threads_only_where_the_page_is_isolated():
    got = node(f"""
const m = await import({json.dumps(BACKENDS)});
const plan = (cores, isolated, requested = "auto") => {{
  Object.defineProperty(globalThis, "navigator", {{ value: {{ hardwareConcurrency: cores }}, configurable: true }});
  globalThis.crossOriginIsolated = isolated;
  try {{ const p = m.championThreads(requested); return [p.count, p.calibrate]; }} catch (e) {{ return e.code; }}
}};
console.log(JSON.stringify({{ not_isolated: plan(8, false), one_core: plan(1, true), two: plan(2, true),
  eight: plan(8, true), three_asked: plan(2, false, 3), zero: plan(2, true, 0), word: plan(2, true, "many") }}));
""")
    assert got == {"not_isolated": [1, False], "one_core": [1, False], "two": [2, True], "eight": [4, True],
                   "three_asked": [3, False], "zero": "E_BAD_ARGUMENT", "word": "E_BAD_ARGUMENT"}


def test_calibration_keeps_the_faster_count_and_needs_a_clear_gain():
    """A stand-in champion whose forward costs what its thread count says: the pool is kept only
    when at least 10% faster; a 2x gap settles it in 3 pairs; the champion is left at the choice."""
    got = node(f"""
const {{ calibrateThreads }} = await import({json.dumps(BACKENDS)});
function fake(cost) {{
  return {{ poolThreads: 2, threads: 2, maxBlock: 9, maxContext: 64, vocabSize: 100,
    setThreads(n) {{ this.threads = n; }},
    forwardNow() {{ const end = performance.now() + cost[this.threads]; while (performance.now() < end) {{}} }} }};
}}
const out = {{}};
for (const [name, cost] of Object.entries({{ slow_pool: {{ 1: 1, 2: 4 }}, fast_pool: {{ 1: 4, 2: 1 }}, marginal: {{ 1: 2, 2: 1.95 }} }})) {{
  const c = fake(cost);
  const r = calibrateThreads(c);
  out[name] = [r.threads, c.threads, r.reps];
}}
console.log(JSON.stringify(out));
""")
    assert got["slow_pool"] == [1, 1, 3]
    assert got["fast_pool"] == [2, 2, 3]
    assert got["marginal"][:2] == [1, 1] and got["marginal"][2] > 3


def test_switching_the_thread_count_keeps_every_logit_bit():
    """cpu_mt.wasm with a pool of 3, switched between 3 threads and 1 block by block (what the
    load's calibration does), gives the one-thread cpu.wasm's logits bit for bit; a count other
    than 1 or the pool's size is refused (every helper wakes for every step: a helper beyond the
    count would answer for a missing one)."""
    ensure_wasm()
    script = f"""
import {{ readFileSync }} from "node:fs";
import {{ createHash }} from "node:crypto";
const {{ createWasmChampion }} = await import({json.dumps(CHAMPION_WASM)});
const {{ validatedConfigFromJson }} = await import({json.dumps(MODEL_CONFIG)});
const dir = {json.dumps(str(CHAMPION))};
const load = (name, threads) => createWasmChampion({{ wasmBytes: readFileSync({json.dumps(str(REPO_ROOT / "web" / "build"))} + "/" + name),
  threads, maxBlock: 9, configJson: validatedConfigFromJson(readFileSync(dir + "/config.json")),
  weightsBytes: new Uint8Array(readFileSync(dir + "/model.q8.safetensors")) }});
const blocks = [[9, 0], [1, 9], [5, 10], [3, 12], [9, 15], [1, 24], [7, 25]];   // [n, start]: re-feeds roll back
async function run(champion, counts) {{
  const h = createHash("sha256");
  const V = champion.vocabSize;
  for (const [i, [n, start]] of blocks.entries()) {{
    if (counts) champion.setThreads(counts[i % counts.length]);
    champion.forwardNow(Int32Array.from({{ length: n }}, (_, j) => ((start + j) * 7919 + 13) % V), start);
    h.update(Buffer.from((await champion.readLogits(n)).buffer));
  }}
  return h.digest("hex");
}}
const one = await load("cpu.wasm", 1);
const pool = await load("cpu_mt.wasm", 3);
const want = await run(one, null), got = await run(pool, [3, 1, 1, 3]);
const refused = [4, 2, 0].map((n) => {{ try {{ pool.setThreads(n); return ""; }} catch (e) {{ return e.code; }} }});
one.destroy(); pool.destroy();
console.log(JSON.stringify({{ want, got, refused }}));
setTimeout(() => process.exit(0), 50);
"""
    got = node(script)
    assert got["got"] == got["want"] and got["refused"] == ["E_BAD_ARGUMENT"] * 3


# ----------------------------------------------------------------------------- in the page
PROMPTS = ["In the beginning God created", "To be, or not to be,", "And the LORD said unto Moses,"]


def answers(rt) -> dict:
    """Greedy answers in every mode and a seeded sampled draft answer, per prompt -> token ids."""
    out = {}
    for prompt in PROMPTS:
        for mode, temperature in (("none", 0), ("lookup", 0), ("draft", 0), ("draft", 1.0)):
            r = rt.generate({"prompt": prompt, "config": {"max_new_tokens": 24, "temperature": temperature,
                                                          "speculate": mode, "k": 4, "seed": 7}})["result"]
            assert r["error"] is None, r["error"]
            out[(prompt, mode, temperature)] = r["token_ids"]
            assert f"/threads-{rt.ready['info']['champion']['threads']}/" in r["receipt"]["hardware_class"]
    return out


@pytest.mark.browser
def test_served_page_is_isolated_and_auto_tries_every_core(chromium_browser):  # noqa: F811
    """The server `exactspec serve` runs sends COOP/COEP: the page is cross-origin isolated, so
    "auto" starts min(cores, 4) threads (> 1 on this 2-core machine), times them against one and
    says which it kept and why."""
    rt = browser_runtime(str(CHAMPION), None, browser=chromium_browser, champion_backend="wasm", threads="auto")
    try:
        isolated, cores = rt.page.evaluate("[crossOriginIsolated, typeof SharedArrayBuffer, navigator.hardwareConcurrency]")[::2], \
            rt.page.evaluate("navigator.hardwareConcurrency")
        assert isolated[0] is True
        champ = rt.ready["info"]["champion"]
        planned = min(cores, 4)
        assert planned > 1
        why = champ["threads_why"]
        print("auto:", champ["threads"], why, "warm-up:", champ.get("warmup_ms"))
        assert why.startswith(f"auto: {cores} cores, cross-origin isolated; ms per step")
        assert f"1 thread " in why and f"{planned} threads " in why and why.endswith(f": {champ['threads']} kept")
        assert champ["threads"] in (1, planned)
    finally:
        rt.close()


@pytest.mark.browser
def test_outputs_are_the_same_at_one_two_and_three_threads(chromium_browser):  # noqa: F811
    """The page's engine on the WASM champion at 1, 2 and 3 threads (explicit: no calibration, so
    each count really runs): every greedy mode and a seeded sampled draft answer give the same
    tokens; greedy lookup and draft equal champion-alone."""
    runs = {}
    for threads in (1, 2, 3):
        rt = browser_runtime(str(CHAMPION), str(DRAFT), browser=chromium_browser, champion_backend="wasm", threads=threads)
        try:
            assert rt.ready["info"]["champion"]["threads"] == threads
            runs[threads] = answers(rt)
        finally:
            rt.close()
    assert runs[2] == runs[1] and runs[3] == runs[1]
    for prompt in PROMPTS:
        alone = runs[1][(prompt, "none", 0)]
        assert runs[1][(prompt, "lookup", 0)] == alone and runs[1][(prompt, "draft", 0)] == alone
    print("threads 1/2/3 identical:", hashlib.sha256(json.dumps(sorted(map(str, runs[1].items()))).encode()).hexdigest()[:12])


@pytest.mark.browser
def test_without_isolation_auto_runs_one_thread_and_threads_are_refused(chromium_browser, http_server):  # noqa: F811
    """A page served without COOP/COEP (an embedding site that sends neither): no
    SharedArrayBuffer, so "auto" runs one thread and says why, and an explicit threads: 2 is a
    coded load error (docs/browser.md, "Threads: the headers to send")."""
    context = chromium_browser.new_context()
    try:
        page = context.new_page()

        def strip(route):
            response = route.fetch()
            headers = {k: v for k, v in response.headers.items() if not k.lower().startswith("cross-origin-")}
            route.fulfill(response=response, headers=headers)

        page.route("**/web/runner.html", strip)
        page.goto(http_server.url + "/web/runner.html")
        page.wait_for_function("() => window.runnerReady === true")
        assert page.evaluate("crossOriginIsolated") is False
        models = {"champion": "/web/models/champion/", "draft": None}
        ready = page.evaluate("([m, o]) => window.exactspecRunner.tryLoad(m, o)",
                              [models, {"championBackend": "wasm", "threads": "auto", **FAST_LOAD}])["ready"]
        assert ready["info"]["champion"]["threads"] == 1
        assert ready["info"]["champion"]["threads_why"] == "auto: the page is not cross-origin isolated (no SharedArrayBuffer)"
        refused = page.evaluate("([m, o]) => window.exactspecRunner.tryLoad(m, o)",
                                [models, {"championBackend": "wasm", "threads": 2, **FAST_LOAD}])
        assert refused["error"]["code"] == "E_BAD_ARGUMENT" and "SharedArrayBuffer" in refused["error"]["message"]
    finally:
        context.close()


def test_cli_threads_argument():
    """`--threads` is "auto" or a count >= 1 (anything else: E_BAD_ARGUMENT in one line)."""
    from exactspec.host.cli import build_parser
    parser = build_parser()
    assert parser.parse_args(["generate", "--prompt", "x"]).threads == "auto"
    assert parser.parse_args(["generate", "--prompt", "x", "--threads", "3"]).threads == 3
    for bad in ("0", "-1", "two"):
        r = subprocess.run([sys.executable, "-m", "exactspec.host.cli", "generate", "--prompt", "x", "--threads", bad],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT / "py")))
        assert r.returncode != 0 and "E_BAD_ARGUMENT: argument --threads: must be auto or a count >= 1" in r.stderr


@pytest.mark.browser
def test_cli_runs_the_wasm_champion_at_the_threads_asked():
    """`exactspec generate --backend browser --champion-backend wasm --threads 2 --json`: the
    receipt says threads-2, the load's timings include the warm-up phases, and the answer is the
    one-thread answer."""
    def run(threads):
        r = subprocess.run([sys.executable, "-m", "exactspec.host.cli", "generate", "--prompt", "In the beginning", "--backend", "browser",
                            "--champion-backend", "wasm", "--threads", str(threads), "--temperature", "0",
                            "--max-new-tokens", "12", "--json"], capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, PYTHONPATH=str(REPO_ROOT / "py")))
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)
    two, one = run(2), run(1)
    assert "/threads-2/" in two["receipt"]["hardware_class"] and "/threads-1/" in one["receipt"]["hardware_class"]
    load = two["timing_ms"]["load"]
    assert load["warmup"] > 0 and load["champion_warmup"] > 0
    assert two["token_ids"] == one["token_ids"]
    print("CLI first request ms/token:", [round(o["timing_ms"]["decode"] / max(1, len(o["token_ids"])), 2) for o in (two, one)])
