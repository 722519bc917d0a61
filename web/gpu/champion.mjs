// Champion Llama forward on WebGPU: q8 weights, KV cache on the GPU, batch-invariant blocks.
import {
  bindGroups, createPipelines, fetchText, metaBuffer, packMeta, readBuffer, storageBuffer, writeBytes, META_STRIDE,
} from "./device.mjs";
import { expectTensor, fetchSafetensors, parseSafetensors } from "./safetensors.mjs";
import { parseConfig, resolveMaxContext, ropeTable } from "./champion_config.mjs";
import { bindingLimit, planChampion } from "./champion_plan.mjs";
import { sha256Hex } from "../sha256.mjs";

export { parseConfig } from "./champion_config.mjs";

export const KERNELS = [
  "embed_gather", "rmsnorm_f32", "matmul_q8", "rope_qkv", "attention_scores",
  "attention_softmax", "attention_values", "swiglu_f32", "lm_head_f32", "embed_gather_q8", "bias_add_f32",
];
const cdiv = (a, b) => Math.ceil(a / b);
const u = (v) => [v, "u32"];

/** Meta fields and dispatch grid of each kernel, from its dims: the one place both the forward
 *  and the test harness compute them. `matmul_q8`/`lm_head_f32` dims: {n, rows: out, cols: in},
 *  `accumulate` (matmul_q8: add into y, the residual stream), and for one piece of a tensor split
 *  by rows `row0` (its first output row) and `stride` (outputs per y row; default rows).
 *  `embed_gather(_q8)`: {n, hidden, vocab: rows of this piece, row0}. */
const gather = (d) => ({ meta: [u(d.n), u(d.hidden), u(d.vocab), u(d.row0 ?? 0)], grid: [cdiv(d.hidden, 64), d.n, 1] });
const matmulMeta = (d, flag) => [u(d.n), u(d.rows), u(d.cols / 4), u(flag), u(d.stride ?? d.rows), u(d.row0 ?? 0)];
export const OPS = {
  embed_gather: gather,
  embed_gather_q8: gather,
  rmsnorm_f32: (d) => ({ meta: [u(d.n), u(d.hidden), [d.eps, "f32"]], grid: [d.n, 1, 1] }),
  matmul_q8: (d) => ({ meta: matmulMeta(d, d.accumulate ? 1 : 0), grid: [cdiv(d.rows, 256), 1, 1] }),
  lm_head_f32: (d) => ({ meta: matmulMeta(d, 0), grid: [cdiv(d.rows, 256), 1, 1] }),
  bias_add_f32: (d) => ({ meta: [u(d.n), u(d.rows)], grid: [cdiv(d.rows, 64), d.n, 1] }),
  rope_qkv: (d) => ({
    meta: [u(d.n), u(d.startPos), u(d.heads), u(d.kvHeads), u(d.headDim), u(d.layerOffset)],
    grid: [cdiv(d.n * (d.heads + 2 * d.kvHeads) * d.headDim / 2, 64), 1, 1],
  }),
  attention_scores: (d) => ({
    meta: [u(d.n), u(d.startPos), u(d.heads), u(d.kvHeads), u(d.headDim), u(d.layerOffset), [d.scale, "f32"], u(d.maxContext)],
    grid: [cdiv(d.startPos + d.n, 64), d.heads, 1],
  }),
  attention_softmax: (d) => ({
    meta: [u(d.n), u(d.startPos), u(d.heads), u(d.maxContext)], grid: [cdiv(d.n * d.heads, 64), 1, 1],
  }),
  attention_values: (d) => ({
    meta: [u(d.n), u(d.startPos), u(d.heads), u(d.kvHeads), u(d.headDim), u(d.layerOffset), u(d.maxContext)],
    grid: [cdiv(d.n * d.heads * d.headDim / 4, 64), 1, 1],
  }),
  swiglu_f32: (d) => ({ meta: [u(d.n), u(d.inter)], grid: [cdiv(d.inter, 64), d.n, 1] }),
};

/** Compile the champion's pipelines (no model needed: the kernels take their shapes at run time). */
export function compileChampionPipelines(device, shaderUrl = null) {
  return createPipelines(device, shaderUrl ?? new URL("../../shaders/", import.meta.url), KERNELS);
}

