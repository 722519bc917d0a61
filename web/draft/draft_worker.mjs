// draft_worker.mjs — module worker around the WASM draft (web/draft/draft.mjs), speaking the
// envelope protocol of py/exactspec/core/protocol.json: {kind, request_id, seq, epoch, payload}.
//
//   new Worker(new URL("draft_worker.mjs?wasm=/web/build/cpu.wasm&model=/web/models/draft/",
//              import.meta.url), {type: "module"})
//
// In:  "propose" {round_id, k, feed, start_pos, policy, seed: [lo, hi], stop_token_ids, context_from,
//                 context_tail[, first_step, mask_bits]}   the committed context is sent once and then
//                 only what it grew by: context_from 0 starts it over, else it must equal the length
//                 the worker holds (E_PROTOCOL otherwise), so a round's message is O(k), not O(context);
//                 first_step (default 0) and mask_bits (Uint32Array ceil(V / 32) or null) are
//                 draft.mjs propose's firstStep and maskBits
//      "sync"    {committed_length, pending[, start_pos]}  adopt (request, epoch); feed the ids
//                `pending` at [start_pos ?? committed_length - pending.length, committed_length)
//                (prefill, = RunnerDraft.prefill); answered with the draft state
//      "cancel"  {}                              adopt its (newer) epoch; no answer
//      "fault"   {action: "nan_next"}            tests: the next propose computes NaN logits
// Out: "progress" {stage: "ready" | "fault_armed"}, "proposals" {round_id, tokens, p_draft,
//      error_code, ms}, "sync" {committed_length, pending, n_cached, dropped_stale, ...},
//      "error" {code, message}. Every reply's payload carries in_reply_to (the seq it answers)
//      and memory_bytes (the WASM memory size), and the epoch of the message it answers.
// A message from an epoch older than the newest seen is dropped and counted (dropped_stale); so
// is a duplicate or out-of-order seq within the current (request, epoch): it gets no answer,
// and the client (which moved to the newer epoch first) has already settled its call.
// p_draft (Float32Array m*V) is transferred, not copied.
import { createDraft } from "./draft.mjs";
import { weightCacheFetch } from "../weight_cache.mjs";

