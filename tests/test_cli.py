"""The command line: coded one-line errors (never a traceback), demo, generate/sample JSON."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "py"))
    env.pop("EXACTSPEC_DEBUG", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "exactspec.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_demo_toy_json():
    r = cli("demo", "--toy", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["all_greedy_identical"] is True and len(out["prompts"]) >= 3
    for row in out["prompts"]:
        assert set(row["greedy"]) == {"none", "draft", "lookup"}
        assert row["sampled"]["accepted"] <= row["sampled"]["proposed"]


@pytest.mark.parametrize("args,code", [
    (["generate"], "E_BAD_ARGUMENT"),
    (["generate", "--prompt", "x", "--k", "banana"], "E_BAD_ARGUMENT"),
    (["generate", "--prompt", "x", "--speculate", "tree"], "E_BAD_ARGUMENT"),
    (["nonsense"], "E_BAD_ARGUMENT"),
    (["sample", "--prompt", "x", "--n", "0"], "E_BAD_ARGUMENT"),
])
def test_bad_arguments_one_line_no_traceback(args, code):
    r = cli(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"exactspec: {code}:"), r.stderr


def test_missing_model_dir_is_a_coded_error(tmp_path):
    r = cli("generate", "--prompt", "x", "--champion", str(tmp_path / "nope"), "--speculate", "none")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("exactspec: E_MODEL_LOAD:") and len(r.stderr.strip().splitlines()) == 1
