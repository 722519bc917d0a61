// draft_worker.mjs — module worker around the WASM draft (web/draft/draft.mjs), speaking the
// envelope protocol of py/exactspec/protocol.json: {kind, request_id, seq, epoch, payload}.
//
//   new Worker(new URL("draft_worker.mjs?wasm=/web/build/draft.wasm&model=/web/models/draft/",
//              import.meta.url), {type: "module"})
//
// In:  "propose" {round_id, k, feed, start_pos, policy, seed: [lo, hi], stop_token_ids, context_ids}
//      "sync"    {committed_length, pending[, start_pos]}  adopt (request, epoch); feed the ids
//                `pending` at [start_pos ?? committed_length - pending.length, committed_length)
//                (prefill, = RunnerDraft.prefill); answered with the draft state
//      "cancel"  {}                              adopt its (newer) epoch; no answer
// Out: "progress" {stage: "ready" | ...}, "proposals" {round_id, tokens, p_draft, error_code, ms},
//      "sync" {committed_length, pending, n_cached, dropped_stale, ...}, "error" {code, message}.
// A message from an epoch older than the newest seen is dropped and counted (dropped_stale); so
// is a duplicate or out-of-order seq within the current (request, epoch). p_draft (Float32Array
// m*V) is transferred, not copied.
import { createDraft } from "./draft.mjs";

/** The protocol handler as a plain function of (draft, post): tests can drive it directly. */
export function createHandler(draftPromise, post) {
  const state = {
    requestId: null, epoch: 0, nextSeq: 0, seqOut: 0,
    droppedStale: 0, droppedOutOfOrder: 0, nTransferred: 0, nProposals: 0,
  };
  const reply = (env, kind, payload, transfer = []) =>
    post({ kind, request_id: env.request_id, seq: state.seqOut++, epoch: env.epoch, payload }, transfer);

  function admit(env) {
    if (env.epoch < state.epoch) { state.droppedStale++; return false; }
    if (env.epoch > state.epoch || env.request_id !== state.requestId) {
      state.epoch = env.epoch;
      state.requestId = env.request_id;
      state.nextSeq = 0;
    }
    if (env.seq < state.nextSeq) { state.droppedOutOfOrder++; return false; }
    state.nextSeq = env.seq + 1;
    return true;
  }

  function stats(draft) {
    return { n_cached: draft ? draft.nCached : 0, dropped_stale: state.droppedStale,
      dropped_out_of_order: state.droppedOutOfOrder, n_transferred: state.nTransferred,
      n_proposals: state.nProposals, epoch: state.epoch };
  }

  async function handle(env) {
    if (!env || typeof env !== "object" || typeof env.kind !== "string" || !Number.isInteger(env.epoch) ||
        !Number.isInteger(env.seq) || typeof env.request_id !== "string" || typeof env.payload !== "object") {
      post({ kind: "error", request_id: String(env?.request_id ?? ""), seq: state.seqOut++, epoch: state.epoch,
        payload: { code: "E_PROTOCOL", message: "malformed envelope" } });
      return;
    }
    if (!admit(env)) return;
    let draft;
    try {
      draft = await draftPromise;
    } catch (err) {
      reply(env, "error", { code: err.code ?? "E_DRAFT_LOST", message: String(err.message ?? err) });
      return;
    }
    const p = env.payload;
    try {
      if (env.kind === "cancel") return;
      if (env.kind === "sync") {
        const pending = p.pending ?? [];
        if (pending.length) {
          const start = p.start_pos ?? p.committed_length - pending.length;
          draft.forward(pending, start);
        }
        reply(env, "sync", { committed_length: p.committed_length, pending: [], ...stats(draft) });
        return;
      }
      if (env.kind === "propose") {
        const t0 = performance.now();
        const res = draft.propose({ feed: p.feed, startPos: p.start_pos, k: p.k, policy: p.policy,
          seed: p.seed, roundId: p.round_id, stopTokenIds: p.stop_token_ids ?? [], contextIds: p.context_ids ?? [] });
        const ms = performance.now() - t0;
        state.nProposals += res.tokens.length;
        const pDraft = res.pDraft;
        reply(env, "proposals", { round_id: p.round_id, tokens: Array.from(res.tokens), p_draft: pDraft,
          error_code: res.error_code, ms }, [pDraft.buffer]);
        if (pDraft.buffer.byteLength === 0) state.nTransferred++;   // detached: it moved, no copy
        return;
      }
      reply(env, "error", { code: "E_PROTOCOL", message: `draft worker cannot handle kind ${env.kind}` });
    } catch (err) {
      reply(env, "error", { code: err.code ?? "E_DRAFT_LOST", message: String(err.message ?? err) });
    }
  }

  let queue = Promise.resolve();       // one message at a time, in arrival order
  return { state, onMessage: (env) => { queue = queue.then(() => handle(env)); return queue; } };
}

