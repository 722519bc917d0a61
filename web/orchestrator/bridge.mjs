// The JS side of the Pyodide adapter (py/exactspec/browser_backend.py): one call per round step.
// Owns the GPU champion + acceptor and a client of the draft worker. Values arriving from Python
// are JS arrays (to_js); p_draft rows stay a Float32Array end to end.
import { requestDevice } from "/web/gpu/device.mjs";
import { createChampion } from "/web/gpu/champion.mjs";
import { createAcceptor } from "/web/gpu/accept.mjs";
import { DraftWorkerClient } from "/web/draft/draft_worker.mjs";

export const MAX_BLOCK = 9;            // k <= 8 proposals + the pending token

// -> { bridge, info: {champion, draft}, timing_ms }
export async function createBridge({ championUrl, draftUrl, maxContext }) {
  const t0 = performance.now();
  const device = await requestDevice();
  const champion = await createChampion({ device, modelUrl: championUrl, maxBlock: MAX_BLOCK, maxContext });
  const acceptor = await createAcceptor({ device, vocabSize: champion.vocabSize, maxBlock: MAX_BLOCK });
  const t1 = performance.now();
  const draft = draftUrl ? await DraftWorkerClient.create({ wasmUrl: "/web/build/draft.wasm", modelUrl: draftUrl }) : null;
  const t2 = performance.now();
  const ints = (a) => Int32Array.from(a ?? []);
  const bridge = {
    async championForward(ids, startPos) {
      await champion.forward(ints(ids), startPos);
    },
    async championRound(feed, startPos, m, pDraft, committedIds, proposals, policyJson, seedLo, seedHi,
                        roundId, stopIds, remaining, greedy) {
      if (feed.length !== m + 1) throw new Error("E_CACHE_STATE: the champion must have exactly one pending token");
      await champion.forward(ints(feed), startPos);
      const r = await acceptor.decide({
        logitsBuffer: champion.logitsBuffer, nRows: m + 1, proposals: ints(proposals), pDraft: pDraft ?? null,
        contextIds: ints(committedIds), policy: JSON.parse(policyJson), seed: [seedLo >>> 0, seedHi >>> 0],
        roundId, stopTokenIds: Array.from(stopIds ?? []), remaining, greedy: !!greedy,
      });
      return JSON.stringify(r);
    },
    async championLogits(ids, startPos) {            // diagnostics and tests only
      await champion.forward(ints(ids), startPos);
      return champion.readLogits(ids.length);
    },
    async draftForward(ids, startPos) {
      await draft.forward(ints(ids), startPos);
    },
    async draftPropose(feed, startPos, k, policyJson, seedLo, seedHi, roundId, stopIds, contextIds) {
      const r = await draft.propose({ feed: ints(feed), startPos, k, policy: JSON.parse(policyJson),
        seed: [seedLo >>> 0, seedHi >>> 0], roundId, stopTokenIds: Array.from(stopIds ?? []), contextIds: ints(contextIds) });
      return { tokens_json: JSON.stringify(Array.from(r.tokens)), pDraft: r.pDraft, error_code: r.error_code || "" };
    },
  };
  const info = {
    champion: { vocab_size: champion.vocabSize, max_context: maxContext ?? champion.config.max_position_embeddings,
                identity: champion.identity ?? "webgpu-q8", max_block: MAX_BLOCK },
    draft: draft ? { vocab_size: draft.vocabSize, max_context: draft.maxContext, identity: draft.identity ?? "wasm-f32" } : null,
  };
  return { bridge, info, timing_ms: { champion_load: t1 - t0, draft_load: t2 - t1 } };
}