/** The stored form of the two (V, H) tensors: embed "f32" | "q8"; head "tied" | "f32" | "q8". */
function tensorForms(tensors, hp) {
  const form = (name) => (tensors.has(`${name}.q8`) ? "q8" : "f32");
  return { embed: form("model.embed_tokens.weight"), head: hp.tied ? "tied" : form("lm_head.weight") };
}

/** Upload a (rows, cols) tensor made of row-stacked parts [[name, rows]] (q8: `<name>.q8` int8 +
 *  `<name>.scale`; f32: `<name>` F32) into pieces of rows ({row0, rows}), each its own buffers. */
function uploadPieces(device, tensors, parts, cols, form, pieces, label) {
  const rowBytes = form === "q8" ? cols : 4 * cols;
  const sources = [];
  let at = 0;
  for (const [name, rows] of parts) {
    const w = form === "q8" ? expectTensor(tensors, `${name}.q8`, "I8", [rows, cols], label)
      : expectTensor(tensors, name, "F32", [rows, cols], label);
    const s = form === "q8" ? expectTensor(tensors, `${name}.scale`, "F32", [rows], label) : null;
    sources.push({ row0: at, rows, w: w.bytes, s: s?.bytes });
    at += rows;
  }
  return pieces.map(({ row0, rows }) => {
    const piece = { row0, rows, cols, stride: at, w: storageBuffer(device, rows * rowBytes, null, `${parts[0][0]}[${row0}:]`) };
    if (form === "q8") piece.s = storageBuffer(device, rows * 4, null, `${parts[0][0]}.scale[${row0}:]`);
    for (const src of sources) {   // copy the overlap of [src.row0, +src.rows) and [row0, +rows)
      const a = Math.max(row0, src.row0), b = Math.min(row0 + rows, src.row0 + src.rows);
      if (a >= b) continue;
      writeBytes(device, piece.w, (a - row0) * rowBytes, src.w.subarray((a - src.row0) * rowBytes, (b - src.row0) * rowBytes));
      if (piece.s) writeBytes(device, piece.s, (a - row0) * 4, src.s.subarray((a - src.row0) * 4, (b - src.row0) * 4));
    }
    return piece;
  });
}

/** Upload the q8 linears of one layer, fusing q|k|v and gate|up row-wise (same dot products). */
function uploadLayer(device, tensors, hp, i, pieces, label) {
  const p = `model.layers.${i}.`, H = hp.hidden, F = hp.inter;
  const qDim = hp.heads * hp.headDim, kvDim = hp.kvHeads * hp.headDim;
  const linear = (parts, cols, which) => uploadPieces(device, tensors, parts.map(([n, r]) => [p + n + ".weight", r]), cols, "q8", pieces[which], label);
  const f32 = (name, n) => storageBuffer(device, n * 4, expectTensor(tensors, p + name, "F32", [n], label).bytes, p + name);
  const qkvParts = [["self_attn.q_proj", qDim], ["self_attn.k_proj", kvDim], ["self_attn.v_proj", kvDim]];
  let qkvBias = null;
  if (hp.qkvBias) {
    const bias = new Uint8Array((qDim + 2 * kvDim) * 4);
    let at = 0;
    for (const [name, r] of qkvParts) {
      bias.set(expectTensor(tensors, `${p}${name}.bias`, "F32", [r], label).bytes, at);
      at += r * 4;
    }
    qkvBias = storageBuffer(device, bias.byteLength, bias, `${p}qkv.bias`);
  }
  return {
    attnNorm: f32("input_layernorm.weight", H), mlpNorm: f32("post_attention_layernorm.weight", H),
    qkv: linear(qkvParts, H, "qkv"), qkvBias,
    o: linear([["self_attn.o_proj", H]], qDim, "o"),
    gateUp: linear([["mlp.gate_proj", F], ["mlp.up_proj", F]], H, "gateUp"),
    down: linear([["mlp.down_proj", H]], F, "down"),
  };
}

/** Load config.json + model.q8.safetensors from modelUrl and build every buffer and pipeline.
 *  maxContext: KV positions (default min(max_position_embeddings, 4096)); maxBindingBytes: a
 *  smaller split threshold for the weights than the device's (tests); memoryBudgetBytes: refuse a
 *  plan above it (E_OUT_OF_MEMORY saying which maxContext would fit). */