/**
 * The other side of the protocol, for the page or the orchestrator worker:
 *   const draft = await DraftWorkerClient.create({ wasmUrl, modelUrl });
 *   await draft.forward(ids, startPos);            // prefill, via "sync"
 *   const { tokens, pDraft, error_code } = await draft.propose({ feed, startPos, k, policy, seed,
 *                                                               roundId, stopTokenIds, contextIds });
 *   draft.cancel();                                // newer epoch: queued older messages are dropped
 * Replies come back in request order (the worker handles one message at a time), so pending
 * calls wait in a FIFO; an "error" reply rejects the call it answers with {code, message}.
 */
export class DraftWorkerClient {
  static async create({ wasmUrl = "/web/build/draft.wasm", modelUrl = "/web/models/draft/", workerUrl } = {}) {
    const url = new URL(workerUrl ?? import.meta.url);
    url.searchParams.set("wasm", wasmUrl);
    url.searchParams.set("model", modelUrl);
    const worker = new Worker(url, { type: "module" });
    const ready = await new Promise((resolve, reject) => {
      worker.onmessage = (ev) => (ev.data.kind === "progress" ? resolve(ev.data.payload)
        : reject(Object.assign(new Error(ev.data.payload?.message ?? "draft worker failed"),
          { code: ev.data.payload?.code ?? "E_DRAFT_LOST" })));
      worker.onerror = (ev) => reject(Object.assign(new Error(ev.message), { code: "E_DRAFT_LOST" }));
    });
    return new DraftWorkerClient(worker, ready);
  }

  constructor(worker, ready) {
    this.worker = worker;
    this.vocabSize = ready.vocab_size;
    this.maxContext = ready.max_context;
    this.identity = ready.identity;
    this.requestId = "draft";
    this.epoch = 0;
    this.seq = 0;
    this.pending = [];                 // FIFO of {resolve, reject}
    worker.onmessage = (ev) => this._onReply(ev.data);
    worker.onerror = (ev) => this._failAll({ code: "E_DRAFT_LOST", message: ev.message });
  }

  _onReply(env) {
    const call = this.pending.shift();
    if (!call) return;
    if (env.kind === "error") call.reject(Object.assign(new Error(`${env.payload.code}: ${env.payload.message}`),
      { code: env.payload.code }));
    else call.resolve(env.payload);
  }

  _failAll(err) {
    for (const call of this.pending.splice(0)) call.reject(Object.assign(new Error(err.message), { code: err.code }));
  }

  _send(kind, payload) {
    const env = { kind, request_id: this.requestId, seq: this.seq++, epoch: this.epoch, payload };
    if (kind === "cancel") { this.worker.postMessage(env); return Promise.resolve(); }
    return new Promise((resolve, reject) => { this.pending.push({ resolve, reject }); this.worker.postMessage(env); });
  }

  /** feed ids at [startPos, startPos + n) (no logits come back: the orchestrator never needs them) */
  forward(ids, startPos) {
    return this._send("sync", { committed_length: startPos + ids.length, pending: Array.from(ids), start_pos: startPos });
  }

  async propose({ feed, startPos, k, policy, seed, roundId = 0, stopTokenIds = [], contextIds = [] }) {
    const p = await this._send("propose", { round_id: roundId, k, feed: Array.from(feed), start_pos: startPos, policy,
      seed: Array.from(seed), stop_token_ids: Array.from(stopTokenIds), context_ids: Array.from(contextIds) });
    return { tokens: Int32Array.from(p.tokens), pDraft: p.p_draft, error_code: p.error_code, ms: p.ms };
  }

  cancel() {
    this.epoch += 1;
    this.seq = 0;
    return this._send("cancel", {});
  }

  terminate() {
    this._failAll({ code: "E_DRAFT_LOST", message: "draft worker terminated" });
    this.worker.terminate();
  }
}

const inWorker = typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope;
if (inWorker) {
  const params = new URL(self.location.href).searchParams;
  const post = (msg, transfer) => self.postMessage(msg, transfer);
  const draftPromise = createDraft({
    wasmUrl: new URL(params.get("wasm") ?? "../build/draft.wasm", self.location.href).href,
    modelUrl: new URL(params.get("model") ?? "../models/draft/", self.location.href).href,
  });
  const handler = createHandler(draftPromise, post);
  self.onmessage = (ev) => handler.onMessage(ev.data);
  draftPromise.then(
    (d) => post({ kind: "progress", request_id: "", seq: handler.state.seqOut++, epoch: 0,
      payload: { stage: "ready", vocab_size: d.vocabSize, max_context: d.maxContext,
        identity: d.identity } }, []),
    (err) => post({ kind: "error", request_id: "", seq: handler.state.seqOut++, epoch: 0,
      payload: { code: err.code ?? "E_MODEL_LOAD", message: String(err.message ?? err) } }, []));
}
