// qmatmul_harness.mjs — the CPU module's matmul test hook champion_qmatmul (wasm/qmatmul.c, the
// q8act-v1 function of docs/quant_kernels.md) on given weights and inputs, for tests/test_qmatmul.py
// (Node), which compares every output bit with the NumPy twin (py/exactspec/twins/qmatmul_twins.py):
//
//   node web/tests/qmatmul_harness.mjs cases.json out.json
//
// cases.json: {wasm, threads, cases: [{fmt, n, rows, cols, w, scale, x}]}: w the raw weight bytes
// (fmt's layout), scale (rows,) float32 or null, x (n, cols) float32, each base64. threads > 1:
// cpu_mt.wasm with a pool of threads - 1 helpers (champion_thread.mjs), started before any model as
// the champion starts it. No model is built: the hook works on its own.
// -> {exports: bool (the module has champion_qmatmul), threads, results: [{status, out, guard_ok}]}:
// out (n, rows) float32 as base64 when status is 0, else ""; guard_ok: the GUARD bytes after the
// output are as they were (nothing written past n * rows).
import { readFileSync, writeFileSync } from "node:fs";
import { Worker } from "node:worker_threads";
import { cpuImports, isThreadedModule } from "../champion_wasm/cpu_module.mjs";

const HELPER_STACK_BYTES = 256 * 1024;       // champion_wasm.mjs's
const POOL_START_MS = 20_000;
const GUARD = 64;                            // bytes after the output that must stay 0x5A

const [, , casesPath, outPath] = process.argv;
const spec = JSON.parse(readFileSync(casesPath, "utf8"));
const threads = spec.threads ?? 1;
const module = await WebAssembly.compile(readFileSync(spec.wasm));
const memory = isThreadedModule(module) ? new WebAssembly.Memory({ initial: 256, maximum: 65536, shared: true }) : null;
const instance = await WebAssembly.instantiate(module, cpuImports(memory));
const e = instance.exports;
const mem = () => (memory ?? e.memory).buffer;

function alloc(nbytes) {
  const ptr = e.champion_alloc(Math.max(16, nbytes));
  if (!ptr) throw new Error(`champion_alloc(${nbytes}) refused`);
  return ptr;
}

function bytesOf(b64) { return new Uint8Array(Buffer.from(b64, "base64")); }

const out = { exports: typeof e.champion_qmatmul === "function", threads, results: [] };
const workers = [];
if (out.exports) {
  if (threads > 1) {
    if (!memory) throw new Error(`threads ${threads}: ${spec.wasm} is the one-thread build`);
    const url = new URL("../champion_wasm/champion_thread.mjs", import.meta.url);
    for (let index = 1; index < threads; index++) {
      const stackTop = (alloc(HELPER_STACK_BYTES) + HELPER_STACK_BYTES) & ~15;
      const worker = new Worker(url);
      worker.postMessage({ module, memory, index, stackTop });
      workers.push(new Promise((resolve, reject) => { worker.on("exit", resolve); worker.on("error", reject); }));
    }
    const t0 = Date.now();
    while (e.champion_threads_ready() < threads - 1) {
      if (Date.now() - t0 > POOL_START_MS) throw new Error(`only ${e.champion_threads_ready()} helpers started`);
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
    const status = e.champion_threads_start(threads);
    if (status !== 0) throw new Error(`champion_threads_start(${threads}): status ${status}`);
  }
  // one set of buffers, as large as the largest case needs (the arena never frees)
  const need = (key) => Math.max(16, ...spec.cases.map((c) => (c[key] ? Buffer.from(c[key], "base64").length : 0)));
  const wCap = need("w"), sCap = need("scale"), xCap = need("x");
  const oCap = Math.max(16, ...spec.cases.map((c) => 4 * c.n * c.rows));
  const wPtr = alloc(wCap), sPtr = alloc(sCap), xPtr = alloc(xCap), oPtr = alloc(oCap + GUARD);
  for (const c of spec.cases) {
    const w = bytesOf(c.w), x = bytesOf(c.x);
    new Uint8Array(mem(), wPtr, w.length).set(w);
    new Uint8Array(mem(), xPtr, x.length).set(x);
    if (c.scale) { const s = bytesOf(c.scale); new Uint8Array(mem(), sPtr, s.length).set(s); }
    new Uint8Array(mem(), oPtr, 4 * c.n * c.rows).fill(0xA5);   // a result not written shows
    new Uint8Array(mem(), oPtr + 4 * c.n * c.rows, GUARD).fill(0x5A);
    // the weights' load-time check (a non-finite f16 scale: E_MODEL_LOAD), then the matmul
    const checked = e.champion_qmatmul_check ? e.champion_qmatmul_check(c.fmt, wPtr, c.rows, c.cols) : 0;
    const status = checked === 0 || checked === 2 ? e.champion_qmatmul(c.fmt, wPtr, c.scale ? sPtr : 0, xPtr, c.n, c.rows, c.cols, oPtr) : checked;
    const result = status === 0 ? Buffer.from(new Uint8Array(mem(), oPtr, 4 * c.n * c.rows).slice()).toString("base64") : "";
    const guardOk = new Uint8Array(mem(), oPtr + 4 * c.n * c.rows, GUARD).every((b) => b === 0x5A);
    out.results.push({ status, out: result, guard_ok: guardOk });
  }
  if (threads > 1) {
    e.champion_threads_stop();
    await Promise.all(workers);
  }
}
writeFileSync(outPath, JSON.stringify(out));