/** The protocol handler as a plain function of (draft, post): tests can drive it directly. */
export function createHandler(draftPromise, post) {
  const state = {
    requestId: null, epoch: 0, nextSeq: 0, seqOut: 0,
    droppedStale: 0, droppedOutOfOrder: 0, nTransferred: 0, nProposals: 0,
    context: [],                       // the committed context, as the propose messages built it
  };
  let memoryBytes = 0;
  const reply = (env, kind, payload, transfer = []) =>
    post({ kind, request_id: env.request_id, seq: state.seqOut++, epoch: env.epoch,
      payload: { ...payload, in_reply_to: env.seq, memory_bytes: memoryBytes, dropped_stale: state.droppedStale } }, transfer);

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
    memoryBytes = draft.memoryBytes;
    const p = env.payload;
    try {
      if (env.kind === "cancel") return;
      if (env.kind === "fault") {
        if (p.action !== "nan_next") throw Object.assign(new Error(`unknown fault ${p.action}`), { code: "E_BAD_ARGUMENT" });
        draft.injectNaNOnce();
        reply(env, "progress", { stage: "fault_armed" });
        return;
      }
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
        const from = p.context_from ?? 0;
        if (from !== 0 && from !== state.context.length) {
          throw Object.assign(new Error(`context_from ${from}, but the worker holds ${state.context.length} ids`), { code: "E_PROTOCOL" });
        }
        if (from === 0) state.context = [];
        for (const id of p.context_tail ?? []) state.context.push(id);
        const res = draft.propose({ feed: p.feed, startPos: p.start_pos, k: p.k, policy: p.policy,
          seed: p.seed, roundId: p.round_id, stopTokenIds: p.stop_token_ids ?? [], contextIds: state.context,
          firstStep: p.first_step ?? 0, maskBits: p.mask_bits ?? null });
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
 * The other side of the protocol, for the orchestrator worker (or a page):
 *   const draft = await DraftWorkerClient.create({ wasmUrl, modelUrl });
 *   draft.setEpoch(e);                             // the request's epoch; a newer one cancels
 *   await draft.forward(ids, startPos);            // prefill, via "sync"
 *   const { tokens, pDraft, error_code } = await draft.propose({ feed, startPos, k, policy, seed,
 *                                                               roundId, stopTokenIds, contextIds,
 *                                                               firstStep, maskBits });   // optional
 *   draft.kill(); draft.terminate();               // fault injection / release
 * Calls are matched to replies by seq (payload.in_reply_to). Moving to a newer epoch settles
 * every call of the old one at once with E_CANCELLED (the worker drops those messages, or its
 * late replies, which arrive with the old epoch, are dropped and counted here). A worker that
 * errors, is killed, or does not answer within callTimeoutMs is dead: its calls and all later
 * ones fail with E_DRAFT_LOST (E_TIMEOUT for the timeout), and the owner makes a new client.
 */
export class DraftWorkerClient {
  static async create({ wasmUrl = new URL("../build/cpu.wasm", import.meta.url).href,
    modelUrl = new URL("../models/draft/", import.meta.url).href, configJson = null, workerUrl,
    callTimeoutMs = 60000, cache = false } = {}) {
    const url = new URL(workerUrl ?? import.meta.url);
    url.searchParams.set("wasm", wasmUrl);
    url.searchParams.set("model", modelUrl);
    if (cache) url.searchParams.set("cache", "1");   // its weights through the weight cache (web/weight_cache.mjs)
    // the validated config from the engine's model check (a few hundred bytes): no second fetch of config.json
    if (configJson) url.searchParams.set("config", JSON.stringify(configJson));
    const worker = new Worker(url, { type: "module" });
    let ready;
    try {
      ready = await new Promise((resolve, reject) => {
        worker.onmessage = (ev) => (ev.data.kind === "progress" ? resolve(ev.data.payload)
          : reject(Object.assign(new Error(`${ev.data.payload?.code ?? "E_DRAFT_LOST"}: ${ev.data.payload?.message ?? "draft worker failed"}`),
            { code: ev.data.payload?.code ?? "E_DRAFT_LOST", cacheEvicted: ev.data.payload?.cache_evicted === true })));
        worker.onerror = (ev) => reject(Object.assign(new Error(`E_DRAFT_LOST: ${ev.message || "draft worker failed to start"}`),
          { code: "E_DRAFT_LOST" }));
      });
    } catch (err) {
      worker.terminate();
      throw err;
    }
    return new DraftWorkerClient(worker, ready, callTimeoutMs);
  }

  constructor(worker, ready, callTimeoutMs = 60000) {
    this.worker = worker;
    this.vocabSize = ready.vocab_size;
    this.maxContext = ready.max_context;
    this.identity = ready.identity;
    this.artifactBytes = ready.artifact_bytes;
    this.memoryBytes = ready.memory_bytes ?? 0;
    this.requestId = "draft";
    this.epoch = 0;
    this.seq = 0;
    this.callTimeoutMs = callTimeoutMs;
    this.pending = new Map();          // seq -> {resolve, reject, timer}
    this.droppedStale = 0;             // replies of an older epoch (or unknown seq) dropped here
    this.workerDroppedStale = 0;       // the worker's own count, as last reported
    this.dead = null;                  // {code, message} once unusable
    worker.onmessage = (ev) => this._onReply(ev.data);
    worker.onerror = (ev) => this._die("E_DRAFT_LOST", `draft worker failed: ${ev.message || "error event"}`);
  }

  _onReply(env) {
    const p = env?.payload ?? {};
    if (Number.isInteger(p.memory_bytes)) this.memoryBytes = p.memory_bytes;
    if (Number.isInteger(p.dropped_stale)) this.workerDroppedStale = p.dropped_stale;
    const call = env?.epoch === this.epoch ? this.pending.get(p.in_reply_to) : undefined;
    if (!call) { this.droppedStale++; return; }
    this.pending.delete(p.in_reply_to);
    clearTimeout(call.timer);
    if (env.kind === "error") call.reject(Object.assign(new Error(`${p.code}: ${p.message}`), { code: p.code }));
    else call.resolve(p);
  }

  _settleAll(code, message) {
    for (const call of this.pending.values()) {
      clearTimeout(call.timer);
      call.reject(Object.assign(new Error(`${code}: ${message}`), { code }));
    }
    this.pending.clear();
  }

  _die(code, message) {
    if (this.dead) return;
    this.dead = { code, message };
    this._settleAll(code, message);
    this.worker.terminate();
  }

  _send(kind, payload) {
    if (this.dead) return Promise.reject(Object.assign(new Error(`${this.dead.code}: ${this.dead.message}`), { code: this.dead.code }));
    const seq = this.seq++;
    const env = { kind, request_id: this.requestId, seq, epoch: this.epoch, payload };
    if (kind === "cancel") { this.worker.postMessage(env); return Promise.resolve(); }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => this._die("E_TIMEOUT", `draft worker did not answer ${kind} within ${this.callTimeoutMs} ms`),
        this.callTimeoutMs);
      this.pending.set(seq, { resolve, reject, timer });
      this.worker.postMessage(env);
    });
  }

  /** Adopt the request's epoch; moving forward cancels every call of the older epoch. */
  setEpoch(epoch) {
    if (epoch <= this.epoch) return;
    this.epoch = epoch;
    this.seq = 0;
    this._settleAll("E_CANCELLED", `superseded by epoch ${epoch}`);
    if (!this.dead) this._send("cancel", {});
  }

  /** feed ids at [startPos, startPos + n) (no logits come back: the orchestrator never needs them) */
  forward(ids, startPos) {
    return this._send("sync", { committed_length: startPos + ids.length, pending: Array.from(ids), start_pos: startPos });
  }

  /** draft.mjs propose's arguments (firstStep, maskBits: see there; the mask bits are copied, not
   *  transferred, so the caller keeps its array). */
  async propose({ feed, startPos, k, policy, seed, roundId = 0, stopTokenIds = [], contextIds = [], firstStep = 0,
                  maskBits = null }) {
    const from = this._contextGrowth(contextIds);
    const p = await this._send("propose", { round_id: roundId, k, feed: Array.from(feed), start_pos: startPos, policy,
      seed: Array.from(seed), stop_token_ids: Array.from(stopTokenIds), context_from: from,
      context_tail: Array.from(contextIds.subarray ? contextIds.subarray(from) : contextIds.slice(from)),
      first_step: firstStep, mask_bits: maskBits });
    return { tokens: Int32Array.from(p.tokens), pDraft: p.p_draft, error_code: p.error_code, ms: p.ms };
  }

  /** Where the worker's copy of the context stops matching `contextIds`: its length when the
   *  context only grew since the last propose (then only the growth is sent), else 0 (sent whole). */
  _contextGrowth(contextIds) {
    const sent = this._context ?? new Int32Array(0);
    const ids = Int32Array.from(contextIds);
    let from = sent.length <= ids.length && this._contextEpoch === this.epoch ? sent.length : 0;
    for (let i = 0; i < from; i++) if (sent[i] !== ids[i]) { from = 0; break; }
    this._context = ids;
    this._contextEpoch = this.epoch;
    return from;
  }

  /** Cancel the current epoch's calls (moves to the next epoch). */
  cancel() { this.setEpoch(this.epoch + 1); return Promise.resolve(); }

  /** Fault injection (tests): the next proposal's logits are NaN, computed so by the WASM. */
  injectNaN() { return this._send("fault", { action: "nan_next" }); }

  /** Fault injection (tests): the worker dies as a crash would (its calls fail E_DRAFT_LOST). */
  kill() { this._die("E_DRAFT_LOST", "draft worker was killed"); }

  /** Stale-epoch replies dropped: here, and inside the worker (as it last reported). */
  get staleCounts() { return { draft_client: this.droppedStale, draft_worker: this.workerDroppedStale }; }

  terminate() { this._die("E_TERMINATED", "draft worker terminated"); }
}

