"""The WASM champion loads quantised weights in their blocks (issue 19 item 1, docs/champion_wasm.md
"Weight formats"): the q8 artifact's int8 rows + row scales (ROWQ8) and a GGUF's Q8_0/Q4_0/Q4_1/
Q4_K/Q6_K tensors are written as they are and multiplied by the q8act-v1 function
(docs/quant_kernels.md); weight bytes stay within 1.15x the file's; the logits equal the CPython
reference computing q8act; every position's logits are the same bits alone, in any block, at any
offset and after rollback; refusals are coded; the real SmolLM2 Q4_1 file decodes the same tokens
at 1, 2 and 3 threads. Node (web/tests/blocks_harness.mjs), and one page for the engine's report."""
from __future__ import annotations

import base64
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q, GGUFReader

from exactspec.formats.gguf_model import GGUFModel, load_reference
from exactspec.reference.models import default_models_dir
from exactspec.reference.reference_llama import LlamaReference
from gguf_builders import REPO, gguf_reference_pair, smollm2_path as fetched_smollm2
from node_harness import run_harness
from synthetic_models import odd_q8, write_tiny_model
from tolerances import max_error, within
from browser_fixture import chromium_browser  # noqa: F401

HARNESS = Path(REPO) / "web" / "tests" / "blocks_harness.mjs"
WASM = str(Path(REPO) / "web" / "build" / "cpu.wasm")
TOY = os.path.join(default_models_dir(), "champion")
TOY_DRAFT = os.path.join(default_models_dir(), "draft")
MEMORY_RATIO = 1.15            # issue 19: WASM memory for weights <= 1.15x the weight file
# every linear in a block type (memory, batch invariance); MIXED adds float linears (F16, BF16)
BLOCKS = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K, "attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q4_1,
          "attn_v.weight": Q.Q4_0, "attn_output.weight": Q.Q8_0, "ffn_gate.weight": Q.Q4_0, "ffn_up.weight": Q.Q8_0,
          "ffn_down.weight": Q.Q6_K}
MIXED = {**BLOCKS, "attn_output.weight": Q.F16, "ffn_gate.weight": Q.BF16}
FMT_F32, FMT_ROWQ8 = 0, 100


def champions(*cases) -> list:
    return run_harness(HARNESS, {"champions": [{"wasm": WASM, **c} for c in cases]})["champions"]


def rows(b64: str, vocab: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype=np.float32).reshape(-1, vocab)


def gguf_case(path: str, **kw) -> dict:
    with GGUFModel(path) as model:
        return {"gguf": path, "config": model.config, **kw}


def gguf_tensor_bytes(path: str) -> int:
    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors)


def q8_tensor_bytes(model_dir: str) -> int:
    """The data section of model.q8.safetensors (the file less its header)."""
    with open(os.path.join(model_dir, "model.q8.safetensors"), "rb") as f:
        header = struct.unpack("<Q", f.read(8))[0]
    return os.path.getsize(os.path.join(model_dir, "model.q8.safetensors")) - 8 - header


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """arch -> (all-blocks file, mixed file): tiny llama (q/k rows permuted) and qwen2 (biases)."""
    root = tmp_path_factory.mktemp("blocks")
    out = {}
    for arch in ("llama", "qwen2"):
        paths = (str(root / f"{arch}_blocks.gguf"), str(root / f"{arch}_mixed.gguf"))
        write_tiny_model(paths[0], arch=arch, types=BLOCKS, seed=1)
        write_tiny_model(paths[1], arch=arch, types=MIXED, seed=2)
        out[arch] = paths
    return out


