"""WebGPU champion (shaders/*.wgsl, web/gpu/champion.mjs) in headless Chromium on SwiftShader.

(a) each kernel vs its NumPy twin (py/exactspec/twins/gpu_twins.py) on awkward shapes; (b) batch
invariance: a position's logits are bit-identical decoded alone or inside any block; (c) whole
champion vs LlamaReference.from_dir(dir, weights="q8") on a random tiny HF Llama (GQA, tied,
synthetic_models.tiny_llama), and on the trained champion in web/models/champion/ when it is present.
Also the CPU-only test of the q8 loading option of LlamaReference.
"""
from __future__ import annotations

import base64
import shutil
from pathlib import Path

import numpy as np
import pytest

from browser_fixture import REPO_ROOT, chromium_browser, forward_console, http_server  # noqa: F401
from tolerances import TOLERANCES, max_error, within
import synthetic_models

from exactspec.twins import gpu_twins
from exactspec.core.errors import ExactSpecError
from exactspec.reference.reference_llama import LlamaReference

TEST_MODELS = synthetic_models.TEST_MODELS   # gitignored, served by the test server
TRAINED_CHAMPION = REPO_ROOT / "web" / "models" / "champion"


# ----------------------------------------------------------------------------- helpers
def b64(a) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def unb64(s: str, dtype, count: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=dtype)[:count]


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return synthetic_models.tiny_llama()


@pytest.fixture(scope="module")
def gpu_page(chromium_browser, http_server):  # noqa: F811
    context = chromium_browser.new_context()
    page = context.new_page()
    forward_console(page, prefix="gpu")
    page.goto(f"{http_server.url}/web/tests/gpu_harness.html")
    page.wait_for_function("() => window.harnessReady === true", timeout=60_000)
    page.evaluate("window.harness.init()")
    yield page
    context.close()


def run_kernel(page, name, dims, tensors, read):
    return page.evaluate("([n, d, t, r]) => window.harness.runKernel(n, d, t, r)", [name, dims, tensors, read])


def assert_close(got, want, name):
    err = max_error(got, want, name)
    print(f"[err] {name}: {err:.3e}")   # shown with -s: the number TOLERANCES[name].measured records
    assert within(got, want, name), f"{name}: max err {err:.3e} (tolerance {TOLERANCES[name]})"


def url_of(model_dir: Path) -> str:
    return "/" + model_dir.resolve().relative_to(REPO_ROOT).as_posix() + "/"


# ----------------------------------------------------------------------------- (a) kernels
def test_kernels_follow_the_conventions():
    """Every kernel champion.mjs loads is shaders/<name>.wgsl with a twin of the same name, a
    one-line header, tensors in group 0 each with a shape comment, and one Meta uniform in group 1."""
    import re
    source = (REPO_ROOT / "web" / "gpu" / "champion.mjs").read_text()
    names = re.findall(r'"(\w+)"', source[source.index("KERNELS = ["):source.index("];")])
    assert len(names) == 11
    for name in names:
        assert callable(getattr(gpu_twins, name, None)), f"no NumPy twin {name}"
        wgsl = (REPO_ROOT / "shaders" / f"{name}.wgsl").read_text()
        assert wgsl.startswith("// "), name
        bindings = [line for line in wgsl.splitlines() if line.startswith("@group(")]
        assert bindings[-1] == "@group(1) @binding(0) var<uniform> params: Meta;", name
        for i, line in enumerate(bindings[:-1]):
            assert line.startswith(f"@group(0) @binding({i}) var<storage") and re.search(r"// \(", line), line


@pytest.mark.parametrize("vocab,hidden,n", [(1000, 96, 1), (1000, 100, 9), (4097, 64, 5)])
def test_embed_gather(gpu_page, vocab, hidden, n):
    rng = np.random.default_rng(vocab + n)
    embed = rng.standard_normal((vocab, hidden)).astype(np.float32)
    ids = rng.integers(0, vocab, n).astype(np.uint32)
    ids[0] = vocab - 1
    (x,) = run_kernel(gpu_page, "embed_gather", {"n": n, "hidden": hidden, "vocab": vocab},
                      [{"b64": b64(embed)}, {"b64": b64(ids)}, {"bytes": 9 * hidden * 4}], [2])
    assert_close(unb64(x, np.float32, n * hidden).reshape(n, hidden), gpu_twins.embed_gather(embed, ids), "embed")


