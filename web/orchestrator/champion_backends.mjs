// The two champion backends behind one interface, and the choice between them.
//   webgpu: WGSL kernels (web/gpu/champion.mjs + accept.mjs) on a device whose buffers are counted
//   wasm:   WASM-SIMD forward + float64 decisions in C (web/champion_wasm/champion_wasm.mjs)
// Both run the same q8 artifact, or a GGUF file (the file dequantised to float32 linears, web/gguf/),
// sized by championConfig, the validated config the model check handed over (web/formats/model_config.mjs),
// and give decide() results of one layout (protocol.json round_record):
//   backend = { kind, identity, artifactBytes, vocabSize, maxContext, config, lost,
//               forward(ids Int32Array, startPos), decide(args) -> Int32Array, the round record's decision words,
//               readLogits(n) -> Float32Array n*V (the last forward's rows: the load-time batch check,
//               web/orchestrator/batch_check.mjs), setBatchVariantFault() (tests: the block path made variant),
//               wasm only: forwardNow / decideNow, the same synchronously,
//               injectNaN(nRows), loseDevice(), memory(), hardwareClass(), close(),
//               wasm only: beginNow / roundNow / chainNow / lastFailure / cpuDraft / loadDraft, the CPU round in
//               one call with the draft loaded into the champion's instance (cpu_session.mjs) }
// "auto" takes WebGPU only from a hardware adapter; a fallback (software) adapter, a missing
// navigator.gpu or no adapter at all gives the WASM champion.
import { requestDevice, trackDevice } from "../gpu/device.mjs";
import { compileChampionPipelines, createChampion, createChampionFromTensors, refuseUnfit } from "../gpu/champion.mjs";
import { ggufHeaderTensorMap, openGgufStream } from "../gguf/gguf_tensors.mjs";
import { LoadTransient } from "../formats/streamed_file.mjs";
import { ggufLabel, isGgufUrl } from "../gguf/gguf_reader.mjs";
import { createAcceptor } from "../gpu/accept.mjs";
import { createDraft } from "../draft/draft.mjs";
import { codedError } from "../protocol.mjs";

export const CHAMPION_BACKENDS = ["auto", "webgpu", "wasm"];

/** -> {kind: "webgpu"|"wasm", why}: what "auto" (or an explicit choice) resolves to here.
 *  softwareAdapterCounts (tests, with faults: options.fault_adapter_is_hardware): "auto" takes a
 *  fallback (software) adapter as if it were hardware, so SwiftShader exercises auto's WebGPU path. */
export async function chooseChampionBackend(requested = "auto", { softwareAdapterCounts = false } = {}) {
  if (!CHAMPION_BACKENDS.includes(requested)) {
    throw codedError("E_BAD_ARGUMENT", `championBackend must be one of ${CHAMPION_BACKENDS.join(", ")}, got ${JSON.stringify(requested)}`);
  }
  if (requested !== "auto") return { kind: requested, why: "requested" };
  if (!globalThis.navigator?.gpu) return { kind: "wasm", why: "no navigator.gpu" };
  let adapter = null;
  try { adapter = await navigator.gpu.requestAdapter(); } catch { adapter = null; }
  if (!adapter) return { kind: "wasm", why: "no WebGPU adapter" };
  const fallback = adapter.info?.isFallbackAdapter ?? adapter.isFallbackAdapter ?? false;
  if (fallback && softwareAdapterCounts) return { kind: "webgpu", why: "a fallback (software) adapter, taken as hardware (test fault)" };
  return fallback ? { kind: "wasm", why: "the WebGPU adapter is a fallback (software) one" }
    : { kind: "webgpu", why: "hardware WebGPU adapter" };
}

/** The WASM champion's thread plan for `requested` ("auto" or a count) -> {count, calibrate, why}.
 *  "auto": min(navigator.hardwareConcurrency, 4) threads where the page is cross-origin isolated
 *  (SharedArrayBuffer), else 1; with more than one, the load times a forward at 1 thread and at
 *  `count` (calibrateThreads) and keeps the faster, since on a loaded machine a descheduled helper
 *  stalls every step (docs/champion_wasm.md, Threads). The bits are the same at any count. */
