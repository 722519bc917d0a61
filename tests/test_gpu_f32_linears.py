"""WebGPU champion with float32 linears (web/gpu/champion.mjs createChampionFromTensors) in headless Chromium.

A tensor map whose linears are F32 under Hugging Face names (what a GGUF file's blocks become,
dequantised exactly) against the CPython reference on the same float32 weights; blocks bit for bit
against single positions; row pieces bit for bit against one piece; q8 and f32 linears mixed (also
inside one fused q|k|v or gate|up); the URL loader on the same map; refusals; the memory plan at
SmolLM2's shape; and the real SmolLM2 GGUF dequantised (greedy tokens equal the reference's).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from browser_fixture import REPO_ROOT, chromium_browser, http_server  # noqa: F401
from test_gpu_champion import (TEST_MODELS, forward_blocks, gpu_page, load_champion,  # noqa: F401
                               split, unb64, url_of)
import synthetic_models
from synthetic_models import quantize_rows
from tolerances import flip_margin, max_error, within

from exactspec.reference.reference_llama import LlamaReference

TINY_SPLIT = 16384                 # bytes per binding that force every big tensor into pieces
LINEAR_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                   "gate_proj.weight", "up_proj.weight", "down_proj.weight")

# The page side: its own device (the harness keeps its own private), a champion built from a
# safetensors file parsed in the page and handed over as a tensor map.
LOAD_JS = """async ([url, config, identity, label, options]) => {
  const { requestDevice } = await import('/web/gpu/device.mjs');
  const { compileChampionPipelines, createChampionFromTensors } = await import('/web/gpu/champion.mjs');
  const { parseSafetensors } = await import('/web/formats/safetensors.mjs');
  const t = (window.f32t ??= {});
  if (!t.device) { t.device = await requestDevice(); t.pipelines = compileChampionPipelines(t.device); }
  t.champion?.destroy();
  t.champion = null;
  const buffer = await (await fetch(url)).arrayBuffer();
  const { tensors } = parseSafetensors(buffer, label);
  const { spoil, ...rest } = options;                        // spoil: [name, how] makes a hand-made map's fault
  if (spoil) {
    const [name, how] = spoil, bytes = tensors.get(name).bytes;
    const spoilt = how === "short" ? bytes.subarray(4) : new Float32Array(bytes.slice().buffer);
    tensors.set(name, { ...tensors.get(name), bytes: spoilt });
  }
  const t0 = performance.now();
  t.champion = await createChampionFromTensors({ device: t.device, config, tensors, identity, label,
                                                 pipelinesPromise: t.pipelines, maxBlock: 9, ...rest });
  const c = t.champion;
  return { loadMs: performance.now() - t0, identity: c.identity, vocabSize: c.vocabSize, pieces: c.pieces,
           forms: c.forms, memoryPlan: c.memoryPlan, artifactBytes: c.artifactBytes };
}"""
FORWARD_JS = """async (blocks) => {
  const c = window.f32t.champion, out = [];
  for (const [ids, startPos] of blocks) {
    await c.forward(Int32Array.from(ids), startPos);
    const bytes = new Uint8Array((await c.readLogits(ids.length)).buffer);
    let s = '';
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    out.push(btoa(s));
  }
  return out;
}"""
GREEDY_JS = """async ([prompt, steps]) => {
  const c = window.f32t.champion, V = c.vocabSize, ids = [...prompt], ms = [];
  const argmaxLast = (logits, n) => {
    let best = 0;
    for (let v = 1; v < V; v++) if (logits[(n - 1) * V + v] > logits[(n - 1) * V + best]) best = v;
    return best;
  };
  let t0 = performance.now();
  await c.forward(Int32Array.from(prompt), 0);
  ids.push(argmaxLast(await c.readLogits(prompt.length), prompt.length));
  ms.push(performance.now() - t0);
  for (let s = 1; s < steps; s++) {
    t0 = performance.now();
    await c.forward(Int32Array.of(ids[ids.length - 1]), ids.length - 1);
    ids.push(argmaxLast(await c.readLogits(1), 1));
    ms.push(performance.now() - t0);
  }
  return { tokens: ids.slice(prompt.length), ms };
}"""


def sha256_of(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def validated(config: dict) -> dict:
    """A config.json object as the engine's model check hands it to the loaders: validate_config's fields."""
    import dataclasses

    from exactspec.formats.config import validate_config
    return dataclasses.asdict(validate_config(config))


def load_tensors(page, weights: Path, config: dict, identity=None, label=None, **options):
    return page.evaluate(LOAD_JS, [url_of(weights.parent) + weights.name, validated(config),
                                   sha256_of(weights) if identity is None else identity,
                                   weights.name if label is None else label, options])


def forward_map(page, blocks, vocab):
    out = page.evaluate(FORWARD_JS, [[list(map(int, ids)), int(s)] for ids, s in blocks])
    return [unb64(s, np.float32, len(ids) * vocab).reshape(len(ids), vocab) for s, (ids, _) in zip(out, blocks)]


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def config_of(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def vs_reference(page, ref: LlamaReference, vocab: int, seed: int, name: str) -> float:
    """Logits of blocks of several sizes vs the reference at the same positions; returns the max error."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for length, sizes in ((17, [9, 1, 7]), (60, [8, 9, 3])):
        ids = rng.integers(0, vocab, length)
        blocks = split(ids, sizes)
        ref.reset()
        for (block, start), logits in zip(blocks, forward_map(page, blocks, vocab)):
            want = ref.forward(block, start)
            worst = max(worst, max_error(logits, want, "champion_logits_vs_reference"))
            assert within(logits, want, "champion_logits_vs_reference"), (name, worst)
    print(f"[err] {name}: f32-linear champion vs reference max abs {worst:.3e}")
    return worst