def test_q8_artifact_stays_int8_rows_and_matches_the_q8act_reference():
    """The shipped champion: "auto" and "q8act" hold every q8 linear as ROWQ8 (int8 + row scale, as
    in the file), within 1.15x the file's tensor bytes; "f32" widens (today's function). Logits
    equal LlamaReference(matmul="q8act") within the table's tolerance."""
    with open(os.path.join(TOY, "config.json")) as f:
        V = json.load(f)["vocab_size"]
    ids = [int(i) for i in np.random.default_rng(11).integers(0, V, 9)]
    auto, q8act, f32 = champions(*({"model_dir": TOY, "matmul": m, "forward": [[[ids, 0]]]} for m in ("auto", "q8act", "f32")))
    for c in (auto, q8act):
        assert c["info"]["matmul"] == "q8act-v1" and c["info"]["weight_storage"] == "blocks"
        linears = {k: v for k, v in c["info"]["formats"].items() if k != "model.embed_tokens.weight"}
        assert set(linears.values()) == {FMT_ROWQ8}, c["info"]["formats"]
    assert auto["forward"] == q8act["forward"]
    file_bytes = q8_tensor_bytes(TOY)
    print(f"[measure] toy champion weight bytes: q8act {auto['info']['weight_bytes']}, f32 {f32['info']['weight_bytes']}, "
          f"file tensors {file_bytes}; WASM memory {auto['info']['memory_bytes']}")
    assert auto["info"]["weight_bytes"] <= MEMORY_RATIO * file_bytes
    assert f32["info"]["matmul"] == "f32" and f32["info"]["weight_bytes"] > 2 * file_bytes
    got = rows(auto["forward"][0][0], V)
    want = LlamaReference.from_dir(TOY, weights="q8", role="champion", matmul="q8act").forward(np.array(ids), 0)
    want_f32 = LlamaReference.from_dir(TOY, weights="q8", role="champion").forward(np.array(ids), 0)
    same = sum(np.array_equal(got[i], want[i].astype(np.float32)) for i in range(len(ids)))
    err, err_f32 = max_error(got, want, "wasm_champion_logits_q8act"), float(np.abs(got - want_f32).max())
    print(f"[err] toy champion q8act WASM vs reference q8act: max abs {err:.3g} ({same} of {len(ids)} rows bit-identical); "
          f"vs the f32 function {err_f32:.3g}")
    # (its head is the float tied embedding: an activation rounding flipped by float32-vs-float64 upstream moves
    # logits by up to ~0.16 on other prompts, tests/tolerances.py; these ids measure 5.4e-6)
    assert within(got, want, "wasm_champion_logits_q8act")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_blocks_are_written_raw_and_match_the_q8act_reference(tiny, arch):
    """Every block type as its GGUF id, F16/BF16 linears float32; q/k rows put back in HF order
    as whole rows of blocks (llama): the logits equal load_reference(matmul="q8act")."""
    blocks, mixed = tiny[arch]
    ref_q8act, ref_f32 = load_reference(mixed, matmul="q8act"), load_reference(mixed)
    case = gguf_case(mixed, matmul="auto")
    V = case["config"]["vocab_size"]
    ids = [int(i) for i in np.random.default_rng(5).integers(0, V, 9)]
    out, = champions({**case, "forward": [[[ids, 0]]]})
    formats = out["info"]["formats"]
    assert out["info"]["matmul"] == "q8act-v1"
    assert formats["model.embed_tokens.weight"] == Q.Q8_0 and formats["lm_head.weight"] == Q.Q6_K
    assert [formats[f"model.layers.1.{n}.weight"] for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
            "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")] == \
        [Q.Q4_K, Q.Q4_1, Q.Q4_0, FMT_F32, FMT_F32, Q.Q8_0, Q.Q6_K]
    got = rows(out["forward"][0][0], V)
    want = ref_q8act.forward(np.array(ids), 0)
    want_f32 = ref_f32.forward(np.array(ids), 0)
    same = sum(np.array_equal(got[i], want[i].astype(np.float32)) for i in range(len(ids)))
    err, err_f32 = max_error(got, want, "wasm_champion_logits"), float(np.abs(got - want_f32).max())
    print(f"[err] tiny {arch} GGUF q8act WASM vs reference q8act: max abs {err:.3g} ({same} of {len(ids)} rows "
          f"bit-identical); vs the f32 function {err_f32:.3g}")
    assert within(got, want, "wasm_champion_logits")
    assert err * 10 <= err_f32


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_weight_bytes_stay_within_the_file(tiny, arch):
    blocks, _ = tiny[arch]
    q8act, f32 = champions(gguf_case(blocks, matmul="q8act"), gguf_case(blocks, matmul="f32"))
    file_bytes = gguf_tensor_bytes(blocks)
    print(f"[measure] tiny {arch} GGUF weight bytes: q8act {q8act['info']['weight_bytes']}, f32 {f32['info']['weight_bytes']}, "
          f"file tensors {file_bytes}")
    assert q8act["info"]["weight_bytes"] <= MEMORY_RATIO * file_bytes
    assert f32["info"]["matmul"] == "f32" and f32["info"]["weight_bytes"] > 2 * file_bytes


