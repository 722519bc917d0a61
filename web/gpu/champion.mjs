// Champion Llama forward on WebGPU: q8 or f32 linears, KV cache on the GPU, batch-invariant blocks.
import {
  bindGroups, createPipelines, metaBuffer, packMeta, readBuffer, storageBuffer, writeBytes, META_STRIDE,
} from "./device.mjs";
import { expectTensor, openSafetensorsStream } from "../formats/safetensors.mjs";
import { LoadTransient } from "../formats/streamed_file.mjs";
import { float32Slices, placeAll } from "../formats/streamed_placement.mjs";
import { gpuHyperParameters, readValidatedConfig, resolveMaxContext, ropeTable } from "../formats/model_config.mjs";
import { bindingLimit, formRowBytes, LINEAR_GROUPS, linearShapes, planChampion } from "./champion_plan.mjs";
import { compileQmatmulPipelines, QMATMUL_FORMATS, QOPS } from "./qmatmul.mjs";
import { streamedIdentity } from "../weight_cache.mjs";
import { modelLoadError } from "../formats/model_checks.mjs";

export const KERNELS = [
  "embed_gather", "rmsnorm_f32", "matmul_q8", "rope_qkv", "attention_scores",
  "attention_softmax", "attention_values", "swiglu_f32", "matmul_f32", "embed_gather_q8", "bias_add_f32",
];
/** The matmul option -> the function's name and version as reported (docs/quant_kernels.md): "f32"
 *  (the float kernels on int8 or float32 weights: the default) or "q8act" (q8 and GGUF Q8_0 / Q4_0 /
 *  Q4_1 linears on the q8act-v1 kernels, docs/gpu.md "Weights in their blocks"). */
export const MATMUL_FUNCTIONS = { f32: "f32", q8act: "q8act-v1" };
const cdiv = (a, b) => Math.ceil(a / b);
const u = (v) => [v, "u32"];
const isBlockForm = (form) => Object.hasOwn(QMATMUL_FORMATS, form) && form !== "ROWQ8";

/** Meta fields and dispatch grid of each kernel, from its dims: the one place both the forward
 *  and the test harness compute them. `matmul_q8`/`matmul_f32` dims: {n, rows: out, cols: in},
 *  `accumulate` (add into y, the residual stream), and for one piece of a tensor split
 *  by rows `row0` (its first output row) and `stride` (outputs per y row; default rows).
 *  `embed_gather(_q8)`: {n, hidden, vocab: rows of this piece, row0}. */
const gather = (d) => ({ meta: [u(d.n), u(d.hidden), u(d.vocab), u(d.row0 ?? 0)], grid: [cdiv(d.hidden, 64), d.n, 1] });
const matmul = (d) => ({
  meta: [u(d.n), u(d.rows), u(d.cols / 4), u(d.accumulate ? 1 : 0), u(d.stride ?? d.rows), u(d.row0 ?? 0)],
  grid: [cdiv(d.rows, 256), 1, 1],
});
export const OPS = {
  embed_gather: gather,
  embed_gather_q8: gather,
  rmsnorm_f32: (d) => ({ meta: [u(d.n), u(d.hidden), [d.eps, "f32"]], grid: [d.n, 1, 1] }),
  matmul_q8: matmul,
  matmul_f32: matmul,
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
  quantize_act: QOPS.quantize_act,        // matmul "q8act" only (web/gpu/qmatmul.mjs)
  qmatmul: QOPS.qmatmul,
  embed_gather_blocks: QOPS.embed_gather_blocks,
};

/** Compile the champion's pipelines (no model needed: the kernels take their shapes at run time). */
export function compileChampionPipelines(device, shaderUrl = null) {
  return createPipelines(device, shaderUrl ?? new URL("../../shaders/", import.meta.url), KERNELS);
}

/** Stored form of one weight in a tensor map: "q8" (`<name>.q8` int8 + `<name>.scale`), "f32"
 *  (`<name>` F32, under its Hugging Face name), or with matmul "q8act" a GGUF block form ("Q8_0",
 *  "Q4_0", "Q4_1": `<name>` in its blocks, as ggufTensorMap(..., {blocks: true}) gives). A block
 *  entry of another type (Q4_K, Q6_K: no WGSL kernel yet) or under matmul "f32" is "f32": its
 *  float32() entry (the exact dequantisation) is uploaded. */
