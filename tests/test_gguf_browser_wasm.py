"""The WASM champion on a GGUF file's own weights (web/gguf/ tensor map): tiny llama/qwen2 files of
every tensor type against the NumPy reference on the same file computing the same function -- the
block tensors in their blocks with q8act-v1 (matmul "auto") against load_reference(matmul="q8act")
within TOLERANCES["wasm_champion_logits_q8act"], and everything widened to float32 (matmul "f32",
the old function) against the float reference within TOLERANCES["wasm_champion_logits"] -- a
block's logits bitwise those of single positions, and the real SmolLM2-135M-Instruct Q4_1 file
(q8act): 16 greedy tokens of a chat turn equal to the CPython q8act reference's (gguf_pair), and
the prompt's logits rows counted where they are the reference's bits. Node, no browser."""
from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from exactspec.formats.chat import encode_chat_prompt
from exactspec.formats.gguf_model import GGUFModel, load_reference
from gguf_builders import REPO, gguf_reference_pair, smollm2_path as fetched_smollm2
from synthetic_models import write_tiny_model
from node_harness import run_harness
from tolerances import flip_margin, max_error, within

FUNCTIONS = {"auto": ("q8act", "q8act-v1", "wasm_champion_logits_q8act"), "f32": ("f32", "f32", "wasm_champion_logits")}


def same_rows(got, want) -> int:
    """How many logits rows are the same bits (float32 got, float64 want holding float32 values)."""
    return int(np.all(got.astype(np.float64) == want, axis=1).sum())

HARNESS = Path(REPO) / "web" / "tests" / "gguf_harness.mjs"
WASM = str(Path(REPO) / "web" / "build" / "cpu.wasm")       # the CPU module: the champion is one of its halves
TYPES = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K, "attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q4_1,
         "attn_v.weight": Q.Q4_0, "attn_output.weight": Q.F16, "ffn_gate.weight": Q.BF16, "ffn_up.weight": Q.Q8_0,
         "ffn_down.weight": Q.Q6_K}


def rows(b64: str, n: int, vocab: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype=np.float32).reshape(n, vocab)


