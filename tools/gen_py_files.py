"""Write web/orchestrator/py_files.json, the files Pyodide loads, from the pure folders of py/exactspec.

A browser cannot list a folder over HTTP, so the page reads this index; the folders are the truth:
exactspec/__init__.py and every .py / .json file under exactspec/core, formats and pyodide (docs/layout.md).
`--check` writes nothing and exits 1 when the index differs from the folders (tests/test_pure_python.py).
"""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "py", "exactspec")
INDEX = os.path.join(REPO, "web", "orchestrator", "py_files.json")
sys.path.insert(0, os.path.join(REPO, "py"))
from exactspec.host.safe_files import write_file  # noqa: E402  (never through a link)
PYODIDE_FOLDERS = ("core", "formats", "pyodide")


def pyodide_files() -> list[str]:
    """Paths relative to py/exactspec, sorted: what Pyodide loads."""
    files = []
    for folder in PYODIDE_FOLDERS:
        for root, dirs, names in os.walk(os.path.join(PACKAGE, folder)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = os.path.relpath(root, PACKAGE).replace(os.sep, "/")
            files += [f"{rel}/{name}" for name in names if name.endswith((".py", ".json"))]
    return ["__init__.py"] + sorted(files)


def index_text() -> str:
    return json.dumps(pyodide_files(), indent=1) + "\n"


def main(argv: list[str]) -> int:
    want = index_text()
    try:
        with open(INDEX, encoding="utf-8") as f:
            have = f.read()
    except FileNotFoundError:
        have = None
    if have == want:
        return 0
    if "--check" in argv:
        print(f"gen_py_files: {os.path.relpath(INDEX, REPO)} does not match the folders; run python3 tools/gen_py_files.py",
              file=sys.stderr)
        return 1
    write_file(INDEX, want)   # only when it changes: the snapshot step in tools/setup.sh compares mtimes
    print(f"gen_py_files: wrote {os.path.relpath(INDEX, REPO)} ({len(json.loads(want))} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
