"""wllama (llama.cpp compiled to WASM) on our F32 GGUF export gives exactly our champion's greedy
tokens (LlamaReference, f32 weights), at 1 thread and (runner wllama@2t, beside it) really at 2;
only the benchmark's server serves wllama; tools/bench/peer.py
on the real model (SmolLM2 GGUF) gives wllama's greedy tokens on the very same file. Starts Chromium:
run under the browser lock (flock /tmp/browser.lock ...)."""
import importlib.util
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from browser_fixture import REPO_ROOT, chromium_browser  # noqa: F401
from gguf_builders import REPO as REPO_FOR_PATHS, smollm2_path
from exactspec.reference.models import default_models_dir, load_pair
from exactspec.core.orchestrator import GenerationConfig
from exactspec.reference.processors import SamplingPolicy
from exactspec.host.server import CONTENT_SECURITY_POLICY, StaticServer
from exactspec.core.errors import ExactSpecError

sys.path.insert(0, str(REPO_ROOT / "tools" / "bench"))
import peer  # noqa: E402  (tools/bench/peer.py: PeerServer, open_bench_page)

_spec = importlib.util.spec_from_file_location("export_gguf", REPO_ROOT / "tools" / "export_gguf.py")
export_gguf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(export_gguf)

CHAMPION = os.path.join(default_models_dir(), "champion")
PROMPTS = ["In the beginning God created", "To be, or not to be,", "And the LORD said unto Moses,"]
N_TOKENS = 24
WLLAMA_JS = "/node_modules/@wllama/wllama/esm/index.js"


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def test_only_the_bench_server_serves_wllama():
    app, bench = StaticServer(REPO_ROOT), peer.PeerServer()
    try:
        assert _get(app.url + WLLAMA_JS)[0] == 404
        status, headers = _get(bench.url + WLLAMA_JS)
        assert status == 200 and headers["Content-Type"] == "text/javascript"
        assert headers["Content-Security-Policy"] == (CONTENT_SECURITY_POLICY.replace("worker-src 'self'", "worker-src 'self' blob:")
                                                      .replace("frame-ancestors 'none'", "frame-ancestors 'self'"))
        assert _get(app.url + "/web/runner.mjs")[1]["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        # the rest of the bench server is the app's: no other node_modules, no escaping the package
        assert _get(bench.url + "/node_modules/@wllama/wllama/../../pyodide/package.json")[0] == 404
        assert _get(bench.url + "/node_modules/ws/package.json")[0] == 404
    finally:
        app.close()
        bench.close()


@pytest.fixture(scope="module")
def wllama_page(chromium_browser, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("gguf")
    export_gguf.export_gguf(CHAMPION, str(folder / "champion.f32.gguf"), "f32", weights="f32")
    server = peer.PeerServer(mounts={"/models/gguf/": str(folder)})
    context, page = peer.open_bench_page(chromium_browser, server, timeout_s=180)
    try:
        info = page.evaluate("(url) => window.peerBench.loadWllama(url, {nThreads: 1})", "/models/gguf/champion.f32.gguf")
        yield page, info
    finally:
        context.close()
        server.close()


def test_wllama_reads_our_metadata(wllama_page):
    info = wllama_page[1]["info"]
    assert (info["n_vocab"], info["n_layer"], info["n_embd"], info["n_ctx_train"]) == (4096, 6, 256, 512)
    assert info["token_bos"] == 0 and info["add_bos_token"] is True and info["add_eos_token"] is False
    assert sorted(info["list_tokens_eog"]) == [1, 6]


def test_wllama_greedy_tokens_equal_reference_f32(wllama_page):
    page = wllama_page[0]
    pair = load_pair(CHAMPION, champion_weights="f32")
    for prompt in PROMPTS:
        prompt_ids = pair.tokenizer.encode(prompt)
        ref = pair.orchestrator.generate(prompt_ids, GenerationConfig(
            max_new_tokens=N_TOKENS, policy=SamplingPolicy(temperature=0), speculate="none",
            stop_token_ids=pair.stop_token_ids))
        got = page.evaluate("([p, n]) => window.peerBench.wllamaGenerate(p, {maxTokens: n, temperature: 0, withIds: true})",
                            [prompt, N_TOKENS])
        assert got["prompt_tokens"] == len(prompt_ids), prompt   # same tokenization, BOS included
        assert len(ref.token_ids) == N_TOKENS, prompt            # no early stop: all N compared
        assert got["token_ids"] == ref.token_ids, prompt
        assert got["text"] == ref.text, prompt


def test_wllama_two_thread_runner_runs_two_threads_beside_the_one_thread_runner(wllama_page):
    """peer.py --wllama-threads 1,2: runner wllama@2t, a second Wllama instance in the same
    (cross-origin-isolated) page, really runs 2 threads: wllama's count, its worker's pthread pool of
    2, and 3 new workers seen by the browser (wllama's worker and its 2 pthreads; the 1-thread runner
    started 1); both runners answer afterwards with the same greedy tokens."""
    page, one = wllama_page
    assert (one["n_threads"], one["multithread"], one["pthread_pool"], one["cross_origin_isolated"]) == (1, False, 0, True)
    started = []
    page.on("worker", lambda worker: started.append(worker.url))
    two = page.evaluate("(url) => window.peerBench.loadWllama(url, {name: 'wllama@2t', nThreads: 2})", "/models/gguf/champion.f32.gguf")
    assert (two["n_threads"], two["multithread"], two["pthread_pool"], two["cross_origin_isolated"]) == (2, True, 2, True)
    assert len(started) == 3, started
    assert peer.wllama_threads_checked("wllama@2t", 2, two)["n_threads"] == 2
    gen = "([name, p]) => window.peerBench.wllamaGenerate(p, {name, maxTokens: 12, temperature: 0, withIds: true})"
    for prompt in PROMPTS[:2]:
        ids = {name: page.evaluate(gen, [name, prompt])["token_ids"] for name in ("wllama", "wllama@2t")}
        assert len(ids["wllama"]) == 12 and ids["wllama@2t"] == ids["wllama"], prompt


# ---- the bench's pure parts ----

def test_bench_arithmetic_and_doc_section():
    assert peer.decode_ms_per_token(40.0, 140.0, 11) == 10.0          # 10 tokens after the first
    assert peer.decode_ms_per_token(None, 140.0, 11) is None and peer.decode_ms_per_token(5.0, 9.0, 1) is None
    assert peer.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert peer.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert peer.first_divergence([1, 2], [1, 2, 3]) == 2
    rec = lambda runner, ms, t=0.0: {"runner": runner, "temperature": t, "ms_per_token": ms, "own_ms_per_token": ms,
                                     "first_token_ms": 1.0, "tokens_per_round": 1.0, "n_tokens": 8}
    rows = peer.summarise([rec("wllama", 4.0), rec("wllama", 6.0), rec("ours-wasm:draft", 2.0), rec("ours-wasm:draft", 3.0),
                           rec("ours-wasm:none", 9.0, t=1.0)], {"wllama": 1000.0, "ours-wasm": 2000.0})
    by = {(r["runner"], r["temperature"]): r for r in rows}
    assert by[("wllama", 0.0)]["ms_per_token"] == 5.0 and by[("ours-wasm:draft", 0.0)]["vs_wllama"] == 2.0
    assert by[("ours-wasm:none", 1.0)]["vs_wllama"] is None and by[("ours-wasm:draft", 0.0)]["load_ms"] == 2000
    doc = f"# T\n\nintro\n\n{peer.SECTION_BEGIN}\nold\n{peer.SECTION_END}\n\nafter\n"
    new = peer.replace_section(doc, "new table")
    assert new == f"# T\n\nintro\n\n{peer.SECTION_BEGIN}\nnew table\n{peer.SECTION_END}\n\nafter\n"
    assert peer.replace_section(new, "x").count(peer.SECTION_BEGIN) == 1
    assert peer.replace_section("# T\n", "x") == f"# T\n\n{peer.SECTION_BEGIN}\nx\n{peer.SECTION_END}\n"


def test_bench_prompt_set_and_stratum_tables():
    prompts = peer.prompt_set(2, ["dialogue", "summary"])
    assert [p["stratum"] for p in prompts] == ["default"] * 2 + ["dialogue"] * 2 + ["summary"] * 2
    assert prompts[0]["text"] == peer.PROMPTS[0] and prompts[2]["text"] == "Tell me a story about a shepherd."
    with pytest.raises(SystemExit, match="E_BAD_ARGUMENT: --corpus-strata nonsense: no eval/corpus/nonsense.jsonl"):
        peer.prompt_set(1, ["nonsense"])
    rec = lambda runner, stratum, ms, tpr: {"runner": runner, "temperature": 0.0, "stratum": stratum,
                                            "ms_per_token": ms, "tokens_per_round": tpr}
    rows = peer.stratum_rows([rec("ours-wasm:lookup", "summary", 4.0, 1.0), rec("ours-wasm:lookup", "summary", 6.0, 3.0),
                              rec("ours-wasm:lookup", "extraction", 2.0, 4.0)])
    by = {r["stratum"]: r for r in rows}
    assert (by["summary"]["ms_per_token"], by["summary"]["tokens_per_round"], by["extraction"]["tokens_per_round"]) == (5.0, 2.0, 4.0)
    assert "| ours-wasm:lookup | 0 | summary | 5.0 | 2.00 |" in peer.stratum_table(rows)
    assert peer.load_table({"wllama": 1500.0, "ours-wasm": 9000.0}, {"wllama": 1200.0}).splitlines()[2:] == [
        "| wllama | 1.5 | 1.2 |", "| ours-wasm | 9.0 | - |"]


def test_bench_wllama_runners_and_their_best():
    assert peer.wllama_runners("1,2") == [("wllama", 1), ("wllama@2t", 2)]
    assert peer.wllama_runners("2,1,2") == [("wllama@2t", 2), ("wllama", 1)]
    with pytest.raises(SystemExit, match=r"^E_BAD_ARGUMENT: --wllama-threads 0: a thread count"):
        peer.wllama_runners("1,0")
    assert peer.is_wllama("wllama@2t") and not peer.is_wllama("ours-wasm@abc:none")
    rec = lambda runner, ms, t=0.0: {"runner": runner, "temperature": t, "ms_per_token": ms, "own_ms_per_token": ms,
                                     "first_token_ms": 1.0, "tokens_per_round": 1.0, "n_tokens": 8}
    rows = peer.summarise([rec("wllama", 6.0), rec("wllama@2t", 4.0), rec("ours-wasm:none", 2.0),
                           rec("wllama", 5.0, t=1.0), rec("wllama@2t", 8.0, t=1.0), rec("ours-wasm:none", 2.5, t=1.0)],
                          {"wllama": 1000.0, "wllama@2t": 1100.0, "ours-wasm": 2000.0})
    by = {(r["runner"], r["temperature"]): r for r in rows}
    # "vs wllama": against wllama's fastest runner of each temperature (2 threads at T 0, 1 thread at T 1)
    assert by[("ours-wasm:none", 0.0)]["vs_wllama"] == 2.0 and by[("ours-wasm:none", 1.0)]["vs_wllama"] == 2.0
    assert by[("wllama", 0.0)]["vs_wllama"] == round(4 / 6, 3) and by[("wllama@2t", 0.0)]["load_ms"] == 1100
    table = peer.markdown_table(rows)
    assert "| wllama | 0 | 6.0 | 0.67x |" in table and "| wllama@2t | 0 | 4.0 | 1.00x |" in table
    out = {"rows": rows, "wllama": {"wllama": {"threads": 1}, "wllama@2t": {"threads": 2}},
           "agreement": [{"prompt": "p", "wllama_runners": {"wllama": {"first_divergence": None}, "wllama@2t": {"first_divergence": 3}}}]}
    assert peer.wllama_doc_lines(out) == [
        "Greedy tokens, wllama@2t against wllama: 0 of 1 (prompt, runner) runs identical; first divergences: 'p' wllama@2t at 3.",
        'wllama at its best thread count (the fastest runner: "vs wllama" is against it): '
        "T = 0: wllama@2t 4.0 ms/token; T = 1: wllama 5.0 ms/token."]
    assert peer.wllama_threads_text(out) == "runners wllama (1 thread), wllama@2t (2 threads)"
    assert peer.wllama_threads_text({"wllama": {"wllama": {"threads": 1}}}) == "1 thread"
    # a page that is not cross-origin isolated: wllama quietly runs 1 thread, and the bench stops
    quiet = {"n_threads": 1, "multithread": False, "pthread_pool": 0, "cross_origin_isolated": False}
    with pytest.raises(ExactSpecError, match=r"^E_INTERNAL: wllama@2t: wllama runs 1 thread\(s\) \(pthread pool 0\), not 2 "
                                             r"\(page cross-origin isolated: False\)$"):
        peer.wllama_threads_checked("wllama@2t", 2, quiet)
    assert peer.wllama_threads_checked("wllama", 1, quiet)["threads"] == 1


def test_bench_refusal_names_the_runner_and_the_code_once():
    err = peer.refusal("ours-wasm", {"code": "E_MANIFEST_MISMATCH", "message": "E_MANIFEST_MISMATCH: field 'x' differs"})
    assert str(err) == "E_MANIFEST_MISMATCH: ours-wasm: field 'x' differs"


# ---- the real model: peer.py --champion FILE.gguf, wllama on the very same file ----

@pytest.fixture(scope="module")
def smollm2_gguf():
    return os.path.relpath(smollm2_path(), REPO_FOR_PATHS)


def test_peer_refuses_before_any_browser_starts(smollm2_gguf, tmp_path):
    """One code and one sentence each: draft mode without a draft, a champion nowhere, a .gguf that is none."""
    with pytest.raises(SystemExit, match=r"^E_BAD_ARGUMENT: --modes none,draft: draft needs a draft model \(--draft FOLDER\)$"):
        peer.main(["--champion", str(REPO_ROOT / smollm2_gguf), "--modes", "none,draft", "--no-doc"])
    with pytest.raises(SystemExit, match="^E_BAD_ARGUMENT: --champion /web/models/nothing.gguf: neither a file"):
        peer.main(["--champion", "/web/models/nothing.gguf", "--no-doc"])
    (tmp_path / "fake.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(SystemExit, match=r"^E_MODEL_LOAD: [^\n]*fake.gguf[^\n]*magic[^\n]*$") as refused:
        peer.main(["--champion", str(tmp_path / "fake.gguf"), "--no-doc"])
    assert str(refused.value).count("E_MODEL_LOAD") == 1


def test_peer_on_the_real_gguf_gives_wllamas_greedy_tokens(smollm2_gguf, tmp_path):
    """1 chat prompt, 8 greedy tokens, modes none and lookup, one timed round: our engine's tokens
    are wllama's, one for one, on the same file and the same prompt token count."""
    out_path = tmp_path / "peer.json"
    proc = subprocess.run([sys.executable, "tools/bench/peer.py", "--champion", smollm2_gguf, "--prompts", "1",
                           "--max-new-tokens", "8", "--rounds", "1", "--temperatures", "0", "--backends", "wasm",
                           "--modes", "none,lookup", "--no-doc", "--json", str(out_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(out_path.read_text())
    assert out["chat"] is True and out["models"]["gguf"] == out["models"]["champion"]
    (entry,) = out["agreement"]
    eos = 2                                       # <|im_end|>: SmolLM2's answer here ends within 8 tokens
    assert len(entry["wllama"]) == 8 or entry["wllama"][-1] == eos, entry["wllama"]
    for mode in ("wasm:none", "wasm:lookup"):
        assert entry["ours"][mode]["prompt_tokens"] == entry["wllama_prompt_tokens"], mode
        assert entry["ours"][mode]["token_ids"] == entry["wllama"], mode
    assert entry["wllama_runners"]["wllama@2t"]["token_ids"] == entry["wllama"]     # 2 threads, the same tokens
    assert {name: v["n_threads"] for name, v in out["wllama"].items()} == {"wllama": 1, "wllama@2t": 2}
    assert set(out["load_ms"]) == set(out["second_load_ms"]) == {"wllama", "wllama@2t", "ours-wasm"}
    assert {r["runner"] for r in out["rows"]} == {"wllama", "wllama@2t", "ours-wasm:none", "ours-wasm:lookup"}
    assert (tmp_path / "peer.md").read_text().startswith("Last run: ")
