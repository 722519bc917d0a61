// Test harness: runs single kernels and the whole champion for tests/test_gpu_champion.py (base64 I/O).
import { bindGroups, createPipelines, metaBuffer, packMeta, readBuffer, requestDevice, storageBuffer } from "../gpu/device.mjs";
import { createChampion, KERNELS, OPS } from "../gpu/champion.mjs";

const fromB64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
function toB64(buffer) {
  const bytes = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

let device = null, pipelines = null, champion = null;

async function init() {
  if (!device) {
    device = await requestDevice();
    pipelines = await createPipelines(device, new URL("../../shaders/", import.meta.url), KERNELS);
  }
  return { kernels: KERNELS };
}

/** Run one kernel: `tensors` lists its group-0 bindings in order, each {b64} (contents) or
 *  {bytes} (zero-filled); returns the base64 contents of the bindings listed in `read`. */
async function runKernel(name, dims, tensors, read) {
  await init();
  device.pushErrorScope("validation");
  const bufs = tensors.map((t) => (t.b64 !== undefined
    ? storageBuffer(device, fromB64(t.b64).byteLength, fromB64(t.b64)) : storageBuffer(device, t.bytes)));
  const { meta, grid } = OPS[name](dims);
  const metas = metaBuffer(device, 1);
  device.queue.writeBuffer(metas, 0, packMeta(meta));
  const [g0, g1] = bindGroups(device, pipelines[name], bufs, metas);
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipelines[name]);
  pass.setBindGroup(0, g0);
  pass.setBindGroup(1, g1);
  pass.dispatchWorkgroups(...grid);
  pass.end();
  device.queue.submit([enc.finish()]);
  const out = [];
  for (const i of read) out.push(toB64(await readBuffer(device, bufs[i], bufs[i].size)));
  const err = await device.popErrorScope();
  bufs.forEach((b) => b.destroy());
  metas.destroy();
  if (err) throw new Error(`WebGPU validation: ${err.message}`);
  return out;
}

/** ms per dispatch of one kernel on given buffers: `reps` dispatches in one submission, best
 *  of `tries` (kernel tuning; results are not read back). */
async function benchKernel(name, dims, tensors, reps = 20, tries = 5) {
  await init();
  const bufs = tensors.map((t) => (t.b64 !== undefined
    ? storageBuffer(device, fromB64(t.b64).byteLength, fromB64(t.b64)) : storageBuffer(device, t.bytes)));
  const { meta, grid } = OPS[name](dims);
  const metas = metaBuffer(device, 1);
  device.queue.writeBuffer(metas, 0, packMeta(meta));
  const [g0, g1] = bindGroups(device, pipelines[name], bufs, metas);
  let best = Infinity;
  for (let t = 0; t < tries; t++) {
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipelines[name]);
    pass.setBindGroup(0, g0);
    pass.setBindGroup(1, g1);
    for (let r = 0; r < reps; r++) pass.dispatchWorkgroups(...grid);
    pass.end();
    const t0 = performance.now();
    device.queue.submit([enc.finish()]);
    await device.queue.onSubmittedWorkDone();
    best = Math.min(best, (performance.now() - t0) / reps);
  }
  bufs.forEach((b) => b.destroy());
  metas.destroy();
  return best;
}

/** options: {maxBindingBytes, memoryBudgetBytes} of createChampion. The previous champion is freed. */
async function loadChampion(modelUrl, maxBlock, maxContext, options = {}) {
  await init();
  champion?.destroy();
  champion = null;
  const t0 = performance.now();
  champion = await createChampion({ device, modelUrl, maxBlock, maxContext, pipelinesPromise: Promise.resolve(pipelines), ...options });
  return { loadMs: performance.now() - t0, vocabSize: champion.vocabSize, maxContext: champion.maxContext,
           identity: champion.identity, phases: champion.loadMs, pieces: champion.pieces, memoryPlan: champion.memoryPlan };
}

/** The adapter's limits that decide splitting, and the plan of a config (a config.json object,
 *  validated here as the engine's model check would) that is never loaded (real-size shapes: no
 *  weights are fetched or allocated). */
async function planFor(config, forms, maxBlock, maxContext, maxBindingBytes = 0) {
  await init();
  const { gpuHyperParameters, resolveMaxContext } = await import("../formats/model_config.mjs");
  const { validateConfig } = await import("../formats/model_checks.mjs");
  const { bindingLimit, planChampion } = await import("../gpu/champion_plan.mjs");
  const hp = gpuHyperParameters(validateConfig(config));
  const limit = bindingLimit(device.limits, maxBindingBytes);
  const plan = planChampion(hp, forms, { maxBlock, maxContext: resolveMaxContext(hp, maxContext), limit });   // the override as the device's limit
  return { limit, maxStorageBufferBindingSize: device.limits.maxStorageBufferBindingSize, maxBufferSize: device.limits.maxBufferSize,
           pieces: Object.fromEntries(Object.entries(plan.pieces).map(([k, v]) => [k, v && v.map((p) => [p.row0, p.rows])])),
           bytes: plan.bytes };
}

/** transformers-style inverse RoPE frequencies the champion computes for a config.json object (float64 values). */
async function ropeInvFreq(config) {
  const { ropeInvFreq: inv } = await import("../formats/model_config.mjs");
  const { validateConfig } = await import("../formats/model_checks.mjs");
  return Array.from(inv(validateConfig(config)));
}

/** Forward blocks in order ([[ids, startPos], ...]); returns base64 logits of each block. */
async function forwardBlocks(blocks) {
  const out = [];
  for (const [ids, startPos] of blocks) {
    await champion.forward(Int32Array.from(ids), startPos);
    out.push(toB64((await champion.readLogits(ids.length)).buffer));
  }
  return out;
}

/** Min and median ms of `reps` (forward(n tokens at startPos) + readLogits(n)) round trips per n. */
async function timeForward(ns, startPos, reps) {
  const result = {};
  for (const n of ns) {
    const ms = [];
    for (let r = 0; r < reps + 1; r++) {
      const ids = Int32Array.from({ length: n }, (_, i) => (7 + 13 * i) % champion.vocabSize);
      const t0 = performance.now();
      await champion.forward(ids, startPos);
      await champion.readLogits(n);
      if (r > 0) ms.push(performance.now() - t0);   // the first run warms up
    }
    ms.sort((a, b) => a - b);
    result[n] = { min: ms[0], median: ms[Math.floor(ms.length / 2)] };
  }
  return result;
}

/** Per-kernel ms of one forward of n tokens at startPos (each dispatch submitted alone). */
async function profile(n, startPos) {
  return champion.profile(n, startPos);
}

window.harness = { init, runKernel, benchKernel, loadChampion, planFor, ropeInvFreq, forwardBlocks, timeForward, profile };
window.harnessReady = true;
