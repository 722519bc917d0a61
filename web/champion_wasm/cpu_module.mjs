// cpu_module.mjs — instantiating the CPU module (web/build/cpu.wasm | cpu_mt.wasm: wasm/champion.c +
// draft.c + cpu.c over one memory): the imports every instance needs (the clock of the CPU round's
// timing words; the shared memory of the threaded build), and the status table both halves use.
import { wasmStatusCode } from "../wasm_status.mjs";
import { codedError } from "../protocol.mjs";

/** The import object of one instance: env.cpu_now_ms (ms, performance.now()), and env.memory
 *  for the threaded build (an imported shared memory). */
export function cpuImports(memory = null) {
  const env = { cpu_now_ms: () => performance.now() };
  if (memory) env.memory = memory;
  return { env };
}

/** Whether a compiled module is the threaded build (it imports its memory). */
export function isThreadedModule(module) {
  return WebAssembly.Module.imports(module).some((i) => i.kind === "memory");
}

/** A nonzero status of an export as a coded error: the code from protocol.json's wasm_status
 *  table (web/wasm_status.mjs), the same for the champion and the draft half. */
export function statusError(status, what) {
  return codedError(wasmStatusCode(status) || "E_INTERNAL", `${what} failed (status ${status})`);
}