def assert_blocks_bitwise(page, vocab, seed, name):
    """Any partition into blocks (and a re-decode after a rollback) gives single positions' bits."""
    ids = np.random.default_rng(seed).integers(0, vocab, 27)
    singles = np.concatenate(forward_map(page, split(ids, [1]), vocab))
    for sizes in ([9], [2, 7, 4], [5, 1, 8, 3, 6, 9]):
        blocks = np.concatenate(forward_map(page, split(ids, sizes), vocab))
        differ = np.flatnonzero((bits(blocks) != bits(singles)).any(axis=1))
        assert differ.size == 0, f"{name}: block sizes {sizes}: positions {differ.tolist()} not bit-identical"
    other = ids.copy()
    other[20:] = (other[20:] + 1) % vocab
    forward_map(page, [(other[18:27], 18)], vocab)
    again = forward_map(page, [(ids[18:27], 18)], vocab)[0]
    assert np.array_equal(bits(again), bits(singles[18:27])), f"{name}: re-decode after rollback differs"
    return ids, singles


# ----------------------------------------------------------------------------- models
@pytest.fixture(scope="module")
def f32_models() -> dict:
    """HF folders whose model.safetensors (float32, HF names: every linear F32) is the tensor map:
    a tied GQA Llama, and Qwen2 with q/k/v biases and an untied f32 head."""
    return {"tiny_llama_tied": synthetic_models.tiny_llama(seed=3),
            "qwen2_bias_untied": synthetic_models.family("qwen2_bias_untied")}


