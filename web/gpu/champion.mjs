// Champion Llama forward on WebGPU: q8 weights, KV cache on the GPU, batch-invariant blocks.
import {
  bindGroups, createPipelines, fetchText, metaBuffer, packMeta, readBuffer, storageBuffer, writeBytes, META_STRIDE,
} from "./device.mjs";
import { expectTensor, parseSafetensors } from "./safetensors.mjs";
import { sha256Hex } from "../sha256.mjs";

export const KERNELS = [
  "embed_gather", "rmsnorm_f32", "matmul_q8", "rope_qkv", "attention_scores",
  "attention_softmax", "attention_values", "swiglu_f32", "lm_head_f32",
];
const cdiv = (a, b) => Math.ceil(a / b);
const u = (v) => [v, "u32"];

/** Meta fields and dispatch grid of each kernel, from its dims: the one place both the forward
 *  and the test harness compute them. `matmul_q8`/`lm_head_f32` dims: {n, rows: out, cols: in},
 *  `accumulate` (matmul_q8: add into y, the residual stream). */
export const OPS = {
  embed_gather: (d) => ({ meta: [u(d.n), u(d.hidden), u(d.vocab)], grid: [cdiv(d.hidden, 64), d.n, 1] }),
  rmsnorm_f32: (d) => ({ meta: [u(d.n), u(d.hidden), [d.eps, "f32"]], grid: [d.n, 1, 1] }),
  matmul_q8: (d) => ({ meta: [u(d.n), u(d.rows), u(d.cols / 4), u(d.accumulate ? 1 : 0)], grid: [cdiv(d.rows, 256), 1, 1] }),
  lm_head_f32: (d) => ({ meta: [u(d.n), u(d.rows), u(d.cols / 4)], grid: [cdiv(d.rows, 256), 1, 1] }),
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

/** Hyper-parameters from config.json (HF Llama), refusing what the kernels cannot run. */
export function parseConfig(cfg) {
  const need = (k) => { if (cfg[k] === undefined) throw new Error(`E_MODEL_LOAD: config.json lacks ${k}`); return cfg[k]; };
  const heads = need("num_attention_heads");
  const hp = {
    vocab: need("vocab_size"), hidden: need("hidden_size"), inter: need("intermediate_size"),
    layers: need("num_hidden_layers"), heads, kvHeads: cfg.num_key_value_heads || heads,
    headDim: cfg.head_dim || need("hidden_size") / heads, eps: cfg.rms_norm_eps ?? 1e-6,
    ropeTheta: cfg.rope_parameters?.rope_theta ?? cfg.rope_theta ?? 10000.0,
    maxPositions: need("max_position_embeddings"),
  };
  const refuse = (why) => { throw new Error(`E_MODEL_LOAD: config.json: ${why}`); };
  if ((cfg.model_type ?? "llama") !== "llama") refuse(`model_type ${cfg.model_type} is not llama`);
  if ((cfg.hidden_act ?? "silu") !== "silu") refuse(`hidden_act ${cfg.hidden_act} is not silu`);
  if (cfg.tie_word_embeddings !== true) refuse("the WebGPU champion needs tie_word_embeddings=true");
  if (cfg.rope_scaling) refuse("rope_scaling is not supported");
  if (heads % hp.kvHeads) refuse("num_attention_heads must be a multiple of num_key_value_heads");
  for (const k of ["hidden", "inter", "headDim"]) if (hp[k] % 4) refuse(`${k} must be a multiple of 4 (int8 packed 4 per word)`);
  return hp;
}

/** RoPE table (maxContext, hd/2) of (cos, sin) pairs, angles in float64 like the reference. */
function ropeTable(hp, maxContext) {
  const half = hp.headDim / 2, table = new Float32Array(maxContext * half * 2);
  for (let p = 0; p < maxContext; p++) {
    for (let i = 0; i < half; i++) {
      const angle = p * (1.0 / Math.pow(hp.ropeTheta, (2 * i) / hp.headDim));
      table[2 * (p * half + i)] = Math.cos(angle);
      table[2 * (p * half + i) + 1] = Math.sin(angle);
    }
  }
  return table;
}

/** Upload the q8 linears of one layer, fusing q|k|v and gate|up row-wise (same dot products). */
function uploadLayer(device, tensors, hp, i, label) {
  const p = `model.layers.${i}.`, H = hp.hidden, F = hp.inter;
  const qDim = hp.heads * hp.headDim, kvDim = hp.kvHeads * hp.headDim;
  const fused = (parts, cols) => {
    const rows = parts.reduce((a, [, r]) => a + r, 0);
    const w = storageBuffer(device, rows * cols, null, `${p}w`), s = storageBuffer(device, rows * 4, null, `${p}s`);
    let row = 0;
    for (const [name, r] of parts) {
      writeBytes(device, w, row * cols, expectTensor(tensors, `${p}${name}.weight.q8`, "I8", [r, cols], label).bytes);
      writeBytes(device, s, row * 4, expectTensor(tensors, `${p}${name}.weight.scale`, "F32", [r], label).bytes);
      row += r;
    }
    return { w, s, rows, cols };
  };
  const norm = (name) => storageBuffer(device, H * 4, expectTensor(tensors, `${p}${name}.weight`, "F32", [H], label).bytes);
  return {
    attnNorm: norm("input_layernorm"), mlpNorm: norm("post_attention_layernorm"),
    qkv: fused([["self_attn.q_proj", qDim], ["self_attn.k_proj", kvDim], ["self_attn.v_proj", kvDim]], H),
    o: fused([["self_attn.o_proj", H]], qDim),
    gateUp: fused([["mlp.gate_proj", F], ["mlp.up_proj", F]], H),
    down: fused([["mlp.down_proj", H]], F),
  };
}

/** Compile the champion's pipelines (no model needed: the kernels take their shapes at run time). */
export function compileChampionPipelines(device, shaderUrl = null) {
  return createPipelines(device, shaderUrl ?? new URL("../../shaders/", import.meta.url), KERNELS);
}

/** Load config.json + model.q8.safetensors from modelUrl and build every buffer and pipeline. */
export async function createChampion({ device, modelUrl, maxBlock = 9, maxContext = 0, shaderUrl = null, pipelinesPromise = null }) {
  const base = new URL(modelUrl.endsWith("/") ? modelUrl : modelUrl + "/", location.href);
  const t0 = performance.now();
  // pipelines compile (slow on SwiftShader) while the weights download
  // `pipelinesPromise`: from compileChampionPipelines, started earlier (e.g. while Pyodide boots)
  const pipelinesReady = pipelinesPromise ?? compileChampionPipelines(device, shaderUrl);
  pipelinesReady.catch(() => {});   // awaited below; avoid an unhandled rejection if loading fails first
  const config = JSON.parse(await fetchText(new URL("config.json", base)));
  const hp = parseConfig(config);
  maxContext = maxContext || hp.maxPositions;
  if (!(maxContext >= 1 && maxContext <= hp.maxPositions)) {
    throw new Error(`E_BAD_ARGUMENT: maxContext ${maxContext} outside [1, ${hp.maxPositions}]`);
  }
  if (!(maxBlock >= 1 && maxBlock <= 64)) throw new Error(`E_BAD_ARGUMENT: maxBlock ${maxBlock} outside [1, 64]`);
  const weightsUrl = new URL("model.q8.safetensors", base);
  const res = await fetch(weightsUrl);
  if (!res.ok) throw new Error(`E_MODEL_LOAD: GET ${weightsUrl} -> ${res.status}`);
  const fileBytes = await res.arrayBuffer();
  const t1 = performance.now();
  const { tensors } = parseSafetensors(fileBytes, weightsUrl.pathname);
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
    ({ bufs, steps, metas } = buildForward(device, hp, tensors, pipelines, { maxBlock, maxContext, label }));
  } finally {
    const oom = await device.popErrorScope();
    const invalid = await device.popErrorScope();
    if (oom) throw Object.assign(new Error(`E_OUT_OF_MEMORY: WebGPU: ${oom.message}`), { code: "E_OUT_OF_MEMORY" });
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
      const owned = new Set([...Object.values(bufs), metas, ...steps.flatMap((s) => s.tensorsOf)]);
      for (const b of owned) b.destroy();
      length = 0;
    },
  };
  return champion;
}