export function championThreads(requested = "auto") {
  if (requested !== "auto") {
    if (!(Number.isInteger(requested) && requested >= 1)) throw codedError("E_BAD_ARGUMENT", `threads must be "auto" or >= 1, got ${JSON.stringify(requested)}`);
    return { count: requested, calibrate: false, why: "requested" };
  }
  const cores = globalThis.navigator?.hardwareConcurrency ?? 1;
  if (!globalThis.crossOriginIsolated || typeof SharedArrayBuffer === "undefined") {
    return { count: 1, calibrate: false, why: "auto: the page is not cross-origin isolated (no SharedArrayBuffer)" };
  }
  if (cores < 2) return { count: 1, calibrate: false, why: `auto: ${cores} core` };
  return { count: Math.min(cores, 4), calibrate: true, why: `auto: ${cores} cores, cross-origin isolated` };
}

/** Token ids for warm-up and calibration forwards (any valid ids: the outputs are discarded). */
const warmIds = (champion) => Int32Array.from({ length: champion.maxBlock }, (_, i) => (i * 7919 + 13) % champion.vocabSize);

/** Run the WASM champion on blocks of 1, 2, 3, 4 and maxBlock at position 0, so that the code a
 *  request runs (the small blocks' and the largest's paths) is compiled and tiered up before it
 *  (its prefill starts again at 0). All of 1..9 cost 45 positions, ~1.3 s at 135M; these 19; and
 *  no more once `budgetMs` has passed (the 1.7B shape spent 8.6 s here). -> ms. */
export function warmForwards(champion, { budgetMs = 400 } = {}) {
  const t0 = performance.now();
  const ids = warmIds(champion);
  const last = Math.min(champion.maxBlock, champion.maxContext);
  for (const n of new Set([1, last, 2, 3, 4].filter((b) => b <= last))) {   // a large model stops early: its
    champion.forwardNow(ids.subarray(0, n), 0);                           // forwards tier up on their own
    if (performance.now() - t0 > budgetMs) break;
  }
  return performance.now() - t0;
}

const quantile = (xs, q) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(q * s.length))]; };

/** Time a decode step (a block of 1) plus a verification block (5) at 1 thread and at the pool's
 *  size, interleaved, for up to `reps` pairs within about `budgetMs` (at least 1, 3 when the budget
 *  allows, and no more once the medians differ by 2x); keep the pool's
 *  size only when its median is at least 10% faster and its upper quartile no slower.
 *  -> {threads, ms: {1: median, n: median}, reps}; the champion is left at the chosen count. */
export function calibrateThreads(champion, { reps = 9, budgetMs = 1500 } = {}) {
  const pool = champion.poolThreads ?? 1;
  const ids = warmIds(champion), B = Math.min(5, champion.maxBlock);
  if (pool <= 1 || champion.maxContext <= B) return { threads: champion.threads, ms: {}, reps: 0 };
  const times = { 1: [], [pool]: [] };
  const t0 = performance.now();
  champion.forwardNow(ids.subarray(0, B), 0);
  const clear = () => {   // 3 pairs settle a gap of 2x either way
    const ratio = quantile(times[pool], 0.5) / quantile(times[1], 0.5);
    return ratio > 2 || ratio < 0.5;
  };
  let r = 0;
  // at least one pair; up to 3 within the budget (a 1.7B pair takes ~1.6 s: 3 cost 5 s of load), more
  // only while within it and unclear
  const within = () => performance.now() - t0 < budgetMs;
  for (; r < reps && (r < 1 || (within() && (r < 3 || !clear()))); r++) {
    for (const n of r % 2 ? [1, pool] : [pool, 1]) {
      champion.setThreads(n);
      const s = performance.now();
      champion.forwardNow(ids.subarray(B - 1, B), B);
      champion.forwardNow(ids.subarray(0, B), 0);
      times[n].push(performance.now() - s);
    }
  }
  const med1 = quantile(times[1], 0.5), medN = quantile(times[pool], 0.5);
  const threads = medN < 0.9 * med1 && quantile(times[pool], 0.75) <= quantile(times[1], 0.75) ? pool : 1;
  champion.setThreads(threads);
  return { threads, ms: { 1: +med1.toFixed(3), [pool]: +medN.toFixed(3) }, reps: r };
}