@pytest.mark.parametrize("hidden,n", [(96, 1), (260, 9), (4097, 3)])
def test_rmsnorm_f32(gpu_page, hidden, n):
    rng = np.random.default_rng(hidden + n)
    x = (rng.standard_normal((n, hidden)) * rng.uniform(0.01, 30, (n, 1))).astype(np.float32)
    x[-1] = 0.0 if n > 1 else x[-1]                  # an all-zero row: eps keeps it finite
    w = (1 + 0.3 * rng.standard_normal(hidden)).astype(np.float32)
    (y,) = run_kernel(gpu_page, "rmsnorm_f32", {"n": n, "hidden": hidden, "eps": 1e-5},
                      [{"b64": b64(x)}, {"b64": b64(w)}, {"bytes": n * hidden * 4}], [2])
    assert_close(unb64(y, np.float32, n * hidden).reshape(n, hidden), gpu_twins.rmsnorm_f32(x, w, 1e-5), "rmsnorm")


def _q8_case(rng, rows, cols):
    q8 = rng.integers(-127, 128, (rows, cols)).astype(np.int8)
    q8[0, :] = 127
    q8[-1, :] = -127                                 # extreme rows: every word saturated
    scale = (rng.uniform(0.5, 2.0, rows) / (127 * np.sqrt(cols))).astype(np.float32)
    return q8, scale


@pytest.mark.parametrize("rows,cols,n", [(1000, 96, 1), (4097, 96, 9), (130, 260, 5), (7, 8, 3), (512, 256, 4)])
def test_matmul_q8(gpu_page, rows, cols, n):
    rng = np.random.default_rng(rows * cols + n)
    q8, scale = _q8_case(rng, rows, cols)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    (y,) = run_kernel(gpu_page, "matmul_q8", {"n": n, "rows": rows, "cols": cols},
                      [{"b64": b64(q8)}, {"b64": b64(scale)}, {"b64": b64(x)}, {"bytes": n * rows * 4}], [3])
    assert_close(unb64(y, np.float32, n * rows).reshape(n, rows), gpu_twins.matmul_q8(q8, scale, x), "matmul_q8")


