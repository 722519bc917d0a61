// runner.mjs — headless entry of web/runner.html: window.exactspecRunner and window.runnerReady
// (a file, not an inline script, so the server's Content-Security-Policy can be script-src 'self').
// `exactspec generate --backend browser` and the browser tests (incl. the fault matrix) drive it.
import { Engine } from "./orchestrator/engine.mjs";

let engine = null;
const coded = (err) => ({ code: err?.code ?? "E_INTERNAL", message: String(err?.message ?? err) });

/** One request with its event log and page_ms (the page clock, request start to result: what
 *  `exactspec bench` times; the driver's own clock adds the events' transfer); never throws: a
 *  refusal comes back as {refused: {code, message}}.
 *  cancelAfterTokens: engine.cancel() once that many "tokens" events have arrived;
 *  cancelOnStall: engine.cancel() when the worker reports a "stalled" fault point;
 *  ifBusy and silenceTimeoutMs: the engine's per-request options. */
async function run(payload, { cancelAfterTokens = 0, cancelOnStall = false, ifBusy, silenceTimeoutMs } = {}) {
  const events = [];
  let nTokenEvents = 0;
  const t0 = performance.now();
  try {
    const result = await engine.generate(payload, (env) => {
      events.push({ kind: env.kind, payload: env.payload });
      if (env.kind === "tokens" && ++nTokenEvents === cancelAfterTokens) engine.cancel();
      if (cancelOnStall && env.kind === "progress" && env.payload.stage === "stalled") engine.cancel();
    }, { ...(ifBusy ? { ifBusy } : {}), ...(silenceTimeoutMs ? { silenceTimeoutMs } : {}) });
    return { result, events, staleDropped: engine.staleDropped, page_ms: performance.now() - t0 };
  } catch (err) {
    return { refused: coded(err), events, staleDropped: engine.staleDropped };
  }
}

window.exactspecRunner = {
  /** options: Engine.create options ({faults, refuseAllocAfter, whenBusy, championBackend}). The
   *  runner's championBackend default is "webgpu" (the engine's is "auto"): tests name the backend
   *  they exercise; the CLI passes its --champion-backend. Throws coded on failure. */
  async load(models, options = {}) {
    // load progress goes to window.exactspecProgress when the driver exposed one (the demo's line)
    options = { championBackend: "webgpu", onProgress: (p) => window.exactspecProgress?.(p), ...options };
    if (engine && !engine.terminated) {
      engine.ready = null;
      engine.ready = await engine.load(models, options);
      return engine.ready;
    }
    engine = await Engine.create(models, options);
    return engine.ready;
  },
  /** Like load, but a failure comes back as {error: {code, message}} and leaves no engine. */
  async tryLoad(models, options = {}) {
    try {
      return { ready: await this.load(models, options) };
    } catch (err) {
      if (engine?.terminated) engine = null;   // a failed reload leaves a live engine with no model
      return { error: coded(err) };
    }
  },
  generate: run,
  /** Several requests started at once (each with its own options); results in call order. */
  async generateAll(items) {
    return Promise.all(items.map(({ payload, options }) => run(payload, options)));
  },
  /** The engine's current ready object ({timing_ms, info}: info changes when a late draft arrives). */
  info: () => engine?.ready ?? null,
  cancel: () => engine.cancel(),
  epoch: () => engine.epoch,
  fault: (spec) => engine.fault(spec),
  memory: () => engine.memory(),
  /** Post a raw envelope into the orchestrator worker (stale-epoch injection). */
  inject: (env) => engine.worker.postMessage(env),
  async terminate() {
    await engine.terminate();
    return { terminated: engine.terminated };
  },
  /** JS heap of this page in bytes (Chromium's performance.memory; null elsewhere). */
  pageHeap: () => performance.memory?.usedJSHeapSize ?? null,
};
window.runnerReady = true;
