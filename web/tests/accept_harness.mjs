// accept_harness.mjs: drives web/gpu/accept.mjs for tests/test_gpu_accept.py (Playwright).
// Arrays cross the boundary as base64 of little-endian bytes so floats arrive bit-exact.
import { createAcceptor } from "../gpu/accept.mjs";
import { fromB64, toB64 } from "./b64.mjs";
import { requestAcceptDevice } from "../gpu/accept_device.mjs";
import { loadSchema, roundRecordLayout } from "../protocol.mjs";

const layout = roundRecordLayout((await loadSchema()).schema);   // decide() returns the record's decision words

let device = null;
const acceptors = new Map();                   // "V/maxBlock" -> { acceptor, logits buffer }

async function get(V, maxBlock, workgroupSize = null) {    // null: the acceptor's default for the adapter
  device ??= await requestAcceptDevice();
  const key = `${V}/${maxBlock}/${workgroupSize}`;
  if (!acceptors.has(key)) {
    const acceptor = await createAcceptor({ device, vocabSize: V, maxBlock, workgroupSize: workgroupSize ?? undefined });
    const logits = device.createBuffer({ size: maxBlock * V * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST });
    acceptors.set(key, { acceptor, logits });
  }
  return acceptors.get(key);
}

window.acceptHarness = {
  async init(V, maxBlock) {
    await get(V, maxBlock);
    const info = device.adapterInfo || {};
    const { acceptor } = await get(V, maxBlock);
    return { vendor: info.vendor || "", architecture: info.architecture || "", workgroupSize: acceptor.workgroupSize };
  },

  async processRows({ V, maxBlock, logitsB64, nRows, proposals, contextIds, policy, greedy, workgroupSize }) {
    const { acceptor } = await get(V, maxBlock, workgroupSize);
    const out = await acceptor.processRows({
      logits: fromB64(logitsB64, Float32Array), nRows, proposals, contextIds, policy, greedy,
    });
    return { probsB64: toB64(out), status: out.status, argmax: out.argmax, nKept: out.nKept };
  },

  // sets: [{ logitsB64 ((m+1)*V f32), pDraftB64 (m*V f32 or "") }]; jobs reference a set by index.
  async decideMany({ V, maxBlock, sets, jobs }) {
    const { acceptor, logits } = await get(V, maxBlock);
    const decoded = sets.map((s) => ({
      logits: fromB64(s.logitsB64, Float32Array),
      pDraft: s.pDraftB64 ? fromB64(s.pDraftB64, Float32Array) : null,
    }));
    const results = [];
    let current = -1;
    const t0 = performance.now();
    for (const job of jobs) {
      const set = decoded[job.set];
      if (job.set !== current) { device.queue.writeBuffer(logits, 0, set.logits); current = job.set; }
      const m = job.proposals.length;
      results.push(layout.decodeDecision(await acceptor.decide({
        logitsBuffer: logits, nRows: m + 1, proposals: Int32Array.from(job.proposals),
        pDraft: m > 0 && !job.greedy ? set.pDraft : null, contextIds: Int32Array.from(job.contextIds || []),
        policy: job.policy, seed: job.seed, roundId: job.roundId, stopTokenIds: job.stopTokenIds || [],
        remaining: job.remaining, greedy: !!job.greedy,
      })));
    }
    return { results, ms: performance.now() - t0 };
  },

  async drawBits({ addrsB64 }) {
    const { acceptor } = await get(8, 1);
    return toB64(await acceptor.drawBits(fromB64(addrsB64, Uint32Array)));
  },

  // Wall time of decide() (upload, one submission, 8-word readback) for k proposals.
  async timeDecide({ V, k, iters, policy, workgroupSize, greedy = false }) {
    const { acceptor, logits } = await get(V, k + 1, workgroupSize);
    const rows = new Float32Array((k + 1) * V);
    let s = 12345;
    for (let i = 0; i < rows.length; i++) { s = (s * 1103515245 + 12345) >>> 0; rows[i] = (s / 2 ** 32) * 8 - 4; }
    device.queue.writeBuffer(logits, 0, rows);
    const pDraft = greedy ? null : new Float32Array(k * V).fill(1 / V);
    const proposals = Int32Array.from({ length: k }, (_, i) => (i * 7919) % V);
    const times = [];
    for (let it = 0; it < iters + 1; it++) {
      const t0 = performance.now();
      await acceptor.decide({ logitsBuffer: logits, nRows: k + 1, proposals, pDraft, contextIds: Int32Array.from([1, 2, 3]),
                              policy, seed: [7, 0], roundId: it, stopTokenIds: [], remaining: 100, greedy });
      if (it > 0) times.push(performance.now() - t0);   // the first call includes warm-up
    }
    times.sort((a, b) => a - b);
    return { median: times[Math.floor(times.length / 2)], min: times[0], max: times[times.length - 1] };
  },
};
document.getElementById("status").textContent = "ready";
window.acceptHarnessReady = true;
