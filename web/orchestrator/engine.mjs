// The engine behind web/exactspec.mjs (internal: the one public entry is exactspec.mjs; the page's runner, the bench pages and tests use this directly): one orchestrator worker, one request at a time, on the main thread.
//   const engine = await Engine.create({ champion: "models/champion/", draft: "models/draft/" });
//   const result = await engine.generate({ prompt: "…", config: { speculate: "draft", k: 4 } }, onEvent);
//   engine.cancel();          // the running request ends "cancelled" at its next round boundary
//   await engine.terminate(); // frees GPU buffers, both workers, every Pyodide proxy
//
// generate() queues behind the running request (FIFO); with {ifBusy: "refuse"} (or the engine
// option whenBusy: "refuse") a busy engine refuses it with E_BUSY instead. It resolves with the
// result (finish_reason eos|stop|length|cancelled|error; a failure after the request started is
// a result with `error`), and rejects with an Error carrying .code only when the request was
// refused before it started (E_BAD_ARGUMENT, E_CONTEXT_OVERFLOW, E_DRAFT_LOST, E_BUSY, ...).
// Every request settles: its fields and options are type-checked here (protocol.json's table)
// before it queues, one that cannot be posted is refused, the worker refuses in the request's
// own epoch, and a running request that hears nothing from the worker for silenceTimeoutMs
// (default 5 min) ends E_TIMEOUT and ends the engine with it (visibly dead: later calls are
// refused E_TERMINATED saying why), since a worker that silent cannot be trusted with another.
// Epochs: every request runs under the engine's epoch at its start; cancel() moves the epoch on.
// Envelopes from the worker for anything but the running request in its own epoch (late events
// of a finished request, junk) are dropped and counted: result.stats.stale_dropped.engine.
// Every worker and asset URL derives from baseUrl (default: web/, the folder above this module's),
// so the engine runs from any path or origin.
import { codedError, errorPayload, loadSchema, shown } from "../protocol.mjs";
import { openMailbox, postCounted } from "./mailbox.mjs";

/** How long a running request may hear nothing from the orchestrator worker (a backstop: every
 *  round and every refusal speaks well before this). */
export const DEFAULT_SILENCE_TIMEOUT_MS = 300000;
const MAX_TIMER_MS = 2 ** 31 - 1;

/** The URLs the engine needs, from its base (web/, the folder holding exactspec.mjs). A package
 *  installed under node_modules/exactspec/ finds Pyodide and web-xgrammar beside it
 *  (node_modules/pyodide/, node_modules/@mlc-ai/web-xgrammar/). */
export function engineAssets(baseUrl = new URL("../", import.meta.url).href, overrides = {}) {
  const base = new URL(baseUrl.endsWith("/") ? baseUrl : baseUrl + "/", globalThis.location?.href).href;
  const installed = /\/node_modules\/exactspec\/web\/$/.test(new URL(base).pathname);
  return {
    worker: new URL("orchestrator/worker.mjs", base).href,
    pyodide: new URL(installed ? "../../pyodide/" : "../node_modules/pyodide/", base).href,
    // xgrammar's WASM build, for response_format (loaded on the first constrained request)
    xgrammar: new URL(`${installed ? "../../" : "../node_modules/"}@mlc-ai/web-xgrammar/lib/index.js`, base).href,
    py: new URL("../py/exactspec/", base).href,
    pyFiles: new URL("orchestrator/py_files.json", base).href,
    protocol: new URL("../py/exactspec/core/protocol.json", base).href,
    build: new URL("build/", base).href,
    snapshot: new URL("../build/pyodide_snapshot/", base).href,   // tools/pyodide_snapshot.mjs (absent: slow boot)
    models: new URL("models/", base).href,
    ...overrides,
  };
}

/** A module worker for `url`; from another origin (an embedding page), through a same-origin blob
 *  that imports it (a worker script itself must be same-origin; its imports may be CORS). */
export function startModuleWorker(url) {
  const here = globalThis.location?.origin;
  if (!here || new URL(url).origin === here) return new Worker(url, { type: "module" });
  const shim = URL.createObjectURL(new Blob([`import ${JSON.stringify(url)};\n`], { type: "text/javascript" }));
  try {
    return new Worker(shim, { type: "module" });
  } finally {
    setTimeout(() => URL.revokeObjectURL(shim), 60000);
  }
}

