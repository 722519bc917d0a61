// grammar_rows_harness_browser.mjs: drives web/gpu/accept.mjs's rowOffset / rowMasks / logitsRows and
// the draft worker's firstStep / maskBits (DraftWorkerClient, a real module worker) for
// tests/test_grammar_rows_browser.py (Playwright, grammar_rows_harness_browser.html). Arrays cross as
// base64 of little-endian bytes (f32 logits and p_draft, u32 mask words) so they arrive bit-exact.
import { createAcceptor } from "../gpu/accept.mjs";
import { fromB64, toB64 } from "./b64.mjs";
import { requestAcceptDevice } from "../gpu/accept_device.mjs";
import { loadSchema, roundRecordLayout } from "../protocol.mjs";
import { DraftWorkerClient } from "../draft/draft_worker.mjs";

const layout = roundRecordLayout((await loadSchema()).schema);   // decide() returns the record's decision words

let device = null;
const acceptors = new Map();                   // "V/maxBlock" -> { acceptor, logits buffer (maxBlock, V) }

async function get(V, maxBlock) {
  device ??= await requestAcceptDevice();
  const key = `${V}/${maxBlock}`;
  if (!acceptors.has(key)) {
    const acceptor = await createAcceptor({ device, vocabSize: V, maxBlock });
    const logits = device.createBuffer({ size: maxBlock * V * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST });
    acceptors.set(key, { acceptor, logits });
  }
  return acceptors.get(key);
}

window.grammarRowsHarness = {
  // sets: [{logitsB64 (F * V f32: the whole block, forced rows first)}]; jobs: {set, proposals, policy,
  // contextIds, seed, roundId, stopTokenIds, remaining, greedy, rowOffset, rowMasks (b64 | null),
  // pDraft (b64 | null), nRows?, logitsRows?} -> decisions, or {thrown: code}
  async decideMany({ V, maxBlock, sets, jobs }) {
    const { acceptor, logits } = await get(V, maxBlock);
    const blocks = sets.map((s) => fromB64(s.logitsB64, Float32Array));
    const results = [];
    let current = -1;
    for (const job of jobs) {
      if (job.set !== current) { device.queue.writeBuffer(logits, 0, blocks[job.set]); current = job.set; }
      const m = job.proposals.length;
      try {
        results.push(layout.decodeDecision(await acceptor.decide({
          logitsBuffer: logits, nRows: job.nRows ?? m + 1, proposals: Int32Array.from(job.proposals),
          pDraft: job.pDraft ? fromB64(job.pDraft, Float32Array) : null, contextIds: Int32Array.from(job.contextIds || []),
          policy: job.policy, seed: job.seed, roundId: job.roundId, stopTokenIds: job.stopTokenIds || [],
          remaining: job.remaining, greedy: !!job.greedy, rowOffset: job.rowOffset,
          rowMasks: job.rowMasks ? fromB64(job.rowMasks, Uint32Array) : null,
          logitsRows: job.logitsRows ?? blocks[job.set].length / V,
        })));
      } catch (err) {
        results.push({ thrown: err.code ?? `uncoded: ${err.message}` });
      }
    }
    return results;
  },

  // processRows on a block given as logits (F * V f32), decided rows from rowOffset -> probs (b64) and rowinfo
  async processRows({ V, maxBlock, logitsB64, nRows, rowOffset, rowMasks, proposals, contextIds, policy, greedy }) {
    const { acceptor } = await get(V, maxBlock);
    const out = await acceptor.processRows({ logits: fromB64(logitsB64, Float32Array), nRows, rowOffset,
      rowMasks: rowMasks ? fromB64(rowMasks, Uint32Array) : null, proposals, contextIds, policy, greedy });
    return { probsB64: toB64(out), status: out.status, argmax: out.argmax, nKept: out.nKept };
  },

  // calls: grammar_rows_harness.mjs's masked cases ({feed, start_pos, k, policy, seed, round_id, context,
  // first_step, mask}) through DraftWorkerClient.propose in a module worker -> {tokens, p_draft (b64), error_code}
  async workerPropose({ wasmUrl, modelUrl, calls }) {
    const client = await DraftWorkerClient.create({ wasmUrl, modelUrl });
    const out = [];
    try {
      for (const c of calls) {
        const r = await client.propose({ feed: c.feed, startPos: c.start_pos, k: c.k, policy: c.policy, seed: c.seed,
          roundId: c.round_id, stopTokenIds: [], contextIds: c.context, firstStep: c.first_step,
          maskBits: c.mask ? fromB64(c.mask, Uint32Array) : null });
        out.push({ tokens: Array.from(r.tokens), p_draft: toB64(r.pDraft), error_code: r.error_code });
      }
    } finally {
      client.terminate();
    }
    return out;
  },
};
document.getElementById("status").textContent = "ready";
window.grammarRowsHarnessReady = true;
