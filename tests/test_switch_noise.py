"""tools/bench/switch_noise: the pure summary of paired identical requests (the browser run is a bench)."""
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import switch_noise  # noqa: E402


def test_the_engine_ratio_is_alone_over_spec_whichever_ran_first():
    # alone always 10% slower, the order alternating: the engine ratio is constant (log-sd 0) while
    # first over second alternates 1.1 and 1/1.1 (geometric mean 1)
    pairs = [("alone", "spec", 11.0, 10.0), ("spec", "alone", 20.0, 22.0)] * 5
    s = switch_noise.summarise(pairs)
    assert s["pairs"] == 10 and s["log_sd"] == 0 and s["geo"] == pytest.approx(1.1, abs=1e-4)
    assert s["first_over_second_geo"] == pytest.approx(1.0, abs=1e-4) and s["median_ms"] == 15.5


def test_the_log_sd_is_that_of_the_pairs_log_ratios():
    pairs = [("spec", "spec", 10.0 * math.exp(d), 10.0) for d in (0.1, -0.1, 0.1, -0.1)]
    s = switch_noise.summarise(pairs)
    assert s["log_sd"] == pytest.approx(0.1, abs=1e-4) and s["geo"] == pytest.approx(1.0, abs=1e-4)


def test_the_result_is_written_with_its_command_line_and_date(tmp_path):
    import json
    import pairs
    path = pairs.write_result({"x": 1}, str(tmp_path / "default" / "r.json"))
    got = json.loads(open(path).read())
    assert got["x"] == 1 and isinstance(got["argv"], list) and got["date"].endswith("UTC")
    other = tmp_path / "given.json"
    assert pairs.write_result({"x": 2}, str(tmp_path / "unused.json"), str(other)) == str(other) and other.exists()
