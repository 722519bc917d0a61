// calibrate.mjs — the load's calibration of this device (docs/browser.md, "Calibration at load"): what
// a champion verification of n rows costs, V(n) for n = 1..9, what T > 0 sampling adds per row, the
// draft's cost per proposal and per caught-up token, within a wall budget; cached in IndexedDB per
// device, browser and model identity, and measured again when requests report drift. Python's "auto"
// policy (py/exactspec/core/auto_policy.py) reads it through bridge.calibration().
import { sha256Hex } from "../sha256.mjs";

export const CALIBRATION_VERSION = 1;
export const DEFAULT_BUDGET_MS = 300;
/** The order in which V(n) is timed: 1, then k = 4's block, then the far end, then between them, so
 *  that an early stop still interpolates the rest between timed neighbours. */
export const V_ORDER = [1, 5, 9, 3, 2, 7, 4, 6, 8];
/** Requests whose observed / calibrated champion step time (stats.auto.drift) lies outside this
 *  range count as drifting; two in a row drop the cached entry and measure again. */
export const DRIFT_RANGE = [0.75, 1.33];
export const DRIFT_REQUESTS = 2;
export const MAX_DRIFT_REQUESTS = 16;
const CONTEXT_IDS = 8;           // the synthetic context (WASM) before each timed round: its prefill is one block
const CATCHUP_IDS = 8;           // the draft's catch-up forward
const PROPOSE_K = 4;             // the draft's timed proposal
const SPOT_TIMINGS = 5;          // V(1) timings of a cached entry's spot check, at most
const SPOT_BUDGET_MS = 50;       // ... and no more than two once this has passed
const MAX_TIMINGS = 4;           // timings of one V(n) at most (a cheap device repeats while the budget lasts)
const MID_N = 5;                 // the smallest second point of a slow device: k = 4's block, the k auto weighs most

const round3 = (x) => (x == null ? null : Math.round(x * 1000) / 1000);

/** sha256 hex of the identity a calibration was measured for (common contract §1): the champion and
 *  draft identities, the backend, matmul, threads, hardware class / GPU adapter, user agent and
 *  this module's version. `parts` is a plain object; its keys are sorted. */
export async function calibrationKey(parts) {
  const obj = { calibration_version: CALIBRATION_VERSION, ...parts };
  const canonical = JSON.stringify(Object.keys(obj).sort().map((k) => [k, obj[k]]));
  return sha256Hex(new TextEncoder().encode(canonical));
}

/** The GPU adapter's info as a string (vendor, architecture, device, description), "" off WebGPU. */
export async function adapterDescription() {
  try {
    const adapter = await globalThis.navigator?.gpu?.requestAdapter();
    const i = adapter?.info ?? {};
    return [i.vendor, i.architecture, i.device, i.description].map((s) => s ?? "").join("/");
  } catch {
    return "";
  }
}

/** Above the largest timed n, V grows at least V(1) x this a row (the auto policy's
 *  min_slope_fraction, version 7): a slow device times only small n, and a flat line there made
 *  every k look as cheap as k = 1 (test-split run #10's WebGPU spec engine: V(1) = V(2) = 118 ms). */
export const MIN_SLOPE_FRACTION = 0.125;

/** [null, V1..VmaxN] from the timed points (Map n -> ms): an untimed n is linear between its timed
 *  neighbours; above the largest timed n, the line through the two largest, never flatter than
 *  MIN_SLOPE_FRACTION x V1 a row (n x V1 with V1 alone: no batching gain assumed, the conservative
 *  side). Needs V1. */
export function interpolate(timed, maxN = 9) {
  const ns = [...timed.keys()].sort((a, b) => a - b);
  if (!timed.has(1)) throw new Error("calibration: V(1) was not timed");
  const out = [null];
  for (let n = 1; n <= maxN; n++) {
    if (timed.has(n)) { out.push(timed.get(n)); continue; }
    const lo = ns.filter((m) => m < n).pop(), hi = ns.find((m) => m > n);
    if (hi !== undefined) {
      const a = timed.get(lo), b = timed.get(hi);
      out.push(a + ((b - a) * (n - lo)) / (hi - lo));
    } else if (ns.length >= 2) {
      const [p, q] = ns.slice(-2);
      const slope = Math.max(MIN_SLOPE_FRACTION * timed.get(1), (timed.get(q) - timed.get(p)) / (q - p));
      out.push(timed.get(q) + slope * (n - q));
    } else {
      out.push(timed.get(1) * n);
    }
  }
  return out.map(round3);
}

/** The synthetic context a calibration session starts from (8 ids, one block's prefill; WebGPU 4:
 *  the first timed round waits for its prefill). */
const syntheticContext = (backend, vocabSize) =>
  Array.from({ length: backend === "webgpu" ? 4 : CONTEXT_IDS }, (_, i) => (i * 7919 + 13) % vocabSize);

