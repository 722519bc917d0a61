// eval.mjs — page of `exactspec bench` (py/exactspec/evaluation/runner.py): named engines, one request
// at a time, each answered with its per-round record (proposed, accepted, draft/verify ms, sources),
// page-clock times and a memory sample after it. wllama comes from peer.mjs (window.peerBench).
// window.evalBench; window.evalReady once loaded.
import { Engine } from "/web/orchestrator/engine.mjs";

const engines = new Map();   // name -> Engine
const remeasures = new Map();  // name -> {due: a promise of the calibration a drift made due, or null; resolve}
const REMEASURE_WAIT_MS = 60000;
const coded = (err) => ({ code: err?.code ?? "E_INTERNAL", message: String(err?.message ?? err) });
const pageHeap = () => performance.memory?.usedJSHeapSize ?? null;

/** Load an engine under `name` -> {load_ms, ready, memory, page_heap} or {refused}. With
 *  options.draftInBackground the engine is ready with the champion alone (load_ms) and its draft
 *  loads while it is idle: the bench waits for it and for the calibration it brings (nothing else
 *  runs meanwhile, as for a user still typing) and adds draft_ready_ms (load start to the draft's
 *  arrival), draft_calibrated_ms (to that calibration's end), draft_load_ms (the draft's own load,
 *  from its start) and draft_error. */
async function load(name, models, options = {}) {
  const t0 = performance.now();
  let draftReady = null, draftCalibrated = null, draftError = null, draftLoadMs = null, settle;
  const settled = new Promise((r) => { settle = r; });
  const remeasure = { due: null, resolve: null };
  remeasures.set(name, remeasure);
  const onProgress = (p) => {
    if (p.stage === "calibration_due") {      // after a request whose drift made one due (before its result)
      remeasure.due = new Promise((r) => { remeasure.resolve = r; });
    } else if (p.stage === "calibration" && remeasure.resolve) {
      remeasure.resolve(p.calibration);
      remeasure.resolve = null;
    }
    if (p.stage === "draft_ready") {
      draftReady = performance.now() - t0;
      draftError = p.draft_error ?? null;
      draftLoadMs = p.draft_load_ms ?? null;
      if (draftError || options.calibrate === "off") settle();
    } else if (p.stage === "calibration" && draftReady !== null) {
      draftCalibrated = performance.now() - t0;
      settle();
    }
  };
  try {
    const engine = await Engine.create(models, { ...options, onProgress });
    engines.set(name, engine);
    const load_ms = performance.now() - t0;
    const late = !!engine.ready?.info?.draft_loading;
    if (late) await settled;
    return { load_ms, ready: engine.ready, memory: await engine.memory(), page_heap: pageHeap(),
             ...(late ? { draft_ready_ms: draftReady, draft_calibrated_ms: draftCalibrated, draft_error: draftError,
                          draft_load_ms: draftLoadMs } : {}) };
  } catch (err) {
    return { refused: coded(err) };
  }
}

/** One request: {result, rounds, first_token_ms, total_ms, memory, page_heap, recalibration} or
 *  {refused}. rounds: one entry per tokens event: its round info, token count and sources.
 *  recalibration: when this request's drift made a calibration due (progress "calibration_due"),
 *  the new calibration, waited for after the request's clock stopped (null otherwise), so that no
 *  timed request of any engine runs beside a measurement. */
async function generate(name, payload) {
  const engine = engines.get(name);
  const rounds = [];
  let tFirst = null;
  const t0 = performance.now();
  try {
    const result = await engine.generate(payload, (env) => {
      if (env.kind !== "tokens") return;
      const p = env.payload;
      if (p.token_ids.length) tFirst ??= performance.now();
      rounds.push({ ...p.round, n: p.token_ids.length, sources: p.sources });
    });
    const total_ms = performance.now() - t0;
    delete result.text;   // the ids are what the evaluation compares
    const remeasure = remeasures.get(name);
    const recalibration = remeasure?.due   // (bounded: a measurement that never comes costs a minute, not the run)
      ? await Promise.race([remeasure.due, new Promise((r) => setTimeout(() => r(null), REMEASURE_WAIT_MS))]) : null;
    if (remeasure) remeasure.due = null;
    return { result, rounds, first_token_ms: tFirst === null ? null : tFirst - t0, total_ms,
             memory: await engine.memory(), page_heap: pageHeap(), recalibration };
  } catch (err) {
    return { refused: coded(err) };
  }
}

async function unload(name) {
  const engine = engines.get(name);
  if (engine) await engine.terminate();
  engines.delete(name);
  remeasures.delete(name);
}

window.evalBench = { load, generate, unload, pageHeap };
window.evalReady = true;