# blocks of every size 1..9 at moving offsets, then rollbacks that re-feed shorter and longer blocks
SCHEDULE = [(0, 9), (9, 1), (10, 8), (18, 2), (20, 7), (27, 3), (30, 6), (36, 4), (40, 5)]
ROLLBACK = [(0, 7), (2, 9), (11, 1), (5, 4), (9, 9), (3, 2)]


@pytest.mark.parametrize("which", ["q8", "gguf-llama", "gguf-qwen2"])
def test_every_position_is_the_same_bits_alone_in_any_block_and_after_rollback(tiny, which):
    case = {"model_dir": TOY} if which == "q8" else gguf_case(tiny[which.split("-")[1]][0])
    V = json.load(open(os.path.join(TOY, "config.json")))["vocab_size"] if which == "q8" else case["config"]["vocab_size"]
    ids = [int(i) for i in np.random.default_rng(17).integers(0, V, 45)]
    singles = [[[ids[i:i + 1], i] for i in range(45)]]
    blocks = [[[ids[s:s + n], s] for s, n in SCHEDULE]]
    rollback = [[[ids[s:s + n], s] for s, n in ROLLBACK]]
    out, = champions({**case, "matmul": "q8act", "forward": singles + blocks + rollback})
    alone = np.concatenate([rows(r, V) for r in out["forward"][0]])
    for seq, plan in ((out["forward"][1], SCHEDULE), (out["forward"][2], ROLLBACK)):
        for r, (s, n) in zip(seq, plan):
            got = rows(r, V)
            assert got.shape[0] == n
            assert np.array_equal(got.view(np.uint32), alone[s:s + n].view(np.uint32)), f"block of {n} at {s}"


def test_a_q8_linear_of_odd_width_is_refused_by_q8act_and_runs_f32_under_auto():
    """odd_q8: down_proj's 176 input columns are no multiple of 32."""
    d = str(odd_q8())
    refused, auto = champions({"model_dir": d, "matmul": "q8act"}, {"model_dir": d, "matmul": "auto"})
    assert refused["error"]["code"] == "E_MODEL_LOAD"
    assert "model.layers.0.mlp.down_proj.weight.q8" in refused["error"]["message"]
    assert "176 columns are not a multiple of 32" in refused["error"]["message"]
    assert auto["info"]["matmul"] == "f32"


def test_matmul_and_weight_storage_arguments_are_checked():
    bad, both, storage = champions({"model_dir": TOY, "matmul": "int4"}, {"model_dir": TOY, "matmul": "q8act", "weight_storage": "int8"},
                                   {"model_dir": TOY, "weight_storage": "int8"})
    assert bad["error"]["code"] == both["error"]["code"] == "E_BAD_ARGUMENT"
    assert "matmul int4" in bad["error"]["message"] and "weightStorage int8" in both["error"]["message"]
    assert storage["info"]["matmul"] == "f32" and storage["info"]["weight_storage"] == "int8"   # the float function, as before


def test_a_block_with_a_non_finite_scale_is_refused_naming_tensor_and_row(tiny, tmp_path):
    blocks, _ = tiny["llama"]
    reader = GGUFReader(blocks)
    t = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")    # Q8_0: {f16 d; i8 qs[32]}
    row_bytes = int(t.n_bytes) // int(t.shape[1])
    raw = bytearray(open(blocks, "rb").read())
    at = int(t.data_offset) + 3 * row_bytes + 34       # row 3, its second block's d
    raw[at:at + 2] = struct.pack("<H", 0x7C00)         # +inf
    path = tmp_path / "inf_scale.gguf"
    path.write_bytes(bytes(raw))
    out, = champions(gguf_case(str(path), matmul="q8act"))
    assert out["error"]["code"] == "E_MODEL_LOAD"
    assert "'blk.1.ffn_up.weight'" in out["error"]["message"] and "row 3" in out["error"]["message"]


