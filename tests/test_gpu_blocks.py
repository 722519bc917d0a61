"""q8act-v1 on WebGPU (shaders/quantize_act.wgsl, shaders/qmatmul_*.wgsl) against the NumPy twin, bit for bit.

In headless Chromium on SwiftShader (web/tests/gpu_blocks_harness.*): the activation quantiser on
awkward blocks; every format (ROWQ8, Q8_0, Q4_0, Q4_1) on both integer paths (dot4I8Packed and
unpacking), n = 1..9, rows not a multiple of the workgroup, cols 32..1536; batch invariance (a
position's bits alone or in any block); accumulating into a row piece of the residual stream; zero,
huge and NaN inputs; subnormal and signed-zero f16 scales. Every comparison is bitwise: SwiftShader
fuses no multiply-add (test_swiftshader_does_not_fuse_multiply_add), and the kernels guard every
product that feeds an addition (exact() in shaders/gen_qmatmul.py) so a fusing compiler cannot either.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from browser_fixture import REPO_ROOT, chromium_browser, forward_console, http_server  # noqa: F401
from test_gpu_champion import b64, gpu_page, split, unb64, url_of  # noqa: F401

from exactspec.twins import qmatmul_twins as twin

F32 = np.float32
FORMATS = ["ROWQ8", "Q8_0", "Q4_0", "Q4_1"]
PATHS = ["dot4", "unpack"]
SHADERS = REPO_ROOT / "shaders"


def bits(a):
    return np.ascontiguousarray(a, F32).view(np.uint32)


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_qmatmul", SHADERS / "gen_qmatmul.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_qmatmul_shaders_equal_the_generator_output():
    gen = load_generator()
    committed = {name: (SHADERS / name).read_text() for name in gen.file_names()}
    params = {gen.parameters_of(text) for text in committed.values()}
    assert len(params) == 1 and None not in params, f"qmatmul shaders lost or differ in their GENERATED line: {params}"
    C, R = params.pop()
    for name, text in gen.generate(C, R).items():
        assert committed[name] == text, f"shaders/{name} is stale or hand-edited: run `python3 shaders/gen_qmatmul.py {C} {R}`"
    qmatmul_mjs = (REPO_ROOT / "web" / "gpu" / "qmatmul.mjs").read_text()
    assert f"export const QMATMUL_ROWS = {R};" in qmatmul_mjs, "web/gpu/qmatmul.mjs's grid does not use the shaders' R"


# ----------------------------------------------------------------------------- the page
@pytest.fixture(scope="module")
def blocks_page(chromium_browser, http_server):  # noqa: F811
    context = chromium_browser.new_context()
    page = context.new_page()
    forward_console(page, prefix="gpu-blocks")
    page.goto(f"{http_server.url}/web/tests/gpu_blocks_harness.html")
    page.wait_for_function("() => window.harnessReady === true", timeout=60_000)
    yield page
    context.close()


def gpu_run(page, fmt, path, x, raw, rows, scale=None, y0=None, stride=None, row0=0, accumulate=False, max_block=9):
    """(y (n, stride), qx (n, cols) int8, dx (n, cols/32), xsum (n, cols/32)) from the page."""
    n, cols = x.shape
    stride = rows if stride is None else stride
    args = {"format": fmt, "dot4": path == "dot4", "n": n, "rows": rows, "cols": cols, "weight": b64(np.frombuffer(raw, np.uint8)),
            "scale": None if scale is None else b64(scale.astype(F32)), "x": b64(x.astype(F32)),
            "y0": None if y0 is None else b64(y0.astype(F32)), "stride": stride, "row0": row0,
            "accumulate": accumulate, "maxBlock": max(max_block, n)}
    out = page.evaluate("(a) => window.harness.run(a)", args)
    y = unb64(out["y"], F32, n * stride).reshape(n, stride)
    qx = unb64(out["qx"], np.int8, n * cols).reshape(n, cols)
    xb = unb64(out["xb"], F32, n * cols // 16).reshape(n, cols // 32, 2)
    return y, qx, xb[..., 0], xb[..., 1]


def weights(fmt, rows, cols, rng):
    """(raw bytes, row scales or None) of random valid weights in fmt's layout."""
    raw = twin.random_blocks(fmt, rows, cols, rng)
    scale = (rng.uniform(0.5, 2.0, rows) / (127 * np.sqrt(cols))).astype(F32) if fmt == "ROWQ8" else None
    return raw, scale


