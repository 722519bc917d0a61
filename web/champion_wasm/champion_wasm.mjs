// champion_wasm.mjs — JS side of the WASM-SIMD champion (wasm/champion.c): loads config.json +
// model.q8.safetensors, or a tensor map (a GGUF's, web/gguf/gguf_tensors.mjs), into the module's memory
// with each linear in the format its matmul reads (docs/champion_wasm.md "Weight formats"): the
// q8act-v1 function (docs/quant_kernels.md) on the q8 artifact's int8 rows + row scales and on a
// GGUF's Q8_0/Q4_0/Q4_1/Q4_K/Q6_K blocks, written as they are in the file; or the float function
// (matmul "f32": q8 linears kept int8 or widened to exact float32; a float32 linear `<name>` with no
// scale runs as float32 rows times a scale of exactly 1.0). It runs the
// batch-invariant forward over a block and decides the round on the CPU with the semantics of
// exactspec.core.acceptance.decide_round (docs/champion_wasm.md). Works in a page, a module worker and
// Node (pass bytes instead of URLs there).
//
//   const champion = await createWasmChampion({ wasmUrl, modelUrl, maxBlock: 9 });
//   await champion.forward(Int32Array.of(...ids), startPos);   // logits rows 0..n-1 kept in WASM
//   await champion.decide({ nRows, proposals, pDraft, contextIds, policy, seed, roundId,
//                           stopTokenIds, remaining, greedy, rowOffset = 0, rowMasks = null })
//     -> Int32Array: the round record's decision words (protocol.json round_record, words 0..7;
//        web/protocol.mjs roundRecordLayout decodes them); decided on logits rows rowOffset ..
//        rowOffset + nRows - 1, row i masked by rowMasks' row i (Uint32Array nRows * ceil(V / 32))
// With a draft loaded into the same instance (createWasmChampion({..., draft})), a whole round is one
// call: champion.beginNow({...}) once a request, then champion.roundNow({...}) -> the whole record
// (web/champion_wasm/cpu_session.mjs).
import { readValidatedConfig, wasmKernelConfig } from "../formats/model_config.mjs";
import { checkedPolicy } from "../sampling_policy.mjs";
import { expectTensor, openSafetensorsStream, parseSafetensors } from "../formats/safetensors.mjs";
import { codedError, errorPayload } from "../protocol.mjs";
import { artifactIdentity, streamedIdentity } from "../weight_cache.mjs";
import { BLOCK_TYPE_IDS, ggufHeaderTensorMap, openGgufStream } from "../gguf/gguf_tensors.mjs";
import { LoadTransient, StreamedFile } from "../formats/streamed_file.mjs";
import { float32Slices, placeAll } from "../formats/streamed_placement.mjs";
import { ggufLabel } from "../gguf/gguf_reader.mjs";
import { cpuImports, isThreadedModule, statusError } from "./cpu_module.mjs";
import { CpuSession } from "./cpu_session.mjs";
import { moduleUrl, relaxedDotWorks } from "./cpu_simd.mjs";
import { createDraft } from "../draft/draft.mjs";

const MAX_BLOCK_LIMIT = 64;
// weight formats of champion_set_format (wasm/qmatmul.h): the float function's F32 and I8F, the
// q8act function's ROWQ8 (the q8 artifact) and the GGUF block types under their GGUF type ids
export const FMT = { F32: 0, ROWQ8: 100, I8F: 101 };
export const MATMULS = ["auto", "q8act", "f32"];
export const SIMDS = ["auto", "simd128", "relaxed"];
export const Q8ACT_FUNCTION = "q8act-v1";     // docs/quant_kernels.md: the function's name and version
const Q8ACT_BLOCK = 32;                      // activations are quantised per 32 inputs
// "auto" widens the q8 linears to f32 at load while that copy is at most this many bytes, and keeps
// them int8 beyond (a 1.5B champion, 6 GB widened, fits wasm32's 4 GiB only as int8). Measured
// (tools/bench/wasm_champion.py --storage both): widening in registers costs more than the bytes
// it saves on this machine, even at real widths (docs/champion_wasm.md), so f32 wherever it fits.
export const F32_WEIGHTS_LIMIT = 1536 * 1024 * 1024;
const MAX_THREADS = 16;                        // MAX_THREADS of wasm/champion.c
const HELPER_STACK_BYTES = 256 * 1024;
const POOL_START_MS = 20_000;
const DECISION_WORDS = 8;                      // REC_DECISION_WORDS (protocol.json round_record)

// tensor kinds of champion_tensor_ptr (wasm/champion.c); [suffix, q8 kind, scale kind, shape]
const T = { embed: 0, final_norm: 1, lm_head: 2, s_lm_head: 3, s_embed: 4, attn_norm: 10, mlp_norm: 11,
  bias: { q_proj: 32, k_proj: 33, v_proj: 34 } };
const LAYER_LINEARS = [
  ["self_attn.q_proj.weight", 12, 22, (c) => [c.num_heads * c.head_dim, c.hidden_size]],
  ["self_attn.k_proj.weight", 13, 23, (c) => [c.num_kv_heads * c.head_dim, c.hidden_size]],
  ["self_attn.v_proj.weight", 14, 24, (c) => [c.num_kv_heads * c.head_dim, c.hidden_size]],
  ["self_attn.o_proj.weight", 15, 25, (c) => [c.hidden_size, c.num_heads * c.head_dim]],
  ["mlp.gate_proj.weight", 16, 26, (c) => [c.intermediate_size, c.hidden_size]],
  ["mlp.up_proj.weight", 17, 27, (c) => [c.intermediate_size, c.hidden_size]],
  ["mlp.down_proj.weight", 18, 28, (c) => [c.hidden_size, c.intermediate_size]],
];

