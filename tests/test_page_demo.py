"""`exactspec demo --toy-pair` (the default when the real model is unavailable; the real model's
chat: tests/test_cli.py): the browser engine in headless Chromium on the shipped pair
(the text of each mode, greedy equality, speed-ups, a progress line while loading), and the
reference only when no browser can start, said clearly."""
import json
import os
import subprocess
import sys

from browser_fixture import REPO_ROOT
from exactspec.host import demo


def test_demo_runs_the_browser_engine():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "py"))
    r = subprocess.run([sys.executable, "-m", "exactspec", "demo", "--toy-pair", "--json"], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["engine"] == "browser" and out["champion_backend"] in ("wasm", "webgpu")
    assert out["all_greedy_identical"] is True and len(out["prompts"]) == len(demo.DEMO_PROMPTS)
    for row in out["prompts"]:
        texts = {mode: row["greedy"][mode]["text"] for mode in ("none", "auto", "draft", "lookup")}
        assert texts["none"].strip() and len(set(texts.values())) == 1, texts
    for mode in ("none", "auto", "draft", "lookup"):
        assert out["speedups"][mode]["tokens_per_s"] > 0 and out["speedups"][mode]["speedup"] > 0
    assert out["speedups"]["none"]["speedup"] == 1.0
    assert "exactspec demo: loading:" in r.stderr and "exactspec demo: loaded in" in r.stderr, r.stderr


def test_demo_falls_back_to_the_reference_only_without_a_browser(monkeypatch, capsys):
    import exactspec.host.browser_run as browser_run

    def no_browser():
        raise FileNotFoundError("/nonexistent/chromium: not found")
    monkeypatch.setattr(browser_run, "launch_chromium", no_browser)
    monkeypatch.setattr(demo, "_reference_demo", lambda toy, as_json, n, weights: 42)
    assert demo.run_demo(as_json=True, toy_pair=True) == 42
    assert "no browser could start (/nonexistent/chromium: not found); running the CPython reference instead" \
        in capsys.readouterr().err
    monkeypatch.setattr(browser_run, "launch_chromium", lambda: (_ for _ in ()).throw(AssertionError("not called")))
    assert demo.run_demo(reference=True) == 42 and demo.run_demo(toy=True) == 42   # asked for: no browser tried
