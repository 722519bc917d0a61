// batch_check.mjs — the load-time batch-invariance check (docs/browser.md "Batch invariance at load"):
// the champion forwards a short block, then the same positions one by one from the same start, and
// the logits of every position must be the same bits. Greedy identity (and exactness under
// speculation) rests on it: a verified block must give the rows the champion alone would.
import { codedError } from "../protocol.mjs";

export const CHECK_CONTEXT = 3;        // ids forwarded first (one block of 3 at position 0), the same both ways
export const CHECK_POSITIONS = 5;      // positions compared: one block of 5, then 5 blocks of 1

/** The fixed synthetic ids of the check (any valid ids: only the bits of the two paths are compared). */
export function checkIds(vocabSize, n) {
  return Int32Array.from({ length: n }, (_, i) => (i * 7919 + 101) % vocabSize);
}

/** The first element where two float32 arrays differ as bits -> its index, or -1. NaNs compare by
 *  their bits too, so a NaN row passes only if both paths gave the same NaN. */
export function firstBitDifference(a, b) {
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length), y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  if (x.length !== y.length) return 0;
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return i;
  return -1;
}

/**
 * Run the check on a champion backend (champion_backends.mjs: forward(ids, startPos), readLogits(n),
 * vocabSize, maxContext) -> {backend, positions, ms, result: "invariant" | "variant",
 * first_mismatch: {position, index} | null}: position counts from 0 among the compared positions,
 * index is the logit (token id). The positions stay written in the champion's KV cache; every
 * request prefills from position 0, so the next one starts clean. A champion whose context cannot
 * hold a block of 2 after one context id cannot be checked: result "unchecked".
 */
export async function checkBatchInvariance(champion, { maxBlock, positions = CHECK_POSITIONS, context = CHECK_CONTEXT } = {}) {
  const t0 = performance.now();
  const V = champion.vocabSize;
  context = Math.max(1, Math.min(context, champion.maxContext - 2));
  const P = Math.min(positions, maxBlock ?? positions, champion.maxContext - context);
  const out = { backend: champion.kind, positions: P, ms: 0, result: "unchecked", first_mismatch: null };
  if (!(P >= 2)) return { ...out, ms: performance.now() - t0 };
  const ids = checkIds(V, context + P);
  await champion.forward(ids.subarray(0, context), 0);
  await champion.forward(ids.subarray(context), context);
  const block = await champion.readLogits(P);
  out.result = "invariant";
  for (let i = 0; i < P; i++) {
    await champion.forward(ids.subarray(context + i, context + i + 1), context + i);
    const single = await champion.readLogits(1);
    const at = firstBitDifference(block.subarray(i * V, (i + 1) * V), single);
    if (at >= 0) {
      out.result = "variant";
      out.first_mismatch = { position: i, index: at };
      break;
    }
  }
  out.ms = +(performance.now() - t0).toFixed(3);
  return out;
}

/** The coded error of a variant check (E_BATCH_VARIANT, protocol.json), naming where it differed. */
export function batchVariantError(check) {
  const m = check.first_mismatch;
  return codedError("E_BATCH_VARIANT", `the ${check.backend} champion's kernels gave different logits for the same positions ` +
    `run as one block of ${check.positions} and one by one (position ${m.position}, logit ${m.index}): batch-variant, ` +
    "so greedy identity cannot be promised on this device");
}