@pytest.mark.parametrize("name", ["matmul_q8", "matmul_f32"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_matmul_every_block_size_bitwise(gpu_page, name, accumulate):
    """n = 1..9 on the same rows, plain and accumulating into a residual: every n matches the
    twin, and row j's outputs are the same float32 bits whatever n is (the kernel-level form of
    batch invariance)."""
    rng = np.random.default_rng(5)
    rows, cols = 1000, 96
    q8, scale = _q8_case(rng, rows, cols)
    w32 = (q8 * scale[:, None]).astype(np.float32)
    weight = [{"b64": b64(q8)}, {"b64": b64(scale)}] if name == "matmul_q8" else [{"b64": b64(w32)}]
    x = rng.standard_normal((9, cols)).astype(np.float32)
    resid = rng.standard_normal((9, rows)).astype(np.float32)
    outputs = []
    for n in range(1, 10):
        y_in = {"b64": b64(resid[:n])} if accumulate else {"bytes": n * rows * 4}
        (y,) = run_kernel(gpu_page, name, {"n": n, "rows": rows, "cols": cols, "accumulate": accumulate},
                          weight + [{"b64": b64(x[:n])}, y_in], [len(weight) + 1])
        y = unb64(y, np.float32, n * rows).reshape(n, rows)
        r = resid[:n] if accumulate else None
        want = gpu_twins.matmul_q8(q8, scale, x[:n], r) if name == "matmul_q8" else gpu_twins.matmul_f32(w32, x[:n], r)
        assert_close(y, want, name)
        outputs.append(y)
    for y in outputs:
        assert np.array_equal(y.view(np.uint32), outputs[-1][:len(y)].view(np.uint32)), f"n={len(y)}: bits differ from n=9"


@pytest.mark.parametrize("rows,cols,n", [(1001, 96, 9), (6, 12, 2)])
def test_matmul_q8_accumulate(gpu_page, rows, cols, n):
    rng = np.random.default_rng(rows + cols + n)
    q8, scale = _q8_case(rng, rows, cols)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    resid = rng.standard_normal((n, rows)).astype(np.float32)
    (y,) = run_kernel(gpu_page, "matmul_q8", {"n": n, "rows": rows, "cols": cols, "accumulate": True},
                      [{"b64": b64(q8)}, {"b64": b64(scale)}, {"b64": b64(x)}, {"b64": b64(resid)}], [3])
    assert_close(unb64(y, np.float32, n * rows).reshape(n, rows),
                 gpu_twins.matmul_q8(q8, scale, x, resid), "matmul_q8")


@pytest.mark.parametrize("rows,cols,n", [(1000, 96, 1), (4097, 96, 9), (4096, 256, 2), (7, 8, 3), (130, 260, 5)])
def test_matmul_f32(gpu_page, rows, cols, n):
    rng = np.random.default_rng(rows + cols + n)
    w = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    (y,) = run_kernel(gpu_page, "matmul_f32", {"n": n, "rows": rows, "cols": cols},
                      [{"b64": b64(w)}, {"b64": b64(x)}, {"bytes": n * rows * 4}], [2])
    assert_close(unb64(y, np.float32, n * rows).reshape(n, rows), gpu_twins.matmul_f32(w, x), "matmul_f32")


@pytest.mark.parametrize("name", ["matmul_q8", "matmul_f32"])
def test_matmul_row_piece_accumulates_into_its_rows(gpu_page, name):
    """One piece of a tensor split by rows (row0, stride) adds into its own columns of the
    residual stream and leaves every other element's bits alone."""
    rng = np.random.default_rng(8)
    rows, cols, n, stride, row0 = 37, 24, 6, 100, 50
    q8, scale = _q8_case(rng, rows, cols)
    w32 = (q8 * scale[:, None]).astype(np.float32)
    weight = [{"b64": b64(q8)}, {"b64": b64(scale)}] if name == "matmul_q8" else [{"b64": b64(w32)}]
    x = rng.standard_normal((n, cols)).astype(np.float32)
    resid = rng.standard_normal((n, stride)).astype(np.float32)
    dims = {"n": n, "rows": rows, "cols": cols, "accumulate": True, "row0": row0, "stride": stride}
    (y,) = run_kernel(gpu_page, name, dims, weight + [{"b64": b64(x)}, {"b64": b64(resid)}], [len(weight) + 1])
    y = unb64(y, np.float32, n * stride).reshape(n, stride)
    mine = slice(row0, row0 + rows)
    want = gpu_twins.matmul_q8(q8, scale, x, resid[:, mine]) if name == "matmul_q8" else \
        gpu_twins.matmul_f32(w32, x, resid[:, mine])
    assert_close(y[:, mine], want, name)
    others = np.ones(stride, bool)
    others[mine] = False
    assert np.array_equal(y[:, others].view(np.uint32), resid[:, others].view(np.uint32))


@pytest.mark.parametrize("heads,kv_heads,hd,n,start_pos", [(4, 2, 24, 9, 30), (6, 3, 64, 1, 0), (4, 4, 8, 5, 3)])
def test_rope_qkv(gpu_page, heads, kv_heads, hd, n, start_pos):
    rng = np.random.default_rng(heads * hd + n)
    layers, layer, ctx, theta = 2, 1, 48, 10000.0
    qkv = rng.standard_normal((n, (heads + 2 * kv_heads) * hd)).astype(np.float32)
    table = gpu_twins.rope_table(ctx, hd, theta).astype(np.float32)
    cache_bytes = layers * ctx * kv_heads * hd * 4
    dims = {"n": n, "startPos": start_pos, "heads": heads, "kvHeads": kv_heads, "headDim": hd,
            "layerOffset": layer * ctx * kv_heads * hd}
    q, kc, vc = run_kernel(gpu_page, "rope_qkv", dims,
                           [{"b64": b64(qkv)}, {"b64": b64(table)}, {"bytes": n * heads * hd * 4},
                            {"bytes": cache_bytes}, {"bytes": cache_bytes}], [2, 3, 4])
    want_q, want_k, want_v = gpu_twins.rope_qkv(qkv, start_pos, heads, kv_heads, hd, theta)
    kc = unb64(kc, np.float32, cache_bytes // 4).reshape(layers, ctx, kv_heads, hd)
    vc = unb64(vc, np.float32, cache_bytes // 4).reshape(layers, ctx, kv_heads, hd)
    assert_close(unb64(q, np.float32, n * heads * hd).reshape(n, heads, hd), want_q, "rope")
    assert_close(kc[layer, start_pos:start_pos + n], want_k, "rope")
    assert np.array_equal(vc[layer, start_pos:start_pos + n], want_v.astype(np.float32))
    untouched = np.ones((layers, ctx), bool)
    untouched[layer, start_pos:start_pos + n] = False
    assert not kc[untouched].any() and not vc[untouched].any()


ATTENTION_CASES = [
    (4, 2, 24, 9, 70, 80),      # > 64 keys: several score workgroups per row
    (6, 3, 64, 3, 0, 16),       # first positions: 1..3 keys
    (2, 1, 128, 2, 200, 256),   # MQA, wide heads
]


def _attention_case(heads, kv_heads, hd, n, start_pos, ctx):
    rng = np.random.default_rng(heads + hd + start_pos)
    layers, layer = 2, 1
    q = (rng.standard_normal((n, heads, hd)) * 3.0).astype(np.float32)     # peaked softmax rows
    kc = rng.standard_normal((layers, ctx, kv_heads, hd)).astype(np.float32)
    vc = rng.standard_normal((layers, ctx, kv_heads, hd)).astype(np.float32)
    dims = {"n": n, "startPos": start_pos, "heads": heads, "kvHeads": kv_heads, "headDim": hd,
            "layerOffset": layer * ctx * kv_heads * hd, "scale": hd ** -0.5, "maxContext": ctx}
    return q, kc, vc, dims, layer


def _rows(flat, n, heads, ctx, start_pos):
    """(n, heads, ctx) scratch -> per query row j its (heads, start_pos + j + 1) live part."""
    flat = flat.reshape(n, heads, ctx)
    return [flat[j, :, :start_pos + j + 1] for j in range(n)]


@pytest.mark.parametrize("heads,kv_heads,hd,n,start_pos,ctx", ATTENTION_CASES)
def test_attention_kernels(gpu_page, heads, kv_heads, hd, n, start_pos, ctx):
    """Each of attention_scores / _softmax / _values against its twin, then the three chained."""
    q, kc, vc, dims, layer = _attention_case(heads, kv_heads, hd, n, start_pos, ctx)
    scratch = n * heads * ctx
    (s,) = run_kernel(gpu_page, "attention_scores", dims,
                      [{"b64": b64(q)}, {"b64": b64(kc)}, {"bytes": scratch * 4}], [2])
    scores = _rows(unb64(s, np.float32, scratch), n, heads, ctx, start_pos)
    for got, want in zip(scores, gpu_twins.attention_scores(q, kc[layer], start_pos)):
        assert_close(got, want, "attention")
    full = np.zeros((n, heads, ctx), np.float32)
    for j, sc in enumerate(scores):
        full[j, :, :sc.shape[1]] = sc
    (p,) = run_kernel(gpu_page, "attention_softmax", dims, [{"b64": b64(full)}], [0])
    probs = _rows(unb64(p, np.float32, scratch), n, heads, ctx, start_pos)
    for got, want in zip(probs, gpu_twins.attention_softmax(scores)):
        assert_close(got, want, "attention")
    full = np.zeros((n, heads, ctx), np.float32)
    for j, pr in enumerate(probs):
        full[j, :, :pr.shape[1]] = pr
    (out,) = run_kernel(gpu_page, "attention_values", dims,
                        [{"b64": b64(full)}, {"b64": b64(vc)}, {"bytes": n * heads * hd * 4}], [2])
    out = unb64(out, np.float32, n * heads * hd).reshape(n, heads * hd)
    assert_close(out, gpu_twins.attention_values(probs, vc[layer]), "attention")
    assert_close(out, gpu_twins.attention(q, kc[layer], vc[layer], start_pos), "attention")


@pytest.mark.parametrize("inter,n", [(160, 1), (1000, 9)])
def test_swiglu_f32(gpu_page, inter, n):
    rng = np.random.default_rng(inter + n)
    gate_up = (rng.standard_normal((n, 2 * inter)) * 4).astype(np.float32)
    gate_up[0, :3] = [-100.0, 100.0, 0.0]            # exp overflow / underflow / zero
    (a,) = run_kernel(gpu_page, "swiglu_f32", {"n": n, "inter": inter},
                      [{"b64": b64(gate_up)}, {"bytes": n * inter * 4}], [1])
    assert_close(unb64(a, np.float32, n * inter).reshape(n, inter), gpu_twins.swiglu_f32(gate_up), "swiglu")


# ----------------------------------------------------------------------------- whole champion
TRAINED = {"champion": TRAINED_CHAMPION, "draft": REPO_ROOT / "web" / "models" / "draft"}


def model_dirs():
    """The tiny random model always; the trained pair when exported (the draft, 2 layers with
    one kv head, is a second real shape for the same engine)."""
    return ["tiny"] + [name for name, d in TRAINED.items() if (d / "model.q8.safetensors").exists()]


def resolve(which, tiny_model) -> Path:
    return tiny_model if which == "tiny" else TRAINED[which]


def load_champion(page, model_dir: Path, max_block=9, max_context=0):
    return page.evaluate("([u, b, c]) => window.harness.loadChampion(u, b, c)", [url_of(model_dir), max_block, max_context])


def forward_blocks(page, blocks, vocab):
    """[(ids, start_pos)] in order -> list of (n, V) float32 logits."""
    out = page.evaluate("(b) => window.harness.forwardBlocks(b)", [[list(map(int, ids)), int(s)] for ids, s in blocks])
    return [unb64(s, np.float32, len(ids) * vocab).reshape(len(ids), vocab) for s, (ids, _) in zip(out, blocks)]


def split(ids, sizes):
    """Blocks [(ids[a:b], a)] of the given sizes (cycled) covering ids."""
    blocks, pos, i = [], 0, 0
    while pos < len(ids):
        n = sizes[i % len(sizes)]
        blocks.append((ids[pos:pos + n], pos))
        pos, i = pos + n, i + 1
    return blocks


@pytest.mark.parametrize("which", model_dirs())
def test_block_logits_bitwise_equal_single(gpu_page, tiny_model, which):
    model_dir = resolve(which, tiny_model)
    info = load_champion(gpu_page, model_dir)
    vocab = info["vocabSize"]
    ids = np.random.default_rng(7).integers(0, vocab, 27)
    singles = np.concatenate(forward_blocks(gpu_page, split(ids, [1]), vocab))
    for sizes in ([9], [2, 7, 4], [5, 1, 8, 3, 6, 9]):
        blocks = np.concatenate(forward_blocks(gpu_page, split(ids, sizes), vocab))
        differ = np.flatnonzero((blocks.view(np.uint32) != singles.view(np.uint32)).any(axis=1))
        assert differ.size == 0, f"{which}: block sizes {sizes}: positions {differ.tolist()} not bit-identical"
    # rollback: re-decode a suffix inside a block after a different continuation was cached
    other = ids.copy()
    other[20:] = (other[20:] + 1) % vocab
    forward_blocks(gpu_page, [(other[18:27], 18)], vocab)
    again = forward_blocks(gpu_page, [(ids[18:27], 18)], vocab)[0]
    assert np.array_equal(again.view(np.uint32), singles[18:27].view(np.uint32))


@pytest.mark.parametrize("which", model_dirs())
def test_champion_logits_vs_q8_reference(gpu_page, tiny_model, which):
    model_dir = resolve(which, tiny_model)
    info = load_champion(gpu_page, model_dir)
    vocab = info["vocabSize"]
    ref = LlamaReference.from_dir(model_dir, weights="q8")
    assert info["identity"] == ref.identity               # sha256 of model.q8.safetensors
    rng = np.random.default_rng(11)
    worst_abs = worst_rel = 0.0
    longest = min(150, info["maxContext"])             # > 64 keys: attention strides
    for length, sizes in ((5, [5]), (17, [9, 1, 7]), (40, [8, 9, 3]), (longest, [9, 9, 2])):
        ids = rng.integers(0, vocab, length)
        ids[0] = 0
        blocks = split(ids, sizes)
        got = forward_blocks(gpu_page, blocks, vocab)
        ref.reset()
        for (block, start), logits in zip(blocks, got):
            want = ref.forward(block, start)
            err = np.abs(logits - want)
            worst_abs = max(worst_abs, float(err.max()))
            worst_rel = max(worst_rel, float((err / np.maximum(np.abs(want), 1e-30)).max()))
            assert_close(logits, want, "champion_logits_vs_reference")
            # (so an argmax can differ only where the reference's top-two gap is below
            # flip_margin("champion_logits_vs_reference"): the rule test_browser_e2e.py applies)
    print(f"[{which}] champion vs q8 reference: max abs err {worst_abs:.3e}, max rel err {worst_rel:.3e}")


def test_champion_refuses_bad_calls(gpu_page, tiny_model):
    load_champion(gpu_page, tiny_model, max_block=4, max_context=32)
    for call, code in (("[[1,2,3,4,5], 0]", "E_BAD_ARGUMENT"),          # block > maxBlock
                       ("[[1], 3]", "E_BAD_ARGUMENT"),                  # skips uncached positions
                       ("[[1000], 0]", "E_BAD_ARGUMENT")):              # id >= V
        with pytest.raises(Exception, match=code):
            gpu_page.evaluate(f"window.harness.forwardBlocks([{call}])")
    forward_blocks(gpu_page, [(list(range(4)), 0)] + [([1, 2, 3, 4], s) for s in range(4, 32, 4)], 1000)
    with pytest.raises(Exception, match="E_CONTEXT_OVERFLOW"):
        gpu_page.evaluate("window.harness.forwardBlocks([[[1], 32]])")


def test_champion_load_errors_are_coded(gpu_page, tiny_model):
    with pytest.raises(Exception, match="E_MODEL_LOAD"):
        gpu_page.evaluate("window.harness.loadChampion('/build/test_models/no_such_model/', 9, 0)")
    with pytest.raises(Exception, match="E_BAD_ARGUMENT"):
        load_champion(gpu_page, tiny_model, max_block=9, max_context=65)   # > max_position_embeddings


def test_safetensors_reader_refuses_corruption(gpu_page, tiny_model):
    res = gpu_page.evaluate("""async (u) => {
      const { parseSafetensors } = await import('/web/formats/safetensors.mjs');
      const buf = await (await fetch(u)).arrayBuffer();
      const ok = parseSafetensors(buf, 'ok').tensors.size;
      const tries = {
        short: buf.slice(0, 5),
        truncated: buf.slice(0, buf.byteLength - 4),
        header_too_long: (() => { const b = buf.slice(0); new DataView(b).setUint32(0, b.byteLength, true); return b; })(),
        trailing: (() => { const b = new Uint8Array(buf.byteLength + 4); b.set(new Uint8Array(buf)); return b.buffer; })(),
      };
      const errors = {};
      for (const [k, b] of Object.entries(tries)) {
        try { parseSafetensors(b, k); errors[k] = null; } catch (e) { errors[k] = e.message; }
      }
      return { ok, errors };
    }""", url_of(tiny_model) + "model.q8.safetensors")
    assert res["ok"] > 10
    for kind, message in res["errors"].items():
        assert message and message.startswith("E_MODEL_LOAD"), (kind, message)


# ----------------------------------------------------------------------------- q8 reference (CPU)
def test_reference_q8_weights_dequantise(tiny_model, tmp_path):
    from safetensors.numpy import load_file, save_file
    q8 = load_file(str(tiny_model / "model.q8.safetensors"))
    deq = {}
    for name, t in q8.items():
        if name.endswith(".q8"):
            deq[name[:-3]] = t.astype(np.float32) * q8[name[:-3] + ".scale"][:, None]
        elif not name.endswith(".scale"):
            deq[name] = t
    f32_dir = tmp_path / "deq"
    f32_dir.mkdir()
    shutil.copy(tiny_model / "config.json", f32_dir / "config.json")
    save_file(deq, str(f32_dir / "model.safetensors"))
    ids = [0, 5, 999, 17, 3]
    want = LlamaReference.from_dir(f32_dir).forward(ids, 0)
    got = LlamaReference.from_dir(tiny_model, weights="q8").forward(ids, 0)
    assert np.array_equal(got, want)                     # same float32 weights -> same float64 math
    full = LlamaReference.from_dir(tiny_model).forward(ids, 0)
    assert 0 < np.abs(full - got).max() < 0.05 * np.abs(full).max()   # int8 rounding: visible, small
    with pytest.raises(ExactSpecError, match="weights must be"):
        LlamaReference.from_dir(tiny_model, weights="q4")
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(tiny_model / "config.json", broken / "config.json")
    save_file({k: v for k, v in q8.items() if k != "model.layers.0.mlp.up_proj.weight.scale"},
              str(broken / "model.q8.safetensors"))
    with pytest.raises(ExactSpecError, match="scale"):
        LlamaReference.from_dir(broken, weights="q8")