/** A cached thread choice against this moment: one step at its count (the better of two), against
 *  the step's median when it was measured -> {kept, ms, ratio}; kept within THREADS_DRIFT (a machine
 *  busier or quieter than then measures again). The champion is left at the cached count. */
export function spotCheckThreads(champion, cached) {
  const ids = warmIds(champion), B = Math.min(5, champion.maxBlock);
  champion.setThreads(Math.min(cached.threads, champion.poolThreads ?? 1));
  champion.forwardNow(ids.subarray(0, B), 0);        // positions [0, B) hold K/V, as calibrateThreads starts
  let best = Infinity;
  for (let r = 0; r < 2; r++) {
    const s = performance.now();
    champion.forwardNow(ids.subarray(B - 1, B), B);
    champion.forwardNow(ids.subarray(0, B), 0);
    best = Math.min(best, performance.now() - s);
  }
  const ratio = best / cached.ms[cached.threads];
  return { kept: champion.threads === cached.threads && ratio >= THREADS_DRIFT[0] && ratio <= THREADS_DRIFT[1],
    ms: +best.toFixed(3), ratio: +ratio.toFixed(3) };
}
export const THREADS_DRIFT = [0.75, 1.33];

const cpuBucket = () => {
  const n = globalThis.navigator?.hardwareConcurrency ?? 0;
  return n <= 2 ? "1-2" : n <= 4 ? "3-4" : n <= 8 ? "5-8" : "9+";
};

/** Work that needs no model bytes, started while Pyodide boots: the WebGPU device and the
 *  champion's pipelines (seconds on SwiftShader). Consumed by openChampion, or closed. */
export function prepareChampion(kind) {
  if (kind !== "webgpu") return { kind, close() {} };
  const devicePromise = requestDevice();
  const pipelines = devicePromise.then((device) => compileChampionPipelines(device));
  pipelines.catch(() => {});   // reported where it is awaited
  return {
    kind, devicePromise, pipelines,
    close() { devicePromise.then((d) => d.destroy(), () => {}); },
  };
}

// the WebGPU champion's matmul: "q8act" only when asked for; "auto" keeps the float kernels there (on
// SwiftShader q8act is 2.3-2.8x slower per linear: docs/gpu.md)
const gpuMatmul = (matmul) => (matmul === "q8act" ? "q8act" : "f32");

