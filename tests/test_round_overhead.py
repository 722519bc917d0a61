"""tools/bench/round_overhead: the orchestrator's own cost per round, in CPython and in Pyodide (Node)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import round_overhead  # noqa: E402


@pytest.mark.parametrize("mode", ["none", "auto", "lookup", "draft"])
def test_every_mode_answers_the_scripted_champion_and_times_each_phase(mode):
    row = round_overhead.measure(mode, 1.0, 24, 2, repeat=0.3, draft_accept=0.7)
    assert set(row["us_per_round"]) == {"choose", "call", "commit", "emit", "pause"}
    assert all(v >= 0 for v in row["us_per_round"].values()) and row["us_outside_call"] > 0
    assert sum(row["rounds_by_method"].values()) >= 24 // 9


def test_a_scripted_round_that_disagrees_is_caught(monkeypatch):
    """The bench's own check (each answer is the script) fails when a round commits a wrong id."""
    real = round_overhead.ScriptedSession.round

    def wrong(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        return out.__class__(**{**out.__dict__, "next_token": (out.next_token + 1) % round_overhead.VOCAB})
    monkeypatch.setattr(round_overhead.ScriptedSession, "round", wrong)
    with pytest.raises(AssertionError, match="not the champion's"):
        round_overhead.measure("none", 0.0, 8, 1, repeat=0.0, draft_accept=0.5)


def test_the_node_runner_measures_in_pyodide():
    out = subprocess.run(["node", os.path.join(ROOT, "tools", "bench", "round_overhead.mjs"), "16", "2"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout.strip().splitlines()[-1])["round_overhead"]
    assert [(r["mode"], r["temperature"]) for r in rows] == [("none", 0.0), ("auto", 0.0), ("none", 1.0), ("auto", 1.0)]
    assert "events posted" in out.stderr


def test_the_node_runner_compares_against_another_tree():
    """--baseline: two Pyodides, one per exactspec tree (here the same one twice), passes alternated."""
    out = subprocess.run(["node", os.path.join(ROOT, "tools", "bench", "round_overhead.mjs"), "--baseline",
                          os.path.join(ROOT, "py"), "--passes", "2", "8", "1"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])["round_overhead_ab"]
    assert [s["tree"] for s in summary] == ["this tree", os.path.join(ROOT, "py")]
    assert all(len(s["passes"]["none"]) == len(s["passes"]["auto"]) == 2 and s["auto_us"] > 0 for s in summary)