function formOf(tensors, name, where, matmul = "f32") {
  const q8 = tensors.has(`${name}.q8`), f32 = tensors.has(name);
  if (q8 && f32) throw modelLoadError(`${where}: tensor ${name} is stored twice (F32 and ${name}.q8)`);
  if (!q8 && !f32) throw modelLoadError(`${where}: missing tensor ${name} (F32, or ${name}.q8 + ${name}.scale)`);
  if (q8) return "q8";
  const dtype = tensors.get(name).dtype;
  return matmul === "q8act" && isBlockForm(dtype) ? dtype : "f32";
}

/** A block-form tensor's raw bytes (rows of cols / 32 blocks), checked against its shape. */
function blockBytes(tensors, name, form, rows, cols, where) {
  const t = tensors.get(name);
  const want = rows * formRowBytes(form, cols);
  if (!(t.dtype === form && Array.isArray(t.shape) && t.shape.length === 2 && t.shape[0] === rows && t.shape[1] === cols)) {
    throw modelLoadError(`${where}: tensor ${name} is ${t.dtype} ${JSON.stringify(t.shape)}, expected ${form} [${rows}, ${cols}]`);
  }
  const bytes = t.bytes;
  if (!(bytes instanceof Uint8Array) || bytes.byteLength !== want) {
    throw modelLoadError(`${where}: tensor ${name} holds ${bytes?.byteLength} bytes, ${rows} rows of ${form} need ${want}`);
  }
  return bytes;
}

/** [HF name, rows] of the parts of each fused linear of layer i (q|k|v and gate|up stacked by rows). */
function linearParts(hp, i) {
  const p = `model.layers.${i}.`, qDim = hp.heads * hp.headDim, kvDim = hp.kvHeads * hp.headDim;
  return {
    qkv: [[`${p}self_attn.q_proj.weight`, qDim], [`${p}self_attn.k_proj.weight`, kvDim], [`${p}self_attn.v_proj.weight`, kvDim]],
    o: [[`${p}self_attn.o_proj.weight`, hp.hidden]],
    gateUp: [[`${p}mlp.gate_proj.weight`, hp.inter], [`${p}mlp.up_proj.weight`, hp.inter]],
    down: [[`${p}mlp.down_proj.weight`, hp.hidden]],
  };
}

/** The stored forms planChampion sizes: embed "f32" | "q8" | a block form; head "tied" | "f32" | "q8" | a block
 *  form; per layer each fused linear the form all its parts share ("q8", or with matmul "q8act" a
 *  block form), else "f32" (the other parts dequantised at upload). Under "q8act" an embedding in
 *  blocks stays in them (gathered by embed_gather_<fmt>; tied, the head multiplies them). */
function tensorForms(tensors, hp, where, matmul) {
  const layers = Array.from({ length: hp.layers }, (_, i) => Object.fromEntries(Object.entries(linearParts(hp, i)).map(
    ([group, parts]) => {
      const fs = parts.map(([name]) => formOf(tensors, name, where, matmul));
      return [group, fs.every((f) => f === fs[0]) ? fs[0] : "f32"];
    })));
  const embed = formOf(tensors, "model.embed_tokens.weight", where, matmul);
  const forms = { embed, head: hp.tied ? "tied" : formOf(tensors, "lm_head.weight", where, matmul), layers };
  if (matmul === "q8act") {        // q8act-v1 quantises its input in blocks of 32 (docs/quant_kernels.md)
    const shapes = linearShapes(hp);
    const inputs = [["the LM head", hp.tied ? embed : forms.head, hp.hidden], ["the embedding", embed, hp.hidden],
      ...layers.flatMap((f, i) => LINEAR_GROUPS.map((g) => [`layer ${i} ${g}`, f[g], shapes[g][1]]))];
    for (const [what, form, cols] of inputs) {
      if (form !== "f32" && cols % 32 !== 0) {
        throw modelLoadError(`${where}: ${what} has ${cols} input columns, not a multiple of 32: matmul "q8act" cannot run it`);
      }
    }
  }
  return forms;
}

/** (rows, cols) int8 + per-row scale as float32 bytes of q8 * scale: one float32 rounding of an
 *  exact product, the values the reference's dequantisation gives (a q8 part of an f32 upload). */
function dequantisedQ8(q8, scale, rows, cols) {
  const q = new Int8Array(q8.buffer, q8.byteOffset, rows * cols);
  const s = new Float32Array(scale.slice().buffer);        // copied: the view may be unaligned
  const out = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let i = 0, at = r * cols; i < cols; i++, at++) out[at] = q[at] * s[r];
  }
  return new Uint8Array(out.buffer);
}

