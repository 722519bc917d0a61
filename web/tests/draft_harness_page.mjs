// draft_harness_page.mjs — page script of web/tests/draft_harness.html (window.draftHarness);
// kept apart from draft_harness.mjs, which also runs under Node.
import { createDraft } from "../draft/draft.mjs";
import { runCases, timePropose, toBase64, fromBase64 } from "./draft_harness.mjs";
import { DraftWorkerClient } from "../draft/draft_worker.mjs";

// start the draft worker and collect every message it sends (tests read window.workerLog)
function startWorker(wasm, model) {
  const url = new URL(`../draft/draft_worker.mjs?wasm=${encodeURIComponent(wasm)}&model=${encodeURIComponent(model)}`,
    import.meta.url);
  const worker = new Worker(url, { type: "module" });
  const log = [];
  worker.onmessage = (ev) => log.push(ev.data);
  worker.onerror = (ev) => log.push({ kind: "worker_error", payload: { message: ev.message } });
  return { worker, log };
}

window.draftHarness = { createDraft, runCases, timePropose, toBase64, fromBase64, startWorker, DraftWorkerClient };
window.harnessReady = true;