async function openWebGpu({ championUrl, championConfig = null, maxContext, maxBlock, refuseAllocAfter = -1, prepared = null,
                            matmul = "auto", memoryBudgetBytes = 0 }) {
  const fn = gpuMatmul(matmul);
  const device = prepared ? await prepared.devicePromise : await requestDevice();
  const accounting = trackDevice(device);
  accounting.refuseAfter = refuseAllocAfter;
  let champion = null, acceptor = null;
  try {
    if (isGgufUrl(championUrl)) {      // a GGUF file: its tensor map (float32 linears, or blocks under q8act)
      // before a byte is fetched: the plan in the forms it will take (f32: every linear dequantised to
      // float32; q8act: at least Q4_0's blocks) against the budget and the binding limits
      refuseUnfit(device, championConfig, { maxBlock, maxContext, memoryBudgetBytes, matmul: fn, forms: (hp) => {
        const linear = fn === "q8act" ? "Q4_0" : "f32";
        return { embed: fn === "q8act" ? "q8" : "f32", head: hp.tied ? "tied" : linear,
          layers: Array.from({ length: hp.layers }, () => ({ qkv: linear, o: linear, gateUp: linear, down: linear })) };
      } });
      // streamed: each tensor written to its buffers as it arrives, the file hashed as it comes
      const label = ggufLabel(championUrl);
      const { file, header, end, size, response } = await openGgufStream(fetch, championUrl, label, new LoadTransient());
      try {
        const tensors = ggufHeaderTensorMap(header, (t) => file.current(t), championConfig, label, { lazy: true, blocks: fn === "q8act" });
        champion = await createChampionFromTensors({ device, config: championConfig, tensors, identity: null, label,
          artifactBytes: size ?? 0, maxBlock, maxContext, pipelinesPromise: prepared?.pipelines, matmul: fn, memoryBudgetBytes,
          stream: { file, end, drain: true, size, response } });
      } catch (err) {
        file.cancel();
        throw err;
      }
    } else {                           // the q8 artifact: createChampion plans it (every weight q8 at least) before its fetch
      champion = await createChampion({ device, modelUrl: championUrl, config: championConfig, maxBlock, maxContext,
        pipelinesPromise: prepared?.pipelines, matmul: fn, memoryBudgetBytes });
    }
    acceptor = await createAcceptor({ device, vocabSize: champion.vocabSize, maxBlock });
  } catch (err) {
    accounting.destroyAll();   // whatever was allocated before the failure
    device.destroy();
    throw err;
  }
  const backend = {
    kind: "webgpu", identity: champion.identity, artifactBytes: champion.artifactBytes, vocabSize: champion.vocabSize,
    maxContext: champion.maxContext, config: champion.config, lost: false,
    matmul: champion.matmulFunction ?? "f32",                              // "q8act-v1" | "f32" 
    forward: (ids, startPos) => champion.forward(ids, startPos),
    cachedLength: () => champion.length,                                  // positions [0, n) hold K/V
    decide: (args) => acceptor.decide({ ...args, logitsBuffer: champion.logitsBuffer }),
    readLogits: (n) => champion.readLogits(n),
    setBatchVariantFault: () => champion.setBatchVariantFault(),
    injectNaN(nRows) {   // fault: this block's rows become NaN, as a numeric failure would
      device.queue.writeBuffer(champion.logitsBuffer, 0, new Float32Array(nRows * champion.vocabSize).fill(NaN));
    },
    loseDevice() { backend.lost = true; device.destroy(); },
    memory: () => ({ category: "gpu_buffers", peak: accounting.peakBytes, live: accounting.liveBytes,
      buffers_live: accounting.liveBuffers }),
    // what the load held of the weights' file in JS memory at most (streamed: one tensor and a read)
    loadTransient: { ...champion.transient.report(), streamed: true },
    hardwareClass: () => `webgpu-${device.esFallbackAdapter ? "fallback" : "hardware"}/` +
      `${device.esAdapterInfo.vendor || "unknown"}/cpu-${cpuBucket()}`,
    close() {
      acceptor.destroy();
      champion.destroy();
      accounting.destroyAll();
      device.destroy();
    },
  };
  device.lost.then(() => { backend.lost = true; });
  return backend;
}