/** Buffers for a (rows, cols) tensor made of row-stacked parts [[name, rows]] in `form` (q8: int8
 *  weights + one scale buffer; f32: float32 weights, q8 and block parts dequantised; a block form:
 *  the raw blocks, 4 bytes of padding for the kernels' word reads) in pieces of rows ({row0,
 *  rows}), each its own buffers; each piece says its `form`. The bytes are written by the writes
 *  this pushes (streamed_placement.mjs: [needs, write(tensors)]), one per part (and its scales). */
function uploadPieces(device, tensors, parts, cols, form, pieces, where, writes, put) {
  const rowBytes = formRowBytes(form, cols), pad = isBlockForm(form) ? 4 : 0;
  const stride = parts.reduce((n, [, rows]) => n + rows, 0);
  const out = pieces.map(({ row0, rows }) => {
    const piece = { form, row0, rows, cols, stride, w: storageBuffer(device, rows * rowBytes + pad, null, `${parts[0][0]}[${row0}:]`) };
    if (form === "q8") piece.s = storageBuffer(device, rows * 4, null, `${parts[0][0]}.scale[${row0}:]`);
    return piece;
  });
  // rows [src0, src0 + n) of one part (its bytes `data`, `unit` bytes a row) into every piece they overlap
  const writeRows = (key, src0, n, data, unit) => put.whole(data, () => {
    for (const piece of out) {
      const a = Math.max(piece.row0, src0), b = Math.min(piece.row0 + piece.rows, src0 + n);
      if (a < b) put(piece[key], (a - piece.row0) * unit, data.subarray((a - src0) * unit, (b - src0) * unit));
    }
  });
  let at = 0;
  for (const [name, rows] of parts) {
    const row0 = at;
    at += rows;
    const q8 = `${name}.q8`, scale = `${name}.scale`;
    const w = (t) => expectTensor(t, q8, "I8", [rows, cols], where).bytes, s = (t) => expectTensor(t, scale, "F32", [rows], where).bytes;
    if (tensors.has(q8) && form === "f32") {       // a q8 part of a float32 upload: needs its scales too
      writes.push([[q8, scale], (t) => writeRows("w", row0, rows, dequantisedQ8(w(t), s(t), rows, cols), rowBytes)]);
    } else if (tensors.has(q8)) {
      writes.push([[q8], (t) => writeRows("w", row0, rows, w(t), rowBytes)]);
      writes.push([[scale], (t) => writeRows("s", row0, rows, s(t), 4)]);
    } else if (isBlockForm(form)) {
      writes.push([[name], (t) => writeRows("w", row0, rows, blockBytes(t, name, form, rows, cols, where), rowBytes)]);
    } else {
      writes.push([[name], (t) => {     // float32: a converted tensor a slice at a time
        for (const [a, b, bytes] of float32Slices(t, name, [rows, cols], where)) writeRows("w", row0 + a, b - a, bytes, rowBytes);
      }]);
    }
  }
  return out;
}

/** A buffer of n float32 values written from tensor `name` (a norm, a bias) by a write it pushes. */
function uploadF32(device, name, n, where, writes, put, buffer = null, offset = 0) {
  const buf = buffer ?? storageBuffer(device, n * 4, null, name);
  writes.push([[name], (t) => put(buf, offset, expectTensor(t, name, "F32", [n], where).bytes)]);
  return buf;
}

/** Upload the linears of layer i in their planned forms, fusing q|k|v and gate|up row-wise (same
 *  dot products), plus its norms and Qwen2's q/k/v biases (fused like q|k|v). */
function uploadLayer(device, tensors, hp, i, forms, pieces, where, writes, put) {
  const p = `model.layers.${i}.`, H = hp.hidden;
  const parts = linearParts(hp, i);
  const f32 = (name, n) => uploadF32(device, p + name, n, where, writes, put);
  let qkvBias = null;
  if (hp.qkvBias) {                  // q|k|v biases into one buffer, each at its rows
    qkvBias = storageBuffer(device, parts.qkv.reduce((sum, [, r]) => sum + r, 0) * 4, null, `${p}qkv.bias`);
    let at = 0;
    for (const [name, r] of parts.qkv) {
      uploadF32(device, name.replace(/\.weight$/, ".bias"), r, where, writes, put, qkvBias, at);
      at += r * 4;
    }
  }
  const shapes = linearShapes(hp);
  const linears = Object.fromEntries(LINEAR_GROUPS.map(
    (g) => [g, uploadPieces(device, tensors, parts[g], shapes[g][1], forms[g], pieces[g], where, writes, put)]));
  return {
    attnNorm: f32("input_layernorm.weight", H), mlpNorm: f32("post_attention_layernorm.weight", H), qkvBias, ...linears,
  };
}

