// champion_thread.mjs — one helper thread of the WASM champion's pool (cpu_mt.wasm): a
// module worker (browser) or a worker_threads worker (Node). It receives {module, memory, index,
// stackTop}, instantiates the module over the shared memory with its own stack and runs
// champion_worker(index), which returns when the pool stops (docs/champion_wasm.md, Threads).
import { cpuImports } from "./cpu_module.mjs";

function run({ module, memory, index, stackTop }) {
  const instance = new WebAssembly.Instance(module, cpuImports(memory));
  instance.exports.__stack_pointer.value = stackTop;     // this thread's own stack in the shared memory
  instance.exports.champion_worker(index);               // blocks until champion_threads_stop()
}

if (typeof process !== "undefined" && process.versions?.node) {
  const { parentPort } = await import("node:worker_threads");
  parentPort.once("message", (msg) => { run(msg); parentPort.close(); });
} else {
  self.onmessage = (event) => { run(event.data); self.close(); };
}