def activations(rng, n, cols):
    """Hidden-state-like rows: a wide spread of magnitudes across blocks, a zero block, one huge element."""
    x = (rng.standard_normal((n, cols)) * np.exp(rng.uniform(-3, 3, (n, cols // 32))).repeat(32, axis=1)).astype(F32)
    if cols >= 64:
        x[:, 32:64] = 0.0
    x[-1, 0] = 3.0e4
    return x


def assert_bitwise(got, want, what):
    differ = np.argwhere(bits(got) != bits(want))
    if differ.size:
        j, o = differ[0]
        raise AssertionError(f"{what}: {len(differ)} elements differ; first ({j}, {o}): gpu {got[j, o]!r} "
                             f"(0x{bits(got)[j, o]:08x}) twin {want[j, o]!r} (0x{bits(want)[j, o]:08x})")


# ----------------------------------------------------------------------------- facts of SwiftShader
def test_swiftshader_offers_dot4_and_both_paths_compile(blocks_page):
    """Chromium's WGSL has packed_4x8_integer_dot_product on SwiftShader, so the default path is
    dot4I8Packed; the unpacking path is the one forced with {dot4: false}."""
    f = blocks_page.evaluate("window.harness.features()")
    assert "packed_4x8_integer_dot_product" in f["wgsl"] and f["dot4"] is True, f


def test_swiftshader_does_not_fuse_multiply_add(blocks_page):
    """SwiftShader rounds a*b before adding c in `a * b + c`, and even WGSL's fma() is a rounded
    product plus a rounded sum there: the declared sequence is what it computes."""
    got = blocks_page.evaluate("""async () => {
      const device = await (await navigator.gpu.requestAdapter()).requestDevice();
      const code = `@group(0) @binding(0) var<storage, read_write> v: array<f32>;
        @compute @workgroup_size(1) fn main() { let a = v[0]; let b = v[1]; let c = v[2];
          v[3] = a * b + c; v[4] = fma(a, b, c); }`;
      const p = device.createComputePipeline({ layout: 'auto', compute: { module: device.createShaderModule({ code }), entryPoint: 'main' } });
      const buf = device.createBuffer({ size: 32, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
      device.queue.writeBuffer(buf, 0, new Float32Array([1 + 2 ** -12, 1 + 2 ** -12, -1, 0, 0]));
      const read = device.createBuffer({ size: 32, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      const enc = device.createCommandEncoder(), pass = enc.beginComputePass();
      pass.setPipeline(p);
      pass.setBindGroup(0, device.createBindGroup({ layout: p.getBindGroupLayout(0), entries: [{ binding: 0, resource: { buffer: buf } }] }));
      pass.dispatchWorkgroups(1);
      pass.end();
      enc.copyBufferToBuffer(buf, 0, read, 0, 32);
      device.queue.submit([enc.finish()]);
      await read.mapAsync(GPUMapMode.READ);
      return Array.from(new Float32Array(read.getMappedRange()).slice(3, 5));
    }""")
    a = F32(1 + 2 ** -12)
    rounded = float(a * a - F32(1))                       # f32(f32(a*a) - 1) = 2^-11 (a*a ties to even)
    fused = float(np.float64(a) * np.float64(a) - 1)      # 2^-11 + 2^-24: what an FMA gives
    assert rounded != fused
    assert got == [rounded, rounded], f"SwiftShader fused: {got} (rounded {rounded}, fused {fused})"


# ----------------------------------------------------------------------------- the quantiser
def awkward_activations():
    """Blocks that probe every branch of section 1: amax mantissas at a table-index boundary and one
    ulp past it (127/64, the top index), halves of a power-of-two grid, a zero block, a block below
    2^-100, subnormals beside a normal, the largest amax below 2^100; and rows with a NaN, a -Inf
    and an amax of exactly 2^100 (those blocks' dx NaN: the row becomes NaN)."""
    one = F32(1)
    blocks = []
    b = np.linspace(-1, 1, 32, dtype=F32)
    blocks.append(b)                                          # amax 1: e = -6
    blocks.append(b * F32(127 / 64))                          # mantissa exactly 127/64: e = E - 6
    blocks.append(b * np.nextafter(F32(127 / 64), F32(2)))    # one ulp above: e = E - 5
    ties = (np.arange(32, dtype=F32) - 16) + F32(0.5)         # x * 2^-e = k + 0.5 exactly: ties to even
    ties[0] = 127.0
    blocks.append(ties * F32(2 ** -20))
    blocks.append(np.zeros(32, F32))                          # a zero block
    blocks.append(np.full(32, np.ldexp(one, -101), F32))      # below 2^-100: a zero block
    sub = np.full(32, np.ldexp(one, -140), F32)               # subnormals beside 2^-100 (they round to 0)
    sub[5] = np.ldexp(one, -100)
    blocks.append(sub)
    below = np.nextafter(np.ldexp(one, 100), F32(0))         # the largest amax a block may have
    blocks.append(np.linspace(-1, 1, 32, dtype=F32) * below)
    return np.stack([np.concatenate(blocks),
                     np.concatenate(blocks[::-1]),
                     np.concatenate([b] * 3 + [np.array([np.nan] + [0.5] * 31, F32)] + [b] * 4),
                     np.concatenate([b] * 7 + [np.array([1.0] * 31 + [-np.inf], F32)]),
                     np.concatenate([b] * 5 + [np.linspace(-1, 1, 32, dtype=F32) * np.ldexp(one, 100)] + [b] * 2)])


@pytest.mark.parametrize("path", PATHS)
def test_quantize_act_equals_the_twin_bitwise(blocks_page, path):
    x = awkward_activations()
    rows, cols = 3, x.shape[1]
    raw, _ = weights("Q8_0", rows, cols, np.random.default_rng(1))
    y, qx, dx, xsum = gpu_run(blocks_page, "Q8_0", path, x, raw, rows)
    want_qx, want_dx, want_xsum = twin.quantize_activations(x)
    assert np.array_equal(qx, want_qx)
    assert np.array_equal(dx, want_dx, equal_nan=True) and np.array_equal(bits(dx)[~np.isnan(dx)], bits(want_dx)[~np.isnan(dx)])
    assert np.isnan(dx[2, 3]) and np.isnan(dx[3, 7]) and np.isnan(dx[4, 5]) and np.isnan(dx).sum() == 3
    assert np.array_equal(xsum, want_xsum.astype(F32))
    assert np.isnan(y[2:]).all() and not np.isnan(y[:2]).any()      # a NaN, -Inf or 2^100 block: its row is NaN
    assert_bitwise(y[:2], twin.qmatmul("Q8_0", raw, x[:2], rows, cols), "quantize_act rows 0-1 matmul")


# ----------------------------------------------------------------------------- the matmuls
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_block_size_equals_the_twin_and_is_batch_invariant(blocks_page, fmt, path):
    """n = 1..9 on the same rows and inputs: each n's output is the twin's bits, and position j's
    outputs are the same bits whatever n is."""
    rng = np.random.default_rng(FORMATS.index(fmt))
    rows, cols = 70, 160                                      # rows: a full workgroup and a partial one
    raw, scale = weights(fmt, rows, cols, rng)
    x = activations(rng, 9, cols)
    outputs = []
    for n in range(1, 10):
        y, *_ = gpu_run(blocks_page, fmt, path, x[:n], raw, rows, scale)
        assert_bitwise(y, twin.qmatmul(fmt, raw, x[:n], rows, cols, scale), f"{fmt} {path} n={n}")
        outputs.append(y)
    for y in outputs:
        assert np.array_equal(bits(y), bits(outputs[-1][:len(y)])), f"{fmt} {path}: n={len(y)} differs from n=9"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,cols,n", [(1, 32, 1), (3, 96, 9), (12, 1536, 5), (37, 544, 7)])
def test_shapes_equal_the_twin_bitwise(blocks_page, fmt, path, rows, cols, n):
    rng = np.random.default_rng(rows * cols + n)
    raw, scale = weights(fmt, rows, cols, rng)
    x = activations(rng, n, cols)
    y, *_ = gpu_run(blocks_page, fmt, path, x, raw, rows, scale)
    assert_bitwise(y, twin.qmatmul(fmt, raw, x, rows, cols, scale), f"{fmt} {path} ({rows}, {cols}) n={n}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_piece_accumulates_into_its_columns(blocks_page, fmt):
    """A piece of rows (row0, stride) adds its outputs into the residual stream with one f32
    addition each, and leaves every other element's bits alone."""
    rng = np.random.default_rng(40 + FORMATS.index(fmt))
    rows, cols, n, stride, row0 = 37, 96, 6, 100, 50
    raw, scale = weights(fmt, rows, cols, rng)
    x = activations(rng, n, cols)
    resid = rng.standard_normal((n, stride)).astype(F32)
    y, *_ = gpu_run(blocks_page, fmt, "dot4", x, raw, rows, scale, y0=resid, stride=stride, row0=row0, accumulate=True)
    mine = slice(row0, row0 + rows)
    assert_bitwise(y[:, mine], resid[:, mine] + twin.qmatmul(fmt, raw, x, rows, cols, scale), f"{fmt} accumulate")
    others = np.ones(stride, bool)
    others[mine] = False
    assert np.array_equal(bits(y[:, others]), bits(resid[:, others]))


def scale_edge_blocks(fmt, rows, cols, rng):
    """Random blocks whose f16 scales (and Q4_1 mins) include subnormals, +0, -0 and the largest f16."""
    raw = bytearray(twin.random_blocks(fmt, rows, cols, rng))
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[fmt]
    edges = [0x0001, 0x03ff, 0x8001, 0x0000, 0x8000, 0x7bff, 0xfbff, 0x0400]   # subnormals, zeros, max, min normal
    for i, h in enumerate(edges * ((len(raw) // size) // len(edges))):
        at = i * size + (2 * (i % 2) if fmt == "Q4_1" else 0)                  # Q4_1: alternate d and m
        raw[at:at + 2] = int(h).to_bytes(2, "little")
    return bytes(raw)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1"])
def test_f16_scale_edges_widen_exactly(blocks_page, fmt, path):
    rng = np.random.default_rng(7)
    rows, cols, n = 16, 256, 3
    raw = scale_edge_blocks(fmt, rows, cols, rng)
    x = activations(rng, n, cols)
    y, *_ = gpu_run(blocks_page, fmt, path, x, raw, rows)
    assert_bitwise(y, twin.qmatmul(fmt, raw, x, rows, cols), f"{fmt} {path} f16 edges")


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1"])
def test_embed_gather_from_blocks_equals_the_twin_bitwise(blocks_page, fmt):
    """embed_gather_<fmt>: the rows of the piece [row0, row0 + rows) by section 4's formula (the
    twin's dequantize_rows, bit for bit, f16 scale edges included); tokens outside keep x."""
    rng = np.random.default_rng(11)
    rows, hidden, row0 = 50, 96, 30
    raw = scale_edge_blocks(fmt, rows, hidden, rng)
    ids = np.array([30, 79, 55, 10, 100, 31, 78], np.uint32)          # 10 and 100 lie outside the piece
    x0 = rng.standard_normal((len(ids), hidden)).astype(F32)
    out = blocks_page.evaluate("(a) => window.harness.gather(a)", {
        "format": fmt, "n": len(ids), "hidden": hidden, "rows": rows, "row0": row0,
        "weight": b64(np.frombuffer(raw, np.uint8)), "ids": ids.tolist(), "x0": b64(x0)})
    x = unb64(out, F32, len(ids) * hidden).reshape(len(ids), hidden)
    table = twin.dequantize_rows(fmt, raw, rows, hidden)
    inside = (ids >= row0) & (ids < row0 + rows)
    want = np.where(inside[:, None], table[np.clip(ids - row0, 0, rows - 1)], x0)
    assert_bitwise(x, want, f"embed_gather {fmt}")


def test_a_fused_multiply_add_would_be_caught(blocks_page):
    """The bitwise comparison is sensitive to fusion: the twin's sum with each block term added by
    an FMA (acc + dwdx * isum rounded once) differs from the GPU's bits on these shapes."""
    rng = np.random.default_rng(3)
    rows, cols, n = 64, 512, 4
    raw, _ = weights("Q8_0", rows, cols, rng)
    x = activations(rng, n, cols)
    y, *_ = gpu_run(blocks_page, "Q8_0", "dot4", x, raw, rows)
    q, dw, _, _ = twin.decode_blocks("Q8_0", raw, rows, cols)
    qx, dx, _ = twin.quantize_activations(x)
    acc = None
    for b in range(cols // 32):
        isum = twin.block_sums(q, None, qx, b).astype(F32)
        p = dw[None, :, b] * dx[:, b, None]
        acc = p * isum if acc is None else (acc.astype(np.float64) + p.astype(np.float64) * isum).astype(F32)
    assert_bitwise(y, twin.qmatmul("Q8_0", raw, x, rows, cols), "Q8_0")
    assert (bits(acc) != bits(y)).sum() > rows * n // 10, "the fused variant gave the same bits: the test is blind to fusion"


# ----------------------------------------------------------------------------- the champion, matmul "q8act"
# The page keeps its own device and champion (window.f32t, as tests/test_gpu_f32_linears.py), so
# forward_map reads the champion loaded here.
LOAD_URL_JS = """async ([url, options]) => {
  const { requestDevice } = await import('/web/gpu/device.mjs');
  const { compileChampionPipelines, createChampion } = await import('/web/gpu/champion.mjs');
  const t = (window.f32t ??= {});
  if (!t.device) { t.device = await requestDevice(); t.pipelines = compileChampionPipelines(t.device); }
  t.champion?.destroy();
  t.champion = null;
  t.champion = await createChampion({ device: t.device, modelUrl: url, pipelinesPromise: t.pipelines, maxBlock: 9, ...options });
  const c = t.champion;
  return { forms: c.forms, matmulFunction: c.matmulFunction, dot4: c.dot4, memoryPlan: c.memoryPlan };
}"""
LOAD_MAP_JS = """async ([config, entries, options]) => {
  const { requestDevice } = await import('/web/gpu/device.mjs');
  const { compileChampionPipelines, createChampionFromTensors } = await import('/web/gpu/champion.mjs');
  const t = (window.f32t ??= {});
  if (!t.device) { t.device = await requestDevice(); t.pipelines = compileChampionPipelines(t.device); }
  t.champion?.destroy();
  t.champion = null;
  const bytes = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const tensors = new Map(Object.entries(entries).map(([name, e]) => {
    const entry = { dtype: e.dtype, shape: e.shape, bytes: bytes(e.b64) };   // a block entry as ggufTensorMap's {blocks: true}
    if (e.f32) entry.float32 = () => ({ dtype: "F32", shape: e.shape, bytes: bytes(e.f32) });
    return [name, entry];
  }));
  t.champion = await createChampionFromTensors({ device: t.device, config, tensors, identity: "ab".repeat(32), label: "a blocks map",
                                                 pipelinesPromise: t.pipelines, maxBlock: 9, ...options });
  const c = t.champion;
  return { forms: c.forms, matmulFunction: c.matmulFunction, dot4: c.dot4, memoryPlan: c.memoryPlan };
}"""

# GGUF formats of the tiny Llama's linears in the blocks map: every kernel, a tied Q8_0 embedding (held
# once, in its blocks: gathered by embed_gather_q8_0, multiplied as the head) and, in layer 1, a q|k|v
# group of mixed formats (uploaded as float32: the reference computes those parts in float too)
BLOCK_PLAN = {
    0: {"q_proj": "Q8_0", "k_proj": "Q8_0", "v_proj": "Q8_0", "o_proj": "Q4_0", "gate_proj": "Q4_1", "up_proj": "Q4_1", "down_proj": "Q8_0"},
    1: {"q_proj": "Q4_0", "k_proj": "Q8_0", "v_proj": "Q4_1", "o_proj": "Q4_1", "gate_proj": "Q4_0", "up_proj": "Q4_0", "down_proj": "Q4_1"},
}
MIXED = {"model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight"}


@pytest.fixture(scope="module")
def tiny_q8():
    import synthetic_models
    return synthetic_models.tiny_llama()


def blocks_model(model_dir):
    """(config, page entries, reference tensors, reference blocks) of the tiny Llama's float32 weights
    with every linear and the embedding encoded in BLOCK_PLAN's GGUF format (llama.cpp's quantisers)."""
    import json

    from exactspec.reference.hf import open_safetensors_files
    from exactspec.reference.block_linear import BlockLinear
    config = json.loads((model_dir / "config.json").read_text())
    with open_safetensors_files([str(model_dir / "model.safetensors")]) as ckpt:
        floats = {name: np.asarray(ckpt.read_float32(name), F32) for name in ckpt.header()}
    fmt_of = {"model.embed_tokens.weight": "Q8_0"}
    for layer, parts in BLOCK_PLAN.items():
        for part, fmt in parts.items():
            group = "self_attn" if part.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            fmt_of[f"model.layers.{layer}.{group}.{part}.weight"] = fmt
    entries, ref_tensors, ref_blocks = {}, {}, {}
    for name, w in floats.items():
        if name not in fmt_of:
            entries[name] = {"dtype": "F32", "shape": list(w.shape), "b64": b64(w)}
            ref_tensors[name] = w
            continue
        fmt, (rows, cols) = fmt_of[name], w.shape
        raw = twin.quantize_weights(fmt, w)
        dequant = twin.dequantize_rows(fmt, raw, rows, cols)
        entries[name] = {"dtype": fmt, "shape": [rows, cols], "b64": b64(np.frombuffer(raw, np.uint8)), "f32": b64(dequant)}
        ref_tensors[name] = dequant
        if name not in MIXED:
            ref_blocks[name] = BlockLinear(fmt, raw, rows, cols, name=name, source="a blocks map")
    return config, entries, ref_tensors, ref_blocks


def entry_bytes(name, entry):
    """Bytes the champion holds for one tensor of the blocks map: its blocks, or float32 in a mixed group."""
    rows, cols = entry["shape"]
    if entry["dtype"] == "F32" or name in MIXED:
        return 4 * rows * cols
    return rows * twin.row_bytes(entry["dtype"], cols)


def q8act_vs_reference(page, ref, vocab, seed, what):
    """Logits of blocks of several sizes vs the q8act reference; returns the max abs error."""
    from test_gpu_f32_linears import forward_map
    from tolerances import max_error, within
    rng = np.random.default_rng(seed)
    worst = 0.0
    for length, sizes in ((17, [9, 1, 7]), (40, [8, 9, 3])):
        ids = rng.integers(0, vocab, length)
        blocks = split(ids, sizes)
        ref.reset()
        for (block, start), logits in zip(blocks, forward_map(page, blocks, vocab)):
            want = ref.forward(block, start)
            worst = max(worst, max_error(logits, want, "champion_logits_q8act"))
            assert within(logits, want, "champion_logits_q8act"), (what, worst)
    print(f"[err] {what}: q8act champion vs q8act reference max abs {worst:.3e}")
    return worst


def test_q8act_champion_on_the_q8_artifact(gpu_page, tiny_q8):
    """createChampion(modelUrl, {matmul: "q8act"}): every int8 linear (and the tied int8 head) on
    qmatmul_rowq8; logits vs LlamaReference(weights="q8", matmul="q8act") within the stated
    tolerance; blocks bit for bit equal to single positions; both integer paths the same bits."""
    from test_gpu_f32_linears import assert_blocks_bitwise, forward_map
    from exactspec.reference.reference_llama import LlamaReference
    ref = LlamaReference.from_dir(tiny_q8, weights="q8", role="champion", matmul="q8act")
    assert ref.matmul_function == "q8act-v1"
    info = gpu_page.evaluate(LOAD_URL_JS, [url_of(tiny_q8), {"matmul": "q8act"}])
    assert info["matmulFunction"] == "q8act-v1" and info["dot4"] is True
    assert info["forms"]["head"] == "tied" and {f for layer in info["forms"]["layers"] for f in layer.values()} == {"q8"}
    vocab = ref.vocab_size
    q8act_vs_reference(gpu_page, ref, vocab, 3, "tiny q8 artifact")
    ids, singles = assert_blocks_bitwise(gpu_page, vocab, 4, "q8act tiny (dot4)")
    gpu_page.evaluate(LOAD_URL_JS, [url_of(tiny_q8), {"matmul": "q8act", "dot4": False}])
    unpacked = np.concatenate(forward_map(gpu_page, split(ids, [9, 9, 9]), vocab))
    assert np.array_equal(bits(unpacked), bits(singles)), "the unpacking path gave other bits"
    f32 = gpu_page.evaluate(LOAD_URL_JS, [url_of(tiny_q8), {}])          # the default is unchanged: the float kernels
    assert f32["matmulFunction"] == "f32" and f32["dot4"] is None


def test_q8act_champion_on_gguf_blocks(gpu_page, tiny_q8):
    """createChampionFromTensors with GGUF Q8_0 / Q4_0 / Q4_1 entries in their blocks under matmul
    "q8act": those linears run on their kernels (forms say so), a mixed q|k|v group uses the exact
    float32 entries, the tied Q8_0 embedding is held once (gathered from its blocks, the head); logits
    vs the reference computing the same (BlockLinear parts) within the stated tolerance, blocks bit
    for bit equal to single positions."""
    from test_gpu_f32_linears import assert_blocks_bitwise, validated
    from exactspec.reference.reference_llama import LlamaReference
    config, entries, ref_tensors, ref_blocks = blocks_model(tiny_q8)
    ref = LlamaReference(config, ref_tensors, "ab" * 32, role="champion", matmul="q8act", blocks=ref_blocks.get)
    info = gpu_page.evaluate(LOAD_MAP_JS, [validated(config), entries, {"matmul": "q8act"}])
    assert info["matmulFunction"] == "q8act-v1"
    assert info["forms"]["embed"] == "Q8_0" and info["forms"]["head"] == "tied"
    assert info["forms"]["layers"] == [{"qkv": "Q8_0", "o": "Q4_0", "gateUp": "Q4_1", "down": "Q8_0"},
                                       {"qkv": "f32", "o": "Q4_1", "gateUp": "Q4_0", "down": "Q4_1"}]
    held = sum(entry_bytes(name, e) for name, e in entries.items() if not name.endswith("norm.weight"))
    norms = sum(4 * e["shape"][0] for name, e in entries.items() if name.endswith("norm.weight"))
    assert info["memoryPlan"]["weights"] == held + norms      # every weight once, in the form it runs in
    q8act_vs_reference(gpu_page, ref, ref.vocab_size, 5, "tiny GGUF blocks")
    assert_blocks_bitwise(gpu_page, ref.vocab_size, 6, "q8act GGUF blocks")
    plain = gpu_page.evaluate(LOAD_MAP_JS, [validated(config), entries, {}])   # matmul "f32": every block entry as float32
    assert plain["forms"]["embed"] == "f32" and {f for layer in plain["forms"]["layers"] for f in layer.values()} == {"f32"}


def test_q8act_champion_refusals(gpu_page, tiny_q8):
    from test_gpu_f32_linears import validated
    config, entries, _, _ = blocks_model(tiny_q8)
    bad = dict(entries)
    name = "model.layers.0.mlp.down_proj.weight"
    bad[name] = {**entries[name], "b64": b64(np.frombuffer(base64_bytes(entries[name]["b64"])[:-2], np.uint8))}
    with pytest.raises(Exception, match=r"E_MODEL_LOAD: a blocks map: tensor model\.layers\.0\.mlp\.down_proj\.weight holds"):
        gpu_page.evaluate(LOAD_MAP_JS, [validated(config), bad, {"matmul": "q8act"}])
    with pytest.raises(Exception, match=r"E_BAD_ARGUMENT: matmul \"q4\" is not one of f32, q8act"):
        gpu_page.evaluate(LOAD_MAP_JS, [validated(config), entries, {"matmul": "q4"}])


def base64_bytes(s):
    import base64
    return base64.b64decode(s)


# ----------------------------------------------------------------------------- GPU vs WASM, both q8act
# In one page: the WebGPU champion and the WASM champion (web/champion_wasm/champion_wasm.mjs, cpu.wasm)
# on the same weights, both with matmul "q8act", forward the same blocks.
BOTH_JS = """async ([spec, blocks]) => {
  const { requestDevice } = await import('/web/gpu/device.mjs');
  const { compileChampionPipelines, createChampion, createChampionFromTensors } = await import('/web/gpu/champion.mjs');
  const { createWasmChampion } = await import('/web/champion_wasm/champion_wasm.mjs');
  const { fetchGgufFile, ggufTensorMap } = await import('/web/gguf/gguf_tensors.mjs');
  const t = (window.f32t ??= {});
  if (!t.device) { t.device = await requestDevice(); t.pipelines = compileChampionPipelines(t.device); }
  t.champion?.destroy();
  t.champion = null;
  const common = { maxBlock: 9, matmul: 'q8act' };
  let gpu, wasm;
  if (spec.modelUrl) {
    gpu = await createChampion({ device: t.device, modelUrl: spec.modelUrl, pipelinesPromise: t.pipelines, ...common });
    wasm = await createWasmChampion({ wasmUrl: '/web/build/cpu.wasm', modelUrl: spec.modelUrl, simd: 'simd128', ...common });
  } else {
    const { bytes, identity } = await fetchGgufFile(fetch, spec.ggufUrl);
    const tensors = ggufTensorMap(bytes, spec.config, 'tiny gguf', { blocks: true });
    gpu = await createChampionFromTensors({ device: t.device, config: spec.config, tensors, identity, label: 'tiny gguf',
                                            pipelinesPromise: t.pipelines, ...common });
    wasm = await createWasmChampion({ wasmUrl: '/web/build/cpu.wasm', tensors, identity, configJson: spec.config, simd: 'simd128', ...common });
  }
  const b64 = (a) => { const u8 = new Uint8Array(a.buffer); let s = '';
    for (let i = 0; i < u8.length; i += 0x8000) s += String.fromCharCode(...u8.subarray(i, i + 0x8000)); return btoa(s); };
  const out = [];
  for (const [ids, start] of blocks) {
    await gpu.forward(Int32Array.from(ids), start);
    await wasm.forward(Int32Array.from(ids), start);
    out.push([b64(await gpu.readLogits(ids.length)), b64(await wasm.readLogits(ids.length))]);
  }
  const info = { gpu: gpu.matmulFunction, wasm: wasm.matmulFunction, forms: gpu.forms, vocab: gpu.vocabSize };
  gpu.destroy();
  wasm.destroy();
  return { info, out };
}"""
# GGUF types the WebGPU kernels take (so both champions compute every linear with q8act-v1)
GPU_GGUF_TYPES = {"token_embd.weight": "Q8_0", "output.weight": "Q4_1", "attn_q.weight": "Q4_0", "attn_k.weight": "Q4_0",
                  "attn_v.weight": "Q4_0", "attn_output.weight": "Q8_0", "ffn_gate.weight": "Q4_1", "ffn_up.weight": "Q4_1",
                  "ffn_down.weight": "Q8_0"}


def gpu_vs_wasm(page, spec, vocab_hint, seed, what):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_hint, 26)
    blocks = split(ids, [9, 1, 7, 9])
    got = page.evaluate(BOTH_JS, [spec, [[list(map(int, b)), int(s)] for b, s in blocks]])
    assert got["info"]["gpu"] == got["info"]["wasm"] == "q8act-v1", got["info"]
    vocab = got["info"]["vocab"]
    worst, same = 0.0, 0
    from tolerances import max_error, within
    for (block, _), (g, w) in zip(blocks, got["out"]):
        g, w = (unb64(s, F32, len(block) * vocab).reshape(len(block), vocab) for s in (g, w))
        worst = max(worst, max_error(g, w, "champion_logits_q8act"))
        same += sum(np.array_equal(bits(g[i]), bits(w[i])) for i in range(len(block)))
        assert within(g, w, "champion_logits_q8act"), (what, worst)
    print(f"[err] {what}: q8act WebGPU vs q8act WASM max abs {worst:.3e} ({same} of {len(ids)} rows bit-identical)")
    return got["info"]


def test_gpu_and_wasm_q8act_champions_agree_on_the_q8_artifact(gpu_page, tiny_q8):
    gpu_vs_wasm(gpu_page, {"modelUrl": url_of(tiny_q8)}, 1000, 21, "tiny q8 artifact")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gpu_and_wasm_q8act_champions_agree_on_gguf_blocks(gpu_page, arch):
    """A tiny GGUF (q/k rows permuted for llama, biases for qwen2) read in its blocks by the page's
    ggufTensorMap({blocks: true}) into both champions: every linear and the untied head on the
    WebGPU q8act kernels, the Q8_0 embedding gathered from its blocks."""
    from gguf import GGMLQuantizationType as Q
    from synthetic_models import TEST_MODELS, write_tiny_model
    from test_gpu_f32_linears import validated
    from exactspec.formats.gguf_model import GGUFModel
    path = TEST_MODELS / "gpu_blocks" / f"tiny_{arch}_q8act.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tiny_model(str(path), arch=arch, types={k: getattr(Q, v) for k, v in GPU_GGUF_TYPES.items()}, seed=7)
    with GGUFModel(str(path)) as model:
        config = validated(model.config)
    info = gpu_vs_wasm(gpu_page, {"ggufUrl": "/" + path.relative_to(REPO_ROOT).as_posix(), "config": config},
                       config["vocab_size"], 22, f"tiny GGUF {arch}")
    assert info["forms"]["embed"] == "Q8_0" and info["forms"]["head"] == "Q4_1"
    assert info["forms"]["layers"][0] == {"qkv": "Q4_0", "o": "Q8_0", "gateUp": "Q4_1", "down": "Q8_0"}


# ----------------------------------------------------------------------------- the real SmolLM2 GGUF
SMOLLM2_JS = """async ([url, config, prompt, steps]) => {
  const { requestDevice } = await import('/web/gpu/device.mjs');
  const { compileChampionPipelines, createChampionFromTensors } = await import('/web/gpu/champion.mjs');
  const { createWasmChampion } = await import('/web/champion_wasm/champion_wasm.mjs');
  const { fetchGgufFile, ggufTensorMap } = await import('/web/gguf/gguf_tensors.mjs');
  const t = (window.f32t ??= {});
  if (!t.device) { t.device = await requestDevice(); t.pipelines = compileChampionPipelines(t.device); }
  t.champion?.destroy();
  t.champion = null;
  const { bytes, identity } = await fetchGgufFile(fetch, url);
  const tensors = ggufTensorMap(bytes, config, 'smollm2.gguf', { lazy: true, blocks: true });
  const common = { maxBlock: 9, maxContext: 64, matmul: 'q8act' };
  const t0 = performance.now();
  const gpu = await createChampionFromTensors({ device: t.device, config, tensors, identity, label: 'smollm2.gguf',
                                                pipelinesPromise: t.pipelines, ...common });
  const loadMs = performance.now() - t0;
  const wasm = await createWasmChampion({ wasmUrl: '/web/build/cpu.wasm', tensors, identity, configJson: config, simd: 'simd128', ...common });
  const V = gpu.vocabSize, argmax = (row) => { let b = 0; for (let v = 1; v < V; v++) if (row[v] > row[b]) b = v; return b; };
  const ids = [...prompt], gpuTokens = [], wasmTokens = [], ms = [];
  let same = 0, worst = 0;
  for (let s = 0; s < steps; s++) {
    const block = s === 0 ? prompt : [ids[ids.length - 1]], start = s === 0 ? 0 : ids.length - 1;
    const t1 = performance.now();
    await gpu.forward(Int32Array.from(block), start);
    const g = await gpu.readLogits(block.length);
    ms.push(performance.now() - t1);
    await wasm.forward(Int32Array.from(block), start);
    const w = await wasm.readLogits(block.length);
    const gu = new Uint32Array(g.buffer), wu = new Uint32Array(w.buffer);
    for (let r = 0; r < block.length; r++) {
      let equal = true;
      for (let v = r * V; v < (r + 1) * V; v++) { equal &&= gu[v] === wu[v]; worst = Math.max(worst, Math.abs(g[v] - w[v])); }
      same += equal;
    }
    const last = (a) => a.subarray((block.length - 1) * V, block.length * V);
    gpuTokens.push(argmax(last(g)));
    wasmTokens.push(argmax(last(w)));
    ids.push(gpuTokens[gpuTokens.length - 1]);
  }
  const out = { gpuTokens, wasmTokens, same, rows: prompt.length + steps - 1, worst, ms, loadMs, identity,
                weights: gpu.memoryPlan.weights, forms: gpu.forms, fileBytes: bytes.byteLength, wasmWeights: wasm.weightBytes };
  gpu.destroy();
  wasm.destroy();
  return out;
}"""


def test_smollm2_gguf_q8act_greedy_equals_the_wasm_champion(gpu_page):
    """The real SmolLM2-135M Q4_1 GGUF in its blocks on WebGPU (every linear Q4_1 on qmatmul_q4_1,
    the tied Q8_0 embedding gathered from and multiplied in its blocks): weights held = the file's
    tensors, and greedy tokens equal the WASM champion's q8act in the same page (rows of logits
    bit-identical counted and printed)."""
    from test_gpu_f32_linears import smollm2_gguf, validated
    from exactspec.formats.gguf_model import GGUFModel
    from exactspec.formats.gguf_tokenizer import load_tokenizer
    gguf = smollm2_gguf()
    with GGUFModel(gguf) as model:
        config = validated(model.config)
        tokenizer = load_tokenizer(model.file)
    prompt = tokenizer.encode("The capital of France is")
    url = "/" + gguf.resolve().relative_to(REPO_ROOT).as_posix()
    got = gpu_page.evaluate(SMOLLM2_JS, [url, config, prompt, 8])
    print(f"[smollm2 q8act] GPU load {got['loadMs']:.0f} ms, step ms {[round(m) for m in got['ms']]}, weights {got['weights']} "
          f"(file {got['fileBytes']}, WASM {got['wasmWeights']}), tokens {got['gpuTokens']} {tokenizer.decode(got['gpuTokens'])!r}, "
          f"{got['same']} of {got['rows']} rows bit-identical to WASM, max abs {got['worst']:.3g}")
    assert {f for layer in got["forms"]["layers"] for f in layer.values()} == {"Q4_1"}
    assert got["forms"]["embed"] == "Q8_0" and got["forms"]["head"] == "tied"
    assert got["weights"] <= got["fileBytes"]                  # every weight once, in its blocks (norms as float32)
    assert got["gpuTokens"] == got["wasmTokens"]