async function openWasm({ championUrl, championConfig = null, maxContext, maxBlock, wasmUrl, threads = "auto", matmul = "auto" }) {
  const plan = championThreads(threads);
  let mod;
  try {
    mod = await import("../champion_wasm/champion_wasm.mjs");
  } catch (err) {
    throw codedError("E_MODEL_LOAD", `the WASM champion module did not load: ${err.message ?? err}`);
  }
  const champion = await mod.createWasmChampion({ wasmUrl, maxBlock, maxContext, threads: plan.count, matmul,
    configJson: championConfig, ...(isGgufUrl(championUrl) ? { ggufUrl: championUrl } : { modelUrl: championUrl }) });
  let nanRows = 0;
  const backend = {
    kind: "wasm", identity: champion.identity, artifactBytes: champion.artifactBytes, vocabSize: champion.vocabSize,
    maxContext: champion.maxContext, config: champion.config, lost: false,
    matmul: champion.matmulFunction, weightBytes: champion.weightBytes,   // "q8act-v1" | "f32"; bytes of weights held
    simd: champion.simd,                                                  // "relaxed" | "simd128": the module build
    forward: (ids, startPos) => champion.forward(ids, startPos),
    cachedLength: () => champion.nCached,                                 // positions [0, n) hold K/V
    reserve: (n) => champion.reserveKv(n),                                // K/V room for a request, grown once
    async decide(args) { return backend.decideNow(args); },
    readLogits: (n) => champion.readLogits(n),
    setBatchVariantFault: () => champion.setBatchVariantFault(),
    // synchronous twins (CPU work: nothing to wait for), which spare the orchestrator an event-loop hop
    forwardNow: (ids, startPos) => champion.forwardNow(ids, startPos),
    decideNow(args) {
      if (nanRows) {   // fault: decide on NaN rows (written where the logits live)
        nanRows = 0;
        champion.poisonLogits?.(args.nRows);
      }
      return champion.decideNow(args);
    },
    injectNaN(nRows) { nanRows = nRows; },
    // the CPU round in one call (cpu_session.mjs): request state once, then one record per round
    beginNow: (args) => champion.beginNow(args),
    roundNow: (args) => champion.roundNow(args),
    chainNow: (args) => champion.chainNow(args),    // up to h baseline steps, one call (cpu_chain)
    lastFailure: () => champion.lastFailure(),
    cpuDraft: () => champion.draft,
    /** The draft loaded into this champion's instance (one CPU module) -> the Draft. */
    async loadDraft({ modelUrl, configJson }) {
      // a request may be running (a background draft): its CPU session keeps the draft it began
      // with (none); the next beginNow builds one over this draft
      champion.draft = await createDraft({ modelUrl, configJson, instance: { exports: champion.wasm, memory: champion.memory } });
      return champion.draft;
    },
    loseDevice() { backend.lost = true; },
    memory: () => ({ category: "wasm_champion", peak: champion.memoryBytes, live: champion.memoryBytes, buffers_live: 0 }),
    // what the load held of the weights' file in JS memory at most (streamed: one tensor and a chunk)
    loadTransient: champion.transient ? { ...champion.transient.report(), streamed: true }
      : { peak: champion.artifactBytes ?? 0, largest_tensor: null, ratio: null, streamed: false },
    hardwareClass: () => `wasm-${champion.simd === "relaxed" ? "relaxed-simd" : "simd"}/threads-${champion.threads}/` +
      `${champion.matmulFunction}/cpu-${cpuBucket()}`,
    /** Threads in use and why (the plan, and a calibration's medians when there was one). */
    threads: () => ({ count: champion.threads, why: backend.threadsWhy }),
    threadsWhy: plan.why,
    threadsPlan: plan,                                                    // {count, calibrate, why}: thread_cache.mjs
    /** At load: every forward path warmed, then (threads "auto" with a pool) the thread count
     *  calibrated. -> {forwards_ms, calibrate_ms} */
    warmUp({ cachedThreads = null } = {}) {
      if (plan.calibrate) champion.setThreads(1);   // warm on the calling thread alone; calibrate after
      const forwardsMs = warmForwards(champion);
      if (!plan.calibrate) return { forwards_ms: forwardsMs, calibrate_ms: 0 };
      const t0 = performance.now();
      const spot = cachedThreads && spotCheckThreads(champion, cachedThreads);
      const medians = (ms) => Object.entries(ms).map(([n, m]) => `${n} thread${n === "1" ? "" : "s"} ${m}`).join(", ");
      if (spot?.kept) {
        backend.threadsWhy = `${plan.why}; cached (measured ${cachedThreads.measured_at}, ms per step: ${medians(cachedThreads.ms)}), ` +
          `a step now ${spot.ms} ms at ${cachedThreads.threads} (ratio ${spot.ratio}): ${cachedThreads.threads} kept`;
        return { forwards_ms: forwardsMs, calibrate_ms: performance.now() - t0, threads_cache: "hit" };
      }
      const c = calibrateThreads(champion);
      backend.threadsWhy = `${plan.why}; ms per step (a block of 1 + a block of 5), median of ${c.reps}: ${medians(c.ms)}: ${c.threads} kept` +
        (spot ? ` (the cached choice's spot check was off: ratio ${spot.ratio})` : "");
      return { forwards_ms: forwardsMs, calibrate_ms: performance.now() - t0, threads_measured: c,
        threads_cache: spot ? "stale" : "miss" };
    },
    close() { champion.destroy(); },
  };
  return backend;
}

/** Open the chosen backend; `kind` is "webgpu" or "wasm" (resolve "auto" first). */
export function openChampion(kind, opts) {
  return kind === "wasm" ? openWasm(opts) : openWebGpu(opts);
}
