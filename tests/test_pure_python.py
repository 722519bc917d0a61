"""The files the Pyodide orchestrator loads, exactspec/__init__.py and the folders core/, formats/ and
pyodide/ whole (docs/layout.md), import and run a request without NumPy (not available offline) and
without any exactspec module outside them; web/orchestrator/py_files.json lists exactly those files."""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY_FILES_JSON = os.path.join(ROOT, "web", "orchestrator", "py_files.json")

IMPORT_SCRIPT = r'''
import json
import sys
sys.modules["numpy"] = None          # any "import numpy" now raises ImportError
sys.path.insert(0, sys.argv[1])
import importlib
for name in sys.argv[2].split(","):
    importlib.import_module("exactspec." + name)
'''
REQUEST_SCRIPT = IMPORT_SCRIPT + r'''
# a whole request under pure Python: a champion whose rows are plain lists, prompt-lookup proposals
from exactspec.core.backends import ReferenceChampion
from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.core.policy import SamplingPolicy
class ListChampion(ReferenceChampion):
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
print("pure-ok", json.dumps(sorted(m for m in sys.modules if m.startswith("exactspec"))))
'''


PACKAGE = os.path.join(ROOT, "py", "exactspec")
PYODIDE_FOLDERS = ("core", "formats", "pyodide")


def shipped_files() -> list[str]:
    with open(PY_FILES_JSON, encoding="utf-8") as f:
        return json.load(f)


def folder_files() -> list[str]:
    """Every .py and .json file Pyodide must load, found by walking the folders (paths under py/exactspec)."""
    found = []
    for folder in PYODIDE_FOLDERS:
        for root, dirs, names in os.walk(os.path.join(PACKAGE, folder)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [os.path.relpath(os.path.join(root, n), PACKAGE).replace(os.sep, "/")
                      for n in names if n.endswith((".py", ".json"))]
    return ["__init__.py"] + sorted(found)


def test_index_lists_exactly_the_pyodide_folders():
    """The folders are the truth; py_files.json is derived (tools/gen_py_files.py) and must match them."""
    assert shipped_files() == folder_files(), "run: python3 tools/gen_py_files.py"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_py_files.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_pyodide_folders_import_and_run_without_numpy_or_other_modules(tmp_path):
    """Only the folders' files are copied into a fresh exactspec package, as Pyodide gets them; every
    module among them imports with NumPy blocked, and nothing outside them gets loaded."""
    files = folder_files()
    assert {f.split("/")[0] for f in files if "/" in f} == set(PYODIDE_FOLDERS), files
    for name in files:
        (tmp_path / "exactspec" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(PACKAGE, name), tmp_path / "exactspec" / name)
    modules = sorted(name[:-3].replace("/", ".").removesuffix(".__init__") for name in files
                     if name.endswith(".py") and name != "__init__.py")
    r = subprocess.run([sys.executable, "-c", REQUEST_SCRIPT, str(tmp_path), ",".join(modules)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "pure-ok" in r.stdout, r.stderr
    loaded = json.loads(r.stdout.split("pure-ok", 1)[1])
    assert loaded == sorted(["exactspec"] + ["exactspec." + m for m in modules])
