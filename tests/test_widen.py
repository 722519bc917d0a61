"""tools/widen.py: the widened pair computes the trained pair's distribution at a larger shape.

A mid-size widening of the shipped champion and draft (every kind of growth: heads with GQA
regrouping, width, MLP, layers, vocabulary), and of the champion to multi-head attention (its
groups of 2 query heads split over copied kv heads, as for SmolLM2-1.7B's shape); the full
SmolLM2 shapes are a tool run.
Checked with the float64 reference (and once with transformers): log-softmax equal within
TOLERANCES["widened_logprobs"], greedy tokens equal, padded ids far below every real logit and
never produced by the tokenizer.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from exactspec.reference.reference_llama import LlamaReference
from exactspec.formats.tokenizer import Tokenizer
from tolerances import TOLERANCES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import widen  # noqa: E402

MODELS = os.path.join(ROOT, "web", "models")
TARGETS = {   # case -> (source, mid-size target: every dimension grows)
    "champion": ("champion", dict(hidden=384, layers=8, heads=6, kv_heads=2, intermediate=1024, vocab=4608)),  # GQA 2 -> 3
    "draft": ("draft", dict(hidden=192, layers=3, heads=3, kv_heads=1, intermediate=512, vocab=4608)),
    # MHA: groups of 2 -> 1 (each source kv head copied twice), two spare kv heads
    "champion_mha": ("champion", dict(hidden=384, layers=7, heads=6, kv_heads=6, intermediate=1024, vocab=4608)),
}
PROMPTS = ["Once upon a time", "The little robot said", "def add(a, b):\n"]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _greedy(model: LlamaReference, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    model.reset()
    logits = model.forward(ids, 0)
    rows, out = [logits[-1]], []
    for _ in range(n):
        out.append(int(np.argmax(rows[-1])))
        rows.append(model.forward([out[-1]], len(ids) + len(out) - 1)[-1])
    return out, np.stack(rows)


@pytest.fixture(scope="module", params=sorted(TARGETS))
def widened(request, tmp_path_factory):
    role, target = TARGETS[request.param]
    dst = str(tmp_path_factory.mktemp(f"wide_{request.param}"))
    plan = widen.widen_folder(os.path.join(MODELS, role), dst, log=lambda *_: None, **target)
    return role, dst, plan


def test_widened_model_keeps_the_distribution_and_greedy_tokens(widened):
    role, dst, plan = widened
    src = LlamaReference.from_dir(os.path.join(MODELS, role))
    wide = LlamaReference.from_dir(dst)
    tok = Tokenizer.from_file(os.path.join(MODELS, role, "tokenizer.json"))
    V = src.vocab_size
    assert wide.vocab_size == plan["dst"]["vocab"]
    tol = TOLERANCES["widened_logprobs"]
    worst = 0.0
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        want_tokens, want = _greedy(src, ids, 24)
        got_tokens, got = _greedy(wide, ids, 24)
        assert got_tokens == want_tokens, (role, prompt)
        err = np.abs(_log_softmax(got)[:, :V] - _log_softmax(want))
        worst = max(worst, float(err.max()))
        assert np.all(err <= tol.max_abs + tol.max_rel * np.abs(_log_softmax(want))), (role, prompt, err.max())
        # padded ids: far below every real logit, so their probability is exactly 0 in float64
        assert np.all(got[:, V:].max(axis=1) < got[:, :V].min(axis=1) - 1e4)
        assert np.all(np.exp(_log_softmax(got)[:, V:]) == 0.0)
    print(f"{role}: widened log-softmax max |diff| {worst:.3g}")


def test_widened_tokenizer_pads_without_changing_any_encoding(widened):
    role, dst, _ = widened
    src = Tokenizer.from_file(os.path.join(MODELS, role, "tokenizer.json"))
    wide = Tokenizer.from_file(os.path.join(dst, "tokenizer.json"))
    with open(os.path.join(dst, "config.json"), encoding="utf-8") as f:
        assert wide.vocab_size == json.load(f)["vocab_size"]
    for text in PROMPTS + ["<|extra_4100|> <|extra_4500|>", "<|bos|>hi<|end|>", "é 😀 \n\t  x"]:
        assert wide.encode(text) == src.encode(text), text
        assert max(wide.encode(text)) < src.vocab_size


def test_transformers_runs_the_widened_champion_to_the_same_tokens(widened):
    role, dst, _ = widened
    if role != "champion":      # the champion's GQA regrouping and its MHA copies, through HF's repeat_kv
        return
    import torch
    from transformers import AutoModelForCausalLM
    src = LlamaReference.from_dir(os.path.join(MODELS, role))
    tok = Tokenizer.from_file(os.path.join(MODELS, role, "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float64).eval()
    ids = tok.encode(PROMPTS[0])
    want, _ = _greedy(src, ids, 16)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=2)
    assert out[0, len(ids):].tolist()[:len(want)] == want[:out.shape[1] - len(ids)]


def test_impossible_targets_are_refused():
    with open(os.path.join(MODELS, "champion", "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    base = TARGETS["champion"][1]
    for change, needle in [(dict(hidden=256), "hidden"), (dict(layers=4), "layers"),
                           (dict(heads=3, kv_heads=3), "kv heads of 2 query heads each need 4"),
                           (dict(heads=6, kv_heads=4), "multiple of kv heads"), (dict(vocab=100), "vocab")]:
        with pytest.raises(ValueError, match=needle):
            widen.plan_widening(cfg, **dict(base, **change))


def test_head_placement_keeps_every_query_on_its_own_kv_head():
    """Under HF's rule (query head t reads kv head t // (H'/KV')), each source query head lands on a
    target kv head that copies its own source kv head; no two land on one head."""
    with open(os.path.join(MODELS, "champion", "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    for heads, kv_heads in ((4, 2), (6, 2), (4, 4), (6, 6), (8, 4), (32, 32)):
        plan = widen.plan_widening(cfg, **dict(TARGETS["champion"][1], hidden=max(384, heads * 64), heads=heads,
                                               kv_heads=kv_heads))
        group = heads // kv_heads
        assert len(set(plan["q_heads"])) == 4 and max(plan["q_heads"]) < heads
        for h, t in enumerate(plan["q_heads"]):
            assert plan["kv_sources"][t // group] == h // 2, (heads, kv_heads, h, t)


def test_the_1_7b_shape_and_its_draft():
    """SmolLM2-1.7B's shape plans from the shipped champion (MHA: 2 copies of each kv head), its
    draft shape from the shipped draft, at 2.9 % of the 1.7B's multiply-adds a token."""
    def cfg(role):
        with open(os.path.join(MODELS, role, "config.json"), encoding="utf-8") as f:
            return json.load(f)
    big = widen.plan_widening(cfg("champion"), **widen.SHAPES["smollm2-1.7b"])
    assert big["kv_sources"] == [0, 0, 1, 1] and big["q_heads"] == [0, 1, 2, 3]
    assert widen.target_shapes(big)["model.layers.23.self_attn.k_proj.weight"] == (2048, 2048)
    small = widen.plan_widening(cfg("draft"), **widen.SHAPES["smollm2-1.7b-draft"])
    ratio = (widen.macs_per_token(small["dst"], 64)["total"] / widen.macs_per_token(big["dst"], 64)["total"])
    assert widen.macs_per_token(big["dst"], 64)["total"] == 1_711_276_032
    assert round(ratio, 3) == 0.029


