"""Benchmark-only: a GGUF file (or a Hugging Face folder) to the ONNX folder transformers.js loads offline.

    bash tools/bench/setup_onnx.sh                      # once: the export venv build/onnx_venv
    build/onnx_venv/bin/python tools/bench/onnx_export.py \
        build/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf build/onnx/smollm2-135m-instruct

Writes OUT/ with config.json, generation_config.json, tokenizer.json, tokenizer_config.json and
onnx/model.onnx (fp32: optimum's exporter, task text-generation-with-past, merged past/no-past
decoder) and onnx/model_int8.onnx (onnxruntime's quantize_dynamic, int8 weights per channel) -- the names
transformers.js picks for dtype "fp32" and "int8". A GGUF source is first dequantised to a float32
Hugging Face folder OUT.hf/ by the project's own reader (exactspec.formats.gguf_model: the weights
our engine reads, q/k rows in HF order) with its tokenizer.json and tokenizer_config.json rebuilt
from the file (exactspec.formats.gguf_tokenizer), so both sides see the same model and tokenizer.
Runs only in the export venv (optimum-onnx, onnx, onnxruntime, CPU torch): never a runtime
dependency of the project. Used by tools/bench/peer.py --tfjs OUT.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "py"))
from exactspec.host.safe_files import copy_file, write_file  # noqa: E402  (never through a link)

FP32_NAME, INT8_NAME = "model.onnx", "model_int8.onnx"     # transformers.js: dtype fp32, int8
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def generation_config(config: dict, stop_ids) -> dict:
    """generation_config.json: bos, eos (every stop id) and no sampling default."""
    eos = sorted({*(stop_ids or ()), *([config["eos_token_id"]] if "eos_token_id" in config else [])})
    out = {"do_sample": False}
    if "bos_token_id" in config:
        out["bos_token_id"] = config["bos_token_id"]
    if eos:
        out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return out


def write_json(path: str, value: dict) -> None:
    write_file(path, json.dumps(value, indent=1, ensure_ascii=False))


def hf_folder_from_gguf(gguf_path: str, hf_dir: str) -> None:
    """gguf_path dequantised to a float32 Hugging Face folder (config, model.safetensors, tokenizer)."""
    import numpy as np
    from safetensors.numpy import save
    from exactspec.formats.gguf_model import GGUFModel
    from exactspec.formats.gguf_tokenizer import stop_token_ids, tokenizer_config, tokenizer_spec

    os.makedirs(hf_dir, exist_ok=True)
    with GGUFModel(gguf_path) as model:
        tensors = {name: np.ascontiguousarray(model.read_float32(name), dtype=np.float32) for name in model.names}
        write_file(os.path.join(hf_dir, "model.safetensors"), save(tensors, metadata={"format": "pt"}))
        write_json(os.path.join(hf_dir, "config.json"), model.config)
        write_json(os.path.join(hf_dir, "tokenizer.json"), tokenizer_spec(model.file))
        write_json(os.path.join(hf_dir, "tokenizer_config.json"), tokenizer_config(model.file))
        write_json(os.path.join(hf_dir, "generation_config.json"),
                   generation_config(model.config, stop_token_ids(model.file)))


def export_fp32(hf_dir: str, out_dir: str) -> str:
    """optimum's ONNX export of hf_dir (decoder with past key values) -> OUT/onnx/model.onnx."""
    from optimum.exporters.onnx import main_export
    onnx_dir = os.path.join(out_dir, "onnx")
    os.makedirs(onnx_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        main_export(hf_dir, output=tmp, task="text-generation-with-past", device="cpu", local_files_only=True)
        produced = sorted(os.listdir(tmp))
        if FP32_NAME not in produced:
            raise SystemExit(f"onnx_export: optimum wrote {produced}, no {FP32_NAME}")
        for name in produced:
            if name.startswith("model.onnx"):              # model.onnx (+ model.onnx_data when over 2 GB)
                copy_file(os.path.join(tmp, name), os.path.join(onnx_dir, name))   # tmp goes with its folder
    path = os.path.join(onnx_dir, FP32_NAME)
    unshare_weights(path)
    return path


def unshare_weights(path: str, min_elements: int = 1 << 16) -> int:
    """Give every use of a weight its own copy in the ONNX file at path; -> copies made.
    torch's exporter merges parameters of equal value into one initializer, which each further
    use reads through an Identity node: a widened model (tools/widen.py: all-zero appended
    layers) then holds a handful of shared matrices that stay in the CPU's cache across layers
    (onnxruntime would not stream the bytes the model holds), and onnxruntime's quantiser leaves
    every MatMul fed by an Identity in float32. Each such Identity becomes an initializer of its
    own (a copy), and so does every further direct use. Only tensors of min_elements or more (not
    norms, not scalars); the main graph."""
    import numpy as np
    import onnx
    model = onnx.load(path)
    weights = {t.name: t for t in model.graph.initializer if int(np.prod(t.dims)) >= min_elements}
    copies = 0
    for node in list(model.graph.node):
        if node.op_type == "Identity" and node.input[0] in weights:
            copy = onnx.TensorProto()
            copy.CopyFrom(weights[node.input[0]])
            copy.name = node.output[0]
            model.graph.initializer.append(copy)
            model.graph.node.remove(node)
            copies += 1
    seen = set()
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name not in weights:
                continue
            if name not in seen:
                seen.add(name)
                continue
            copy = onnx.TensorProto()
            copy.CopyFrom(weights[name])
            copy.name = f"{name}.copy{copies}"
            model.graph.initializer.append(copy)
            node.input[i] = copy.name
            copies += 1
    used = {name for node in model.graph.node for name in node.input}
    for t in [t for t in model.graph.initializer if t.name in weights and t.name not in used]:
        model.graph.initializer.remove(t)           # one whose every use is now a copy
    if copies:
        onnx.save(model, path)
    return copies


def export_int8(fp32_path: str) -> str:
    """onnxruntime's dynamic int8 quantisation of the fp32 model (weights int8 with a scale per
    output channel, activations quantised at run time) -> onnx/model_int8.onnx. Per channel: with
    quantize_dynamic's default (one scale per tensor) SmolLM2-135M-Instruct's first greedy token
    already differed from the fp32 model's (onnxruntime CPU and onnxruntime-web alike); per channel
    kept the first five of a 20-token greedy answer."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    out = os.path.join(os.path.dirname(fp32_path), INT8_NAME)
    quantize_dynamic(fp32_path, out, weight_type=QuantType.QInt8, per_channel=True)
    return out


def export(src: str, out_dir: str, int8: bool = True) -> dict:
    """src (.gguf file or HF folder) -> out_dir, the folder transformers.js loads. -> what was written."""
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    if src.endswith(".gguf"):
        hf_dir = out_dir.rstrip(os.sep) + ".hf"
        hf_folder_from_gguf(src, hf_dir)
    else:
        hf_dir = src
    for name in ("config.json", "generation_config.json", *TOKENIZER_FILES):
        if os.path.isfile(os.path.join(hf_dir, name)):
            copy_file(os.path.join(hf_dir, name), os.path.join(out_dir, name))
    missing = [n for n in ("config.json", *TOKENIZER_FILES) if not os.path.isfile(os.path.join(out_dir, n))]
    if missing:
        raise SystemExit(f"onnx_export: {src}: no {', '.join(missing)} (transformers.js needs them)")
    written = {"fp32": export_fp32(hf_dir, out_dir)}
    if int8:
        written["int8"] = export_int8(written["fp32"])
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="a .gguf file or a Hugging Face model folder (config.json, safetensors, tokenizer)")
    ap.add_argument("out", help="the folder to write (transformers.js's model folder)")
    ap.add_argument("--no-int8", action="store_true", help="only the fp32 export")
    args = ap.parse_args(argv)
    for dtype, path in export(args.src, args.out, int8=not args.no_int8).items():
        print(f"{dtype}: {path} ({os.path.getsize(path) / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
