"""Function-preserving widening of a trained tied Llama to a larger shape (HF folder, float32).

    python3 tools/widen.py SRC DST --hidden 960 --layers 32 --heads 15 --kv-heads 5 \
        --intermediate 2560 --vocab 49152          # or --shape NAME (SHAPES below)
    python3 tools/widen.py web/models/champion build/widened/champion-1.7b --shape smollm2-1.7b
    python3 tools/widen.py web/models/draft build/widened/draft-1.7b --shape smollm2-1.7b-draft

The widened model computes the same next-token distribution as SRC (up to float rounding), at
the cost of the target shape. Notation: D, H, KV, F, L, V the source sizes, primes the target.

- Heads (head_dim unchanged): HF's GQA gives query head h the kv head h // (H/KV). With source
  groups of s = H/KV query heads and target groups of g' = H'/KV', each source kv head g gets
  c = ceil(s / g') target kv heads g*c .. g*c+c-1, each a copy of its k/v rows; source query head
  h (g = h // s, rank r = h % s) becomes target head (g*c + r // g') * g' + r % g', so every real
  query still reads its own keys and values (c = 1 when g' >= s: head g*g' + r, kv head g; c = 2
  for SmolLM2-1.7B's MHA from the toy pair's groups of 2). Every other head has zero q/k/v rows
  and zero o_proj columns: it attends, but its output is multiplied by zero. Needs
  KV' >= KV * c.
- Width D -> D': the residual stream is [x, c, 0...]: the real D dims, then one "bias" dim c
  holding a constant a in every real embedding row, then zeros. Nothing writes into dims >= D
  (zero o_proj / down_proj rows), so they keep these values through every layer. RMSNorm over
  D' dims sees sum(x^2) + a^2, so with
      eps' = (eps * D - a^2) / D'          (a^2 < eps * D: a is a power of two <= sqrt(eps*D/2))
  mean' + eps' = (sum(x^2) + a^2)/D' + eps' = (D/D') * (sum(x^2)/D + eps): the normalised real
  dims are sqrt(D'/D) times the source's, undone by norm weights w * sqrt(D/D'). The layer
  norms have weight 0 on dims >= D (the layers never see c); q/k/v/gate/up have zero input
  columns there too.
- MLP F -> F': zero gate/up rows and zero down_proj columns (silu(0) * 0 = 0).
- Layers L -> L': appended layers are all zero but their norms (weight 1): o_proj and
  down_proj add exactly 0.0 to the residual.
- Vocabulary V -> V' (tied head): the extra embedding rows are -B on dim c and 0 elsewhere, and
  the final norm has weight W on c, so an extra token's logit is -B * W * a / rms', rms' =
  sqrt(D/D') * (the source's rms): with B = 2^15, W = 2^10 and a = 2^-5 that is -2^20 / rms',
  below -1e4 for any residual rms' up to ~100, and never beyond float32 (rms' >= sqrt((D/D') *
  eps)). B = 2^15 keeps the rows storable in every GGUF block format (the float16 scale of a
  block holding -B alone: Q8_0 B/127, Q4_0 B/8, Q4_1 min -B, all below float16's 65504, and
  Q4_0/Q4_1 give -B back exactly). Greedy never picks an extra token and its probability
  underflows to exactly 0, so processors need not know about it. The same dim adds
  W * a * (a / rms') = 1 / rms' to every real token's logit: one constant per position, so the
  softmax, greedy tokens and sampling are unchanged (compare log-softmax, not raw logits). The tokenizer gets V'-V model-vocabulary entries
  `<|extra_N|>` that no merge produces, so no text ever encodes to them.

Rounding: everything is exact but the rescaled norm weights (float32 w * sqrt(D/D')) and the
sums now running over zeros, so logits agree to float rounding (tests/test_widen.py). bf16 is
not written: the trained weights are float32 and would not survive bf16 exactly.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))

from exactspec.host.safe_files import copy_file, replacing, write_file  # noqa: E402
from exactspec.formats.safetensors import load_safetensors, safetensors_layout, to_numpy  # noqa: E402

SHAPES = {   # the published SmolLM2 configs (hidden, layers, heads, kv heads, intermediate, vocab)
    "smollm2-1.7b": dict(hidden=2048, layers=24, heads=32, kv_heads=32, intermediate=8192, vocab=49152),
    "smollm2-360m": dict(hidden=960, layers=32, heads=15, kv_heads=5, intermediate=2560, vocab=49152),
    "smollm2-135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152),
    # not a published model: a draft for the 1.7B shape (docs/models.md, "Real sizes": 2.9 % of its
    # multiply-adds a token, 18 % of its Q4_1 bytes as the draft's float32)
    "smollm2-1.7b-draft": dict(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536, vocab=49152),
}
EXTRA_ROW_BIAS = float(2 ** 15)      # B: an extra token's row is -B on the bias dim
EXTRA_NORM_WEIGHT = float(2 ** 10)   # W: the final norm's weight on the bias dim
COPIED_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json")


# ---------------------------------------------------------------------------------------------
# The plan (pure)
# ---------------------------------------------------------------------------------------------


def bias_value(eps: float, hidden: int) -> float:
    """a: the largest power of two with a^2 <= eps * D / 2 (exact in any float format)."""
    return 2.0 ** math.floor(math.log2(math.sqrt(eps * hidden / 2)))


def plan_widening(cfg: dict, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                  vocab: int) -> dict:
    """Source config.json + target sizes -> the plan; ValueError naming the first impossibility."""
    src = dict(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
               kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
               intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"])
    dst = dict(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, intermediate=intermediate, vocab=vocab)
    if not cfg.get("tie_word_embeddings", True):
        raise ValueError("source head is untied: only tied models are widened")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("source has biases: not supported")
    for k in ("layers", "intermediate", "vocab", "kv_heads"):
        if dst[k] < src[k]:
            raise ValueError(f"target {k} {dst[k]} is smaller than the source's {src[k]}")
    if dst["hidden"] <= src["hidden"]:
        raise ValueError(f"target hidden {dst['hidden']} must exceed the source's {src['hidden']} (one dim carries the bias)")
    if heads % kv_heads or src["heads"] % src["kv_heads"]:
        raise ValueError("heads must be a multiple of kv heads")
    group, src_group = heads // kv_heads, src["heads"] // src["kv_heads"]
    copies = -(-src_group // group)              # c: target kv heads per source kv head
    if kv_heads < src["kv_heads"] * copies:
        raise ValueError(f"target has {kv_heads} kv heads: the source's {src['kv_heads']} kv heads of {src_group} query "
                         f"heads each need {src['kv_heads'] * copies} at {group} query heads per kv head")
    head_dim = cfg.get("head_dim") or src["hidden"] // src["heads"]
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    a = bias_value(eps, src["hidden"])
    q_heads = [((h // src_group) * copies + (h % src_group) // group) * group + (h % src_group) % group
               for h in range(src["heads"])]
    kv_sources = [j // copies for j in range(src["kv_heads"] * copies)]    # target kv head j copies source kv head
    return dict(src=src, dst=dst, head_dim=head_dim, eps=eps, new_eps=(eps * src["hidden"] - a * a) / hidden,
                bias=a, norm_scale=math.sqrt(src["hidden"] / hidden), q_heads=q_heads, kv_sources=kv_sources,
                bias_dim=src["hidden"])


def widened_config(cfg: dict, plan: dict) -> dict:
    d = plan["dst"]
    out = dict(cfg)
    out.update(hidden_size=d["hidden"], num_hidden_layers=d["layers"], num_attention_heads=d["heads"],
               num_key_value_heads=d["kv_heads"], intermediate_size=d["intermediate"], vocab_size=d["vocab"],
               head_dim=plan["head_dim"], rms_norm_eps=plan["new_eps"], tie_word_embeddings=True,
               torch_dtype="float32")
    return out


def macs_per_token(shape: dict, head_dim: int) -> dict:
    """Multiply-adds of one token's linears at `shape` (SHAPES' keys): {layers, head, total}."""
    D, F = shape["hidden"], shape["intermediate"]
    q, kv = shape["heads"] * head_dim, shape["kv_heads"] * head_dim
    layers = shape["layers"] * (D * q + 2 * D * kv + q * D + 3 * D * F)
    return {"layers": layers, "head": shape["vocab"] * D, "total": layers + shape["vocab"] * D}


def target_shapes(plan: dict) -> dict:
    d, hd = plan["dst"], plan["head_dim"]
    D, F, V = d["hidden"], d["intermediate"], d["vocab"]
    q, kv = d["heads"] * hd, d["kv_heads"] * hd
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                       p + "self_attn.q_proj.weight": (q, D), p + "self_attn.k_proj.weight": (kv, D),
                       p + "self_attn.v_proj.weight": (kv, D), p + "self_attn.o_proj.weight": (D, q),
                       p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                       p + "mlp.down_proj.weight": (D, F)})
    return shapes


def _head_rows(heads: list[int], hd: int) -> np.ndarray:
    """Row indices of the given heads in a (heads*hd, ...) projection."""
    return (np.asarray(heads)[:, None] * hd + np.arange(hd)[None, :]).reshape(-1)


def widen_tensor(name: str, shape: tuple, src: dict, plan: dict) -> np.ndarray:
    """The target tensor `name` (float32) from the source tensors src (name -> float32 array)."""
    s, hd, Ds = plan["src"], plan["head_dim"], plan["src"]["hidden"]
    out = np.zeros(shape, dtype=np.float32)
    if name == "model.embed_tokens.weight":
        out[:s["vocab"], :Ds] = src[name]
        out[:s["vocab"], plan["bias_dim"]] = plan["bias"]
        out[s["vocab"]:, plan["bias_dim"]] = -EXTRA_ROW_BIAS
        return out
    scale = np.float32(plan["norm_scale"])
    if name == "model.norm.weight":
        out[:Ds] = src[name] * scale
        out[plan["bias_dim"]] = EXTRA_NORM_WEIGHT
        return out
    layer = int(name.split(".")[2])
    if layer >= s["layers"]:                         # appended layer: zero but its norms
        if name.endswith("layernorm.weight"):
            out[:] = 1.0
        return out
    w = src[name]
    if name.endswith("layernorm.weight"):
        out[:Ds] = w * scale
    elif name.endswith("q_proj.weight"):
        out[_head_rows(plan["q_heads"], hd), :Ds] = w
    elif name.endswith(("k_proj.weight", "v_proj.weight")):   # target kv head j: source kv head kv_sources[j]
        rows = w.reshape(s["kv_heads"], hd, -1)[plan["kv_sources"]].reshape(-1, w.shape[1])
        out[:rows.shape[0], :Ds] = rows
    elif name.endswith("o_proj.weight"):
        out[:Ds, _head_rows(plan["q_heads"], hd)] = w
    elif name.endswith(("gate_proj.weight", "up_proj.weight")):
        out[:w.shape[0], :Ds] = w
    elif name.endswith("down_proj.weight"):
        out[:Ds, :w.shape[1]] = w
    else:
        raise ValueError(f"unexpected tensor {name}")
    return out


def pad_tokenizer(spec: dict, vocab: int) -> dict:
    """tokenizer.json with model-vocabulary entries <|extra_N|> up to `vocab` ids (no merges)."""
    out = json.loads(json.dumps(spec))
    model_vocab = out["model"]["vocab"]
    used = set(model_vocab.values()) | {t["id"] for t in out.get("added_tokens") or []}
    for i in range(max(used) + 1, vocab):
        model_vocab[f"<|extra_{i}|>"] = i
    return out


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def widen_folder(src_dir: str, dst_dir: str, log=print, **target) -> dict:
    with open(os.path.join(src_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    plan = plan_widening(cfg, **target)
    os.makedirs(dst_dir, exist_ok=True)
    started = time.perf_counter()
    src = {k: to_numpy(t).astype(np.float32) for k, t in load_safetensors(os.path.join(src_dir, "model.safetensors")).items()}
    shapes = target_shapes(plan)
    prefix, order = safetensors_layout({k: ("F32", v) for k, v in shapes.items()},
                                       {"format": "pt", "widened_from": os.path.basename(os.path.normpath(src_dir))})
    with replacing(os.path.join(dst_dir, "model.safetensors"), "wb") as f:     # one tensor at a time
        f.write(prefix)
        for name, _, shape, nbytes in order:
            data = widen_tensor(name, shape, src, plan).astype("<f4").tobytes()
            assert len(data) == nbytes
            f.write(data)
    write_file(os.path.join(dst_dir, "config.json"), json.dumps(widened_config(cfg, plan), indent=2) + "\n")
    with open(os.path.join(src_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = pad_tokenizer(json.load(f), plan["dst"]["vocab"])
    write_file(os.path.join(dst_dir, "tokenizer.json"), json.dumps(tok, ensure_ascii=False, indent=2))
    for name in COPIED_FILES:
        if os.path.exists(os.path.join(src_dir, name)):
            copy_file(os.path.join(src_dir, name), os.path.join(dst_dir, name))
    params = sum(math.prod(s) for s in shapes.values())
    log(f"widen: {src_dir} -> {dst_dir}: {params:,} parameters, {macs_per_token(plan['dst'], plan['head_dim'])['total']:,} "
        f"multiply-adds a token, eps {plan['new_eps']:.6g}, bias {plan['bias']}, "
        f"{time.perf_counter() - started:.1f} s")
    return dict(plan, params=params)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--shape", choices=sorted(SHAPES))
    for k in ("hidden", "layers", "heads", "kv-heads", "intermediate", "vocab"):
        ap.add_argument(f"--{k}", type=int)
    args = ap.parse_args(argv)
    target = dict(SHAPES[args.shape]) if args.shape else {}
    for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
        if getattr(args, k) is not None:
            target[k] = getattr(args, k)
    if len(target) != 6:
        ap.error("give --shape or all of --hidden --layers --heads --kv-heads --intermediate --vocab")
    try:
        widen_folder(args.src, args.dst, **target)
    except ValueError as e:
        print(f"widen: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
