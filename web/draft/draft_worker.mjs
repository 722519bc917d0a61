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
