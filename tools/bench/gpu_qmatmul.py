"""ms per linear of the WebGPU q8act kernels (quantize_act + qmatmul_<fmt>, dot4 and unpacking) vs the
float kernel matmul_q8 on int8 rows, at SmolLM2-135M's linear shapes, on this browser's adapter.

    flock /tmp/browser.lock .venv/bin/python tools/bench/gpu_qmatmul.py [--formats Q4_1,Q8_0] [--ns 1,5,9]

web/tests/gpu_blocks_harness.html's bench(): each linear timed as `reps` dispatches in one
submission, best of `tries`. Prints a table; a measurement, not a test (the machine is shared).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "py"))

SHAPES = {"q|k|v": (960, 576), "o": (576, 576), "gate|up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="Q4_1,Q8_0,ROWQ8")
    ap.add_argument("--ns", default="1,5,9")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    from browser_fixture import get_browser, get_server, shutdown
    page = get_browser().new_context().new_page()
    page.goto(f"{get_server().url}/web/tests/gpu_blocks_harness.html")
    page.wait_for_function("() => window.harnessReady === true", timeout=60_000)
    print(f"{'format':6} {'linear':8} {'rows x cols':>12} {'n':>2} {'dot4 ms':>8} {'unpack ms':>9} {'matmul_q8 ms':>12}")
    try:
        for fmt in args.formats.split(","):
            for name in args.shapes.split(","):
                rows, cols = SHAPES[name]
                for n in map(int, args.ns.split(",")):
                    t = page.evaluate("(a) => window.harness.bench(a)",
                                      {"format": fmt, "n": n, "rows": rows, "cols": cols, "reps": args.reps, "tries": 3})
                    print(f"{fmt:6} {name:8} {f'{rows}x{cols}':>12} {n:>2} {t['dot4']:8.2f} {t['unpack']:9.2f} {t['matmul_q8']:12.2f}",
                          flush=True)
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