export async function createChampion({ device, modelUrl, maxBlock = 9, maxContext = 0, shaderUrl = null, pipelinesPromise = null,
                                       maxBindingBytes = 0, memoryBudgetBytes = 0 }) {
  const base = new URL(modelUrl.endsWith("/") ? modelUrl : modelUrl + "/", location.href);
  const t0 = performance.now();
  // pipelines compile (slow on SwiftShader) while the weights download
  // `pipelinesPromise`: from compileChampionPipelines, started earlier (e.g. while Pyodide boots)
  const pipelinesReady = pipelinesPromise ?? compileChampionPipelines(device, shaderUrl);
  pipelinesReady.catch(() => {});   // awaited below; avoid an unhandled rejection if loading fails first
  const config = JSON.parse(await fetchText(new URL("config.json", base)));
  const hp = parseConfig(config);
  maxContext = resolveMaxContext(hp, maxContext);
  if (!(maxBlock >= 1 && maxBlock <= 64)) throw new Error(`E_BAD_ARGUMENT: maxBlock ${maxBlock} outside [1, 64]`);
  const limit = bindingLimit(device.limits);
  const planOptions = { maxBlock, maxContext, limit, weightLimit: bindingLimit(device.limits, maxBindingBytes), budgetBytes: memoryBudgetBytes };
  // refuse before the download what cannot fit even in the smallest forms (q8 embedding and head)
  planChampion(hp, { embed: "q8", head: hp.tied ? "tied" : "q8" }, planOptions);
  const weightsUrl = new URL("model.q8.safetensors", base);
  const fileBytes = await fetchSafetensors(fetch, weightsUrl, weightsUrl.pathname);   // header checked before the data
  const t1 = performance.now();
  const { tensors } = parseSafetensors(fileBytes, weightsUrl.pathname);
  const plan = planChampion(hp, tensorForms(tensors, hp), planOptions);
  // sha256 of model.q8.safetensors: the identity LlamaReference.from_dir(dir, weights="q8") reports
  const identity = await sha256Hex(fileBytes);
  const t2 = performance.now();
  const pipelines = await pipelinesReady;
  const t3 = performance.now();

  const label = weightsUrl.pathname;
  device.pushErrorScope("validation");
  device.pushErrorScope("out-of-memory");
  let bufs, steps, metas;
  try {
    ({ bufs, steps, metas } = buildForward(device, hp, tensors, pipelines, { maxBlock, maxContext, label, plan }));
  } finally {
    const oom = await device.popErrorScope();
    const invalid = await device.popErrorScope();
    const b = plan.bytes;
    if (oom) {
      throw Object.assign(new Error(`E_OUT_OF_MEMORY: WebGPU: ${oom.message} (needed ${b.total} bytes: weights ${b.weights}, ` +
        `KV cache ${b.kvCache} at maxContext ${maxContext}, activations ${b.activations}; a smaller maxContext needs less KV cache)`),
        { code: "E_OUT_OF_MEMORY" });
    }
    if (invalid) throw new Error(`E_MODEL_LOAD: WebGPU: ${invalid.message}`);
  }
  const loadMs = {   // fetch: config + weights; hash: parse + sha256; pipelines: wait after that
    fetch: t1 - t0, hash: t2 - t1, pipelines: t3 - t2, upload: performance.now() - t3, total: performance.now() - t0,
  };
  const metaWords = new ArrayBuffer(steps.length * META_STRIDE);
  const { vocab: V } = hp, B = maxBlock;
  let length = 0;   // positions [0, length) hold valid K/V
  const champion = {
    config, identity, artifactBytes: fileBytes.byteLength, loadMs, vocabSize: V, maxBlock: B, maxContext, hp, pipelines, buffers: bufs,
    logitsBuffer: bufs.logits,
    memoryPlan: plan.bytes,                                   // bytes: weights, kvCache, activations, total
    pieces: Object.fromEntries(Object.entries(plan.pieces).map(([k, v]) => [k, v && v.length])),   // buffers per tensor
    get length() { return length; },
    /** Run positions [startPos, startPos + n): one submission; logits rows 0..n-1 stay on the GPU. */
    async forward(tokenIds, startPos) {
      const n = tokenIds.length;
      if (!(n >= 1 && n <= B)) throw new Error(`E_BAD_ARGUMENT: block of ${n} tokens outside [1, ${B}]`);
      if (!(Number.isInteger(startPos) && startPos >= 0 && startPos <= length)) {
        throw new Error(`E_BAD_ARGUMENT: startPos ${startPos} outside [0, ${length}] (cannot skip uncached positions)`);
      }
      if (startPos + n > maxContext) throw new Error(`E_CONTEXT_OVERFLOW: positions up to ${startPos + n} exceed maxContext ${maxContext}`);
      const ids = Uint32Array.from(tokenIds);
      for (const t of tokenIds) if (!(Number.isInteger(t) && t >= 0 && t < V)) throw new Error(`E_BAD_ARGUMENT: token id ${t} outside [0, ${V})`);
      writeBytes(device, bufs.ids, 0, ids);
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      for (const [slot, s] of steps.entries()) {
        const { meta, grid } = OPS[s.op](s.dims(n, startPos));
        packMeta(meta, metaWords, slot);
        pass.setPipeline(s.pipeline);
        pass.setBindGroup(0, s.groups[0]);
        pass.setBindGroup(1, s.groups[1]);
        pass.dispatchWorkgroups(...grid);
      }
      pass.end();
      device.queue.writeBuffer(metas, 0, metaWords);
      device.queue.submit([enc.finish()]);
      length = startPos + n;
    },
    /** Float32Array (n * V): logits rows 0..n-1 of the last forward (tests and diagnostics). */
    async readLogits(n) {
      return new Float32Array(await readBuffer(device, bufs.logits, n * V * 4));
    },
    /** Diagnostics: ms per kernel (summed over layers) for a forward of n tokens at startPos,
     *  each dispatch encoded `reps` times in its own submission (amortises the submit + wait).
     *  Overwrites activations: run a forward() before reading logits again. */
    async profile(n, startPos, reps = 8) {
      await this.forward(Array.from({ length: n }, (_, i) => i % V), startPos);   // fills the Meta slab
      await device.queue.onSubmittedWorkDone();
      const ms = {};
      for (const s of steps) {
        const enc = device.createCommandEncoder();
        const pass = enc.beginComputePass();
        pass.setPipeline(s.pipeline);
        pass.setBindGroup(0, s.groups[0]);
        pass.setBindGroup(1, s.groups[1]);
        for (let r = 0; r < reps; r++) pass.dispatchWorkgroups(...OPS[s.op](s.dims(n, startPos)).grid);
        pass.end();
        const t0 = performance.now();
        device.queue.submit([enc.finish()]);
        await device.queue.onSubmittedWorkDone();
        ms[s.op] = (ms[s.op] ?? 0) + (performance.now() - t0) / reps;
      }
      return ms;
    },
    reset() { length = 0; },
    /** Free every buffer this champion made (weights, activations, KV cache, metas). */
    destroy() {
      const owned = new Set([...Object.values(bufs).flat(), metas, ...steps.flatMap((s) => s.tensorsOf)]);
      for (const b of owned) b.destroy();
      length = 0;
    },
  };
  return champion;
}