def test_a_block_tensor_of_the_wrong_byte_count_is_refused(tiny):
    """A hand-made tensor map whose block tensor lost its last row's bytes."""
    blocks, _ = tiny["qwen2"]
    out, = champions(gguf_case(blocks, matmul="q8act", truncate_tensor="model.layers.0.mlp.up_proj.weight"))
    assert out["error"]["code"] == "E_MODEL_LOAD"
    assert "model.layers.0.mlp.up_proj.weight" in out["error"]["message"] and "byte count mismatch" in out["error"]["message"]


@pytest.fixture(scope="module")
def smollm2_path():
    return fetched_smollm2()


@pytest.mark.slow
def test_smollm2_q4_1_decodes_in_its_blocks_identically_at_1_2_and_3_threads(smollm2_path):
    """The real file: every linear Q4_1 and the tied Q8_0 embedding held as in the file (1.0x its
    tensor bytes), the same greedy tokens at 1, 2 and 3 threads, and " Paris" first. (On SmolLM2
    q8act-v1 moves logits by ~1 against the float function, and float32-level differences upstream
    of a quantisation move them as much, so a prompt whose top two tokens lie 0.08 apart -- the chat
    turn "What is the capital of France?" -- may answer either way; this prompt's margin is 2.5.)"""
    pair = gguf_reference_pair(smollm2_path)
    greedy = {"prompt": [int(i) for i in pair.tokenizer.encode("The capital of France is")], "n": 8}
    outs = champions(*(gguf_case(smollm2_path, matmul="auto", threads=n, greedy=greedy) for n in (1, 2, 3)))
    info = outs[0]["info"]
    file_bytes = gguf_tensor_bytes(smollm2_path)
    print(f"[measure] SmolLM2 Q4_1 in its blocks: weight bytes {info['weight_bytes']} (file tensors {file_bytes}, "
          f"{info['weight_bytes'] / file_bytes:.3f}x), WASM memory {info['memory_bytes']}")
    assert info["matmul"] == "q8act-v1"
    assert info["formats"]["model.embed_tokens.weight"] == Q.Q8_0                  # tied: the LM head too
    assert {v for k, v in info["formats"].items() if k != "model.embed_tokens.weight"} == {Q.Q4_1}
    assert info["weight_bytes"] <= MEMORY_RATIO * file_bytes
    assert outs[1]["greedy"] == outs[0]["greedy"] == outs[2]["greedy"]
    text = pair.tokenizer.decode(outs[0]["greedy"])
    print(f"[measure] SmolLM2 Q4_1 q8act greedy after 'The capital of France is': {text!r}")
    assert text.startswith(" Paris")


def test_the_engine_reports_the_matmul_function_and_weight_bytes(chromium_browser):
    """In the page: ready.info.champion names the function and the weight bytes, the receipt's
    hardware_class names the function, memory() the weight bytes; BrowserRuntime(matmul="f32") loads the float function."""
    from engine_loads import browser_runtime
    rt = browser_runtime(TOY, None, browser=chromium_browser, champion_backend="wasm")
    try:
        info = rt.ready["info"]["champion"]
        assert info["backend"] == "wasm" and info["matmul"] == "q8act-v1"
        assert 0 < info["weight_bytes"] <= MEMORY_RATIO * q8_tensor_bytes(TOY)
        receipt = rt.generate({"prompt": "And the LORD said", "config": {"temperature": 0, "max_new_tokens": 4, "speculate": "none"}})["result"]["receipt"]
        assert "/q8act-v1/" in receipt["hardware_class"], receipt["hardware_class"]
        assert rt.page.evaluate("() => window.exactspecRunner.memory()")["champion_weight_bytes"] == info["weight_bytes"]
    finally:
        rt.close()
    rt = browser_runtime(TOY, None, browser=chromium_browser, champion_backend="wasm", matmul="f32")
    try:
        assert rt.ready["info"]["champion"]["matmul"] == "f32"
        assert rt.ready["info"]["champion"]["weight_bytes"] > 2 * info["weight_bytes"]
    finally:
        rt.close()