/** What both entry points check before any weight is touched: the validated config's
 *  hyper-parameters, the resolved maxContext, maxBlock, and the plan options at this device's
 *  binding limit. */
function loadSetup(device, config, { maxBlock, maxContext, maxBindingBytes, memoryBudgetBytes, matmul }) {
  if (!Object.hasOwn(MATMUL_FUNCTIONS, matmul)) {
    throw new Error(`E_BAD_ARGUMENT: matmul ${JSON.stringify(matmul)} is not one of ${Object.keys(MATMUL_FUNCTIONS).join(", ")}`);
  }
  const hp = gpuHyperParameters(config);
  maxContext = resolveMaxContext(hp, maxContext);
  if (!(maxBlock >= 1 && maxBlock <= 64)) throw new Error(`E_BAD_ARGUMENT: maxBlock ${maxBlock} outside [1, 64]`);
  const planOptions = { maxBlock, maxContext, limit: bindingLimit(device.limits), q8act: matmul === "q8act",
                        weightLimit: bindingLimit(device.limits, maxBindingBytes), budgetBytes: memoryBudgetBytes };
  return { hp, maxContext, planOptions, matmul };
}

/** Refuse, before any weight is fetched, a champion whose plan cannot fit (E_OUT_OF_MEMORY saying
 *  which maxContext would, or that the weights alone do not): `forms` the weights' forms as they
 *  will be uploaded (planChampion's), or the smallest they could take. */
export function refuseUnfit(device, config, { maxBlock = 9, maxContext = 0, memoryBudgetBytes = 0, matmul = "f32", forms }) {
  const setup = loadSetup(device, config, { maxBlock, maxContext, maxBindingBytes: 0, memoryBudgetBytes, matmul });
  planChampion(setup.hp, forms(setup.hp), setup.planOptions);
}

/** The pipelines: `pipelinesPromise` (from compileChampionPipelines, started earlier, e.g. while
 *  Pyodide boots) or compiled now; they compile (slow on SwiftShader) while the weights arrive. */
function pipelinesFor(device, shaderUrl, pipelinesPromise) {
  const ready = pipelinesPromise ?? compileChampionPipelines(device, shaderUrl);
  ready.catch(() => {});   // awaited later; avoid an unhandled rejection if loading fails first
  return ready;
}

/** Load model.q8.safetensors from modelUrl and build every buffer and pipeline. config: the
 *  validated config (web/formats/model_config.mjs: the engine's model check hands over Pyodide's;
 *  absent, the folder's config.json is read through the validator's JS port). maxContext: KV positions (default min(max_position_embeddings, 4096)); maxBindingBytes: a
 *  smaller split threshold for the weights than the device's (tests); memoryBudgetBytes: refuse a
 *  plan above it (E_OUT_OF_MEMORY saying which maxContext would fit). matmul: "f32" (default) or
 *  "q8act" (MATMUL_FUNCTIONS; dot4: that path's integer dot, default where WGSL has dot4I8Packed). */
export async function createChampion({ device, modelUrl, config = null, maxBlock = 9, maxContext = 0, shaderUrl = null, pipelinesPromise = null,
                                       maxBindingBytes = 0, memoryBudgetBytes = 0, matmul = "f32", dot4 = undefined }) {
  const base = new URL(modelUrl.endsWith("/") ? modelUrl : modelUrl + "/", location.href);
  const t0 = performance.now();
  const pipelinesReady = pipelinesFor(device, shaderUrl, pipelinesPromise);
  config ??= await readValidatedConfig(new URL("config.json", base).href, fetch);
  const setup = loadSetup(device, config, { maxBlock, maxContext, maxBindingBytes, memoryBudgetBytes, matmul });
  // refuse before the download what cannot fit even in the smallest forms (every weight q8)
  planChampion(setup.hp, { embed: "q8", head: setup.hp.tied ? "tied" : "q8" }, setup.planOptions);
  const weightsUrl = new URL("model.q8.safetensors", base);
  // streamed (streamed_file.mjs): the header checked before the data, each tensor written to its
  // buffers as it arrives; the sha256 of model.q8.safetensors, hashed as it comes, is the identity
  // LlamaReference.from_dir(dir, weights="q8") reports
  const { file, tensors, end, size, response } = await openSafetensorsStream(fetch, weightsUrl.href, weightsUrl.pathname, new LoadTransient());
  const t1 = performance.now();
  try {
    return await buildChampion(device, {
      config, setup, tensors, identity: null, artifactBytes: size, where: `safetensors file ${weightsUrl.pathname}`,
      pipelinesReady, times: { t0, t1, t2: t1 }, shaderUrl, dot4, stream: { file, end, drain: false, size, response },
    });
  } catch (err) {
    file.cancel();
    throw err;
  }
}