def test_extra_rows_survive_every_gguf_block_format():
    """An extra token's embedding row (-B on the bias dim) and a real row's bias value come back from
    Q8_0, Q4_0 and Q4_1 blocks with finite float16 scales; Q4_0/Q4_1 give -B back exactly. (Q4_1
    moves the zeros of -B's own block by the float16 rounding of its scale: dims >= D that are zero
    in every residual, so they add nothing to a logit.)"""
    import gguf
    a = widen.bias_value(1e-5, 256)
    rows = np.zeros((2, 64), dtype=np.float32)
    rows[0, 0], rows[1, 0] = -widen.EXTRA_ROW_BIAS, a
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1):
        back = gguf.quants.dequantize(gguf.quants.quantize(rows, qtype), qtype)
        assert np.isfinite(back).all(), qtype
        assert abs(back[0, 0] + widen.EXTRA_ROW_BIAS) <= widen.EXTRA_ROW_BIAS * 2 ** -10, qtype
        if qtype != gguf.GGMLQuantizationType.Q8_0:
            assert back[0, 0] == -widen.EXTRA_ROW_BIAS, qtype
        assert abs(back[1, 0] - a) <= a * 2 ** -10, qtype
        assert np.count_nonzero(back[:, 32:]) == 0 and np.count_nonzero(back[1, 1:]) == 0, qtype