def test_the_engine_passes_q8act_to_the_webgpu_champion_only_when_asked(chromium_browser):
    """matmul "q8act" reaches the WebGPU champion (ready.info.champion.matmul names it, and greedy
    speculation still equals that champion alone); "auto" keeps the GPU's float kernels (docs/gpu.md)."""
    from engine_loads import browser_runtime
    cfg = {"temperature": 0, "max_new_tokens": 6}
    rt = browser_runtime(TOY, TOY_DRAFT, browser=chromium_browser, champion_backend="webgpu", matmul="q8act")
    try:
        assert rt.ready["info"]["champion"]["backend"] == "webgpu" and rt.ready["info"]["champion"]["matmul"] == "q8act-v1"
        alone = rt.generate({"prompt": "And the LORD said", "config": {**cfg, "speculate": "none"}})["result"]
        drafted = rt.generate({"prompt": "And the LORD said", "config": {**cfg, "speculate": "draft", "k": 4}})["result"]
        assert drafted["token_ids"] == alone["token_ids"] and len(alone["token_ids"]) == 6
    finally:
        rt.close()
    rt = browser_runtime(TOY, None, browser=chromium_browser, champion_backend="webgpu")
    try:
        assert rt.ready["info"]["champion"]["matmul"] == "f32"
    finally:
        rt.close()


def test_the_page_picks_the_relaxed_build_and_it_gives_the_same_bits(chromium_browser, tiny):
    """Chromium's relaxed SIMD passes cpu_simd.mjs's probe: "auto" loads cpu_relaxed.wasm (the Q4
    formats' dot products); its logits on a GGUF of every block type are the bits of cpu.wasm's."""
    from engine_loads import browser_runtime
    path = tiny["llama"][0]
    case = gguf_case(path)
    V = case["config"]["vocab_size"]
    ids = [int(i) for i in np.random.default_rng(23).integers(0, V, 9)]
    rt = browser_runtime(path, None, browser=chromium_browser, champion_backend="wasm")
    try:
        info = rt.ready["info"]["champion"]
        assert info["simd"] == "relaxed" and info["matmul"] == "q8act-v1"
        receipt = rt.generate({"prompt": "hello", "config": {"temperature": 0, "max_new_tokens": 2, "speculate": "none"}})["result"]["receipt"]
        assert receipt["hardware_class"].startswith("wasm-relaxed-simd/"), receipt["hardware_class"]
        out = rt.page.evaluate("""async ([url, config, ids]) => {
            const { createWasmChampion } = await import('/web/champion_wasm/champion_wasm.mjs');
            const { validateConfig } = await import('/web/formats/model_checks.mjs');
            const rows = {};
            for (const simd of ['simd128', 'relaxed']) {
              const c = await createWasmChampion({ wasmUrl: '/web/build/cpu.wasm', ggufUrl: url, configJson: validateConfig(config), simd });
              await c.forward(Int32Array.from(ids), 0);
              rows[simd] = { simd: c.simd, bits: Array.from(new Uint32Array((await c.readLogits(ids.length)).buffer)) };
              c.destroy();
            }
            return rows;
        }""", ["/models/champion/" + os.path.basename(path), case["config"], ids])
        assert out["simd128"]["simd"] == "simd128" and out["relaxed"]["simd"] == "relaxed"
        assert out["relaxed"]["bits"] == out["simd128"]["bits"] and len(set(out["simd128"]["bits"])) > 100
    finally:
        rt.close()


@pytest.mark.parametrize("flags, works", [((), False), (("--experimental-wasm-relaxed-simd", "--no-liftoff"), True),
                                          (("--experimental-wasm-relaxed-simd", "--liftoff-only"), False)])
def test_the_relaxed_probe_and_the_module_names(flags, works):
    """cpu_simd.mjs: Node 20 has no relaxed SIMD by default; with it, TurboFan gives the spec's sums and
    Liftoff twice them (the probe says no, so "auto" keeps cpu.wasm); the one name mapping."""
    import subprocess
    script = """import('./web/champion_wasm/cpu_simd.mjs').then(({ relaxedDotWorks, moduleUrl }) => console.log(JSON.stringify([
      relaxedDotWorks(), moduleUrl('/web/build/cpu.wasm?v=1', { relaxed: true }), moduleUrl('/web/build/cpu.wasm', { threads: 2 }),
      moduleUrl('b/cpu.wasm', { threads: 3, relaxed: true }), moduleUrl('x/mycpu.wasm', { relaxed: true })])))"""
    out = subprocess.run(["node", *flags, "--input-type=module", "-e", script], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [works, "/web/build/cpu_relaxed.wasm?v=1", "/web/build/cpu_mt.wasm",
                                      "b/cpu_mt_relaxed.wasm", "x/mycpu.wasm"]
