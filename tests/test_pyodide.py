"""The orchestrator runs inside real Pyodide (offline, from this origin) and agrees with CPython."""
import json
import os
import subprocess
import sys

from browser_fixture import browser_page, chromium_browser, http_server  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A pure-Python champion with list rows and prompt-lookup proposals: runs on CPython and Pyodide.
SCENARIO = r'''
import json
from exactspec.core.backends import ReferenceChampion
from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.core.policy import SamplingPolicy
class ListChampion(ReferenceChampion):
    vocab_size, max_context, identity, n_calls = 7, 200, "list-champion", 0
    def prefill(self, cache):
        cache.mark_materialized(cache.n_committed - 1)
    def verify_linear(self, cache, policy):
        m, base = len(cache.provisional_ids), cache.n_committed
        cache.mark_materialized(len(cache.tokens))
        rows = []
        for i in range(m + 1):
            ctx = cache.tokens[:base + i]
            row = [1.0 + ((ctx[-1] * 3 + x * 5 + len(ctx)) % 7) for x in range(7)]
            total = sum(row)
            rows.append([w / total for w in row])
        return rows
orch = Orchestrator(ListChampion())
out = []
for temperature in (0, 1.0):
    for seed in range(6):
        r = orch.generate([1, 2, 3, 1, 2, 3, 1], GenerationConfig(max_new_tokens=16, speculate="lookup", k=3,
                          policy=SamplingPolicy(temperature=temperature), seed=seed, stop_token_ids=(0,)))
        out.append([r.token_ids, r.finish_reason, r.stats["accepted"]])
json.dumps(out)
'''


def cpython_answer():
    code = "import sys; sys.path.insert(0, %r)\n" % os.path.join(ROOT, "py") + SCENARIO.replace(
        "json.dumps(out)\n", "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_orchestrator_in_pyodide_matches_cpython(browser_page, http_server):
    page = browser_page
    page.goto(http_server.url + "/web/tests/pyodide_harness.html")
    page.wait_for_function("() => window.harnessReady === true")
    res = page.evaluate("(code) => window.runPy(code)", SCENARIO)
    assert res["ok"], res.get("error")
    assert json.loads(res["value"]) == cpython_answer()
    assert res["timing_ms"]["pyodide"] > 0


def test_pyodide_has_no_numpy_and_only_pure_modules_are_installed(browser_page, http_server):
    page = browser_page
    page.goto(http_server.url + "/web/tests/pyodide_harness.html")
    page.wait_for_function("() => window.harnessReady === true")
    res = page.evaluate("(code) => window.runPy(code)", """
import importlib.util
str([importlib.util.find_spec("numpy") is None,
     [importlib.util.find_spec("exactspec." + folder) is None for folder in ("reference", "twins", "host", "evaluation")],
     importlib.util.find_spec("exactspec.core.orchestrator") is not None])
""")
    assert res["ok"], res.get("error")
    assert res["value"] == "[True, [True, True, True, True], True]"


TEXTS = ["In the beginning God created the heaven and the earth.", "To be, or not to be: that is the question",
         "naïve café — «quoted» 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "שלום עולם مرحبا بالعالم", "日本語のテキスト、中文文本", "नमस्ते दुनिया",
         "👩‍👩‍👧‍👦 👍🏽 🇫🇷", "e\u0301 vs \u00e9", "tabs\t\tand   spaces\n\n\nnewlines", "ctrl\x00\x07\x1b chars",
         "it's they're we've I'm you'll he'd", "12345 3.14159 1e-9", "<|user|>\nhello<|end|>\n<|assistant|>\n"]


def test_tokenizer_in_pyodide_matches_hugging_face(browser_page, http_server):
    """Pyodide runs a newer Python (other Unicode tables): ids must still equal HF tokenizers'."""
    from tokenizers import Tokenizer as HF
    tok_path = os.path.join(ROOT, "web", "models", "champion", "tokenizer.json")
    hf = HF.from_file(tok_path)
    want = [hf.encode(t).ids for t in TEXTS]
    page = browser_page
    page.goto(http_server.url + "/web/tests/pyodide_harness.html")
    page.wait_for_function("() => window.harnessReady === true")
    code = ("import json\nfrom pyodide.http import open_url\nfrom exactspec.formats.tokenizer import Tokenizer\n"
            "tok = Tokenizer.from_json_str(open_url('/web/models/champion/tokenizer.json').read())\n"
            f"texts = json.loads({json.dumps(json.dumps(TEXTS))})\n"
            "json.dumps([[tok.encode(t), tok.decode(tok.encode(t, add_special_tokens=False))] for t in texts])")
    res = page.evaluate("(code) => window.runPy(code)", code)
    assert res["ok"], res.get("error")
    got = json.loads(res["value"])
    assert [g[0] for g in got] == want
    assert [g[1] for g in got] == TEXTS
