"""The WASM champion on Hugging Face families (issue 10): Llama (tied, and llama3 RoPE scaling),
Qwen2 (q/k/v biases, tied and untied head), TinyLlama, each converted by `exactspec convert`
from a transformers-made bf16 folder (tests/synthetic_models.py). In Node: logits against the CPython
reference on the same q8 artifact computing the same function (blocks with a rollback): the
default q8act-v1 matmul against matmul="q8act" within TOLERANCES["wasm_champion_logits_q8act"],
the float function (matmul "f32") within TOLERANCES["wasm_champion_logits"]; greedy argmax equal
wherever the reference's top-2 margin exceeds twice the tolerance, and int8-held weights bitwise
equal to f32-held ones (their remainder path: widths not multiples of 16). Also a q8 embedding
(convert --q8-embedding: the tied head through its int8 rows, so q8act rows can be the
reference's bits)."""
from __future__ import annotations

import numpy as np
import pytest

from synthetic_models import HUB_CHAMPIONS, synth_models_dirs  # noqa: F401 (session fixture)
from test_gpu_champion import split
from test_wasm_champion import WASM, as_blocks, forward_rows, run_node
from tolerances import TOLERANCES, max_error, within

from exactspec.reference.convert import convert
from exactspec.reference.reference_llama import LlamaReference

CASES = [(shape, False) for shape in HUB_CHAMPIONS] + [("qwen2.5-mid", True), ("smollm2-mid", True)]


@pytest.fixture(scope="module")
def converted(synth_models_dirs, tmp_path_factory):  # noqa: F811
    out = {}
    for shape, q8_embedding in CASES:
        dst = tmp_path_factory.mktemp(f"wasm_{shape}_{int(q8_embedding)}")
        convert(synth_models_dirs[shape], dst, q8_embedding=q8_embedding)
        out[(shape, q8_embedding)] = dst
    return out


def check_rows(shape, got_blocks, ref, blocks, tol_name) -> tuple:
    """Every block's logits within tol_name of the reference's, argmax equal where the reference's
    top-2 margin exceeds twice the tolerance; (max error, clear rows, bit-identical rows)."""
    tol = TOLERANCES[tol_name].max_abs
    ref.reset()
    worst, n_argmax, n_same = 0.0, 0, 0
    for got, (block_ids, start) in zip(got_blocks, blocks):
        want = ref.forward(block_ids, start)
        worst = max(worst, max_error(got, want, tol_name))
        assert within(got, want, tol_name), (shape, tol_name, start, np.abs(got - want).max())
        top2 = np.sort(want, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * tol
        assert np.array_equal(got.argmax(1)[clear], want.argmax(1)[clear]), (shape, start)
        n_argmax += int(clear.sum())
        n_same += int(np.all(got.astype(np.float64) == want, axis=1).sum())
    return worst, n_argmax, n_same


def q8act_applies(model_dir) -> bool:
    """Whether every int8 linear's width is a multiple of the 32-block: then matmul "auto" runs
    q8act-v1, else the float function (smollm2-mid and llama3.2-mid: q8act; the Qwen2.5 and
    TinyLlama mid shapes, 56 / 48 / 176 wide: f32)."""
    from exactspec.reference.hf import open_safetensors_files
    with open_safetensors_files([str(model_dir / "model.q8.safetensors")]) as ckpt:
        return all(int(info["shape"][1]) % 32 == 0 for name, info in ckpt.header().items() if name.endswith(".q8"))


@pytest.mark.parametrize("shape,q8_embedding", CASES)
def test_wasm_champion_matches_the_reference_on_real_families(converted, shape, q8_embedding):
    model_dir = converted[(shape, q8_embedding)]
    ref = LlamaReference.from_dir(model_dir, weights="q8")
    q8act = q8act_applies(model_dir)
    ref_auto = LlamaReference.from_dir(model_dir, weights="q8", matmul="q8act") if q8act else ref
    V = ref.vocab_size
    ids = np.random.default_rng(4).integers(0, V, 40)
    blocks = split(ids, [9, 1, 5, 8, 3, 9]) + [(ids[30:35], 30), (ids[35:40], 35)]   # a rollback, re-fed
    cases = {"forward": [as_blocks(blocks)]}
    outs = {storage: run_node(model_dir, cases, weight_storage=storage, wasm=WASM) for storage in ("f32", "int8")}
    outs["q8act"] = run_node(model_dir, cases, wasm=WASM)                          # matmul "auto"
    assert outs["f32"]["info"]["identity"] == outs["q8act"]["info"]["identity"] == ref.identity
    assert [outs[k]["info"]["matmulFunction"] for k in ("f32", "int8", "q8act")] == \
        ["f32", "f32", "q8act-v1" if q8act else "f32"]
    rows = {s: forward_rows(o["forward"][0], blocks, V) for s, o in outs.items()}
    for got, got8 in zip(rows["f32"], rows["int8"]):
        assert np.array_equal(got.view(np.uint32), got8.view(np.uint32)), f"{shape}: int8 storage differs"
    worst, n_argmax, _ = check_rows(shape, rows["f32"], ref, blocks, "wasm_champion_logits")
    assert n_argmax >= 30
    if not q8act:                                                                # "auto" ran the float function
        assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(rows["q8act"], rows["f32"]))
        return
    worst8, n_argmax8, n_same = check_rows(shape, rows["q8act"], ref_auto, blocks, "wasm_champion_logits_q8act")
    print(f"[err] wasm_champion_logits_q8act ({shape}, q8 embedding {q8_embedding}): max abs {worst8:.3g}, "
          f"{n_argmax8} clear argmax, {n_same}/{sum(len(b) for b, _ in blocks)} rows bit-identical")


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
