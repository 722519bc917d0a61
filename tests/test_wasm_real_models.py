"""The WASM champion on Hugging Face families (issue 10): Llama (tied, and llama3 RoPE scaling),
Qwen2 (q/k/v biases, tied and untied head), TinyLlama, each converted by `exactspec convert`
from a transformers-made bf16 folder (tests/synthetic_models.py). In Node: logits against the CPython
reference on the same q8 artifact within TOLERANCES["wasm_champion_logits"] (blocks with a
rollback), greedy argmax equal wherever the reference's top-2 margin exceeds that tolerance, and
int8-held weights bitwise equal to f32-held ones (their remainder path: widths not multiples of
16). Also a q8 embedding (convert --q8-embedding)."""
from __future__ import annotations

import numpy as np
import pytest

from synthetic_models import HUB_CHAMPIONS, synth_models_dirs  # noqa: F401 (session fixture)
from test_gpu_champion import split
from test_wasm_champion import WASM, as_blocks, forward_rows, run_node
from tolerances import TOLERANCES, max_error, within

from exactspec.reference.convert import convert
from exactspec.reference.reference_llama import LlamaReference

CASES = [(shape, False) for shape in HUB_CHAMPIONS] + [("qwen2.5-mid", True)]


@pytest.fixture(scope="module")
def converted(synth_models_dirs, tmp_path_factory):  # noqa: F811
    out = {}
    for shape, q8_embedding in CASES:
        dst = tmp_path_factory.mktemp(f"wasm_{shape}_{int(q8_embedding)}")
        convert(synth_models_dirs[shape], dst, q8_embedding=q8_embedding)
        out[(shape, q8_embedding)] = dst
    return out


@pytest.mark.parametrize("shape,q8_embedding", CASES)
def test_wasm_champion_matches_the_reference_on_real_families(converted, shape, q8_embedding):
    model_dir = converted[(shape, q8_embedding)]
    ref = LlamaReference.from_dir(model_dir, weights="q8")
    V = ref.vocab_size
    ids = np.random.default_rng(4).integers(0, V, 40)
    blocks = split(ids, [9, 1, 5, 8, 3, 9]) + [(ids[30:35], 30), (ids[35:40], 35)]   # a rollback, re-fed
    cases = {"forward": [as_blocks(blocks)]}
    outs = {storage: run_node(model_dir, cases, weight_storage=storage, wasm=WASM) for storage in ("f32", "int8")}
    assert outs["f32"]["info"]["identity"] == ref.identity
    rows = {s: forward_rows(o["forward"][0], blocks, V) for s, o in outs.items()}
    ref.reset()
    tol = TOLERANCES["wasm_champion_logits"].max_abs
    worst, n_argmax = 0.0, 0
    for got, got8, (block_ids, start) in zip(rows["f32"], rows["int8"], blocks):
        want = ref.forward(block_ids, start)
        assert np.array_equal(got.view(np.uint32), got8.view(np.uint32)), f"{shape}: int8 storage differs"
        worst = max(worst, max_error(got, want, "wasm_champion_logits"))
        assert within(got, want, "wasm_champion_logits"), (shape, start, np.abs(got - want).max())
        top2 = np.sort(want, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * tol
        assert np.array_equal(got.argmax(1)[clear], want.argmax(1)[clear]), (shape, start)
        n_argmax += int(clear.sum())
    assert n_argmax >= 30
    print(f"[err] wasm_champion_logits ({shape}, q8 embedding {q8_embedding}): max abs {worst:.3g}")


DRAFTS = ("smollm2-draft", "qwen2.5-draft", "llama3.2-draft", "tinyllama-draft")


@pytest.mark.parametrize("shape", DRAFTS)
def test_wasm_draft_matches_the_reference_on_real_families(synth_models_dirs, tmp_path, shape):  # noqa: F811
    """The WASM draft on `exactspec convert --role draft` folders (all-F32 model.safetensors):
    Qwen2 biases, llama3 RoPE, the families' vocabularies; logits of single steps and a prompt
    block against the reference within TOLERANCES["draft_logits"]."""
    from test_wasm_draft import HARNESS as DRAFT_HARNESS, WASM as DRAFT_WASM, ensure_wasm, unb64
    from node_harness import run_harness
    convert(synth_models_dirs[shape], tmp_path, role="draft")
    ref = LlamaReference.from_dir(tmp_path)
    ids = np.random.default_rng(6).integers(0, ref.vocab_size, 20).tolist()
    seq = [(ids[:12], 0)] + [([t], 12 + i) for i, t in enumerate(ids[12:18])] + [(ids[14:20], 14)]
    ensure_wasm()
    out = run_harness(DRAFT_HARNESS, {"wasm": str(DRAFT_WASM), "model_dir": str(tmp_path),
                                      "forward": [[[i, s] for i, s in seq]]})
    ref.reset()
    for (block, start), row in zip(seq, out["forward"][0]):
        got, want = unb64(row, "<f4"), ref.forward(block, start)[-1]
        assert within(got, want, "draft_logits"), (shape, start, float(np.abs(got - want).max()))