/** The same champion from a tensor map that did not come from model.q8.safetensors (a GGUF file's
 *  weights, dequantised exactly to F32): `config` the validated config, `tensors` a
 *  Map(name -> {dtype, shape, bytes}) as parseSafetensors gives, any linear, the embedding and the
 *  head either F32 `<name>` or `<name>.q8` + `<name>.scale`; `identity` the sha256 hex of the file
 *  the weights came from; `label` names it in refusals; `artifactBytes` its size (default: the
 *  tensors' bytes). Other options as createChampion; with matmul "q8act" a tensor may also come in its
 *  GGUF blocks (ggufTensorMap's {blocks: true} entries: Q8_0 / Q4_0 / Q4_1 run on their kernels).
 *  stream: {file (a StreamedFile past its header), end, drain, size, response}: the map's entries
 *  read from the file's staging buffer (ggufHeaderTensorMap over openGgufStream), each tensor
 *  written as it arrives; the identity is then the file's sha256 as hashed (identity: null). */
export async function createChampionFromTensors({ device, config, tensors, identity, label, artifactBytes = 0, maxBlock = 9,
                                                  maxContext = 0, shaderUrl = null, pipelinesPromise = null,
                                                  maxBindingBytes = 0, memoryBudgetBytes = 0, matmul = "f32", dot4 = undefined,
                                                  stream = null }) {
  if (!(tensors instanceof Map)) throw new Error("E_BAD_ARGUMENT: tensors must be a Map(name -> {dtype, shape, bytes})");
  if (!stream && !(typeof identity === "string" && /^[0-9a-f]{64}$/.test(identity))) {
    throw new Error("E_BAD_ARGUMENT: identity must be the sha256 of the weights' file, 64 lowercase hex digits");
  }
  if (!(typeof label === "string" && label !== "")) throw new Error("E_BAD_ARGUMENT: label must name the weights' source");
  const t0 = performance.now();
  const pipelinesReady = pipelinesFor(device, shaderUrl, pipelinesPromise);
  const setup = loadSetup(device, config, { maxBlock, maxContext, maxBindingBytes, memoryBudgetBytes, matmul });
  const bytes = artifactBytes || (stream ? 0 : [...tensors.values()].reduce((sum, t) => sum + t.bytes.byteLength, 0));
  return buildChampion(device, {
    config, setup, tensors, identity, artifactBytes: bytes, where: label, pipelinesReady, times: { t0, t1: t0, t2: t0 }, shaderUrl, dot4, stream,
  });
}

