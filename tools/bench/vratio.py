"""Driver of tools/bench/vratio.mjs: the WASM champion's block forward times V(n), n = 1..9, and
V(n)/V(1), on a GGUF file (weights in their blocks) or a q8 folder, per module (cpu, relaxed) and
thread count; writes build/bench/vratio-<name>.json. Not a test (run on a quiet machine).

    python tools/bench/vratio.py build/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf --threads 1,2
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "py"))
from exactspec.formats.gguf_model import GGUFModel  # noqa: E402
from exactspec.host.safe_files import write_file  # noqa: E402  (never through a link)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    out = ROOT / "build" / "bench" / f"vratio-{Path(args.model).stem}.json"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        if args.model.endswith(".gguf"):
            with GGUFModel(args.model) as m:
                write_file(config, json.dumps(m.config))
        cmd = ["node", "--experimental-wasm-relaxed-simd", str(ROOT / "tools/bench/vratio.mjs"), args.model,
               str(args.reps), args.threads, str(out), str(config)]
        rc = subprocess.run(cmd).returncode
    if rc == 0:
        print(f"wrote {out.relative_to(ROOT)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