/** A cached entry against this moment: V(1) timed up to SPOT_TIMINGS times (at least twice; no
 *  more once SPOT_BUDGET_MS has passed: WebGPU) over a session of its own (the minimum) -> {v1_ms, ratio: v1_ms / the entry's V(1)}; a ratio outside DRIFT_RANGE makes
 *  the entry stale (an entry measured while the machine was busy, or on a quieter day). */
export async function spotCheck(probe, cached, { backend, vocabSize }) {
  const s = await probe.open({ greedy: true, contextIds: syntheticContext(backend, vocabSize) });
  try {
    let v1 = Infinity;
    const t0 = performance.now();
    for (let r = 0; r < SPOT_TIMINGS && (r < 2 || performance.now() - t0 < SPOT_BUDGET_MS); r++) v1 = Math.min(v1, (await s.verify(1)).verify);
    return { v1_ms: round3(v1), ratio: round3(v1 / cached.verify_ms[1]) };
  } finally {
    s.close();
  }
}

/** Whether a ratio of observed to calibrated time lies inside `range` (DRIFT_RANGE). */
export const withinDrift = (ratio, range = DRIFT_RANGE) => ratio >= range[0] && ratio <= range[1];

/** Timed V(n) with each one at most every larger n's: a timing is only ever inflated (another
 *  thread, a tab, a GC took the core), and verifying more rows never costs less. */
export function monotone(timed) {
  const out = new Map(timed);
  let floor = Infinity;
  for (const n of [...timed.keys()].sort((a, b) => b - a)) {
    floor = Math.min(floor, timed.get(n));
    out.set(n, floor);
  }
  return out;
}

/**
 * Measure on the loaded models through `probe` (bridge.calibrationProbe()):
 *   probe.maxRows: the largest n a round may verify here (<= 9, the context permitting);
 *   probe.hasDraft; probe.open({greedy, contextIds}) -> a session over the synthetic context with
 *     canVerify(n), verify(n) -> {wall, verify} (one round of n rows: the pending token + n - 1
 *     given proposals, decided; `verify` the round record's verify time, the span a request's
 *     round reports and the policy divides by V(n); `wall` the whole call) and close();
 *   probe.draftCatchup(ids) -> ms (a forward from position 0); probe.draftPropose(k, at) -> {ms, proposed}
 *     (a greedy proposal after `at` ids in the draft's cache).
 * A step starts only while the elapsed time plus its predicted cost fits in `budgetMs` (predicted
 * from what was timed; with V(1) alone, V(n) as V(1) (1 + (n - 1) / 4)), except the prefill, the
 * first V(1) (without them there is no calibration), V(MID_N) (when it does not fit: the one round a
 * slow device's calibration may run past the budget) and the draft's first catch-up pair and
 * proposal (auto cannot cost a draft it never timed). Order: V(1), V(5) (k = 4's block, the k auto
 * weighs most), V(9) or the largest n > 5 that fits (V need not be one line: SwiftShader's is flat
 * to 5 rows and ~1.7x from 6), the draft (a catch-up's marginal cost per id: forwards of 9 ids and
 * of 1, twice; a greedy proposal of k = 4 twice), V(1), V(5), V(9) again, one sampled round at the
 * largest n timed, V(3), V(2), V(7), V(4), V(6), V(8) twice each; then, while the budget lasts,
 * more timings of every n (up to MAX_TIMINGS). Each V(n) is the minimum of its timings, and at most any larger
 * n's (monotone); measured_n lists exactly the n timed. The synthetic context is 8 ids (one
 * block's prefill; WebGPU: 4, since the first timed round waits for its prefill).
 * -> the calibration object (common contract §1) plus {budget_ms, skipped: [what was not timed]}.
 */