/** Plan, upload and wire a champion from a parsed tensor map (both entry points). */
async function buildChampion(device, { config, setup, tensors, identity, artifactBytes, where, pipelinesReady, times, shaderUrl, dot4,
                                        stream = null }) {
  const { hp, maxContext, planOptions, matmul } = setup;
  const { t0, t1, t2 } = times;
  const forms = tensorForms(tensors, hp, where, matmul);
  const plan = planChampion(hp, forms, planOptions);
  const q8act = matmul === "q8act" ? await compileQmatmulPipelines(device, { dot4, shaderUrl }) : null;
  const pipelines = { ...(await pipelinesReady), ...(q8act ? { q8act: q8act.pipelines } : {}) };
  const t3 = performance.now();
  const maxBlock = planOptions.maxBlock;
  device.pushErrorScope("validation");
  device.pushErrorScope("out-of-memory");
  let bufs, steps, metas, writes;
  // a weight write; a streamed load counts what it writes from beside the staged bytes (a dequantised copy)
  const transient = stream?.file.transient ?? null;
  const put = (buffer, offset, bytes) => put.whole(bytes, () => writeBytes(device, buffer, offset, bytes));
  let inWhole = false;
  put.whole = (bytes, fn) => {         // fn writes from `bytes` (once counted, however many writes)
    const copy = transient && !inWhole && bytes.buffer !== stream.file.stagingBuffer ? bytes.byteLength : 0;
    transient?.holdCopy(copy);
    const outer = inWhole;
    inWhole = true;
    try { fn(); } finally { inWhole = outer; transient?.release(copy); }
  };
  try {
    ({ bufs, steps, metas, writes } = buildForward(device, hp, tensors, pipelines, { maxBlock, maxContext, where, forms, plan, put }));
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
  // the weights' bytes: as the streamed file's tensors arrive (in file order), or from the map in memory
  device.pushErrorScope("validation");
  try {
    await placeAll(writes, tensors, stream?.file ?? null);
    if (stream) {
      const hex = await stream.file.finish(stream.end, { drain: stream.drain, size: stream.size });
      identity = await streamedIdentity(stream.response, hex);
      artifactBytes = stream.size ?? stream.file.received;
    }
  } catch (err) {
    for (const b of new Set([...Object.values(bufs).flat(), metas, ...steps.flatMap((s) => s.tensorsOf)])) b.destroy();
    await device.popErrorScope();
    throw err;
  }
  const invalidWrite = await device.popErrorScope();
  if (invalidWrite) throw new Error(`E_MODEL_LOAD: WebGPU: ${invalidWrite.message}`);
  const loadMs = {   // fetch: the weights (and config.json when no config was given); hash: parse + sha256; pipelines: wait after that
    fetch: t1 - t0, hash: t2 - t1, pipelines: t3 - t2, upload: performance.now() - t3, total: performance.now() - t0,
  };
  const metaWords = new ArrayBuffer(steps.length * META_STRIDE);
  const { vocab: V } = hp, B = maxBlock;
  let length = 0;   // positions [0, length) hold valid K/V
  let variant = null;   // the batch-variance fault (setBatchVariantFault), or null
  const champion = {
    config, identity, artifactBytes, loadMs, vocabSize: V, maxBlock: B, maxContext, hp, pipelines, buffers: bufs,
    transient,                                                // a streamed load's LoadTransient, else null
    matmulFunction: MATMUL_FUNCTIONS[matmul],                 // "f32" | "q8act-v1": part of the champion's identity
    dot4: q8act ? q8act.dot4 : null,                          // q8act: the integer path (dot4I8Packed or unpacking)
    logitsBuffer: bufs.logits,
    memoryPlan: plan.bytes,                                   // bytes: weights, kvCache, activations, total
    pieces: Object.fromEntries(Object.entries(plan.pieces).map(([k, v]) => [k, v && v.length])),   // buffers per tensor (linears: the most over layers)
    forms,                                                    // stored form of each weight (tensorForms)
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
      if (variant && n > 1) {         // fault: a block's last row gets one logit's lowest bit flipped
        writeBytes(device, variant.at, 0, Uint32Array.of((n - 1) * V + (n * 7919 + 17) % V));
        pass.setPipeline(variant.pipeline);
        pass.setBindGroup(0, variant.group);
        pass.dispatchWorkgroups(1);
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
    /** Fault injection (tests, web/orchestrator/batch_check.mjs): from now on every forward of a
     *  block of n > 1 flips the lowest mantissa bit of one logit of its last row, (n * 7919 + 17) % V,
     *  in one more dispatch after the LM head: the block path is then batch-variant, as a kernel whose
     *  sums depended on the block size would be. */
    setBatchVariantFault() {
      if (variant) return;
      const module = device.createShaderModule({ label: "batch_variant_fault", code: `
        @group(0) @binding(0) var<storage, read_write> logits: array<u32>;
        @group(0) @binding(1) var<uniform> at: vec4<u32>;
        @compute @workgroup_size(1) fn main() { logits[at.x] = logits[at.x] ^ 1u; }` });
      const pipeline = device.createComputePipeline({ label: "batch_variant_fault", layout: "auto", compute: { module, entryPoint: "main" } });
      const at = device.createBuffer({ label: "batch_variant_fault.at", size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      const group = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0),
        entries: [{ binding: 0, resource: { buffer: bufs.logits } }, { binding: 1, resource: { buffer: at } }] });
      variant = { pipeline, at, group };
    },
    /** Free every buffer this champion made (weights, activations, KV cache, metas). */
    destroy() {
      const owned = new Set([...Object.values(bufs).flat(), metas, ...steps.flatMap((s) => s.tensorsOf), ...(variant ? [variant.at] : [])]);
      for (const b of owned) b.destroy();
      length = 0;
    },
  };
  return champion;
}

/** Allocate every weight buffer (its bytes written by the writes this returns), the activations
 *  and the KV cache (one K and one V buffer per layer), and build the dispatch list. A tensor split
 *  into row pieces is one dispatch per piece. put(buffer, offset, bytes): a weight write. */
function buildForward(device, hp, tensors, pipelines, { maxBlock, maxContext, where, forms, plan, put }) {
  const { vocab: V, hidden: H, inter: F, heads, kvHeads, headDim: hd, layers: L } = hp;
  const qkvDim = (heads + 2 * kvHeads) * hd, qDim = heads * hd, B = maxBlock;
  const writes = [];
  const embed = uploadPieces(device, tensors, [["model.embed_tokens.weight", V]], H, forms.embed, plan.pieces.embed, where, writes, put);
  const head = hp.tied ? embed : uploadPieces(device, tensors, [["lm_head.weight", V]], H, forms.head, plan.pieces.head, where, writes, put);
  const kvBytes = maxContext * kvHeads * hd * 4;
  const maxIn = Math.max(H, qDim, F);
  const bufs = {
    finalNorm: uploadF32(device, "model.norm.weight", H, where, writes, put),
    ropeTable: storageBuffer(device, maxContext * hd * 4, ropeTable(hp.config, maxContext), "rope"),
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
    ...(pipelines.q8act ? {
      qx: storageBuffer(device, B * maxIn, null, "qx"),                 // (B, in) int8: the input of the q8act matmul
      xb: storageBuffer(device, B * (maxIn / 32) * 8, null, "xb"),      // (B, in / 32) (dx, xsum)
    } : {}),
    kCache: Array.from({ length: L }, (_, l) => storageBuffer(device, kvBytes, null, `k_cache.${l}`)),   // L x (ctx, KV, hd)
    vCache: Array.from({ length: L }, (_, l) => storageBuffer(device, kvBytes, null, `v_cache.${l}`)),
  };
  const layerW = Array.from({ length: L }, (_, i) => uploadLayer(device, tensors, hp, i, forms.layers[i], plan.layerPieces[i], where, writes, put));

  // The dispatch list: [kernel, tensors, dims(n, startPos)], built once; forward() only
  // rewrites the Meta slab and re-encodes the same bind groups.
  const steps = [];
  const step = (op, tensorsOf, dims, pipeline = pipelines[op]) => steps.push({ op, tensorsOf, dims, pipeline });
  const mm = (pieces, xBuf, yBuf, accumulate) => {
    // matmul "q8act": the q8 and block linears quantise their input once (quantize_act), then one qmatmul a piece
    const q8act = pipelines.q8act && pieces[0].form !== "f32";
    if (q8act) step("quantize_act", [xBuf, bufs.qx, bufs.xb], (n) => ({ n, cols: pieces[0].cols }), pipelines.q8act.quantize_act);
    for (const w of pieces) {
      const dims = (n) => ({ n, rows: w.rows, cols: w.cols, accumulate, row0: w.row0, stride: w.stride });
      if (q8act && w.s) step("qmatmul", [w.w, w.s, bufs.qx, bufs.xb, yBuf], dims, pipelines.q8act.ROWQ8);
      else if (q8act) step("qmatmul", [w.w, bufs.qx, bufs.xb, yBuf], dims, pipelines.q8act[w.form]);
      else if (w.s) step("matmul_q8", [w.w, w.s, xBuf, yBuf], dims);
      else step("matmul_f32", [w.w, xBuf, yBuf], dims);
    }
  };
  for (const e of embed) {
    const dims = (n) => ({ n, hidden: H, vocab: e.rows, row0: e.row0 });
    if (isBlockForm(e.form)) step("embed_gather_blocks", [e.w, bufs.ids, bufs.x], dims, pipelines.q8act.gather[e.form]);
    else if (e.s) step("embed_gather_q8", [e.w, e.s, bufs.ids, bufs.x], dims);
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
    s.groups = bindGroups(device, s.pipeline, s.tensorsOf, metas, slot);
  }
  return { bufs, steps, metas, writes };
}
