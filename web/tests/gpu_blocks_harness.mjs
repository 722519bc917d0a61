// Test harness for tests/test_gpu_blocks.py: quantize_act + one q8act matmul on given bytes (base64 I/O).
import { bindGroups, metaBuffer, packMeta, readBuffer, requestDevice, storageBuffer } from "../gpu/device.mjs";
import { compileQmatmulPipelines, hasDot4, QOPS } from "../gpu/qmatmul.mjs";

const fromB64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
function toB64(buffer) {
  const bytes = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

let device = null;
const paths = {};          // "dot4" | "unpack" -> compiled pipelines

async function pipelinesFor(dot4) {
  device ??= await requestDevice();
  const key = dot4 ? "dot4" : "unpack";
  paths[key] ??= await compileQmatmulPipelines(device, { dot4 });
  return paths[key].pipelines;
}

/** What the page offers: the WGSL language features and whether dot4 is the default path. */
async function features() {
  return { wgsl: [...navigator.gpu.wgslLanguageFeatures], dot4: hasDot4() };
}

/** One submission: quantize_act of x (n, cols) f32, then the format's matmul into y (n, stride)
 *  at column row0 (y starts as `y0` when given, else zeros; `accumulate` adds). `weight` = the
 *  raw bytes (ROWQ8: int8 rows), `scale` = ROWQ8's row scales; buffers sized for `maxBlock`
 *  positions as the champion's are. Returns base64 y (n, stride), qx (n, cols) int8, xb (n, cols/32, 2). */
async function run({ format, dot4, n, rows, cols, weight, scale = null, x, y0 = null, stride = rows, row0 = 0,
                     accumulate = false, maxBlock = n }) {
  const p = await pipelinesFor(dot4);
  device.pushErrorScope("validation");
  const w = fromB64(weight);
  const wBuf = storageBuffer(device, w.byteLength + 4, w);
  const sBuf = scale === null ? null : storageBuffer(device, fromB64(scale).byteLength, fromB64(scale));
  const xBuf = storageBuffer(device, maxBlock * cols * 4, fromB64(x));
  const qxBuf = storageBuffer(device, maxBlock * cols);
  const xbBuf = storageBuffer(device, maxBlock * (cols / 32) * 8);
  const yBuf = storageBuffer(device, maxBlock * stride * 4, y0 === null ? null : fromB64(y0));
  const metas = metaBuffer(device, 2);
  const words = packMeta(QOPS.quantize_act({ n, cols }).meta, new ArrayBuffer(512), 0);
  packMeta(QOPS.qmatmul({ n, rows, cols, accumulate, stride, row0 }).meta, words, 1);
  device.queue.writeBuffer(metas, 0, words);
  const qa = bindGroups(device, p.quantize_act, [xBuf, qxBuf, xbBuf], metas, 0);
  const mm = bindGroups(device, p[format], [wBuf, ...(sBuf ? [sBuf] : []), qxBuf, xbBuf, yBuf], metas, 1);
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(p.quantize_act);
  pass.setBindGroup(0, qa[0]);
  pass.setBindGroup(1, qa[1]);
  pass.dispatchWorkgroups(...QOPS.quantize_act({ n, cols }).grid);
  pass.setPipeline(p[format]);
  pass.setBindGroup(0, mm[0]);
  pass.setBindGroup(1, mm[1]);
  pass.dispatchWorkgroups(...QOPS.qmatmul({ n, rows, cols }).grid);
  pass.end();
  device.queue.submit([enc.finish()]);
  const out = {
    y: toB64(await readBuffer(device, yBuf, n * stride * 4)),
    qx: toB64(await readBuffer(device, qxBuf, n * cols)),
    xb: toB64(await readBuffer(device, xbBuf, n * (cols / 32) * 8)),
  };
  const err = await device.popErrorScope();
  [wBuf, sBuf, xBuf, qxBuf, xbBuf, yBuf, metas].forEach((b) => b?.destroy());
  if (err) throw new Error(`WebGPU validation: ${err.message}`);
  return out;
}

/** The block gather of `format` on one piece of embedding rows [row0, row0 + rows) (raw bytes
 *  `weight`): x (n, hidden) starts as `x0` (rows of tokens outside the piece keep it). Returns base64 x. */
async function gather({ format, n, hidden, rows, row0 = 0, weight, ids, x0 }) {
  const p = await pipelinesFor(true);
  device.pushErrorScope("validation");
  const w = fromB64(weight);
  const wBuf = storageBuffer(device, w.byteLength + 4, w);
  const idBuf = storageBuffer(device, n * 4, Uint32Array.from(ids));
  const xBuf = storageBuffer(device, n * hidden * 4, fromB64(x0));
  const metas = metaBuffer(device, 1);
  const op = QOPS.embed_gather_blocks({ n, hidden, vocab: rows, row0 });
  device.queue.writeBuffer(metas, 0, packMeta(op.meta));
  const [g0, g1] = bindGroups(device, p.gather[format], [wBuf, idBuf, xBuf], metas, 0);
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(p.gather[format]);
  pass.setBindGroup(0, g0);
  pass.setBindGroup(1, g1);
  pass.dispatchWorkgroups(...op.grid);
  pass.end();
  device.queue.submit([enc.finish()]);
  const out = toB64(await readBuffer(device, xBuf, n * hidden * 4));
  const err = await device.popErrorScope();
  [wBuf, idBuf, xBuf, metas].forEach((b) => b.destroy());
  if (err) throw new Error(`WebGPU validation: ${err.message}`);
  return out;
}

/** ms per linear (best of `tries`, `reps` in one submission) at (n, rows, cols): quantize_act +
 *  the format's qmatmul on each path, and the float kernel matmul_q8 on int8 rows (random bytes:
 *  timing only, nothing is read back). tools/bench/gpu_qmatmul.py drives it. */
async function bench({ format, n, rows, cols, reps = 10, tries = 3 }) {
  device ??= await requestDevice();
  const { createPipelines } = await import("../gpu/device.mjs");
  const { qmatmulWeightBytes } = await import("../gpu/qmatmul.mjs");
  paths.float ??= await createPipelines(device, new URL("../../shaders/", import.meta.url), ["matmul_q8"]);
  const random = (bytes) => { const a = new Uint8Array(bytes); for (let i = 0; i < bytes; i++) a[i] = (i * 2654435761) >>> 24; return a; };
  const wq = storageBuffer(device, qmatmulWeightBytes(format, rows, cols) + 4, random(qmatmulWeightBytes(format, rows, cols)));
  const w8 = storageBuffer(device, rows * cols, random(rows * cols));
  const s = storageBuffer(device, rows * 4, new Float32Array(rows).fill(1e-3));
  const x = storageBuffer(device, n * cols * 4, new Float32Array(n * cols).map((_, i) => Math.sin(i)));
  const qx = storageBuffer(device, n * cols), xb = storageBuffer(device, n * (cols / 32) * 8), y = storageBuffer(device, n * rows * 4);
  const metas = metaBuffer(device, 3);
  const { OPS } = await import("../gpu/champion.mjs");
  const words = packMeta(QOPS.quantize_act({ n, cols }).meta, new ArrayBuffer(768), 0);
  packMeta(QOPS.qmatmul({ n, rows, cols }).meta, words, 1);
  packMeta(OPS.matmul_q8({ n, rows, cols }).meta, words, 2);
  device.queue.writeBuffer(metas, 0, words);
  const time = async (encode) => {
    let best = Infinity;
    for (let t = 0; t < tries; t++) {
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      for (let r = 0; r < reps; r++) encode(pass);
      pass.end();
      const t0 = performance.now();
      device.queue.submit([enc.finish()]);
      await device.queue.onSubmittedWorkDone();
      best = Math.min(best, (performance.now() - t0) / reps);
    }
    return best;
  };
  const dispatch = (pass, pipeline, groups, grid) => { pass.setPipeline(pipeline); pass.setBindGroup(0, groups[0]); pass.setBindGroup(1, groups[1]); pass.dispatchWorkgroups(...grid); };
  const out = {};
  for (const dot4 of [true, false]) {
    const p = await pipelinesFor(dot4);
    const qa = bindGroups(device, p.quantize_act, [x, qx, xb], metas, 0);
    const mm = bindGroups(device, p[format], [format === "ROWQ8" ? w8 : wq, ...(format === "ROWQ8" ? [s] : []), qx, xb, y], metas, 1);
    out[dot4 ? "dot4" : "unpack"] = await time((pass) => {
      dispatch(pass, p.quantize_act, qa, QOPS.quantize_act({ n, cols }).grid);
      dispatch(pass, p[format], mm, QOPS.qmatmul({ n, rows, cols }).grid);
    });
  }
  const fq = bindGroups(device, paths.float.matmul_q8, [w8, s, x, y], metas, 2);
  out.matmul_q8 = await time((pass) => dispatch(pass, paths.float.matmul_q8, fq, OPS.matmul_q8({ n, rows, cols }).grid));
  [wq, w8, s, x, qx, xb, y, metas].forEach((b) => b.destroy());
  return out;
}

window.harness = { features, run, gather, bench };
window.harnessReady = true;
