"""The WASM champion's thread pool (wasm/champion.c run_step / claim_chunks) with its race windows
widened (-DCHAMPION_RACE_TEST: a helper and the caller spin where a descheduled thread would
stall): 4 threads on this machine's 2 cores give the same logits bits as one thread on every block.
Before the claim word was closed between steps, a helper that had read the last step's word could
claim a chunk of the next step and count it as finished: this build then gave wrong logits on 38 to
75 of ~250 blocks (the bug behind a greedy mismatch seen once under load in test_auto_browser.py)."""
import os
import shutil
import subprocess
from pathlib import Path

from node_harness import run_harness

REPO_ROOT = Path(__file__).resolve().parent.parent
HARNESS = REPO_ROOT / "web" / "tests" / "thread_race_harness.mjs"


def test_threads_give_one_threads_bits_with_the_race_windows_widened(tmp_path):
    out_dir = tmp_path / "race_build"
    env = dict(os.environ, BUILDS="cpu cpu_mt", EXTRA_CFLAGS="-DCHAMPION_RACE_TEST")
    subprocess.run(["bash", str(REPO_ROOT / "wasm" / "build.sh"), str(out_dir)], check=True, env=env,
                   capture_output=True, cwd=REPO_ROOT)
    out = run_harness(HARNESS, {"wasm": str(out_dir / "cpu.wasm"), "wasm_mt": str(out_dir / "cpu_mt.wasm"),
                                "model_dir": str(REPO_ROOT / "web" / "models" / "champion"),
                                "threads": 4, "passes": 10, "positions": 120})
    shutil.rmtree(out_dir, ignore_errors=True)
    assert out["blocks"] > 200
    assert out["mismatched"] == [], f"{len(out['mismatched'])} of {out['blocks']} blocks differ: {out['mismatched'][:5]}"
