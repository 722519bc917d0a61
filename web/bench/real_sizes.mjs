// real_sizes.mjs — page of tools/bench/real_sizes.py: our engine with its memory (Engine.memory():
// the WASM bytes of the champion and of the draft), beside peer.mjs's wllama runner (window.peerBench).
// Every time is taken here, in the page, with one clock, as peer.mjs does. window.realSizes; window.realSizesReady.
import { Engine } from "/web/orchestrator/engine.mjs";

let engine = null;
const coded = (err) => ({ code: err?.code ?? "E_INTERNAL", message: String(err?.message ?? err) });

/** Load our engine (models {champion, draft?}, options: Engine.create's) in place of the last one.
 *  -> {load_ms, ready, memory, cross_origin_isolated} or {refused: {code, message}}. */
async function load(models, options = {}) {
  await unload();
  const t0 = performance.now();
  try {
    engine = await Engine.create(models, { timeoutMs: 1800000, ...options });
    const load_ms = performance.now() - t0;
    return { load_ms, ready: engine.ready, memory: await engine.memory(), cross_origin_isolated: globalThis.crossOriginIsolated === true };
  } catch (err) {
    engine = null;
    return { refused: coded(err) };
  }
}

/** One request: {result, first_token_ms, total_ms, memory} or {refused}. */
async function generate(payload) {
  let tFirst = null;
  const t0 = performance.now();
  try {
    const result = await engine.generate(payload, (env) => {
      if (env.kind === "tokens" && env.payload.token_ids.length) tFirst ??= performance.now();
    });
    const total_ms = performance.now() - t0;
    return { result, first_token_ms: tFirst === null ? null : tFirst - t0, total_ms, memory: await engine.memory() };
  } catch (err) {
    return { refused: coded(err) };
  }
}

async function unload() {
  if (engine) await engine.terminate();
  engine = null;
}

window.realSizes = { load, generate, unload };
window.realSizesReady = true;