export class Engine {
  /** Create an engine and load a pair. options: {whenBusy: "queue"|"refuse", timeoutMs, silenceTimeoutMs, faults,
   *  refuseAllocAfter, workerUrl, championBackend: "auto"|"webgpu"|"wasm", threads: "auto"|n,
   *  matmul: "auto"|"q8act"|"f32" (the quantised matmul: "auto" is q8act on the WASM champion, the float kernels
   *  on WebGPU; "q8act" on both; docs/champion_wasm.md, docs/gpu.md),
   *  draftPlacement: "auto"|"inline"|"worker"}. `faults` enables engine.fault() (tests). "auto"
   *  takes WebGPU only from a hardware adapter; the draft runs inline next to a WASM champion. */
  static async create(models, options = {}) {
    const engine = new Engine(options);
    try {
      await engine.load(models, options);
    } catch (err) {
      engine._kill(err);
      throw err;
    }
    return engine;
  }

  constructor({ whenBusy = "queue", workerUrl = null, baseUrl, assets = {}, silenceTimeoutMs = DEFAULT_SILENCE_TIMEOUT_MS } = {}) {
    this.whenBusy = whenBusy;
    this.silenceTimeoutMs = silenceTimeoutMs;
    this.assets = engineAssets(baseUrl, assets);
    this.workerUrl = workerUrl ?? this.assets.worker;
    this.worker = null;
    this.schema = null;
    this.seq = 0;
    this._epoch = 0;
    this.queue = [];                     // waiting requests: {payload, onEvent, resolve, reject}
    this.running = null;                 // {request_id, epoch, onEvent, resolve, reject, silenceMs, silenceTimer}
    this.control = new Map();            // request_id of load/memory/fault/terminate -> {resolve, reject}
    this.staleDropped = 0;
    this.staleReported = 0;              // staleDropped already put in some result's stats
    this.invalidDropped = 0;
    this.ready = null;
    this.terminated = false;
    this.endReason = "the engine was terminated";   // what later calls are told (E_TERMINATED)
  }

  /** The current cancellation epoch (moves on at every cancel()). */
  get epoch() { return this._epoch; }

  /** Load (or replace) the pair; a second load frees everything the first one held. models:
   *  {champion, draft?, manifest?, files?} (URLs relative to the page; `files` maps
   *  "role/name" -> File for local folders, web/exactspec.mjs builds it). onProgress(p) sees the
   *  worker's load progress: {stage: "prepare"|"python"|"check"|"models"} and
   *  {stage: "fetch", url, name, loaded, total, done} per artifact.
   *  draftInBackground: ready as soon as the champion is (ready.info.draft_loading true; until
   *  then speculate "draft" is refused with E_DRAFT_LOST); when the draft has loaded (or failed)
   *  onProgress sees {stage: "draft_ready", draft, draft_error} and ready.info is updated.
   *  draftDelayMs (tests, with faults) holds the draft back. faultBatchVariant (tests, with faults): the
   *  first champion opened computes batch-variant logits, so the load-time batch check fails
   *  (docs/browser.md "Batch invariance at load"); faultAdapterIsHardware (tests, with faults): "auto"
   *  takes a software WebGPU adapter as hardware. warmUp (default true): before ready,
   *  a few small requests run the whole round path once per mode, outputs dropped, so the first
   *  request is as fast as the tenth (ready.timing_ms.warmup, ready.info.warmup; web/orchestrator/warmup.mjs).
   *  threads ("auto" or a count): the WASM champion's; "auto" takes min(cores, 4) in a cross-origin
   *  isolated page and keeps it only if a forward is faster than at 1 thread
   *  (ready.info.champion.threads, threads_why; champion_backends.mjs championThreads).
   *  calibrate ("auto" | "force" | "off"): after the warm-up, this device's costs for speculate
   *  "auto", from the IndexedDB cache or measured ("force": measured anew; "off": none), as
   *  ready.info.calibration; one measured again later (drift, a late draft) arrives as
   *  {stage: "calibration", calibration} and replaces it (web/orchestrator/calibrate.mjs).
   *  cache (default true): weight files are read from and kept in the verified weight cache
   *  (web/weight_cache.mjs; each fetch progress says p.cache); false: neither read nor written.
   *  gpuMemoryBudget ("auto" default | bytes | 0 for none): the WebGPU champion's plan is refused
   *  above it before its weights are fetched (E_OUT_OF_MEMORY naming the maxContext that would
   *  fit); "auto" is half of navigator.deviceMemory; under championBackend "auto" a refusal opens
   *  the WASM champion instead (ready.info.champion_fallback). */
  async load(models, { timeoutMs = 300000, faults = false, refuseAllocAfter = -1, championBackend = "auto", threads = "auto", matmul = "auto",
    draftPlacement = "auto", onProgress = null, draftInBackground = false, draftDelayMs = 0, warmUp = true,
    faultBatchVariant = false, faultAdapterIsHardware = false, calibrate = "auto", cache = true, gpuMemoryBudget = "auto" } = {}) {
    if (this.terminated) throw codedError("E_TERMINATED", this.endReason);
    if (this.running || this.queue.length) throw codedError("E_BUSY", "load while requests are running or queued");
    this.schema ??= await loadSchema(this.assets.protocol);
    if (!this.worker) this._startWorker();
    const { worker, ...assets } = this.assets;
    this._onDraftReady = onProgress;
    this.ready = await this._control("load", { models: absoluteModels(models), options: { faults, refuse_alloc_after: refuseAllocAfter,
      champion_backend: championBackend, threads, matmul, draft_placement: draftPlacement, assets,
      draft_in_background: draftInBackground, draft_delay_ms: draftDelayMs, warm_up: warmUp,
      fault_batch_variant: faultBatchVariant, fault_adapter_is_hardware: faultAdapterIsHardware, calibrate, cache,
      gpu_memory_budget: gpuMemoryBudget } }, timeoutMs, onProgress);
    return this.ready;
  }