/** Upload every tensor, allocate activations and the KV cache, and build the dispatch list. */
function buildForward(device, hp, tensors, pipelines, { maxBlock, maxContext, label }) {
  const { vocab: V, hidden: H, inter: F, heads, kvHeads, headDim: hd, layers: L } = hp;
  const qkvDim = (heads + 2 * kvHeads) * hd, qDim = heads * hd, B = maxBlock;
  const bufs = {
    embed: storageBuffer(device, V * H * 4, expectTensor(tensors, "model.embed_tokens.weight", "F32", [V, H], label).bytes, "embed"),
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
    kCache: storageBuffer(device, L * maxContext * kvHeads * hd * 4, null, "k_cache"), // (L, ctx, KV, hd)
    vCache: storageBuffer(device, L * maxContext * kvHeads * hd * 4, null, "v_cache"),
  };
  const layerW = Array.from({ length: L }, (_, i) => uploadLayer(device, tensors, hp, i, label));

  // The dispatch list: [kernel, tensors, dims(n, startPos)], built once; forward() only
  // rewrites the Meta slab and re-encodes the same bind groups.
  const steps = [];
  const step = (op, tensorsOf, dims) => steps.push({ op, tensorsOf, dims });
  const mm = (w, xBuf, yBuf, accumulate) => step("matmul_q8", [w.w, w.s, xBuf, yBuf], (n) => ({ n, rows: w.rows, cols: w.cols, accumulate }));
  step("embed_gather", [bufs.embed, bufs.ids, bufs.x], (n) => ({ n, hidden: H, vocab: V }));
  layerW.forEach((w, layer) => {
    const attnDims = (n, startPos) => ({
      n, startPos, heads, kvHeads, headDim: hd, layerOffset: layer * maxContext * kvHeads * hd, scale: hd ** -0.5, maxContext,
    });
    step("rmsnorm_f32", [bufs.x, w.attnNorm, bufs.xn], (n) => ({ n, hidden: H, eps: hp.eps }));
    mm(w.qkv, bufs.xn, bufs.qkv, false);
    step("rope_qkv", [bufs.qkv, bufs.ropeTable, bufs.q, bufs.kCache, bufs.vCache], attnDims);
    step("attention_scores", [bufs.q, bufs.kCache, bufs.scores], attnDims);
    step("attention_softmax", [bufs.scores], attnDims);
    step("attention_values", [bufs.scores, bufs.vCache, bufs.att], attnDims);
    mm(w.o, bufs.att, bufs.x, true);                  // x += o_proj(att)
    step("rmsnorm_f32", [bufs.x, w.mlpNorm, bufs.xn], (n) => ({ n, hidden: H, eps: hp.eps }));
    mm(w.gateUp, bufs.xn, bufs.gateUp, false);
    step("swiglu_f32", [bufs.gateUp, bufs.act], (n) => ({ n, inter: F }));
    mm(w.down, bufs.act, bufs.x, true);               // x += down(act)
  });
  step("rmsnorm_f32", [bufs.x, bufs.finalNorm, bufs.xn], (n) => ({ n, hidden: H, eps: hp.eps }));
  step("lm_head_f32", [bufs.embed, bufs.xn, bufs.logits], (n) => ({ n, rows: V, cols: H }));

  const metas = metaBuffer(device, steps.length, "meta");
  for (const [slot, s] of steps.entries()) {
    s.pipeline = pipelines[s.op];
    s.groups = bindGroups(device, s.pipeline, s.tensorsOf, metas, slot);
  }
  return { bufs, steps, metas };
}