@pytest.mark.parametrize("matmul", ["auto", "f32"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_gguf_logits_match_reference_and_blocks_are_bitwise(tmp_path, arch, matmul):
    ref_matmul, function, tol_name = FUNCTIONS[matmul]
    path = str(tmp_path / f"{arch}.gguf")
    write_tiny_model(path, arch=arch, types=TYPES)
    ref = load_reference(path, matmul=ref_matmul)
    with GGUFModel(path) as model:
        config = model.config
    V = config["vocab_size"]
    ids = [int(i) for i in np.random.default_rng(3).integers(0, V, 24)]
    singles = [[[ids[i:i + 1], i] for i in range(24)]]
    blocks = [[[ids[0:9], 0], [ids[9:11], 9], [ids[11:20], 11], [ids[20:24], 20]]]
    out = run_harness(HARNESS, {"champions": [{"wasm": WASM, "path": path, "config": config, "matmul": matmul,
                                               "forward": singles + blocks}]})["champions"][0]
    assert out["identity"] == ref.identity                        # the file's sha256
    assert out["matmulFunction"] == function
    single = np.concatenate([rows(r, 1, V) for r in out["forward"][0]])
    block = np.concatenate([rows(r, len(b[0]), V) for r, b in zip(out["forward"][1], blocks[0])])
    assert np.array_equal(single.view(np.uint32), block.view(np.uint32))
    ref.reset()
    want = np.concatenate([ref.forward(np.array(b[0]), b[1]) for b in blocks[0]])
    print(f"[err] wasm GGUF champion ({arch}, {function}) vs reference: max abs {max_error(block, want, tol_name):.3g}; "
          f"{same_rows(block, want)}/{len(ids)} rows bit-identical")
    assert within(block, want, tol_name)


def test_tiny_gguf_greedy_equals_the_q8act_reference(tmp_path):
    """Greedy tokens through the harness's decision loop on a tiny GGUF whose rows are the q8act
    reference's bits: the same tokens as the reference's argmax chain, for prompts of every length
    modulo the block (the decision reads the row of the last prompt position)."""
    path = str(tmp_path / "llama.gguf")
    write_tiny_model(path, arch="llama", types=TYPES)
    ref = load_reference(path, matmul="q8act")
    with GGUFModel(path) as model:
        config = model.config
    gen = np.random.default_rng(8)
    prompts = [[int(i) for i in gen.integers(0, ref.vocab_size, n)] for n in (1, 5, 9, 12)]
    out = run_harness(HARNESS, {"champions": [{"wasm": WASM, "path": path, "config": config, "matmul": "auto",
                                               "greedy": {"prompt": p, "n": 6}} for p in prompts]})["champions"]
    for prompt, champion in zip(prompts, out):
        ref.reset()
        row, want = ref.forward(prompt, 0)[-1], []
        for _ in range(6):
            want.append(int(row.argmax()))
            row = ref.forward([want[-1]], len(prompt) + len(want) - 1)[-1]
        assert champion["greedy"] == want, (len(prompt), champion["greedy"], want)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_float32_linears_run_the_q8_kernel_exactly(tmp_path, arch):
    """The same integer-valued linears as float32 `<name>` and as `<name>.q8` with scales of 1.0
    (widened to float32, times 1.0): the same logits bits, so a float32 linear is the q8 path's
    arithmetic with nothing changed (untied head included)."""
    path = str(tmp_path / f"{arch}.gguf")
    write_tiny_model(path, arch=arch, types=TYPES)
    with GGUFModel(path) as model:
        config = model.config
    ids = [int(i) for i in np.random.default_rng(5).integers(0, config["vocab_size"], 12)]
    case = {"wasm": WASM, "path": path, "config": config, "forward": [[[ids[:9], 0], [ids[9:], 9]]]}
    out = run_harness(HARNESS, {"champions": [{**case, "integer_linears": "f32"}, {**case, "integer_linears": "q8"}]})
    f32, q8 = ([base64.b64decode(r) for r in c["forward"][0]] for c in out["champions"])
    assert f32 == q8
    assert len(set(np.frombuffer(f32[0], np.float32).tolist())) > 100      # real logits, not a constant


@pytest.fixture(scope="module")
def smollm2_path():
    return fetched_smollm2()


@pytest.fixture(scope="module")
def float_pair(smollm2_path):
    """The float reference pair on the file (gguf_pair), built once per process (gguf_builders)."""
    return gguf_reference_pair(smollm2_path)


@pytest.mark.parametrize("matmul", ["f32", "auto"])
def test_smollm2_greedy_chat_equals_reference(smollm2_path, float_pair, matmul):
    """matmul "f32" (the old function: every tensor widened to float32): 16 greedy tokens of a chat
    turn equal to the float reference's (gguf_pair). matmul "auto" (q8act-v1 on the Q4_1 / Q8_0
    blocks, the tied head through the Q8_0 embedding) against the q8act reference on the WASM
    champion's own sequence (prompt + its greedy tokens): the first row the same bits through 30
    layers, every row within TOLERANCES["wasm_champion_logits_q8act_smollm2"] (the same-bits rows
    counted), each greedy token the reference's argmax unless the reference's top-2 margin is
    within flip_margin. Here the first answer token is such a case: "The" and "L" are 0.14 apart
    in the q8act reference (0.09 in the float one) and the WASM champion picks "L"."""
    from exactspec.core.orchestrator import GenerationConfig
    from exactspec.core.policy import SamplingPolicy
    pair = float_pair
    prompt = encode_chat_prompt(pair.tokenizer, pair.tokenizer_config,
                                [{"role": "user", "content": "What is the capital of France?"}])
    with GGUFModel(smollm2_path) as model:
        config = model.config
    case = {"wasm": WASM, "path": smollm2_path, "config": config, "matmul": matmul}
    if matmul == "f32":
        want = pair.orchestrator.generate(prompt, GenerationConfig(max_new_tokens=16, speculate="none",
                                                                    policy=SamplingPolicy(temperature=0))).token_ids
        start = time.perf_counter()
        out = run_harness(HARNESS, {"champions": [{**case, "greedy": {"prompt": prompt, "n": len(want)}}]})["champions"][0]
        print(f"[measure] node: SmolLM2 GGUF load + {len(prompt)}-token prompt + {len(want)} greedy tokens: "
              f"{time.perf_counter() - start:.1f} s in all, {out['ms_total']:.0f} ms of forward + decide")
        assert out["matmulFunction"] == "f32"
        assert out["greedy"] == list(want), pair.tokenizer.decode(out["greedy"])
        assert "Paris" in pair.tokenizer.decode(want)
        return
    greedy = run_harness(HARNESS, {"champions": [{**case, "greedy": {"prompt": prompt, "n": 16}}]})["champions"][0]
    assert greedy["matmulFunction"] == "q8act-v1"
    seq = list(prompt) + greedy["greedy"]
    blocks = [[seq[i:i + 9], i] for i in range(0, len(seq) - 1, 9)]
    blocks[-1][0] = blocks[-1][0][:len(seq) - 1 - blocks[-1][1]]                  # rows 0 .. len(seq) - 2
    out = run_harness(HARNESS, {"champions": [{**case, "forward": [blocks]}]})["champions"][0]
    ref = load_reference(smollm2_path, matmul="q8act")
    got = np.concatenate([rows(r, len(b[0]), ref.vocab_size) for r, b in zip(out["forward"][0], blocks)])
    want_rows = np.concatenate([ref.forward(b[0], b[1]) for b in blocks])
    tol_name = "wasm_champion_logits_q8act_smollm2"
    print(f"[err] {tol_name} ({len(seq) - 1} rows): max abs {max_error(got, want_rows, tol_name):.3g}; "
          f"{same_rows(got, want_rows)}/{len(seq) - 1} rows bit-identical; WASM: "
          f"{pair.tokenizer.decode(greedy['greedy'])!r}")
    assert np.array_equal(got[:1].astype(np.float64), want_rows[:1])     # position 0, 30 layers: the same bits
    assert within(got, want_rows, tol_name)
    for i, token in enumerate(greedy["greedy"]):
        row = want_rows[len(prompt) - 1 + i]
        assert got[len(prompt) - 1 + i].argmax() == token                # the decision read this row
        assert row.max() - row[token] <= flip_margin(tol_name), (i, token, int(row.argmax()))
