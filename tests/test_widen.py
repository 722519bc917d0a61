"""tools/widen.py: the widened pair computes the trained pair's distribution at a larger shape.

A mid-size widening of the shipped champion and draft (every kind of growth: heads with GQA
regrouping, width, MLP, layers, vocabulary); the full SmolLM2 360M/135M shapes are a tool run.
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
TARGETS = {   # mid-size: every dimension grows, GQA groups of 2 -> 3
    "champion": dict(hidden=384, layers=8, heads=6, kv_heads=2, intermediate=1024, vocab=4608),
    "draft": dict(hidden=192, layers=3, heads=3, kv_heads=1, intermediate=512, vocab=4608),
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
    role = request.param
    dst = str(tmp_path_factory.mktemp(f"wide_{role}"))
    plan = widen.widen_folder(os.path.join(MODELS, role), dst, log=lambda *_: None, **TARGETS[role])
    return role, dst, plan


def test_widened_model_keeps_the_distribution_and_greedy_tokens(widened):
    role, dst, plan = widened
    src = LlamaReference.from_dir(os.path.join(MODELS, role))
    wide = LlamaReference.from_dir(dst)
    tok = Tokenizer.from_file(os.path.join(MODELS, role, "tokenizer.json"))
    V = src.vocab_size
    assert wide.vocab_size == TARGETS[role]["vocab"]
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
    if role != "champion":
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
    base = TARGETS["champion"]
    for change, needle in [(dict(hidden=256), "hidden"), (dict(layers=4), "layers"),
                           (dict(heads=8, kv_heads=8), "query heads per kv head"), (dict(vocab=100), "vocab")]:
        with pytest.raises(ValueError, match=needle):
            widen.plan_widening(cfg, **dict(base, **change))
