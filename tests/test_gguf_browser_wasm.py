"""The WASM champion on a GGUF file's own weights (web/gguf/ tensor map, float32 linears with no
scale): tiny llama/qwen2 files of every tensor type against the NumPy reference on the same file,
a block's logits bitwise those of single positions, and the real SmolLM2-135M-Instruct Q4_1 file:
16 greedy tokens of a chat turn equal to the CPython reference's (gguf_pair). Node, no browser."""
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
from gguf_builders import REPO, smollm2_path as fetched_smollm2
from synthetic_models import write_tiny_model
from node_harness import run_harness
from tolerances import max_error, within

HARNESS = Path(REPO) / "web" / "tests" / "gguf_harness.mjs"
WASM = str(Path(REPO) / "web" / "build" / "cpu.wasm")       # the CPU module: the champion is one of its halves
TYPES = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K, "attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q4_1,
         "attn_v.weight": Q.Q4_0, "attn_output.weight": Q.F16, "ffn_gate.weight": Q.BF16, "ffn_up.weight": Q.Q8_0,
         "ffn_down.weight": Q.Q6_K}


def rows(b64: str, n: int, vocab: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype=np.float32).reshape(n, vocab)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_gguf_logits_match_reference_and_blocks_are_bitwise(tmp_path, arch):
    path = str(tmp_path / f"{arch}.gguf")
    write_tiny_model(path, arch=arch, types=TYPES)
    ref = load_reference(path)
    with GGUFModel(path) as model:
        config = model.config
    V = config["vocab_size"]
    ids = [int(i) for i in np.random.default_rng(3).integers(0, V, 24)]
    singles = [[[ids[i:i + 1], i] for i in range(24)]]
    blocks = [[[ids[0:9], 0], [ids[9:11], 9], [ids[11:20], 11], [ids[20:24], 20]]]
    out = run_harness(HARNESS, {"champions": [{"wasm": WASM, "path": path, "config": config,
                                               "forward": singles + blocks}]})["champions"][0]
    assert out["identity"] == ref.identity                        # the file's sha256
    single = np.concatenate([rows(r, 1, V) for r in out["forward"][0]])
    block = np.concatenate([rows(r, len(b[0]), V) for r, b in zip(out["forward"][1], blocks[0])])
    assert np.array_equal(single.view(np.uint32), block.view(np.uint32))
    ref.reset()
    want = np.concatenate([ref.forward(np.array(b[0]), b[1]) for b in blocks[0]])
    print(f"[err] wasm GGUF champion ({arch}) vs reference: max abs {max_error(block, want, 'wasm_champion_logits'):.3g}")
    assert within(block, want, "wasm_champion_logits")


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


def test_smollm2_greedy_chat_equals_reference(smollm2_path):
    from exactspec.reference.gguf_pair import load_gguf_pair
    from exactspec.core.orchestrator import GenerationConfig
    from exactspec.core.policy import SamplingPolicy
    pair = load_gguf_pair(smollm2_path)
    prompt = encode_chat_prompt(pair.tokenizer, pair.tokenizer_config,
                                [{"role": "user", "content": "What is the capital of France?"}])
    want = pair.orchestrator.generate(prompt, GenerationConfig(max_new_tokens=16, speculate="none",
                                                                policy=SamplingPolicy(temperature=0))).token_ids
    with GGUFModel(smollm2_path) as model:
        config = model.config
    start = time.perf_counter()
    out = run_harness(HARNESS, {"champions": [{"wasm": WASM, "path": smollm2_path, "config": config,
                                               "greedy": {"prompt": prompt, "n": len(want)}}]})["champions"][0]
    print(f"[measure] node: SmolLM2 GGUF load + {len(prompt)}-token prompt + {len(want)} greedy tokens: "
          f"{time.perf_counter() - start:.1f} s in all, {out['ms_total']:.0f} ms of forward + decide")
    assert out["greedy"] == list(want), pair.tokenizer.decode(out["greedy"])
    assert "Paris" in pair.tokenizer.decode(want)
