"""The CPU module (web/build/cpu.wasm: wasm/champion.c + draft.c + cpu.c, docs/champion_wasm.md):

- one status table: protocol.json wasm_status generates the C enum and the JS table
  (tools/gen_round_record.py --check), both halves return the same status for the same failure
  and both JS loaders map it through that one table (status 5 is E_OUT_OF_MEMORY in both);
- roundNow (one cpu_round call) gives the same record, bit for bit, as the composition of the
  separate calls (draft propose on its own instance, champion forward + decide on another) over
  many rounds: greedy and sampled, k = 0..4, prompt-lookup proposals, an invalid draft row; a
  composition that is deliberately wrong (its context misses the latest next token) is caught.

Models: the shipped pair web/models/champion (q8) + web/models/draft (f32), V = 4096.
"""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np

from browser_fixture import REPO_ROOT
from exactspec.core.protocol import SCHEMA
from node_harness import run_harness
from test_wasm_champion import ensure_wasm

WASM = REPO_ROOT / "web" / "build" / "cpu.wasm"
HARNESS = REPO_ROOT / "web" / "tests" / "cpu_harness.mjs"
CHAMPION = REPO_ROOT / "web" / "models" / "champion"
DRAFT = REPO_ROOT / "web" / "models" / "draft"
FIXED = len(SCHEMA["round_record"]["words"])     # protocol.json round_record: fixed words


def test_the_js_record_size_is_protocols():
    """cpu_session.mjs names the fixed words' count; it must be protocol.json's."""
    text = (REPO_ROOT / "web" / "champion_wasm" / "cpu_session.mjs").read_text()
    assert re.search(r"const FIXED_WORDS = (\d+);", text).group(1) == str(FIXED)
STATUS, N_PROPOSED, N_ACCEPTED, DRAFT_US = 8, 11, 0, 9


def run(cases: dict) -> dict:
    ensure_wasm()
    return run_harness(HARNESS, {"wasm": str(WASM), "champion_dir": str(CHAMPION), "draft_dir": str(DRAFT),
                                 "max_block": 9, **cases})


def test_generated_status_table_is_current():
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "gen_round_record.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_both_halves_share_one_status_table():
    """The same failure gives the same status in the champion and the draft half, and the one JS
    table names it; neither loader keeps a table of its own."""
    out = run({"statuses": True})
    s = out["statuses"]
    assert out["wasm_status"][5] == "E_OUT_OF_MEMORY"
    assert s["champion_out_of_memory"] == s["draft_out_of_memory"] == [5, "E_OUT_OF_MEMORY"]
    assert s["champion_bad_config"] == s["draft_bad_config"] == [4, "E_MODEL_LOAD"]
    assert s["champion_bad_policy"] == s["draft_bad_policy"] == [2, "E_BAD_ARGUMENT"]
    for loader in ("web/champion_wasm/champion_wasm.mjs", "web/draft/draft.mjs"):
        text = (REPO_ROOT / loader).read_text()
        assert re.search(r"wasmStatusCode|statusError", text), loader
        assert not re.search(r"STATUS_CODES|\b[1-5]: \"E_", text), f"{loader} keeps its own status table"
    for source in ("champion.c", "draft.c", "cpu.c", "common.c", "common.h"):
        assert "ERR_NO_MEMORY" not in (REPO_ROOT / "wasm" / source).read_text()


def plan(gen, n_rounds: int, k_max: int = 4) -> list:
    """Round kinds: mostly the draft (k = 1..k_max), some lookup, baseline and invalid-draft rounds."""
    rounds = []
    for i in range(n_rounds):
        pick = gen.random()
        if pick < 0.6:
            rounds.append({"kind": "draft", "k": int(gen.integers(1, k_max + 1)), "nan_draft": bool(gen.random() < 0.08)})
        elif pick < 0.8:
            rounds.append({"kind": "lookup", "lookup": [int(t) for t in gen.integers(0, 4096, int(gen.integers(1, k_max + 1)))]})
        else:
            rounds.append({"kind": "baseline"})
    return rounds


SAMPLED = {"temperature": 1.0}
PENALISED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.3, "suppress_token_ids": [3, 4]}
GREEDY = {"temperature": 0}
POLICIES = [(SAMPLED, SAMPLED, False), (PENALISED, SAMPLED, False), (GREEDY, GREEDY, True),
            ({**GREEDY, "repetition_penalty": 1.5}, GREEDY, True)]


