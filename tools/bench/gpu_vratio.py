"""V(k+1)/V(1) of the WebGPU champion: a forward over a block of k+1 positions vs one position.

    flock /tmp/browser.lock .venv/bin/python tools/bench/gpu_vratio.py [--reps 5] [--start-pos 64]
                                                                       [--shapes shipped,synth360]

Shapes: `shipped` (web/models/champion) and `synth360`, a synthetic SmolLM2-360M shape (hidden
960, 32 layers, 15/5 heads, intermediate 2560, vocab 49152, tied f32 embedding) with random q8
weights, written once to build/bench/models/; `synth135-q8` / `synth135-f32`: the SmolLM2-135M
shape (hidden 576, 30 layers, 9/3 heads, intermediate 1536) with q8 or float32 linears (what a
GGUF file dequantised gives). Each n = 1..9 is timed `reps` times, the n
interleaved within each repetition (each after its own warm-up run), as forward(n tokens at
start_pos) + readLogits(n) in the test harness page (web/tests/gpu_harness.html); the ratio uses
medians. Prints a table and writes
build/bench/gpu_vratio.json. A measurement, not a test: the machine is shared and noisy.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "py"))
from exactspec.host.safe_files import write_file  # noqa: E402

SYNTH_DIR = os.path.join("build", "bench", "models", "synth360")
SYNTH135 = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3}                   # SmolLM2-135M; the rest as SYNTH_CONFIG
OUT_PATH = os.path.join("build", "bench", "gpu_vratio.json")
SYNTH_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 960,
    "intermediate_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 15, "num_key_value_heads": 5,
    "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 8192, "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
}


def write_synth(model_dir: str, config=None, linears: str = "q8") -> None:
    """Random weights at a config's shape (default SYNTH_CONFIG): linears int8 uniform with scales
    ~1/(127 sqrt(in)), or with linears="f32" those values as float32 under the HF names."""
    import numpy as np
    from safetensors.numpy import save
    c = config or SYNTH_CONFIG
    if os.path.exists(os.path.join(model_dir, "model.q8.safetensors")):
        return
    os.makedirs(model_dir, exist_ok=True)
    gen = np.random.default_rng(360)
    H, F, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q_dim, kv_dim = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    tensors = {"model.embed_tokens.weight": (gen.standard_normal((c["vocab_size"], H)) * 0.02).astype(np.float32),
               "model.norm.weight": np.ones(H, np.float32)}

    def linear(name, rows, cols):
        q8, scale = gen.integers(-127, 128, (rows, cols), dtype=np.int8), np.float32(1.0 / (127 * np.sqrt(cols)))
        if linears == "f32":
            tensors[name] = q8.astype(np.float32) * scale
        else:
            tensors[name + ".q8"], tensors[name + ".scale"] = q8, np.full(rows, scale, np.float32)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = np.ones(H, np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
        for name, rows, cols in (("self_attn.q_proj", q_dim, H), ("self_attn.k_proj", kv_dim, H),
                                 ("self_attn.v_proj", kv_dim, H), ("self_attn.o_proj", H, q_dim),
                                 ("mlp.gate_proj", F, H), ("mlp.up_proj", F, H), ("mlp.down_proj", H, F)):
            linear(p + name + ".weight", rows, cols)
    write_file(os.path.join(model_dir, "model.q8.safetensors"), save(tensors))
    write_file(os.path.join(model_dir, "config.json"), json.dumps(c, indent=2))


def measure(page, url: str, reps: int, start_pos: int) -> dict:
    info = page.evaluate("([u]) => window.harness.loadChampion(u, 9, 512)", [url])
    warm = list(range(start_pos))
    for s in range(0, start_pos, 9):                     # fill the KV cache up to start_pos
        page.evaluate("(b) => window.harness.forwardBlocks(b)", [[warm[s:s + 9], s]])
    samples = {str(n): [] for n in range(1, 10)}
    for _ in range(reps):                                # n = 1..9 interleaved, so load drifts hit all alike
        once = page.evaluate("([ns, s]) => window.harness.timeForward(ns, s, 1)", [list(range(1, 10)), start_pos])
        for n, t in once.items():
            samples[n].append(t["min"])
    times = {n: {"median": statistics.median(v), "min": min(v)} for n, v in samples.items()}
    base = times["1"]["median"]
    return {"load_s": round(info["loadMs"] / 1000, 1), "pieces": info["pieces"],
            "ms": {n: round(t["median"], 1) for n, t in times.items()},
            "min_ms": {n: round(t["min"], 1) for n, t in times.items()},
            "vratio": {f"V({k + 1})/V(1)": round(times[str(k + 1)]["median"] / base, 2) for k in range(1, 9)}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--start-pos", type=int, default=64)
    ap.add_argument("--shapes", default="shipped,synth360")
    args = ap.parse_args(argv)
    os.chdir(REPO)
    from browser_fixture import get_browser, get_server, shutdown
    shapes = {"shipped": "/web/models/champion/", "synth360": "/" + SYNTH_DIR.replace(os.sep, "/") + "/"}
    if "synth360" in args.shapes:
        write_synth(SYNTH_DIR)
    for form in ("q8", "f32"):
        if f"synth135-{form}" in args.shapes:
            model_dir = os.path.join("build", "bench", "models", f"synth135-{form}")
            write_synth(model_dir, {**SYNTH_CONFIG, **SYNTH135}, form)
            shapes[f"synth135-{form}"] = "/" + model_dir.replace(os.sep, "/") + "/"
    load_before = os.getloadavg()
    page = get_browser().new_page()
    page.goto(get_server().url + "/web/tests/gpu_harness.html")
    page.wait_for_function("() => window.harnessReady === true", timeout=60_000)
    page.evaluate("window.harness.init()")
    results = {}
    try:
        for name in args.shapes.split(","):
            results[name] = measure(page, shapes[name], args.reps, args.start_pos)
    finally:
        shutdown()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "command": "tools/bench/gpu_vratio.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, SwiftShader WebGPU", "start_pos": args.start_pos,
              "reps": args.reps, "shapes": results}
    os.makedirs(os.path.dirname(OUT_PATH), exist_ok=True)
    write_file(OUT_PATH, json.dumps(report, indent=2))
    print(f"{report['date']}  load {report['load_before']} -> {report['load_after']}  start_pos {args.start_pos}, "
          f"median of {args.reps}")
    print("| shape | V(1) ms | " + " | ".join(f"k={k}" for k in range(1, 9)) + " |")
    print("|---|---|" + "---|" * 8)
    for name, r in results.items():
        print(f"| {name} | {r['ms']['1']} | " + " | ".join(str(v) for v in r["vratio"].values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