const badArgument = (message) => codedError("E_BAD_ARGUMENT", message);
const isUint = (v, limit) => Number.isInteger(v) && v >= 0 && v < limit;

/** An error thrown by a shared reader (message "E_CODE: ...") as a coded error. */
function asCoded(err, fallback) {
  if (err.code) return err;
  const { code, message } = errorPayload(err, fallback);
  return codedError(code, message);
}

function check(status, what) {
  if (status !== 0) throw statusError(status, `champion ${what}`);
}

async function fetchBytes(fetchFn, url) {
  let response;
  try {
    response = await fetchFn(url);
  } catch (err) {
    throw codedError("E_MODEL_LOAD", `cannot fetch ${url}: ${err.message}`);
  }
  if (!response.ok) throw codedError("E_MODEL_LOAD", `cannot fetch ${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

/**
 * createWasmChampion({wasmUrl, modelUrl, configJson}) in the browser, or
 * createWasmChampion({wasmBytes, configJson, weightsBytes}) anywhere (Node tests), or
 * createWasmChampion({wasmUrl | wasmBytes, configJson, tensors, identity}) for a tensor map whose
 * identity the caller computed, or createWasmChampion({wasmUrl, ggufUrl, configJson}): a GGUF file
 * (configJson: its config as the model check mapped and validated it), identity the file's sha256.
 * configJson: the validated config (an object, web/formats/model_config.mjs), as the engine's model
 * check hands it over; absent (a model folder only), its config.json is read through the
 * validator's JS port (callers outside the engine).
 * A tensor map may hold any linear as float32 `<name>` instead of `<name>.q8` + `<name>.scale`
 * (weight storage f32 then: "int8" is refused).
 * maxBlock: largest block (k + 1); maxContext: 0 = max_position_embeddings; threads: 1 (cpu.wasm)
 * or 2..16 (cpu_mt.wasm, by default wasmUrl with cpu.wasm -> cpu_mt.wasm; needs
 * SharedArrayBuffer, i.e. a cross-origin isolated page or Node). Results
 * are bitwise the same for any thread count. draft: createDraft's arguments (modelUrl, or
 * configJson + weightsBytes): the draft loaded into this same instance (champion.draft), which
 * beginNow / roundNow need for draft rounds (cpu_session.mjs).
 * matmul: the function of the quantised linears (docs/champion_wasm.md "Weight formats"):
 * "q8act" (docs/quant_kernels.md's q8act-v1: the q8 artifact's int8 rows + row scales and a GGUF's
 * block tensors held in their blocks, activations quantised per 32, int32 sums; a linear whose input
 * width is not a multiple of 32 is refused with E_MODEL_LOAD), "f32" (the float function: q8 values
 * as exact float32 times the row scale; a GGUF's blocks dequantised to float32 at load), or "auto":
 * q8act where every quantised linear allows it, else f32, and f32 when weightStorage is given.
 * champion.matmulFunction says which ran ("q8act-v1" or "f32"), champion.weightBytes the weight
 * bytes held in WASM memory.
 * weightStorage (the f32 function only): how the q8 linears are held in WASM memory, "int8" or "f32"
 * (widened at load), or "auto": f32 while the widened copy stays within F32_WEIGHTS_LIMIT, int8
 * beyond (what lets a 1.5B champion fit). Bitwise the same results either way.
 * simd (a module loaded from wasmUrl): "relaxed" loads the relaxed-SIMD build (cpu_relaxed.wasm,
 * cpu_mt_relaxed.wasm: the Q4 formats' dot products, the same bits), "simd128" the plain one, "auto"
 * the relaxed one where this engine's relaxed dot product gives the spec's sums (cpu_simd.mjs's
 * probe) and the file can be fetched. champion.simd says which runs ("relaxed" | "simd128").
 */
export async function createWasmChampion({ wasmUrl, modelUrl, wasmBytes, weightsBytes, configJson, fetchFn,
                                           tensors = null, identity = null, ggufUrl = null,
                                           maxBlock = 9, maxContext = 0, threads = 1, wasmThreadsUrl,
                                           weightStorage = "auto", matmul = "auto", simd = "auto", draft = null } = {}) {
  fetchFn = fetchFn ?? globalThis.fetch?.bind(globalThis);
  if (!(Number.isInteger(maxBlock) && maxBlock >= 1 && maxBlock <= MAX_BLOCK_LIMIT)) {
    throw badArgument(`maxBlock ${maxBlock} outside [1, ${MAX_BLOCK_LIMIT}]`);
  }
  if (!(Number.isInteger(threads) && threads >= 1 && threads <= MAX_THREADS)) throw badArgument(`threads ${threads} outside [1, ${MAX_THREADS}]`);
  if (threads > 1 && (typeof SharedArrayBuffer === "undefined" || globalThis.crossOriginIsolated === false)) {
    throw badArgument(`threads ${threads}: WASM threads need SharedArrayBuffer (a cross-origin isolated page)`);
  }
  if (!MATMULS.includes(matmul)) throw badArgument(`matmul ${matmul}: auto, q8act or f32`);
  if (!["auto", "int8", "f32"].includes(weightStorage)) throw badArgument(`weightStorage ${weightStorage}: auto, int8 or f32`);
  if (matmul === "q8act" && weightStorage !== "auto") throw badArgument(`weightStorage ${weightStorage} is the f32 matmul's (matmul q8act holds the blocks as they are)`);
  if (matmul === "auto" && weightStorage !== "auto") matmul = "f32";
  if (!SIMDS.includes(simd)) throw badArgument(`simd ${simd}: auto, simd128 or relaxed`);
  if (simd === "relaxed" && !wasmBytes && !relaxedDotWorks()) {
    throw badArgument("simd relaxed: this engine's relaxed SIMD dot product is missing or does not give the spec's sums");
  }
  let relaxed = !wasmBytes && simd !== "simd128" && relaxedDotWorks();
  if (threads > 1 && wasmUrl && !wasmBytes) wasmUrl = wasmThreadsUrl ?? moduleUrl(wasmUrl, { threads });
  const base = modelUrl ? (modelUrl.endsWith("/") ? modelUrl : modelUrl + "/") : null;
  if ((tensors || ggufUrl) && !configJson) throw badArgument("a tensor map or a GGUF file needs configJson");
  const transient = new LoadTransient();
  const [wasm, configRaw, file] = await Promise.all([
    wasmBytes ?? (relaxed ? fetchBytes(fetchFn, moduleUrl(wasmUrl, { threads, relaxed }))
      .catch((err) => {                // "auto" does without a build it cannot fetch
        if (simd === "relaxed") throw err;
        relaxed = false;
        return fetchBytes(fetchFn, wasmUrl);
      }) : fetchBytes(fetchFn, wasmUrl)),
    configJson ?? readValidatedConfig(base + "config.json", fetchFn),
    tensors ?? weightsBytes ?? (ggufUrl ? openGgufStream(fetchFn, ggufUrl, ggufLabel(ggufUrl), transient)
      : openSafetensorsStream(fetchFn, base + "model.q8.safetensors", base + "model.q8.safetensors", transient)),
  ]).catch((err) => { throw asCoded(err, "E_MODEL_LOAD"); });
  // a streamed file (the browser's way): placed tensor by tensor as its bytes arrive, hashed as
  // they come; never whole in JS memory (streamed_file.mjs)
  const stream = file?.file instanceof StreamedFile ? file : null;
  try {
    return await buildWasmChampion({ wasm, configRaw, file, stream, tensors, identity, ggufUrl, transient,
      maxBlock, maxContext, weightStorage, matmul, threads, relaxed, simd, wasmBytes, draft, fetchFn });
  } catch (err) {
    stream?.file.cancel();
    throw err;
  }
}

async function buildWasmChampion({ wasm, configRaw, file, stream, tensors, identity, ggufUrl, transient,
                                   maxBlock, maxContext, weightStorage, matmul, threads, relaxed, simd, wasmBytes, draft, fetchFn }) {
  const config = typeof configRaw === "string" ? JSON.parse(configRaw) : configRaw;
  const c = wasmKernelConfig(config);   // the validated config onto the C side's arguments
  let artifactBytes;
  if (stream && ggufUrl) {
    artifactBytes = stream.size;
    try {
      // one tensor at a time: block tensors as their raw bytes (q8act), float32 ones dequantised
      tensors = ggufHeaderTensorMap(stream.header, (t) => stream.file.current(t), config, ggufLabel(ggufUrl),
        { lazy: true, blocks: matmul !== "f32" });
    } catch (err) {
      throw asCoded(err, "E_MODEL_LOAD");
    }
  } else if (stream) {
    artifactBytes = stream.size;
    tensors = stream.tensors;
  } else if (tensors) {
    artifactBytes = [...tensors.values()].reduce((n, t) => n + t.bytes.byteLength, 0);
  } else {
    const bytes = file instanceof Uint8Array ? file : new Uint8Array(file);
    artifactBytes = bytes.byteLength;
    identity = await artifactIdentity(bytes);   // = LlamaReference.from_dir(dir, weights="q8").identity
    tensors = safetensorsMap(bytes);
  }
  maxContext = maxContext || c.max_context;
  if (!(Number.isInteger(maxContext) && maxContext >= 1 && maxContext <= c.max_context)) {
    throw badArgument(`maxContext ${maxContext} outside [1, ${c.max_context}]`);
  }
  let module, instance, memory;
  try {
    module = await WebAssembly.compile(wasm);
    const threaded = isThreadedModule(module);
    if (threads > 1 && !threaded) throw badArgument(`threads ${threads}: this module is the one-thread build (use cpu_mt.wasm)`);
    memory = threaded ? new WebAssembly.Memory({ initial: 256, maximum: 65536, shared: true }) : null;
    instance = await WebAssembly.instantiate(module, cpuImports(memory));
  } catch (err) {
    throw err.code ? err : codedError("E_MODEL_LOAD", `champion wasm: ${err.message}`);
  }
  const champion = new WasmChampion(instance.exports, memory ?? instance.exports.memory, config, c, tensors,
    { maxBlock, maxContext, weightStorage, matmul, artifactBytes, streamed: !!stream });
  champion.transient = transient;
  if (stream) {
    try {
      await champion._placeStreamed(tensors, stream.file);
      identity = await streamedIdentity(stream.response, await stream.file.finish(stream.end, { drain: !!ggufUrl, size: stream.size }));
      champion.artifactBytes ??= stream.file.received;
    } catch (err) {
      throw asCoded(err, "E_MODEL_LOAD");
    }
    champion._checkPlaced();
  }
  champion.identity = identity;
  champion.simd = instance.exports.cpu_relaxed_simd ? (instance.exports.cpu_relaxed_simd() ? "relaxed" : "simd128")
    : wasmBytes ? (simd === "auto" ? "simd128" : simd) : relaxed ? "relaxed" : "simd128";
  if (threads > 1) await champion._startPool(module, threads);
  if (draft) {                          // the draft into the same instance: one memory, one arena
    try {
      champion.draft = await createDraft({ ...draft, fetchFn, instance: { exports: instance.exports, memory: champion.memory } });
    } catch (err) {
      champion.destroy();
      throw err;
    }
  }
  return champion;
}

/** A format code's name in refusals: the GGUF type name of a block format. */
function formatName(fmt) {
  const named = Object.entries(FMT).find(([, v]) => v === fmt) ?? Object.entries(BLOCK_TYPE_IDS).find(([, v]) => v === fmt);
  return named ? named[0] : String(fmt);
}

/** The tensor map of a whole model.q8.safetensors file (views into its bytes). */
function safetensorsMap(bytes) {
  const whole = bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength ? bytes.buffer : bytes.slice().buffer;
  try {
    return parseSafetensors(whole, "model.q8.safetensors").tensors;
  } catch (err) {
    throw asCoded(err, "E_MODEL_LOAD");
  }
}

export class WasmChampion {
  constructor(exports, memory, config, c, tensors, { maxBlock, maxContext, weightStorage = "auto", matmul = "auto", artifactBytes,
                                                   streamed = false }) {
    this.wasm = exports;
    this.memory = memory;                 // exported (one thread) or imported shared (threads)
    this.threads = 1;
    this._helpers = [];
    this.config = config;
    this.hp = c;
    this.vocabSize = c.vocab_size;
    this.maxBlock = maxBlock;
    this.maxContext = maxContext;
    this.artifactBytes = artifactBytes;
    this.identity = null;
    this.draft = null;                    // a Draft in this instance (createWasmChampion's draft option)
    this._session = null;
    this._destroyed = false;
    // the model's features, from config.json and the artifact: an f32, q8 (convert --q8-embedding) or
    // block (a GGUF's) embedding, a tied or untied head, q|k|v biases (Qwen2)
    this.embedQ8 = tensors.has("model.embed_tokens.weight.q8");
    this._label = tensors.has("model.layers.0.self_attn.q_proj.weight.q8") ? "model.q8.safetensors" : "tensor map";
    this._linears = this._planFormats(tensors, c, matmul, weightStorage);   // sets matmulFunction, weightStorage
    const q8Mode = this.matmulFunction === Q8ACT_FUNCTION ? 2 : this.weightStorage === "int8" ? 1 : 0;
    check(this.wasm.champion_build_config(c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads,
      c.num_kv_heads, c.head_dim, maxContext, maxBlock, c.rms_norm_eps, c.rope_theta, q8Mode,
      c.qkv_bias ? 1 : 0, c.tie_word_embeddings ? 1 : 0, this.embedQ8 ? 1 : 0), "build");
    this._setFormats();
    // the weight buffers in their formats, before any tensor is written: E_OUT_OF_MEMORY (coded) when
    // they cannot fit wasm32's 4 GiB or memory cannot grow
    if (this.wasm.champion_alloc_weights) check(this.wasm.champion_alloc_weights(), "alloc_weights (the weights in their formats)");
    if (c.rope_inv_freq) {             // scaled RoPE (linear, llama3): tables from the inverse frequencies
      const ptr = this._alloc(8 * c.rope_inv_freq.length);
      this._view(Float64Array, ptr, c.rope_inv_freq.length).set(c.rope_inv_freq);
      check(this.wasm.champion_set_inv_freq(ptr), "rope");
    }
    this.transient = null;                // the LoadTransient of a streamed load
    if (streamed) return;                 // createWasmChampion places the tensors as they arrive, then _checkPlaced
    try {
      for (const [name, place] of this._placementJobs(c)) place(tensors, name);   // in memory: in this order
    } catch (err) {
      throw asCoded(err, "E_MODEL_LOAD");
    }
    this._checkPlaced();
  }

  /** Every tensor written: the module checks them, and the buffers a round needs come after. */
  _checkPlaced() {
    const c = this.hp, maxBlock = this.maxBlock;
    check(this.wasm.champion_check(), "check");
    /** Bytes of weights held in WASM memory (champion_weight_bytes), null for a module without it. */
    this.weightBytes = this.wasm.champion_weight_bytes ? this.wasm.champion_weight_bytes() >>> 0 : null;
    const V = c.vocab_size;
    this._idsCap = 0;
    this._ensureIds(Math.max(this.maxContext, 1024));
    this._proposals = this._alloc(4 * maxBlock);                 // (B,) int32
    this._pDraft = this._alloc(4 * maxBlock * V);                // (B, V) f32
    this._out = this._alloc(4 * DECISION_WORDS);                 // (8,) int32 decision words
  }

  /** Bytes of WASM linear memory (it only grows: this is also its peak). */
  get memoryBytes() { return this.wasm ? this.memory.buffer.byteLength : 0; }
  /** Positions [0, nCached) hold valid K/V. */
  get nCached() { return this.wasm.champion_n_cached(); }
  /** Positions the K/V caches have room for now: they grow on demand (doubling) up to maxContext. */
  get kvCapacity() { return this.wasm.champion_kv_capacity(); }
  /** Room for n positions (at most maxContext) now, grown at once (to max(n, twice the room)): a
   *  request's prompt and length, before its prefill. E_OUT_OF_MEMORY (coded) when memory cannot grow. */
  reserveKv(n) {
    const positions = Math.min(n, this.maxContext);
    const status = this.wasm.champion_reserve_kv(positions);
    if (status !== 0) {
      const err = statusError(status, "K/V reservation");
      throw codedError(err.code, `the K/V caches could not grow to ${positions} positions (${this.kvCapacity} now): ${err.message}`);
    }
  }

  _alloc(nbytes) {
    const ptr = this.wasm.champion_alloc(nbytes);
    if (!ptr) throw codedError("E_OUT_OF_MEMORY", `WASM memory: ${nbytes} more bytes refused`);
    return ptr;
  }

  _view(Type, ptr, n) { return new Type(this.memory.buffer, ptr, n); }

  /** Start threads - 1 helpers (champion_thread.mjs) over the shared memory; each gets its own
   *  stack. Every later step is split across threads + the calling thread. */
  async _startPool(module, threads) {
    const url = new URL("./champion_thread.mjs", import.meta.url);
    const isNode = typeof process !== "undefined" && process.versions?.node && typeof Worker === "undefined";
    const WorkerClass = isNode ? (await import("node:worker_threads")).Worker : Worker;
    for (let index = 1; index < threads; index++) {
      const stackTop = (this._alloc(HELPER_STACK_BYTES) + HELPER_STACK_BYTES) & ~15;
      const worker = isNode ? new WorkerClass(url) : new WorkerClass(url, { type: "module" });
      worker.postMessage({ module, memory: this.memory, index, stackTop });
      this._helpers.push(worker);
    }
    const t0 = Date.now();
    while (this.wasm.champion_threads_ready() < threads - 1) {
      if (Date.now() - t0 > POOL_START_MS) {
        this.destroy();
        throw codedError("E_MODEL_LOAD", `only ${this.wasm?.champion_threads_ready() ?? 0} of ${threads - 1} helper threads started`);
      }
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
    check(this.wasm.champion_threads_start(threads), "threads_start");
    this.threads = this.poolThreads = threads;
  }

  /** Share every later step among n threads: 1 (the helpers sleep) or the pool's size (every
   *  helper wakes for every step, so no count in between). A share changes which elements a
   *  thread computes, never how, so the bits do not change. */
  setThreads(n) {
    this._alive();
    const pool = this.poolThreads ?? 1;
    if (n !== 1 && n !== pool) throw badArgument(`threads ${n}: 1 or the pool's size ${pool}`);
    if (pool > 1) check(this.wasm.champion_threads_start(n), "threads_start");
    this.threads = n;
  }

  /** Every linear (embedding, untied head, the layers' seven) with the form it comes in ("q8":
   *  `<name>.q8` + `<name>.scale`; "block": a GGUF block tensor; "f32": float32 `<name>`) and the
   *  format the module holds it in; sets matmulFunction and weightStorage. */
  _planFormats(tensors, c, matmul, weightStorage) {
    const H = c.hidden_size, V = c.vocab_size;
    const linears = [{ name: "model.embed_tokens.weight", kind: T.embed, scaleKind: T.s_embed, shape: [V, H], layer: 0, embedding: true }];
    if (!c.tie_word_embeddings) linears.push({ name: "lm_head.weight", kind: T.lm_head, scaleKind: T.s_lm_head, shape: [V, H], layer: 0 });
    for (let l = 0; l < c.num_layers; l++) {
      for (const [suffix, kind, scaleKind, shape] of LAYER_LINEARS) {
        linears.push({ name: `model.layers.${l}.${suffix}`, kind, scaleKind, shape: shape(c), layer: l });
      }
    }
    for (const lin of linears) {
      const t = tensors.get(lin.name);
      lin.form = tensors.has(`${lin.name}.q8`) ? "q8" : t && t.ggmlType !== undefined ? "block" : "f32";
    }
    const quantised = linears.filter((lin) => lin.form !== "f32");
    // q8act quantises activations per 32: a q8 linear of another input width cannot run it
    const narrow = quantised.find((lin) => lin.form === "q8" && lin.shape[1] % Q8ACT_BLOCK !== 0);
    if (matmul === "q8act" && narrow) {
      throw codedError("E_MODEL_LOAD", `${this._label}: tensor ${narrow.name}.q8: ${narrow.shape[1]} columns are not a multiple of ${Q8ACT_BLOCK} (matmul q8act)`);
    }
    const q8act = matmul !== "f32" && quantised.length > 0 && !narrow;
    this.matmulFunction = q8act ? Q8ACT_FUNCTION : "f32";
    if (q8act) {
      this.weightStorage = "blocks";
    } else {
      const f32Linears = linears.some((lin) => lin.form !== "q8" && !lin.embedding);
      if (f32Linears && weightStorage === "int8") throw badArgument("weightStorage int8 cannot hold float32 linears (a GGUF's)");
      const q8Bytes = quantised.filter((lin) => lin.form === "q8").reduce((n, lin) => n + lin.shape[0] * lin.shape[1], 0);
      this.weightStorage = weightStorage === "auto" ? (f32Linears || 4 * q8Bytes <= F32_WEIGHTS_LIMIT ? "f32" : "int8") : weightStorage;
    }
    for (const lin of linears) {
      if (lin.form === "block" && !q8act) lin.form = "f32";            // the f32 function: dequantised at load
      lin.fmt = lin.form === "f32" ? FMT.F32 : lin.form === "block" ? tensors.get(lin.name).ggmlType
        : q8act ? FMT.ROWQ8 : this.weightStorage === "int8" ? FMT.I8F : FMT.F32;
    }
    return linears;
  }

  /** Each linear's format into the module (champion_set_format), before its first tensor pointer.
   *  A module without champion_set_format runs the f32 function only. */
  _setFormats() {
    if (!this.wasm.champion_set_format) {
      if (this.matmulFunction !== "f32") throw codedError("E_MODEL_LOAD", "this CPU module has no q8act matmul (champion_set_format): rebuild it (bash wasm/build.sh)");
      return;
    }
    for (const lin of this._linears) {
      if (lin.kind === T.embed && lin.form === "f32") continue;       // a float32 embedding: nothing to choose
      const status = this.wasm.champion_set_format(lin.kind, lin.layer, lin.fmt);
      if (status !== 0) {
        throw codedError("E_MODEL_LOAD", `${this._label}: tensor ${lin.name}: the module refuses format ${formatName(lin.fmt)} ` +
          `for ${lin.shape[0]} x ${lin.shape[1]} (an unsupported format, or columns not a multiple of its block)`);
      }
    }
  }

  /** Write `bytes` (the values as they are, or int8 widened to exact float32) where the module
   *  holds tensor `kind`; the module's byte count must be what is written. */
  _place(kind, layer, bytes, widen, name, { at = 0, total = null } = {}) {
    const n = total ?? (widen ? 4 * bytes.byteLength : bytes.byteLength);
    if (this.wasm.champion_tensor_bytes) {
      const want = this.wasm.champion_tensor_bytes(kind, layer) >>> 0;
      if (want !== n) throw codedError("E_MODEL_LOAD", `${this._label}: tensor ${name}: the module holds ${want} bytes for it, the file gives ${n} (byte count mismatch)`);
    }
    const ptr = this.wasm.champion_tensor_ptr(kind, layer);
    if (!ptr) throw codedError("E_INTERNAL", `no destination for tensor kind ${kind} (${name})`);
    // a streamed load counts what it holds beside the staging buffer (a re-ordered or dequantised copy)
    const copy = this.transient && this._staging && bytes.buffer !== this._staging ? bytes.byteLength : 0;
    this.transient?.holdCopy(copy);
    if (widen) {                    // int8 -> float32: exact
      this._view(Float32Array, ptr, bytes.byteLength).set(new Int8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength));
    } else {                        // int8 or blocks kept as they are, or float32 bytes (the file may leave them unaligned)
      this._view(Uint8Array, ptr + at, bytes.byteLength).set(bytes);
    }
    this.transient?.release(copy);
  }

  /** A float32 tensor: as given, or a block tensor's float32 entry (a norm or bias stored in blocks). */
  _f32(tensors, name, shape) {
    const t = tensors.get(name);
    const entry = t && t.ggmlType !== undefined ? new Map([[name, t.float32()]]) : tensors;
    return expectTensor(entry, name, "F32", shape, this._label).bytes;
  }

  /** One linear in its planned format: `<name>.q8` + `<name>.scale` (int8, widened for F32), a
   *  block tensor's raw bytes (no scale), or float32 `<name>` with scales of 1.0 (x * 1.0 is x: the
   *  same arithmetic, exactly, as a float32 matmul). */
  _placeLinear(tensors, lin) {
    const { name, kind, scaleKind, shape, layer } = lin;
    if (lin.form === "block") {
      const t = tensors.get(name);
      if (t.shape.length !== 2 || t.shape[0] !== shape[0] || t.shape[1] !== shape[1]) {
        throw codedError("E_MODEL_LOAD", `${this._label}: tensor ${name} has shape ${JSON.stringify(t.shape)}, expected ${JSON.stringify(shape)}`);
      }
      const bytes = t.bytes;
      if (bytes.byteLength !== shape[0] * t.rowBytes) {
        throw codedError("E_MODEL_LOAD", `${this._label}: tensor ${name}: ${t.dtype} holds ${bytes.byteLength} bytes, its shape needs ${shape[0] * t.rowBytes} (byte count mismatch)`);
      }
      this._place(kind, layer, bytes, false, name);
    } else {                        // float32: a converted tensor a slice at a time
      const total = 4 * shape[0] * shape[1];
      for (const [r0, , bytes] of float32Slices(tensors, name, shape, this._label)) {
        this._place(kind, layer, bytes, false, name, { at: 4 * r0 * shape[1], total });
      }
      if (!lin.embedding) this._place(scaleKind, layer, this._ones(shape[0]), false, `${name} (scales of 1.0)`);
    }
  }

  _ones(n) {
    if (!this._onesBytes || this._onesBytes.byteLength < 4 * n) this._onesBytes = new Uint8Array(new Float32Array(n).fill(1).buffer);
    return this._onesBytes.subarray(0, 4 * n);
  }

  /** [[tensor name, place(tensors, name)]]: what is written where, one job per tensor read (a
   *  linear's q8 rows and its scales are two; a float32 linear's scales of 1.0 go with it). */
  _placementJobs(c) {
    const H = c.hidden_size, jobs = [];
    const f32 = (kind, layer, shape) => (tensors, name) => this._place(kind, layer, this._f32(tensors, name, shape), false, name);
    for (const lin of this._linears) {
      const { name, kind, scaleKind, shape, layer } = lin;
      if (lin.form === "q8") {
        jobs.push([`${name}.q8`, (tensors, n) => this._place(kind, layer, expectTensor(tensors, n, "I8", shape, this._label).bytes, lin.fmt === FMT.F32, n)]);
        jobs.push([`${name}.scale`, (tensors, n) => this._place(scaleKind, layer, expectTensor(tensors, n, "F32", [shape[0]], this._label).bytes, false, n)]);
      } else {
        jobs.push([name, (tensors) => this._placeLinear(tensors, lin)]);
      }
    }
    jobs.push(["model.norm.weight", f32(T.final_norm, 0, [H])]);
    for (let l = 0; l < c.num_layers; l++) {
      const p = `model.layers.${l}.`;
      jobs.push([`${p}input_layernorm.weight`, f32(T.attn_norm, l, [H])]);
      jobs.push([`${p}post_attention_layernorm.weight`, f32(T.mlp_norm, l, [H])]);
      if (c.qkv_bias) {                // Qwen2: q|k|v biases, float32
        for (const [proj, kind] of Object.entries(T.bias)) {
          const rows = (proj === "q_proj" ? c.num_heads : c.num_kv_heads) * c.head_dim;
          jobs.push([`${p}self_attn.${proj}.bias`, f32(kind, l, [rows])]);
        }
      }
    }
    return jobs;
  }

  /** Every tensor placed as a streamed file's bytes arrive (streamed_placement.mjs): staged in file
   *  order, each written where the module holds it. */
  async _placeStreamed(tensors, file) {
    const writes = this._placementJobs(this.hp).map(([name, place]) => [[name], (t) => {
      this._staging = file.stagingBuffer;                   // what is not in it is a copy, counted
      place(t, name);
    }]);
    await placeAll(writes, tensors, file);
    this._staging = null;
  }

  _ensureIds(n) {
    if (n <= this._idsCap) return;
    this._idsCap = Math.max(n, 2 * this._idsCap);
    this._ids = this._alloc(4 * this._idsCap);      // (cap,) int32: tokens, context ids
    this._ids2 = this._alloc(4 * this._idsCap);     // (cap,) int32: suppressed ids, stop ids
    this._ids3 = this._alloc(4 * this._idsCap);     // (cap,) int32: allowed ids
  }

  _writeInts(ptr, values) {
    const view = this._view(Int32Array, ptr, values.length);
    for (let i = 0; i < values.length; i++) view[i] = values[i];
    return values.length;
  }

  _alive() {
    if (this._destroyed) throw codedError("E_TERMINATED", "the WASM champion was destroyed");
  }

  _liveExports() {
    this._alive();
    return this.wasm;
  }

  /** The CPU round (cpu_session.mjs): the request's state, once (policy, draftPolicy, stopTokenIds,
   *  seed [lo, hi], contextIds, greedy). */
  beginNow(args) {
    this._alive();
    // over the draft it has now: one loaded into this instance during a request (a background
    // draft) leaves that request's session as it began, and joins the next
    if (this._session?.draft !== this.draft) this._session = new CpuSession(this, this.draft);
    this._session.beginNow(args);
  }

  /** One whole round in one call -> Int32Array, the round record (cpu_session.mjs roundNow). */
  roundNow(args) {
    if (!this._session?.begun) throw badArgument("roundNow before beginNow");
    return this._session.roundNow(args);
  }

  /** Up to h baseline steps in one call -> Int32Array (n, 13): their records (cpu_session.mjs chainNow). */
  chainNow(args) {
    if (!this._session?.begun) throw badArgument("chainNow before beginNow");
    return this._session.chainNow(args);
  }

  /** {code, message} when the last roundNow's record says draft_failed, else null. */
  lastFailure() { return this._session ? this._session.lastFailure() : null; }

  /** Fault injection: the next roundNow's champion rows 0..nRows-1 are NaN after its forward. */
  injectRoundNaN(nRows) { this._liveExports().cpu_inject_nan(nRows); }

  /** Run positions [startPos, startPos + n): K/V written; logits rows 0..n-1 kept in WASM memory. */
  async forward(tokenIds, startPos) { return this.forwardNow(tokenIds, startPos); }

  /** forward(), synchronously (the calling thread computes; helpers, if any, share the work). */
  forwardNow(tokenIds, startPos) {
    this._alive();
    const n = tokenIds.length, V = this.vocabSize;
    if (!(n >= 1 && n <= this.maxBlock)) throw badArgument(`block of ${n} tokens outside [1, ${this.maxBlock}]`);
    const cached = this.nCached;
    if (!(Number.isInteger(startPos) && startPos >= 0 && startPos <= cached)) {
      throw badArgument(`startPos ${startPos} outside [0, ${cached}] (cannot skip uncached positions)`);
    }
    if (startPos + n > this.maxContext) {
      throw codedError("E_CONTEXT_OVERFLOW", `positions up to ${startPos + n} exceed maxContext ${this.maxContext}`);
    }
    for (const t of tokenIds) if (!isUint(Number(t), V)) throw badArgument(`token id ${t} outside [0, ${V})`);
    this._writeInts(this._ids, tokenIds);
    check(this.wasm.champion_forward(this._ids, n, startPos), "forward");
    if (this._batchVariant && n > 1) {   // fault: the block's last row gets one logit's lowest bit flipped
      this._view(Uint32Array, this.wasm.champion_logits(), n * V)[(n - 1) * V + (n * 7919 + 17) % V] ^= 1;
    }
  }

  /** Fault injection (tests, web/orchestrator/batch_check.mjs): from now on every forwardNow of a
   *  block of n > 1 flips the lowest mantissa bit of one logit of its last row, (n * 7919 + 17) % V,
   *  in the rows decide() reads: the block path is then batch-variant. (The one-call CPU round,
   *  roundNow, runs its forward inside the module and is not touched.) */
  setBatchVariantFault() { this._batchVariant = true; }

  /** Float32Array (n * V): logits rows 0..n-1 of the last forward (tests and diagnostics). */
  async readLogits(n) {
    this._alive();
    if (!(Number.isInteger(n) && n >= 1 && n <= this.maxBlock)) throw badArgument(`n ${n} outside [1, ${this.maxBlock}]`);
    return this._view(Float32Array, this.wasm.champion_logits(), n * this.vocabSize).slice();
  }

  /** Tests: put arbitrary logits rows (Float32Array n * V) where decide() reads them. */
  setLogitsForTest(rows, n) {
    this._alive();
    if (!(n >= 1 && n <= this.maxBlock && rows.length === n * this.vocabSize)) throw badArgument(`rows: need n * V floats`);
    this._view(Float32Array, this.wasm.champion_logits(), rows.length).set(rows);
    check(this.wasm.champion_set_n_rows(n), "set_n_rows");
  }

  /** Fault injection: logits rows 0..nRows-1 become NaN (as a numeric failure would); decide()
   *  then reports E_TARGET_NUMERIC_OR_MASK if the round reaches one of them. */
  poisonLogits(nRows) {
    this._alive();
    const n = Math.max(0, Math.min(nRows, this.maxBlock));
    this._view(Float32Array, this.wasm.champion_logits(), n * this.vocabSize).fill(NaN);
  }

  /** decide_round on the last forward's rows: web/gpu/accept.mjs's decide() arguments and result
   *  (an Int32Array of the round record's decision words). */
  async decide(args) { return this.decideNow(args); }

  /** decide(), synchronously: -> Int32Array (8,), a copy of the decision words n_accepted,
   *  next_token (-1 none), rejected_at (-1), ended_by (0 | 1 stop | 2 length), decision_error (0 |
   *  1 E_TARGET_NUMERIC_OR_MASK | 2 E_RESIDUAL_INVARIANT), diag_score, diag_u, diag_a (float32 bits,
   *  NaN: none), in protocol.json round_record's order.
   *  rowOffset: the decided rows are the last forward's logits rows rowOffset .. rowOffset + nRows - 1
   *  (the rows before them were fed, e.g. forced grammar tokens, and are not decided on); decided
   *  row i is what row i is with rowOffset 0. rowMasks: null, or Uint32Array (nRows * ceil(V / 32))
   *  allowed-id bits, bit (id & 31) of word (id >> 5) of row i (xgrammar's bitmask layout): decided
   *  row i is masked by them in processors step 3, ANDed with policy.allowed_token_ids. */
  decideNow({ nRows, proposals, pDraft, contextIds, policy, seed, roundId, stopTokenIds, remaining, greedy,
              rowOffset = 0, rowMasks = null }) {
    this._alive();
    const V = this.vocabSize;
    const pol = checkedPolicy(policy, V);
    const props = Array.from(proposals || [], Number);
    const m = props.length;
    if (!(Number.isInteger(nRows) && nRows >= 1 && nRows <= this.maxBlock)) throw badArgument(`nRows: ${nRows}`);
    if (m > nRows) throw badArgument(`proposals: ${m} > nRows ${nRows}`);
    for (const y of props) if (!isUint(y, V)) throw badArgument(`proposals: ${y}`);
    if (nRows !== m + 1) throw badArgument(`nRows: need m + 1 = ${m + 1}, got ${nRows}`);
    if (m > 0 && !(Number.isInteger(remaining) && remaining >= m)) throw badArgument(`remaining: ${remaining} < m ${m}`);
    const context = Array.from(contextIds || [], Number);
    for (const id of context) if (!isUint(id, V)) throw badArgument(`context_ids: ${id}`);
    const [seedLo, seedHi] = seed || [0, 0];
    if (!isUint(seedLo, 2 ** 32) || !isUint(seedHi, 2 ** 32)) throw badArgument(`seed: ${seed}`);
    if (!isUint(roundId ?? 0, 2 ** 32)) throw badArgument(`roundId: ${roundId}`);
    const stops = Array.from(stopTokenIds || [], Number);
    const useDraft = m > 0 && !greedy;
    if (useDraft && (!pDraft || pDraft.length !== m * V)) throw badArgument(`pDraft: need ${m} * ${V} floats`);
    if (!isUint(rowOffset, this.maxBlock)) throw badArgument(`rowOffset: ${rowOffset}`);
    const kept = this.wasm.champion_n_rows();
    if (rowOffset + nRows > kept) {
      throw badArgument(`nRows ${nRows} at rowOffset ${rowOffset}: the last forward kept ${kept} rows`);
    }
    const nWords = Math.ceil(V / 32);
    if (rowMasks !== null && !((rowMasks instanceof Uint32Array || rowMasks instanceof Int32Array) &&
        rowMasks.length === nRows * nWords)) {
      throw badArgument(`rowMasks: need a Uint32Array of nRows * ceil(V / 32) = ${nRows * nWords} words`);
    }

    check(this.wasm.champion_set_policy(pol.temperature, pol.top_k, pol.top_p, pol.repetition_penalty), "policy");
    const allowed = pol.allowed_token_ids;
    this._ensureIds(Math.max(context.length, stops.length, pol.suppress_token_ids.length, allowed ? allowed.length : 0));
    const nSuppress = this._writeInts(this._ids2, pol.suppress_token_ids);
    const nAllowed = allowed === null ? -1 : this._writeInts(this._ids3, allowed);
    check(this.wasm.champion_set_masks(this._ids2, nSuppress, this._ids3, nAllowed), "masks");
    this._writeInts(this._proposals, props);
    if (useDraft) this._view(Float32Array, this._pDraft, m * V).set(pDraft);
    this._writeInts(this._ids, context);
    this._writeInts(this._ids2, stops);
    if (rowMasks !== null) {
      this._rowMasks ??= this._alloc(4 * this.maxBlock * nWords);   // (B, ceil(V / 32)) uint32, made at first use
      this._view(Uint32Array, this._rowMasks, rowMasks.length).set(new Uint32Array(rowMasks.buffer, rowMasks.byteOffset, rowMasks.length));
    }
    check(this.wasm.champion_decide(nRows, this._proposals, m, useDraft ? this._pDraft : 0, this._ids, context.length,
      seedLo >>> 0, seedHi >>> 0, (roundId ?? 0) >>> 0, this._ids2, stops.length,
      Math.min(remaining ?? 0x7fffffff, 0x7fffffff), greedy ? 1 : 0, rowOffset, rowMasks === null ? 0 : this._rowMasks,
      this._out), "decide");
    return this._view(Int32Array, this._out, DECISION_WORDS).slice();
  }

  /** Forget the module (its memory is freed with the instance); later calls throw E_TERMINATED. */
  destroy() {
    if (this.wasm?.champion_threads_stop) this.wasm.champion_threads_stop();   // helpers return, then close
    for (const worker of this._helpers) setTimeout(() => worker.terminate(), 1000);
    this._helpers = [];
    this._destroyed = true;
    this.wasm = null;
  }
}