  _startWorker() {
    this.worker = startModuleWorker(this.workerUrl);
    this.mail = openMailbox(this.worker);   // messages it has not received yet (mailbox.mjs), or null
    this.worker.onmessage = (ev) => this._onMessage(ev.data);
    this.worker.onerror = (ev) => this._kill(codedError("E_INTERNAL", `orchestrator worker failed: ${ev.message || "error event"}`));
  }

  /** Post one envelope; throws E_BAD_ARGUMENT when the payload cannot be cloned to the worker
   *  (a function, a DOM object, ...), so that no caller waits for an answer to a lost message. */
  _send(kind, request_id, epoch, payload) {
    try {
      postCounted(this.worker, this.mail, { kind, request_id, seq: this.seq++, epoch, payload });
    } catch (err) {
      throw codedError("E_BAD_ARGUMENT", `the ${kind} message cannot be sent to the worker (${err?.name ?? "Error"}: ${String(err?.message ?? err).split("\n")[0]})`);
    }
  }

  _newId(kind) { return `${kind}-${this.seq}-${Math.random().toString(16).slice(2, 10)}`; }

  _control(kind, payload, timeoutMs = 0, onProgress = null) {
    if (this.terminated || !this.worker) return Promise.reject(codedError("E_TERMINATED", this.endReason));
    const id = this._newId(kind);
    if (kind === "load") this._loadRequestId = id;   // its progress may go on after ready (a late draft)
    return new Promise((resolve, reject) => {
      const entry = { resolve, reject, timer: null, onProgress };
      if (timeoutMs) {
        entry.timer = setTimeout(() => {
          this.control.delete(id);
          reject(codedError("E_TIMEOUT", `${kind} did not finish within ${timeoutMs} ms`));
        }, timeoutMs);
      }
      this.control.set(id, entry);
      try {
        this._send(kind, id, this._epoch, payload);
      } catch (err) {
        this.control.delete(id);
        clearTimeout(entry.timer);
        reject(err);
      }
    });
  }

  /** Queue a request; see the header for what resolves and what rejects. silenceTimeoutMs: this
   *  request's limit on the worker's silence (default: the engine's). */
  generate(payload, onEvent = null, { ifBusy = this.whenBusy, silenceTimeoutMs = this.silenceTimeoutMs } = {}) {
    if (this.terminated) return Promise.reject(codedError("E_TERMINATED", this.endReason));
    if (!this.ready) return Promise.reject(codedError("E_BAD_ARGUMENT", "no model is loaded"));
    if ((this.running || this.queue.length) && ifBusy === "refuse") {
      return Promise.reject(codedError("E_BUSY", "a request is running (ifBusy: \"refuse\")"));
    }
    if (!(silenceTimeoutMs > 0 && silenceTimeoutMs <= MAX_TIMER_MS)) {   // setTimeout fires at once beyond 2^31-1 ms
      return Promise.reject(codedError("E_BAD_ARGUMENT", `silenceTimeoutMs must be in (0, ${MAX_TIMER_MS}] ms, got ${shown(silenceTimeoutMs)}`));
    }
    try { this.schema.checkRequest(payload); } catch (err) { return Promise.reject(err); }
    return new Promise((resolve, reject) => {
      this.queue.push({ payload, onEvent, resolve, reject, silenceMs: silenceTimeoutMs });
      this._pump();
    });
  }

  _pump() {
    if (this.running || !this.queue.length || this.terminated) return;
    const next = this.queue.shift();
    const request_id = this._newId("generate");
    this.running = { ...next, request_id, epoch: this._epoch, silenceTimer: null };
    try {
      this.schema.checkRequest(next.payload);   // again: the caller may have changed it while it queued
      this._send("generate", request_id, this._epoch, next.payload);
    } catch (err) {
      this._finishRunning((r) => r.reject(err));   // refused here: nothing reached the worker
      return;
    }
    this._heard();
  }