def runs_of(seed: int, policies=POLICIES, mutate: str = "") -> list:
    gen = np.random.default_rng(seed)
    out = []
    for policy, draft_policy, is_greedy in policies:
        prompt = [int(t) for t in gen.integers(7, 4096, int(gen.integers(2, 12)))]
        out.append({"policy": policy, "draft_policy": draft_policy, "greedy": is_greedy,
                    "seed": [int(gen.integers(0, 2**32)), int(gen.integers(0, 2**32))], "prompt": prompt,
                    "stops": [1, 6], "max_new": 120, "rounds": plan(gen, 40), "mutate": mutate})
    return out


def test_round_equals_composition_of_separate_calls():
    out = run({"runs": runs_of(11)})
    kinds = {"draft": 0, "lookup": 0, "baseline": 0, "draft_invalid": 0, "accepted": 0}
    n_rounds = 0
    for r, run_out in enumerate(out["runs"]):
        assert len(run_out["fused"]) == len(run_out["composed"]) > 5
        for i, (got, want) in enumerate(zip(run_out["fused"], run_out["composed"])):
            assert got == want, f"run {r} round {i}: roundNow {got} != the separate calls {want}"
            n_rounds += 1
            kinds["draft_invalid"] += got[STATUS] == 1
            kinds["accepted"] += got[N_ACCEPTED] > 0
            m = got[N_PROPOSED]
            assert len(got) == FIXED + m
    print(f"cpu_round = composition on {n_rounds} rounds; {kinds}")
    assert n_rounds >= 60 and kinds["draft_invalid"] >= 1 and kinds["accepted"] >= 5


def test_threaded_round_equals_one_thread_composition():
    """roundNow on cpu_mt.wasm with 2 threads (the champion's pool; the draft runs on the calling
    thread) gives the one-thread composition's records bit for bit."""
    runs = runs_of(21)
    for r in runs:
        r["rounds"] = r["rounds"][:12]
    out = run({"runs": runs, "fused_wasm": str(WASM.parent / "cpu_mt.wasm"), "fused_threads": 2})
    for r, run_out in enumerate(out["runs"]):
        assert run_out["fused"] == run_out["composed"], f"run {r}"


def test_a_wrong_composition_is_caught():
    """The comparison is sharp: a composition whose repetition-penalty context misses the latest
    next token differs from roundNow (a sampled run: the penalised token's probability moves every
    row's, and the record's float32 diagnostics show it); without a penalty it agrees."""
    policies = [(SAMPLED, SAMPLED, False), ({"temperature": 1.0, "repetition_penalty": 1.3}, SAMPLED, False)]
    out = run({"runs": runs_of(12, policies, mutate="context_without_next")})
    differ = [sum(a != b for a, b in zip(o["fused"], o["composed"])) for o in out["runs"]]
    assert differ[0] == 0 and differ[1] > 0, differ


def test_bad_calls_and_failing_rounds():
    """Bad calls throw coded errors; a draft that fails (here: told to skip uncached positions) gives
    a draft_failed record with no champion step and lastFailure() names the code; NaN champion rows
    give the decision error; a fine round after them clears lastFailure."""
    got = dict((what, result) for what, result in run({"failures": True})["failures"])
    for what in ("round before begin", "begin bad policy", "begin bad context id", "k beyond maxBlock - 1",
                 "remaining below k", "champStart beyond the cache", "lookup id out of range"):
        assert got[what] == "E_BAD_ARGUMENT", (what, got[what])
    assert got["begin"] == "" and got["two pending tokens"] == "E_CACHE_STATE" and got["after destroy"] == "E_TERMINATED"
    assert got["draft skips uncached positions"] == {"status": 2, "n_proposed": 0, "decision_error": 0, "next_token": -1,
                                                     "failure": "E_BAD_ARGUMENT"}
    assert got["champion rows NaN"] == {"status": 0, "n_proposed": 2, "decision_error": 1, "next_token": -1, "failure": ""}
    fine = got["a fine round"]
    assert fine["status"] == 0 and fine["decision_error"] == 0 and fine["next_token"] >= 0 and fine["failure"] == ""


def test_round_fills_timing_words():
    """draft_us and verify_us come from the module's imported clock (performance.now()): the draft's
    part only in draft rounds, the champion's in every round."""
    timing = run({"runs": runs_of(5)[:1]})["runs"][0]["timing"]
    assert all(verify_us > 0 for _kind, _draft_us, verify_us in timing), timing
    assert all((draft_us > 0) == (kind == "draft") for kind, draft_us, _verify_us in timing), timing
