"""The first request after load runs as warm as the tenth (issue 19 item 4): the load ends with a
warm-up (web/orchestrator/warmup.mjs: champion forwards on every block size, then small requests
through every mode), which ran, is reported as its own load phase, and leaves no trace in what
later requests answer. Timings themselves are benchmarked, not asserted
(tools/bench/first_request.py, docs/performance.md)."""
from __future__ import annotations

import json

import pytest

from browser_fixture import REPO_ROOT, chromium_browser  # noqa: F401
from exactspec.host.browser_run import BrowserRuntime
from test_threads_default import node

WARMUP = (REPO_ROOT / "web" / "orchestrator" / "warmup.mjs").as_uri()
CHAMPION = REPO_ROOT / "web" / "models" / "champion"
DRAFT = REPO_ROOT / "web" / "models" / "draft"


def test_warmup_requests_cover_every_mode_and_block():
    got = node(f"""
const {{ warmupRequests }} = await import({json.dumps(WARMUP)});
const show = (r) => [r.config.speculate, r.config.temperature, r.config.k ?? 0, r.prompt_ids ? r.prompt_ids.length : r.prompt, r.chat ?? false];
console.log(JSON.stringify({{
  full: warmupRequests({{ maxBlock: 9, vocabSize: 4096, draft: true, chat: true }}).map(show),
  alone: warmupRequests({{ maxBlock: 9, vocabSize: 4096, draft: false, chat: false }}).map(show),
  tiny: warmupRequests({{ maxBlock: 2, vocabSize: 5, draft: false }}).map((r) => [r.config.k ?? 0, Math.max(...(r.prompt_ids ?? [0]))]),
  late: warmupRequests({{ maxBlock: 9, vocabSize: 4096, draftOnly: true }}).map(show),
}}));
""")
    assert got["full"] == [["none", 0, 0, "Hello", True], ["lookup", 0, 8, 11, False], ["draft", 0, 8, 11, False],
                           ["draft", 1, 4, 11, False], ["auto", 0, 0, 11, False]]
    assert got["alone"] == [["none", 0, 0, "Hello", False], ["lookup", 0, 8, 11, False], ["auto", 0, 0, 11, False]]
    assert [k for k, _ in got["tiny"]] == [0, 1, 0] and all(top < 5 for _, top in got["tiny"])   # k = maxBlock - 1; ids in the vocabulary
    assert got["late"] == [["draft", 0, 8, 11, False], ["draft", 1, 4, 11, False]]   # a late draft's warm-up: its rounds only


def test_warmup_repeats_to_its_call_count_and_never_throws():
    got = node(f"""
const {{ warmUp }} = await import({json.dumps(WARMUP)});
const reqs = [{{ config: {{ speculate: "none" }} }}, {{ config: {{ speculate: "lookup" }} }}];
const ok = await warmUp(async () => ({{ token_ids: [1, 2], stats: {{ target_calls: 5 }} }}), reqs, {{ minCalls: 12, budgetMs: 10000 }});
const failing = await warmUp(async (p) => {{ if (p.config.speculate === "lookup") throw new Error("boom"); return {{ error: {{ code: "E_X", message: "no" }} }}; }},
  reqs, {{ minCalls: 100, budgetMs: 10000 }});
const slow = await warmUp(async () => {{ await new Promise((r) => setTimeout(r, 30)); return {{ stats: {{ target_calls: 1 }} }}; }}, reqs, {{ minCalls: 1000, budgetMs: 100 }});
console.log(JSON.stringify({{ ok: [ok.requests, ok.rounds, ok.tokens, ok.errors], failing: [failing.requests, failing.errors],
  slow: [slow.requests < 10, slow.ms < 1000] }}));
""")
    assert got["ok"] == [3, 15, 6, []]                      # 3 requests reach 12 calls
    assert got["failing"] == [2, ["none: E_X: no", "lookup: boom"]]   # one pass, no repeats after an error
    assert got["slow"] == [True, True]                      # the time budget ends it


def answers(rt) -> list:
    out = []
    for prompt in ("In the beginning God created", "To be, or not to be,"):
        for mode, temperature in (("none", 0), ("lookup", 0), ("draft", 0), ("draft", 1.0)):
            r = rt.generate({"prompt": prompt, "config": {"max_new_tokens": 20, "temperature": temperature,
                                                          "speculate": mode, "k": 4, "seed": 3}})["result"]
            assert r["error"] is None, r["error"]
            st = r["stats"]
            out.append([r["token_ids"], r["finish_reason"], st["rounds"], st["proposed"], st["accepted"], st["target_calls"]])
    return out


@pytest.mark.browser
def test_the_warmup_runs_at_load_and_leaves_no_trace(chromium_browser):  # noqa: F811
    """With the warm-up (the default) the load reports it as phases of its own and every mode ran
    without error; the answers after it (tokens, rounds, acceptance, champion calls) are those of
    an engine loaded without it."""
    runs = {}
    for warm in (True, False):
        rt = BrowserRuntime(str(CHAMPION), str(DRAFT), browser=chromium_browser, champion_backend="wasm", warm_up=warm)
        try:
            t, info = rt.ready["timing_ms"], rt.ready["info"]
            if warm:
                assert t["warmup"] > 0 and t["champion_warmup"] > 0
                w = info["warmup"]
                print("warm-up:", json.dumps(w), f"{t['warmup']:.0f} ms; champion {t['champion_warmup']:.0f} ms",
                      json.dumps(info["champion"]["warmup_ms"]))
                assert w["errors"] == [] and w["requests"] >= 4 and w["tokens"] > 0 and w["rounds"] > 0
            else:
                assert t["warmup"] == 0 and info["warmup"] is None
            runs[warm] = answers(rt)
        finally:
            rt.close()
    assert runs[True] == runs[False]


def test_demo_reports_the_first_request_against_the_later_ones():
    """`exactspec demo` (toy pair) prints the first request's ms/token (the first prompt, champion
    alone) against the median of that mode's later requests; it no longer runs a request of its
    own to warm up (the engine's load does)."""
    from exactspec.host.demo_browser import _first_request
    rows = [{"greedy": {"none": {"decode_ms": d, "tokens": n}}} for d, n in ((60, 20), (40, 20), (50, 20), (44, 22))]
    assert _first_request(rows) == {"ms_per_token": 3.0, "later_median_ms_per_token": 2.0, "ratio": 1.5}
    assert _first_request(rows[:1])["ratio"] is None
    source = (REPO_ROOT / "py" / "exactspec" / "host" / "demo_browser.py").read_text()
    assert "rt.generate(warm)" not in source
