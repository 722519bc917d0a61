"""pairs.py — the repository root (with py/ importable) and the model pairs the browser benches run.

Imported by tools/bench/auto_ab.py, prefix_reuse.py, structured.py, switch_noise.py and
weight_cache.py (their folder is on sys.path when run); write_result writes their JSON."""
from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.join(ROOT, "py") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "py"))

PAIRS = {   # pair -> (champion, draft), relative to the repository
    "toy": ("web/models/champion", "web/models/draft"),
    "real": ("build/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf", "web/models/smollm2-draft"),
}


def pair_paths(name: str) -> tuple:
    """(champion, draft) of a pair, as absolute paths."""
    return tuple(os.path.join(ROOT, p) for p in PAIRS[name])


def write_result(out: dict, default_path: str, path: str | None = None) -> str:
    """Write a bench's result as JSON with the command line and the date (UTC) to `path` (default
    `default_path`), print where, and return the path."""
    from exactspec.host.safe_files import write_file
    out.update({"argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    path = path or default_path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_file(path, (json.dumps(out, indent=1) + "\n").encode("utf-8"))
    print(f"wrote {os.path.relpath(path, ROOT)}")
    return path