@pytest.mark.parametrize("name", ["tiny_llama_tied", "qwen2_bias_untied"])
def test_f32_linears_vs_reference_blocks_and_pieces(gpu_page, f32_models, name):
    model_dir = f32_models[name]
    weights = model_dir / "model.safetensors"
    info = load_tensors(gpu_page, weights, config_of(model_dir))
    layers = info["forms"]["layers"]
    assert all(f == "f32" for layer in layers for f in layer.values()) and info["forms"]["embed"] == "f32"
    ref = LlamaReference.from_dir(model_dir)                   # the same float32 weights, float64 math
    assert info["identity"] == ref.identity                  # the sha256 handed in: here model.safetensors'
    vocab = info["vocabSize"]
    vs_reference(gpu_page, ref, vocab, 11, name)
    ids, singles = assert_blocks_bitwise(gpu_page, vocab, 7, name)
    whole_plan = info["memoryPlan"]
    split_info = load_tensors(gpu_page, weights, config_of(model_dir), maxBindingBytes=TINY_SPLIT)
    assert min(split_info["pieces"][k] for k in ("embed", "qkv", "gateUp", "down")) > 1, split_info["pieces"]
    assert split_info["memoryPlan"] == whole_plan
    pieces = np.concatenate(forward_map(gpu_page, split(ids, [8, 1, 9]), vocab))
    assert np.array_equal(bits(pieces), bits(singles)), f"{name}: row pieces change the bits"


def test_url_loader_takes_f32_linears_and_gives_the_same_bits(gpu_page, f32_models):
    """createChampion(modelUrl) on a model.q8.safetensors that holds F32 linears: the same code,
    the same bits as the tensor-map entry point."""
    src = f32_models["tiny_llama_tied"]
    model_dir = TEST_MODELS / "f32_tiny_llama_url"
    shutil.rmtree(model_dir, ignore_errors=True)
    model_dir.mkdir(parents=True)
    shutil.copy(src / "config.json", model_dir / "config.json")
    shutil.copy(src / "model.safetensors", model_dir / "model.q8.safetensors")
    ids = np.random.default_rng(2).integers(0, 1000, 12)
    load_tensors(gpu_page, src / "model.safetensors", config_of(src))
    want = np.concatenate(forward_map(gpu_page, split(ids, [5, 7]), 1000))
    info = load_champion(gpu_page, model_dir)
    assert info["identity"] == sha256_of(model_dir / "model.q8.safetensors")
    got = np.concatenate(forward_blocks(gpu_page, split(ids, [5, 7]), 1000))
    assert np.array_equal(bits(got), bits(want))


def write_mixed(src: Path, dest: Path):
    """src's float32 weights with some linears int8 per row: layer 0 all seven, layer 1 q_proj and
    up_proj only (so its fused q|k|v and gate|up mix forms), and the tied embedding. Returns the
    float32 state the champion must compute with (q8 dequantised as W = q8 * scale in float32)."""
    from safetensors.numpy import load_file, save_file
    state = load_file(str(src / "model.safetensors"))
    stored, values = {}, {}
    for name, w in state.items():
        layer0 = name.startswith("model.layers.0.") and name.endswith(LINEAR_SUFFIXES)
        layer1 = name.startswith("model.layers.1.") and name.endswith(("q_proj.weight", "up_proj.weight"))
        if layer0 or layer1 or name == "model.embed_tokens.weight":
            q8, scale = quantize_rows(w)
            stored[name + ".q8"], stored[name + ".scale"] = q8, scale
            values[name] = q8.astype(np.float32) * scale[:, None]
        else:
            stored[name] = values[name] = w
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dest / "config.json")
    save_file(stored, str(dest / "mixed.safetensors"))
    return values


def test_q8_and_f32_linears_mixed(gpu_page, f32_models):
    src = f32_models["tiny_llama_tied"]
    model_dir = TEST_MODELS / "f32_tiny_llama_mixed"
    values = write_mixed(src, model_dir)
    config = config_of(model_dir)
    info = load_tensors(gpu_page, model_dir / "mixed.safetensors", config, identity="ab" * 32)
    assert info["forms"]["embed"] == "q8" and info["forms"]["head"] == "tied"
    assert info["forms"]["layers"] == [{"qkv": "q8", "o": "q8", "gateUp": "q8", "down": "q8"},
                                       {"qkv": "f32", "o": "f32", "gateUp": "f32", "down": "f32"}]
    ref = LlamaReference(config, values, "ab" * 32)
    vs_reference(gpu_page, ref, info["vocabSize"], 13, "mixed q8/f32")
    assert_blocks_bitwise(gpu_page, info["vocabSize"], 9, "mixed q8/f32")


