"""Time the WASM-SIMD champion (web/build/cpu.wasm) in Node (V8, as Chromium): ms per
forward for blocks of 1..9 and decide(); the verification ratio V(k+1)/V(1) for k = 4. Runs the
shipped champion and a synthetic real-size shape (random q8 weights, SmolLM-360M widths with
fewer layers: a 32-layer model held as f32 would need ~1.5 GB of WASM memory). Prints a table and
writes build/bench/wasm_champion.json. Not a test: the numbers depend on the machine and its load.

    python tools/bench/wasm_champion.py [--layers 8] [--reps 30] [--threads 1] [--skip-synthetic]
                                        [--storage auto|int8|f32|both]
--storage: how the q8 linears are held in WASM memory (both: time each, side by side).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "py"))
from exactspec.host.safe_files import write_file  # noqa: E402
HARNESS = ROOT / "web" / "tests" / "champion_harness.mjs"
WASM = ROOT / "web" / "build" / "cpu.wasm"                       # the CPU module (docs/champion_wasm.md)
WASM_THREADS = ROOT / "web" / "build" / "cpu_mt.wasm"            # --threads > 1
OUT = ROOT / "build" / "bench" / "wasm_champion.json"
K = 4


def synthetic_model(layers: int) -> Path:
    """hidden 960, intermediate 2560, 15 heads / 5 KV heads of 64, vocab 49152; random q8 linears."""
    from safetensors.numpy import save
    d = ROOT / "build" / "bench" / f"synthetic_q8_{layers}l"
    if (d / "model.q8.safetensors").exists():
        return d
    V, D, F, H, KV, hd = 49152, 960, 2560, 15, 5, 64
    rs = np.random.default_rng(0)
    t = {"model.embed_tokens.weight": rs.normal(0, 0.02, (V, D)).astype(np.float32),
         "model.norm.weight": np.ones(D, np.float32)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = np.ones(D, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(D, np.float32)
        for name, (rows, cols) in [("self_attn.q_proj", (H * hd, D)), ("self_attn.k_proj", (KV * hd, D)),
                                   ("self_attn.v_proj", (KV * hd, D)), ("self_attn.o_proj", (D, H * hd)),
                                   ("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)), ("mlp.down_proj", (D, F))]:
            t[p + name + ".weight.q8"] = rs.integers(-127, 128, (rows, cols), dtype=np.int8)
            t[p + name + ".weight.scale"] = np.full(rows, 0.02 / 127 * 3, np.float32)
    config = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
              "num_hidden_layers": layers, "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": hd,
              "max_position_embeddings": 256, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": True, "hidden_act": "silu"}
    d.mkdir(parents=True, exist_ok=True)
    write_file(d / "model.q8.safetensors", save(t))
    write_file(d / "config.json", json.dumps(config))
    return d


def time_model(model_dir: Path, reps: int, threads: int, storage: str = "auto") -> dict:
    cases = {"wasm": str(WASM if threads == 1 else WASM_THREADS), "model_dir": str(model_dir), "max_block": K + 5, "max_context": 0,
             "threads": threads, "weight_storage": storage, "timing": {"promptLen": 32, "reps": reps, "warmup": 10, "m": K, "reps_decide": reps}}
    with tempfile.TemporaryDirectory() as tmp:
        cin, cout = Path(tmp) / "cases.json", Path(tmp) / "out.json"
        write_file(cin, json.dumps(cases))
        subprocess.run(["node", str(HARNESS), str(cin), str(cout)], check=True)
        out = json.loads(cout.read_text())
    blocks = {int(n): v for n, v in out["timing"].items()}
    return {"memory_bytes": out["info"]["memoryBytes"], "artifact_bytes": out["info"]["artifactBytes"],
            "threads": threads, "weight_storage": out["info"]["weightStorage"], "forward_ms": blocks, "decide_ms": out["timing_decide"],
            f"ratio_block{K + 1}_over_block1": blocks[K + 1]["median"] / blocks[1]["median"],
            f"ratio_block{K + 1}_over_block1_min": blocks[K + 1]["min"] / blocks[1]["min"]}


def print_table(name: str, r: dict) -> None:
    print(f"\n{name}: {r['artifact_bytes'] / 1e6:.1f} MB q8 file, {r['memory_bytes'] / 1e6:.0f} MB WASM memory, "
          f"{r['threads']} thread(s), q8 linears held as {r['weight_storage']}")
    print("block  median ms  min ms  median ms/position")
    for n, v in sorted(r["forward_ms"].items()):
        print(f"{n:5d}  {v['median']:9.2f}  {v['min']:6.2f}  {v['median'] / n:9.2f}")
    print(f"V({K + 1})/V(1) = {r[f'ratio_block{K + 1}_over_block1']:.2f} (medians), "
          f"{r[f'ratio_block{K + 1}_over_block1_min']:.2f} (minima); decide m={r['decide_ms']['m']}: "
          f"{r['decide_ms']['median']:.2f} ms median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8, help="layers of the synthetic real-width model")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-synthetic", action="store_true")
    ap.add_argument("--storage", choices=("auto", "int8", "f32", "both"), default="auto")
    args = ap.parse_args()
    storages = ("f32", "int8") if args.storage == "both" else (args.storage,)
    if not WASM_THREADS.exists():
        subprocess.run(["bash", str(ROOT / "wasm" / "build.sh")], check=True)
    results = {"node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
               "load_average": os.getloadavg()}
    for storage in storages:
        key = "" if len(storages) == 1 else f"_{storage}"
        results["shipped" + key] = r = time_model(ROOT / "web" / "models" / "champion", args.reps, args.threads, storage)
        print_table("shipped champion (V 4096, D 256, 6 layers)", r)
        if not args.skip_synthetic:
            results["synthetic" + key] = r = time_model(synthetic_model(args.layers), args.reps, args.threads, storage)
            r["layers"] = args.layers
            print_table(f"synthetic (V 49152, D 960, F 2560, {args.layers} layers)", r)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    out = OUT if args.threads == 1 else OUT.with_name(f"wasm_champion_{args.threads}threads.json")
    write_file(out, json.dumps(results, indent=1))
    print(f"\nwrote {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