// Only the draft worker itself (DraftWorkerClient.create sets ?wasm=&model=): a worker that merely
// imports this module (the orchestrator) must not load a second draft.
const inWorker = typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope &&
  new URL(self.location.href).searchParams.has("wasm");
if (inWorker) {
  const params = new URL(self.location.href).searchParams;
  const post = (msg, transfer) => self.postMessage(msg, transfer);
  if (params.get("cache") === "1") {
    const layer = weightCacheFetch(self.fetch.bind(self));
    layer.setEnabled(true);
    self.fetch = layer.fetch;
  }
  const draftPromise = createDraft({
    wasmUrl: new URL(params.get("wasm") ?? "../build/cpu.wasm", self.location.href).href,
    modelUrl: new URL(params.get("model") ?? "../models/draft/", self.location.href).href,
    configJson: params.has("config") ? JSON.parse(params.get("config")) : undefined,
  });
  const handler = createHandler(draftPromise, post);
  self.onmessage = (ev) => handler.onMessage(ev.data);
  draftPromise.then(
    (d) => post({ kind: "progress", request_id: "", seq: handler.state.seqOut++, epoch: 0,
      payload: { stage: "ready", vocab_size: d.vocabSize, max_context: d.maxContext,
        identity: d.identity, artifact_bytes: d.artifactBytes, memory_bytes: d.memoryBytes } }, []),
    (err) => post({ kind: "error", request_id: "", seq: handler.state.seqOut++, epoch: 0,
      payload: { code: err.code ?? "E_MODEL_LOAD", message: String(err.message ?? err), cache_evicted: err.cacheEvicted === true } }, []));
}