/** Upload every tensor, allocate activations and the KV cache (one K and one V buffer per layer),
 *  and build the dispatch list. A tensor split into row pieces is one dispatch per piece. */
function buildForward(device, hp, tensors, pipelines, { maxBlock, maxContext, label, plan }) {
  const { vocab: V, hidden: H, inter: F, heads, kvHeads, headDim: hd, layers: L } = hp;
  const qkvDim = (heads + 2 * kvHeads) * hd, qDim = heads * hd, B = maxBlock;
  const forms = tensorForms(tensors, hp);
  const embed = uploadPieces(device, tensors, [["model.embed_tokens.weight", V]], H, forms.embed, plan.pieces.embed, label);
  const head = hp.tied ? embed : uploadPieces(device, tensors, [["lm_head.weight", V]], H, forms.head, plan.pieces.head, label);
  const kvBytes = maxContext * kvHeads * hd * 4;
  const bufs = {
    finalNorm: storageBuffer(device, H * 4, expectTensor(tensors, "model.norm.weight", "F32", [H], label).bytes, "norm"),
    ropeTable: storageBuffer(device, maxContext * hd * 4, ropeTable(hp, maxContext), "rope"),
    ids: storageBuffer(device, B * 4, null, "ids"),                     // (B,) u32
    x: storageBuffer(device, B * H * 4, null, "x"),                     // (B, H) residual stream
    xn: storageBuffer(device, B * H * 4, null, "xn"),                   // (B, H) normed
    qkv: storageBuffer(device, B * qkvDim * 4, null, "qkv"),            // (B, (heads + 2 KV) hd)
    q: storageBuffer(device, B * qDim * 4, null, "q"),                  // (B, heads hd) after RoPE
    scores: storageBuffer(device, B * heads * maxContext * 4, null, "scores"), // (B, heads, ctx)
    att: storageBuffer(device, B * qDim * 4, null, "att"),              // (B, heads hd)
    gateUp: storageBuffer(device, B * 2 * F * 4, null, "gate_up"),      // (B, 2F)
    act: storageBuffer(device, B * F * 4, null, "act"),                 // (B, F)
    logits: storageBuffer(device, B * V * 4, null, "logits"),           // (B, V)
    kCache: Array.from({ length: L }, (_, l) => storageBuffer(device, kvBytes, null, `k_cache.${l}`)),   // L x (ctx, KV, hd)
    vCache: Array.from({ length: L }, (_, l) => storageBuffer(device, kvBytes, null, `v_cache.${l}`)),
  };
  const layerW = Array.from({ length: L }, (_, i) => uploadLayer(device, tensors, hp, i, plan.pieces, label));

  // The dispatch list: [kernel, tensors, dims(n, startPos)], built once; forward() only
  // rewrites the Meta slab and re-encodes the same bind groups.
  const steps = [];
  const step = (op, tensorsOf, dims) => steps.push({ op, tensorsOf, dims });
  const mm = (pieces, xBuf, yBuf, accumulate) => {
    for (const w of pieces) {
      const dims = (n) => ({ n, rows: w.rows, cols: w.cols, accumulate, row0: w.row0, stride: w.stride });
      if (w.s) step("matmul_q8", [w.w, w.s, xBuf, yBuf], dims);
      else step("lm_head_f32", [w.w, xBuf, yBuf], dims);
    }
  };
  for (const e of embed) {
    const dims = (n) => ({ n, hidden: H, vocab: e.rows, row0: e.row0 });
    if (e.s) step("embed_gather_q8", [e.w, e.s, bufs.ids, bufs.x], dims);
    else step("embed_gather", [e.w, bufs.ids, bufs.x], dims);
  }
  layerW.forEach((w, layer) => {
    const attnDims = (n, startPos) => ({
      n, startPos, heads, kvHeads, headDim: hd, layerOffset: 0, scale: hd ** -0.5, maxContext,
    });
    const kC = bufs.kCache[layer], vC = bufs.vCache[layer];
    step("rmsnorm_f32", [bufs.x, w.attnNorm, bufs.xn], (n) => ({ n, hidden: H, eps: hp.eps }));
    mm(w.qkv, bufs.xn, bufs.qkv, false);
    if (w.qkvBias) step("bias_add_f32", [w.qkvBias, bufs.qkv], (n) => ({ n, rows: qkvDim }));
    step("rope_qkv", [bufs.qkv, bufs.ropeTable, bufs.q, kC, vC], attnDims);
    step("attention_scores", [bufs.q, kC, bufs.scores], attnDims);
    step("attention_softmax", [bufs.scores], attnDims);
    step("attention_values", [bufs.scores, vC, bufs.att], attnDims);
    mm(w.o, bufs.att, bufs.x, true);                  // x += o_proj(att)
    step("rmsnorm_f32", [bufs.x, w.mlpNorm, bufs.xn], (n) => ({ n, hidden: H, eps: hp.eps }));
    mm(w.gateUp, bufs.xn, bufs.gateUp, false);
    step("swiglu_f32", [bufs.gateUp, bufs.act], (n) => ({ n, inter: F }));
    mm(w.down, bufs.act, bufs.x, true);               // x += down(act)
  });
  step("rmsnorm_f32", [bufs.x, bufs.finalNorm, bufs.xn], (n) => ({ n, hidden: H, eps: hp.eps }));
  mm(head, bufs.xn, bufs.logits, false);              // tied: the embedding pieces themselves

  const metas = metaBuffer(device, steps.length, "meta");
  for (const [slot, s] of steps.entries()) {
    s.pipeline = pipelines[s.op];
    s.groups = bindGroups(device, s.pipeline, s.tensorsOf, metas, slot);
  }
  return { bufs, steps, metas };
}
