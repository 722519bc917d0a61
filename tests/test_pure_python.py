"""The modules the Pyodide orchestrator imports must not need NumPy (it is not available offline)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PURE_MODULES = ["errors", "rng", "policy", "acceptance", "deciders", "caches", "protocol", "receipts",
                "textstream", "orchestrator", "backends", "tokenizer", "safetensors", "manifest", "chat"]

SCRIPT = r'''
import sys
sys.modules["numpy"] = None          # any "import numpy" now raises ImportError
sys.path.insert(0, sys.argv[1])
import importlib
for name in sys.argv[2].split(","):
    importlib.import_module("exactspec." + name)
# a whole request under pure Python: a champion whose rows are plain lists, prompt-lookup proposals
from exactspec.orchestrator import GenerationConfig, Orchestrator
from exactspec.policy import SamplingPolicy
class ListChampion:
    vocab_size, max_context, identity, n_calls = 5, 100, "list-champion", 0
    def prefill(self, cache):
        cache.mark_materialized(cache.n_committed - 1)
    def verify_linear(self, cache, policy):
        m = len(cache.provisional_ids)
        base = cache.n_committed
        cache.mark_materialized(len(cache.tokens))
        rows = []
        for i in range(m + 1):
            last = cache.tokens[base + i - 1]
            row = [0.1] * 5
            row[(last + 1) % 5] = 0.6
            rows.append(row)
        return rows
orch = Orchestrator(ListChampion())
for temperature in (0, 1.0):
    r = orch.generate([1, 2, 3, 4, 0, 1, 2], GenerationConfig(max_new_tokens=12, speculate="lookup", k=3,
                      policy=SamplingPolicy(temperature=temperature), seed=3))
    assert r.finish_reason == "length" and len(r.token_ids) == 12, r.to_dict()
    if temperature == 0:
        assert r.token_ids == [(3 + i) % 5 for i in range(12)], r.token_ids
        assert r.stats["accepted"] > 0
print("pure-ok")
'''


def test_browser_side_modules_import_and_run_without_numpy():
    present = [m for m in PURE_MODULES if os.path.exists(os.path.join(ROOT, "py", "exactspec", m + ".py"))]
    assert len(present) >= 12, present
    r = subprocess.run([sys.executable, "-c", SCRIPT, os.path.join(ROOT, "py"), ",".join(present)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "pure-ok" in r.stdout, r.stderr