  /** (Re)start the running request's silence timer: the worker spoke for it just now. */
  _heard() {
    const r = this.running;
    if (!r) return;
    clearTimeout(r.silenceTimer);
    r.silenceTimer = setTimeout(() => {
      if (this.running !== r) return;
      this._kill(codedError("E_TIMEOUT", `the orchestrator worker said nothing for ${r.silenceMs} ms during a request; ` +
        "the engine was ended (create a new one)"));
    }, r.silenceMs);
  }

  _finishRunning(fn) {
    const r = this.running;
    this.running = null;
    clearTimeout(r.silenceTimer);
    fn(r);
    queueMicrotask(() => this._pump());
  }

  /** End the running request at its next round boundary (it resolves "cancelled"); true if one ran. */
  cancel() {
    if (!this.running || this.terminated) return false;
    this._epoch += 1;
    this._send("cancel", this.running.request_id, this._epoch, {});
    return true;
  }

  /** Fault injection for tests (needs Engine.create(..., {faults: true})): {action, at, min_round, ms}. */
  fault(spec) { return this._control("fault", spec, 60000); }

  /** The worker's own accounting: GPU buffers live / bytes, WASM and Pyodide heap sizes, stale drops. */
  memory() { return this._control("memory", {}, 60000); }

  /** Free the GPU buffers, end both workers, destroy every proxy; queued requests fail E_TERMINATED. */
  async terminate({ timeoutMs = 10000 } = {}) {
    if (this.terminated) return;
    for (const q of this.queue.splice(0)) q.reject(codedError("E_TERMINATED", this.endReason));
    this.cancel();
    if (this.worker) {
      try {
        await this._control("terminate", {}, timeoutMs);
      } catch { /* a worker that does not answer is ended below all the same */ }
    }
    this._kill(codedError("E_TERMINATED", "the engine was terminated"));
  }

  _kill(error) {
    if (!this.terminated && error?.code !== "E_TERMINATED") this.endReason = `the engine was ended: ${error?.detail ?? error?.message ?? error}`;
    this.terminated = true;
    this.worker?.terminate();
    this.worker = null;
    if (this.running) this._finishRunning((r) => r.reject(error));
    for (const q of this.queue.splice(0)) q.reject(error);
    for (const [id, c] of this.control) { clearTimeout(c.timer); c.reject(error); this.control.delete(id); }
  }

  _onMessage(data) {
    let env = data;
    try {
      if (typeof data === "string") env = JSON.parse(data);   // a request's events come as JSON text
      this.schema.validate(env);
    } catch { this.invalidDropped++; return; }
    const c = this.control.get(env.request_id);
    if (c) {
      if (env.kind === "progress" && !["fault_armed", "memory", "terminated"].includes(env.payload.stage)) {
        try { c.onProgress?.(env.payload); } catch (err) { console.error("onProgress threw:", err); }
        return;
      }
      this.control.delete(env.request_id);
      clearTimeout(c.timer);
      if (env.kind === "error") c.reject(codedError(env.payload.code, env.payload.message));
      else c.resolve(env.payload);
      return;
    }
    if (env.kind === "progress" && env.request_id === this._loadRequestId && this.ready) {   // a late draft (draftInBackground):
      if (env.payload.stage === "draft_ready") {                                            // its bytes, then its arrival
        Object.assign(this.ready.info, { draft: env.payload.draft, draft_error: env.payload.draft_error, draft_loading: false });
      }
      if (env.payload.stage === "calibration") this.ready.info.calibration = env.payload.calibration;   // measured again
      try { this._onDraftReady?.(env.payload); } catch (err) { console.error("onProgress threw:", err); }
      return;
    }
    const r = this.running;
    if (!r || env.request_id !== r.request_id || env.epoch !== r.epoch) { this.staleDropped++; return; }
    this._heard();
    if (env.kind === "result") {
      const result = env.payload;
      // every drop is reported once: in the first result after it
      result.stats.stale_dropped = { ...(result.stats.stale_dropped ?? {}), engine: this.staleDropped - this.staleReported };
      this.staleReported = this.staleDropped;
      this._finishRunning((x) => x.resolve(result));
    } else if (env.kind === "error" && env.payload.fatal) {
      const { code, message } = errorPayload(env.payload, "E_INTERNAL", this.schema.codes);
      this._finishRunning((x) => x.reject(codedError(code, message)));
    } else if (r.onEvent) {
      try { r.onEvent(env); } catch (err) { console.error("onEvent threw:", err); }
    }
  }
}

/** Model URLs made absolute against the page (the worker may run from a blob: URL). */
function absoluteModels(models) {
  const abs = (u) => (typeof u === "string" && u ? new URL(u, globalThis.location?.href).href : u);
  return { ...models, champion: abs(models.champion), draft: abs(models.draft),
    ...(typeof models.manifest === "string" ? { manifest: abs(models.manifest) } : {}) };
}