def test_tensor_map_refusals(gpu_page, f32_models):
    """A missing linear, a linear stored in both forms, a wrong shape, a hand-made map's tensor
    with too few bytes or not in a Uint8Array: E_MODEL_LOAD naming the source and the tensor once;
    a malformed call: E_BAD_ARGUMENT."""
    from safetensors.numpy import load_file, save_file
    src = f32_models["tiny_llama_tied"]
    config = config_of(src)
    state = load_file(str(src / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    model_dir = TEST_MODELS / "f32_refusals"
    model_dir.mkdir(parents=True, exist_ok=True)
    cases = {
        "missing.safetensors": ({k: v for k, v in state.items() if k != name}, f"missing tensor {name}"),
        "twice.safetensors": ({**state, name + ".q8": quantize_rows(state[name])[0],
                               name + ".scale": quantize_rows(state[name])[1]}, f"tensor {name} is stored twice"),
        "shape.safetensors": ({**state, name: state[name][:, :-4].copy()}, f"tensor {name} has shape"),
    }
    for file, (tensors, problem) in cases.items():
        save_file(tensors, str(model_dir / file))
        with pytest.raises(Exception) as err:
            load_tensors(gpu_page, model_dir / file, config, label=f"source-{file}")
        message = str(err.value)
        assert f"E_MODEL_LOAD: source-{file}: {problem}" in message and message.count("E_MODEL_LOAD") == 1, message
    for how, problem in (("short", f"tensor {name} holds {96 * 160 * 4 - 4} bytes, its shape needs {96 * 160 * 4}"),
                         ("float32", f"tensor {name}: its bytes are not a Uint8Array")):
        with pytest.raises(Exception) as err:                # a map made by hand, not by a parser
            load_tensors(gpu_page, src / "model.safetensors", config, label="hand-made", spoil=[name, how])
        message = str(err.value)
        assert f"E_MODEL_LOAD: hand-made: {problem}" in message and message.count("E_MODEL_LOAD") == 1, message
    for identity, label in (("not-a-sha", "x"), ("ab" * 32, "")):
        with pytest.raises(Exception, match="E_BAD_ARGUMENT"):
            load_tensors(gpu_page, src / "model.safetensors", config, identity=identity, label=label)


# ----------------------------------------------------------------------------- plans at SmolLM2's shape
SMOLLM2_135M = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                "max_position_embeddings": 8192, "rope_theta": 100000.0, "tie_word_embeddings": True}


def plan_js(page, config, forms, max_context, binding, budget=0):
    """planChampion in the page: {pieces (row counts per piece), bytes} or {error}."""
    return page.evaluate("""async ([c, f, x, b, m]) => {
      const { gpuHyperParameters, resolveMaxContext } = await import('/web/formats/model_config.mjs');
      const { planChampion } = await import('/web/gpu/champion_plan.mjs');
      try {
        const hp = gpuHyperParameters(c);
        const p = planChampion(hp, f, { maxBlock: 9, maxContext: resolveMaxContext(hp, x), limit: b, budgetBytes: m });
        return { pieces: Object.fromEntries(Object.entries(p.pieces).map(([k, v]) => [k, v && v.length])),
                 layerPieces: p.layerPieces.map((l) => Object.fromEntries(Object.entries(l).map(([k, v]) => [k, v.length]))),
                 bytes: p.bytes };
      } catch (e) { return { error: e.message }; }
    }""", [validated(config), forms, max_context, binding, budget])


def test_f32_plan_at_smollm2_shape(gpu_page):
    """4 bytes a value: SmolLM2-135M's weights are its parameter count x 4; f32 pieces split at a
    binding limit the q8 ones fit; a budget that fits q8 linears refuses f32 ones naming the
    maxContext that would fit; layers in different forms are planned one by one."""
    L = 30
    all_f32 = {"embed": "f32", "head": "tied", "layers": [dict.fromkeys(("qkv", "o", "gateUp", "down"), "f32")] * L}
    all_q8 = {"embed": "f32", "head": "tied", "layers": [dict.fromkeys(("qkv", "o", "gateUp", "down"), "q8")] * L}
    f32 = plan_js(gpu_page, SMOLLM2_135M, all_f32, 2048, 1 << 30)
    params = 49152 * 576 + 576 + L * (2 * 576 + (9 + 6) * 64 * 576 + 576 * 9 * 64 + 3 * 576 * 1536)
    assert params == 134_515_008 and f32["bytes"]["weights"] == 4 * params
    q8 = plan_js(gpu_page, SMOLLM2_135M, all_q8, 2048, 1 << 30)
    linear_values = L * ((9 + 6) * 64 * 576 + 576 * 9 * 64 + 3 * 576 * 1536)
    assert f32["bytes"]["weights"] - q8["bytes"]["weights"] == 3 * linear_values - 4 * L * (960 + 576 + 3072 + 576)
    gate_up_f32 = 2 * 1536 * 576 * 4                              # 7 MiB: 2 pieces under 4 MiB; q8 (1.7 MiB) 1
    tight = plan_js(gpu_page, SMOLLM2_135M, all_f32, 2048, 4 << 20)
    assert tight["pieces"]["gateUp"] == -(-gate_up_f32 // ((4 << 20) // (576 * 4) * 576 * 4)) == 2
    assert plan_js(gpu_page, SMOLLM2_135M, all_q8, 2048, 4 << 20)["pieces"]["gateUp"] == 1
    mixed = {**all_q8, "layers": [all_f32["layers"][0]] + all_q8["layers"][1:]}
    m = plan_js(gpu_page, SMOLLM2_135M, mixed, 2048, 4 << 20)
    assert m["layerPieces"][0]["gateUp"] == 2 and m["layerPieces"][1]["gateUp"] == 1 and m["pieces"]["gateUp"] == 2
    budget = q8["bytes"]["total"] + 1
    assert "error" not in plan_js(gpu_page, SMOLLM2_135M, all_q8, 2048, 1 << 30, budget)
    refused = plan_js(gpu_page, SMOLLM2_135M, all_f32, 2048, 1 << 30, budget)["error"]
    assert refused.startswith("E_OUT_OF_MEMORY: ") and refused.count("E_OUT_OF_MEMORY") == 1, refused
    assert "the weights alone do not fit" in refused           # f32 linears need 318 MB more than the budget
    fits_budget = f32["bytes"]["total"] - f32["bytes"]["kvCache"] // 2
    refused = plan_js(gpu_page, SMOLLM2_135M, all_f32, 2048, 1 << 30, fits_budget)["error"]
    fits = int(refused.split("maxContext <= ")[1].split()[0])
    assert 0 < fits < 2048 and "error" not in plan_js(gpu_page, SMOLLM2_135M, all_f32, fits, 1 << 30, fits_budget)
    bad = plan_js(gpu_page, SMOLLM2_135M, {**all_f32, "layers": all_f32["layers"][:2]}, 2048, 1 << 30)["error"]
    assert bad.startswith("E_BAD_ARGUMENT") and "30 layers" in bad


# ----------------------------------------------------------------------------- the real SmolLM2 GGUF
def smollm2_gguf() -> Path:
    from gguf_builders import smollm2_path
    return Path(smollm2_path())


def test_smollm2_gguf_f32_greedy_equals_reference(gpu_page):
    """The real SmolLM2-135M Q4_1 GGUF, dequantised by gguf_model (every linear F32, HF names):
    greedy tokens on WebGPU equal the CPython reference's on the same file; the identity is the
    file's sha256."""
    from safetensors.numpy import save_file

    from exactspec.formats.gguf_model import GGUFModel, load_reference
    from exactspec.formats.gguf_tokenizer import load_tokenizer
    gguf = smollm2_gguf()
    model_dir = TEST_MODELS / "smollm2_gguf_f32"
    weights = model_dir / "model.safetensors"
    with GGUFModel(gguf) as model:
        config = model.config
        tokenizer = load_tokenizer(model.file)
        if not weights.exists():
            model_dir.mkdir(parents=True, exist_ok=True)
            save_file({name: model.read_float32(name) for name in model.names}, str(weights) + ".part")
            (model_dir / "model.safetensors.part").rename(weights)
    identity = sha256_of(gguf)
    info = load_tensors(gpu_page, weights, config, identity=identity, label=gguf.name, maxContext=64)
    assert info["identity"] == identity and all(f == "f32" for layer in info["forms"]["layers"] for f in layer.values())
    ref = load_reference(gguf)
    assert ref.identity == identity
    prompt = tokenizer.encode("The capital of France is")
    steps = 8
    got = gpu_page.evaluate(GREEDY_JS, [prompt, steps])
    ids, margins = list(prompt), []
    logits = ref.forward(prompt, 0)[-1]
    for _ in range(steps):
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        ids.append(int(np.argmax(logits)))
        logits = ref.forward([ids[-1]], len(ids) - 1)[-1]
    want = ids[len(prompt):]
    print(f"[smollm2] load {info['loadMs']:.0f} ms, step ms {[round(m) for m in got['ms']]}, tokens {got['tokens']} {tokenizer.decode(got['tokens'])!r}, "
          f"smallest reference margin {min(margins):.3g}")
    for step, (g, w) in enumerate(zip(got["tokens"], want)):
        if g != w:
            assert margins[step] <= flip_margin("champion_logits_vs_reference"), (step, got["tokens"], want)
            break                                            # a near tie: the continuations part here
    else:
        assert got["tokens"] == want


def test_smollm2_gguf_tensor_map_lazy_and_eager_give_the_same_bits(gpu_page):
    """The page's own GGUF reader (web/gguf/gguf_tensors.mjs) straight into
    createChampionFromTensors: its lazy map (one float32 tensor materialised at a time: the loader
    reads each tensor when it uploads it) gives the eager map's logits bit for bit."""
    from exactspec.formats.gguf_model import GGUFModel
    gguf = smollm2_gguf()
    with GGUFModel(gguf) as model:
        config = model.config
    url = "/" + gguf.resolve().relative_to(REPO_ROOT).as_posix()
    result = gpu_page.evaluate("""async ([url, config, ids]) => {
      const { requestDevice } = await import('/web/gpu/device.mjs');
      const { compileChampionPipelines, createChampionFromTensors } = await import('/web/gpu/champion.mjs');
      const { fetchGgufFile, ggufTensorMap } = await import('/web/gguf/gguf_tensors.mjs');
      const t = (window.f32t ??= {});
      if (!t.device) { t.device = await requestDevice(); t.pipelines = compileChampionPipelines(t.device); }
      t.champion?.destroy();
      t.champion = null;
      const { bytes, identity } = await fetchGgufFile(fetch, url);
      const logits = {};
      for (const lazy of [true, false]) {
        const tensors = ggufTensorMap(bytes, config, 'smollm2.gguf', { lazy });
        const c = await createChampionFromTensors({ device: t.device, config, tensors, identity, label: 'smollm2.gguf',
                                                    pipelinesPromise: t.pipelines, maxBlock: 9, maxContext: 64 });
        await c.forward(Int32Array.from(ids), 0);
        logits[lazy] = Array.from(new Uint32Array((await c.readLogits(ids.length)).buffer));
        c.destroy();
      }
      let differ = 0;
      for (let i = 0; i < logits.true.length; i++) differ += logits.true[i] !== logits.false[i];
      return { differ, count: logits.true.length, identity };
    }""", [url, validated(config), [1, 504, 3575, 282, 4649, 314, 7042, 30, 198]])
    assert result["identity"] == sha256_of(gguf)
    assert result["count"] == 9 * 49152 and result["differ"] == 0, result