export async function measureCalibration(probe, { budgetMs = DEFAULT_BUDGET_MS, backend, key, vocabSize } = {}) {
  const t0 = performance.now();
  const elapsed = () => performance.now() - t0;
  const maxN = Math.max(1, Math.min(9, probe.maxRows));
  const timed = new Map();                       // n -> min verify ms (the record's)
  const wall = new Map();                        // n -> max wall ms of the call (budget predictions)
  const counts = new Map();                      // n -> times timed
  const skipped = [];
  const contextIds = syntheticContext(backend, vocabSize);
  const predictV = (n) => {                      // the wall time a round of n rows will take
    if (!wall.size) return 0;
    if (wall.size === 1) return wall.get(1) * (1 + (n - 1) / 4);
    return interpolate(wall, maxN)[n];
  };
  const fits = (predicted) => elapsed() + predicted <= budgetMs;

  const greedy = await probe.open({ greedy: true, contextIds });
  let sampledExtra = null, draftMs = null, catchupMs = null;
  try {
    /** Time V(n) until it has `upto` timings; false when the budget (or the context) stopped it. */
    const timeV = async (n, upto, force = false) => {
      while ((counts.get(n) ?? 0) < upto) {
        const mandatory = (n === 1 && !timed.size) || force;
        if (!mandatory && (!fits(predictV(n)) || !greedy.canVerify(n))) return false;
        const t = await greedy.verify(n);
        timed.set(n, Math.min(timed.get(n) ?? Infinity, t.verify));
        wall.set(n, Math.max(wall.get(n) ?? 0, t.wall));
        counts.set(n, (counts.get(n) ?? 0) + 1);
      }
      return true;
    };
    await timeV(1, 1);
    const mid = Math.min(MID_N, maxN);
    if (maxN > 1) {
      // V(mid) second, k = 4's block, the k auto weighs most; past the budget by one round when it
      // does not fit (SwiftShader, whose first rounds' calls take ~2x their step). V(1) alone reads as
      // no batching gain, and auto kept the draft off where verifying a block is nearly free
      // (test-split run #7); a small second n (V(2), runs #10 and #11) read SwiftShader's flat V(1..5)
      // as flat to 9 (auto drafted k = 8 at acceptance 0) or, under the policy's floor above the
      // largest timed n, as steep from 3 (auto drafted k = 1-3 where k = 4 ran 1.6x)
      let second = false;                        // the largest n <= mid the context allows, whatever the budget
      for (let n = mid; n >= 2 && !second; n--) if (greedy.canVerify(n)) second = await timeV(n, 1, true);
      // then the largest n above it that fits (V(9) on most devices): V need not be one line. SwiftShader's
      // is a step, flat to 5 rows and ~1.7x from 6: test-split run #15's timed engines timed V(1) and
      // V(9) alone, the line between them priced V(5) 27-47% above V(1), and auto drafted k = 1-3 where
      // k = 4 cost no more (0.79-0.85 of draft k = 4 in 5 strata)
      for (let n = maxN; n > mid; n--) if (await timeV(n, 1)) break;
    }
    if (probe.hasDraft) {                        // the draft next: its calls are a fraction of a champion round
      // the marginal cost of a caught-up token: a forward of 1 + CATCHUP_IDS ids against one of 1 id
      // (each call's fixed cost cancels), from the minimum of each over two pairs (the minimum of
      // the two differences would keep the pair where noise slowed the single-id call most)
      const catchup = Array.from({ length: 1 + CATCHUP_IDS }, (_, i) => contextIds[i % contextIds.length]);
      let at = 0;                                 // ids in the draft's cache before its proposal
      let pairMs = predictV(1);                   // a draft forward of 1 + 9 ids, predicted: a champion round
      let oneMs = Infinity, manyMs = Infinity;
      // the first pair and the first proposal whatever the budget: without the draft's costs auto
      // never drafts, and they are a fraction of a champion round (a dev run on SwiftShader's
      // WebGPU, ~80 ms a step, spent its 300 ms on V(1) and V(2) and never timed the draft)
      for (let r = 0; r < 2; r++) {
        if (r && !fits(pairMs)) break;
        const t = performance.now();
        oneMs = Math.min(oneMs, await probe.draftCatchup(catchup.slice(0, 1)));
        manyMs = Math.min(manyMs, await probe.draftCatchup(catchup));
        pairMs = performance.now() - t;
        catchupMs = Math.max(0, (manyMs - oneMs) / CATCHUP_IDS);
        at = catchup.length;
      }
      for (let r = 0; r < 2; r++) {
        if (r && !fits(draftMs * PROPOSE_K * 1.5)) break;
        const { ms, proposed } = await probe.draftPropose(PROPOSE_K, at);
        draftMs = Math.min(draftMs ?? Infinity, ms / Math.max(1, proposed));
      }
    }
    await timeV(1, 2);                           // a second timing of the points first (each V is its timings' minimum)
    if (maxN > 1) await timeV(mid, 2);
    if (maxN > mid) await timeV(maxN, 2);
    const nS = Math.max(...timed.keys());
    if (fits(predictV(9) + predictV(6) + predictV(nS) * 1.5)) {   // a session of its own: its prefill, one sampled round
      const sampled = await probe.open({ greedy: false, contextIds });
      try {
        const ms = (await sampled.verify(nS)).verify;
        sampledExtra = Math.max(0, (ms - timed.get(nS)) / nS);
      } finally {
        sampled.close();
      }
    } else skipped.push("the sampled round");
    let open = true;
    for (const n of V_ORDER) if (n <= maxN && open) open = await timeV(n, 2);
    for (let upto = 3; open && upto <= MAX_TIMINGS; upto++) {
      for (const n of V_ORDER) if (n <= maxN && open) open = await timeV(n, upto);
    }
  } finally {
    greedy.close();
  }
  for (const n of V_ORDER) {
    if (n > maxN) continue;
    const c = counts.get(n) ?? 0;
    if (c === 0) skipped.push(`V(${n})`);
    else if (c === 1) skipped.push(`V(${n})'s second timing`);
  }
  return {
    version: CALIBRATION_VERSION, key, source: "measured", measured_at: new Date().toISOString(), ms: round3(elapsed()), backend,
    verify_ms: interpolate(monotone(timed), 9),
    verify_sampled_extra_ms_per_row: sampledExtra == null ? null : round3(sampledExtra),
    measured_n: [...timed.keys()],
    draft_ms_per_proposal: round3(draftMs),
    draft_catchup_ms_per_token: round3(catchupMs),
    lookup_ms: null,
    budget_ms: budgetMs,
    skipped,
  };
}

