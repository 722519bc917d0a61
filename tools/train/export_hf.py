#!/usr/bin/env python3
"""Export a training checkpoint to a Hugging Face Llama directory + int8 browser weights.

  python3 tools/train/export_hf.py --ckpt build/train/champion/ckpt.pt --out web/models/champion
  python3 tools/train/export_hf.py --ckpt build/train/draft/ckpt.pt    --out web/models/draft
  python3 tools/train/export_hf.py --manifest web/models          # (re)write manifest.json

Files written in --out:
  config.json, generation_config.json, model.safetensors (float32, HF names, lm_head tied so
  not stored), model.q8.safetensors (each 2-D linear weight as "<name>.q8" int8 symmetric per
  output row + "<name>.scale" float32 [rows]; w ~= q8 * scale[:, None]; embedding and norms
  float32 under their own names), tokenizer.json, tokenizer_config.json,
  special_tokens_map.json.
With --check (default on) the directory is loaded with transformers.LlamaForCausalLM and its
logits are compared with the training model's (max abs diff printed; must be < 1e-3).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Llama, LlamaConf, hf_config  # noqa: E402
from train_tokenizer import tokenizer_config  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "py"))
from exactspec.formats.manifest import (FILES_MANIFEST_VERSION, Q8_WEIGHTS_FILE, RUN_WEIGHTS_SCHEMES,  # noqa: E402
                                check_weights_metadata, run_weights_scheme)
from exactspec.formats.safetensors import read_header  # noqa: E402

# What the browser runs for each model (manifest.json models.<name>.run_artifact): the WebGPU
# champion the int8 file, the WASM draft the float32 one.
RUN_ARTIFACTS = {"champion": Q8_WEIGHTS_FILE, "draft": "model.safetensors"}
# A draft made for a champion that is not served here (a GGUF) names it in its safetensors
# metadata by sha256; the file name the manifest's `drafts` entry shows for that champion is the
# metadata's exactspec_champion_file, else this table's.
CHAMPION_SHA_KEY, CHAMPION_FILE_KEY = "exactspec_champion_sha256", "exactspec_champion_file"
CHAMPION_FILES = {"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53":
                  "SmolLM2-135M-Instruct.Q4_1.gguf"}
MAX_TOTAL_BYTES = 64 * 1000 * 1000   # see docs/formats.md, "Served files"
SPECIAL_MAP = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>",
               "additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]}


def quantize_rows(w: torch.Tensor):
    """Symmetric per-output-row int8: w ~= q * scale[:, None]."""
    amax = w.abs().amax(dim=1).clamp_min(1e-12)
    scale = (amax / 127.0).float()
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize_state(q8: dict) -> dict:
    out = {}
    for k, v in q8.items():
        if k.endswith(".q8"):
            base = k[:-3]
            out[base] = v.float() * q8[base + ".scale"][:, None]
        elif not k.endswith(".scale"):
            out[k] = v
    return out


def write_json(path, obj):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def export(ckpt_path, out, tokenizer_dir, check=True, meta=None):
    ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    conf = LlamaConf(**ck["conf"])
    model = Llama(conf)
    model.load_state_dict(ck["model"])
    model.eval()
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    os.makedirs(out, exist_ok=True)

    info = {"format": "pt", "exactspec_step": str(ck["step"]),
            "exactspec_tokens_seen": str(ck["tokens_seen"])}
    if meta:
        info.update({k: str(v) for k, v in meta.items()})
    save_file(sd, os.path.join(out, "model.safetensors"), metadata=info)

    q8 = {}
    for k, v in sd.items():
        if v.dim() == 2 and k != "model.embed_tokens.weight":
            q, s = quantize_rows(v)
            q8[k + ".q8"] = q
            q8[k + ".scale"] = s
        else:
            q8[k] = v
    save_file(q8, os.path.join(out, "model.q8.safetensors"),
              metadata=dict(info, quantization=RUN_WEIGHTS_SCHEMES[Q8_WEIGHTS_FILE][1]))

    cfg = hf_config(conf)
    write_json(os.path.join(out, "config.json"), cfg)
    write_json(os.path.join(out, "generation_config.json"),
               {"bos_token_id": 0, "eos_token_id": [1, 6], "pad_token_id": 2,
                "do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0})
    shutil.copyfile(os.path.join(tokenizer_dir, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config())
    write_json(os.path.join(out, "special_tokens_map.json"), SPECIAL_MAP)
    print(f"exported {ckpt_path} (step {ck['step']}, params {model.num_params()}) -> {out}")

    if check:
        from transformers import LlamaForCausalLM
        hf = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
        hf.eval()
        g = torch.Generator().manual_seed(0)
        x = torch.randint(7, conf.vocab_size, (2, 128), generator=g)
        x[:, 0] = 0
        with torch.no_grad():
            a = model(x)
            b = hf(input_ids=x).logits
            m2 = Llama(conf)
            m2.load_state_dict(dequantize_state(q8), strict=True)
            c = m2(x)
        d = (a - b).abs().max().item()
        dq = (a - c).abs().max().item()
        print(f"max |logits(train model) - logits(HF LlamaForCausalLM)| = {d:.3e}")
        print(f"max |logits(fp32) - logits(int8-dequantised)| = {dq:.3e}")
        if d > 1e-3:
            raise SystemExit("HF logits mismatch")
        return {"hf_max_abs_diff": d, "q8_max_abs_diff": dq, "step": ck["step"],
                "params": model.num_params()}
    return {"step": ck["step"], "params": model.num_params()}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def list_files(root):
    """Every file under root but manifest.json, as {path, bytes, sha256}, sorted by path."""
    files = []
    for dp, _dn, fns in os.walk(root):
        for fn in sorted(fns):
            p = os.path.join(dp, fn)
            rel = os.path.relpath(p, root).replace(os.sep, "/")
            if rel == "manifest.json":
                continue
            files.append({"path": rel, "bytes": os.path.getsize(p), "sha256": sha256_file(p)})
    files.sort(key=lambda f: f["path"])
    return files


def model_entry(root, name, listed):
    """models.<name>: training provenance, shape, and the run artifact the browser runs for it
    (its quantisation scheme from the file name, checked against the file's own metadata)."""
    _, md = read_header(os.path.join(root, name, "model.safetensors"))
    with open(os.path.join(root, name, "config.json")) as f:
        cfg = json.load(f)
    run_file = RUN_ARTIFACTS.get(name, "model.safetensors")
    run_path = os.path.join(root, name, run_file)
    check_weights_metadata(run_file, read_header(run_path)[1], run_path)
    digest = listed[f"{name}/{run_file}"]
    return {"dir": name, "step": int(md.get("exactspec_step", -1)),
            "tokens_seen": int(md.get("exactspec_tokens_seen", -1)),
            "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
            "run_artifact": {"file": run_file, "sha256": digest["sha256"], "bytes": digest["bytes"],
                             "quantization": run_weights_scheme(run_file)}}


def made_for_drafts(root):
    """{folder: champion sha256} of every folder under ROOT whose model.safetensors metadata names
    the champion it was made for (exactspec_champion_sha256)."""
    drafts = {}
    for name in sorted(os.listdir(root)):
        weights = os.path.join(root, name, "model.safetensors")
        if name not in RUN_ARTIFACTS and os.path.isfile(weights):
            sha = read_header(weights)[1].get(CHAMPION_SHA_KEY)
            if sha is not None:
                drafts[name] = sha
    return drafts


def champion_file(root, folder, sha):
    """The champion's file name a `drafts` entry shows: the draft's metadata, else CHAMPION_FILES."""
    name = read_header(os.path.join(root, folder, "model.safetensors"))[1].get(CHAMPION_FILE_KEY)
    name = name or CHAMPION_FILES.get(sha)
    if not name:
        raise SystemExit(f"{folder}/model.safetensors: made for champion {sha[:12]}.., whose file name "
                         f"neither its metadata ({CHAMPION_FILE_KEY}) nor CHAMPION_FILES gives")
    return name


def build_manifest(root):
    """The manifest.json of ROOT (see docs/formats.md, "Served files"): every file; models.<name>
    for the toy champion and draft and for each draft made for a champion (made_for_drafts);
    drafts: champion sha256 -> {dir, champion} for the latter."""
    files = list_files(root)
    listed = {f["path"]: f for f in files}
    made_for = made_for_drafts(root)
    names = [name for name in RUN_ARTIFACTS if os.path.exists(os.path.join(root, name, "model.safetensors"))]
    models = {name: model_entry(root, name, listed) for name in names + list(made_for)}
    drafts = {}
    for folder, sha in made_for.items():
        if sha in drafts:
            raise SystemExit(f"{folder} and {drafts[sha]['dir']}: two drafts made for champion {sha[:12]}.., "
                             "the manifest binds one")
        drafts[sha] = {"dir": folder, "champion": champion_file(root, folder, sha)}
    return {"version": FILES_MANIFEST_VERSION, "total_bytes": sum(f["bytes"] for f in files),
            "files": files, "models": models, "drafts": drafts, "tokenizer_shared": True}


def write_manifest(root):
    man = build_manifest(root)
    write_json(os.path.join(root, "manifest.json"), man)
    print(f"manifest: {len(man['files'])} files, {man['total_bytes']} bytes")
    if man["total_bytes"] > MAX_TOTAL_BYTES:
        raise SystemExit(f"model bytes exceed {MAX_TOTAL_BYTES // 1000000} MB")
    return man


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt")
    ap.add_argument("--out")
    ap.add_argument("--tokenizer-dir", default="build/tokenizer")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--manifest", metavar="ROOT", help="write ROOT/manifest.json and exit")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.manifest:
        write_manifest(args.manifest)
        return
    if not (args.ckpt and args.out):
        ap.error("--ckpt and --out are required (or --manifest)")
    export(args.ckpt, args.out, args.tokenizer_dir, check=not args.no_check)


if __name__ == "__main__":
    main()
