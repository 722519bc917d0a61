"""pairs.py — the repository root (with py/ importable) and the model pairs the browser benches run.

Imported by tools/bench/auto_ab.py and prefix_reuse.py (their folder is on sys.path when run)."""
from __future__ import annotations

import os
import sys

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
