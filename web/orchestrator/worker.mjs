// Orchestrator worker: Pyodide runs the rounds (exactspec.pyodide.browser_backend); the champion and the
// acceptance kernels run on WebGPU here; the draft runs in its own WASM worker. The protocol
// logic is handler.mjs (a plain function, tested with a mock runtime); this file only wires it
// to the Pyodide runtime (runtime.mjs) and to postMessage.
import { createOrchestratorHandler } from "./handler.mjs";
import { createPyodideRuntime } from "./runtime.mjs";
import { loadSchema } from "../protocol.mjs";
import { installWorkerFetch } from "../fetch_progress.mjs";
import { receive } from "./mailbox.mjs";

// No top-level await: a message posted while this module is still evaluating would be lost.
const post = (env) => self.postMessage(env);
let handler = null;
const fetchHooks = installWorkerFetch();   // byte progress of every load, and local model files
const handlerReady = loadSchema().then(({ validate, codes }) => {
  const runtime = createPyodideRuntime({ counters: () => ({ orchestrator: handler.state.droppedStale }), post, fetchHooks });
  handler = createOrchestratorHandler({ runtime, post, validate, codes });
  return handler;
});
handlerReady.catch((err) => post({ kind: "error", request_id: "", seq: 0, epoch: 0,
  payload: { code: err.code ?? "E_MODEL_LOAD", message: String(err.message ?? err), fatal: true } }));

// the page's mailbox (mailbox.mjs) is taken here; every other message is counted received first
self.onmessage = (ev) => { if (!receive(ev.data)) handlerReady.then((h) => h.onMessage(ev.data)); };