// ---- the cache: IndexedDB database "exactspec", object store "calibration", keyed by the key ----

const DB_NAME = "exactspec", STORE = "calibration", DB_VERSION = 1, OPEN_TIMEOUT_MS = 2000;

/** -> a cache {get(key), put(calibration), delete(key)} (promises), or null where IndexedDB is
 *  unavailable here (no indexedDB, an opaque origin, a browser that refuses storage). */
export async function openCalibrationCache(idb = globalThis.indexedDB) {
  if (!idb) return null;
  let db;
  try {
    db = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("IndexedDB open timed out")), OPEN_TIMEOUT_MS);
      const req = idb.open(DB_NAME, DB_VERSION);
      req.onupgradeneeded = () => { if (!req.result.objectStoreNames.contains(STORE)) req.result.createObjectStore(STORE); };
      req.onsuccess = () => { clearTimeout(timer); resolve(req.result); };
      req.onerror = () => { clearTimeout(timer); reject(req.error); };
      req.onblocked = () => { clearTimeout(timer); reject(new Error("IndexedDB open blocked")); };
    });
  } catch {
    return null;
  }
  const op = (mode, fn) => new Promise((resolve, reject) => {
    const tx = db.transaction(STORE, mode);
    const req = fn(tx.objectStore(STORE));
    tx.oncomplete = () => resolve(req.result);
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error);
  });
  return {
    get: (key) => op("readonly", (s) => s.get(key)).then((v) => v ?? null),
    put: (calibration) => op("readwrite", (s) => s.put(calibration, calibration.key)),
    delete: (key) => op("readwrite", (s) => s.delete(key)),
    close: () => db.close(),
  };
}

/** A cached entry fit to serve `key`: this version, this key, the fields present, and not one of
 *  the incomplete measurements an earlier budget rule left (V(1) alone: no slope; a draft loaded,
 *  `hasDraft`, but its costs untimed: auto would never draft), which are measured again. */
export function usableCached(entry, key, { hasDraft = false } = {}) {
  return !!entry && entry.version === CALIBRATION_VERSION && entry.key === key && Array.isArray(entry.verify_ms) &&
    entry.verify_ms.length === 10 && entry.verify_ms[1] > 0 &&
    !(Array.isArray(entry.measured_n) && entry.measured_n.length < 2) &&
    !(hasDraft && !(entry.draft_ms_per_proposal > 0));
}

/** Counts requests in a row whose drift lies outside DRIFT_RANGE; observe(drift) -> true on the
 *  `requests`-th in a row (DRIFT_REQUESTS; then it starts over). null / undefined drift (no auto
 *  request, no calibration) leaves the count as it is. backoff(agreed), after the measurement that
 *  a trigger caused: when it agreed with the calibration it replaced (agreeing(), the drift was in
 *  how requests run, not in the device), the next trigger needs twice as many requests in a row
 *  (at most MAX_DRIFT_REQUESTS), so a steady gap costs a few measurements, not one every two
 *  requests; when it differed, back to DRIFT_REQUESTS. */
export function driftTracker({ range = DRIFT_RANGE, base = DRIFT_REQUESTS } = {}) {
  let run = 0, requests = base;
  return {
    observe(drift) {
      if (drift == null || !Number.isFinite(drift)) return false;
      run = withinDrift(drift, range) ? 0 : run + 1;
      if (run < requests) return false;
      run = 0;
      return true;
    },
    backoff(agreed) { requests = agreed ? Math.min(MAX_DRIFT_REQUESTS, requests * 2) : base; },
    get run() { return run; },
    get requests() { return requests; },
  };
}

/** Whether calibration `b` agrees with `a`: V(1) within DRIFT_RANGE of a's. */
export const agreeing = (a, b) => !!(a?.verify_ms?.[1] && b?.verify_ms?.[1]) && withinDrift(b.verify_ms[1] / a.verify_ms[1]);
