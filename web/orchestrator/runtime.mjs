// The orchestrator worker's runtime: Pyodide (booted once per worker) running
// exactspec.pyodide.browser_backend over a bridge to the WebGPU champion and the draft worker. Every
// PyProxy it makes is destroyed by it: per request, per cancel, and at unload/terminate.
// A load reports progress (notify): {stage: "prepare" | "python" | "check" | "models"}, and
// {stage: "fetch", url, name, loaded, total, done} for every artifact's bytes (the worker's fetch
// counts them, web/fetch_progress.mjs); asset URLs come from options.assets (the page resolves
// them from the engine module's URL), and local model folders arrive as models.files.
// After the warm-up the load calibrates this device ({stage: "calibrate"}; calibrate.mjs): served to
// Python by the bridge, cached in IndexedDB, measured again between requests when two requests in a
// row report drift; a new one is announced as {stage: "calibration", calibration} on the load's
// request (ready.info.calibration follows it).
// Weight files go through the weight cache (web/weight_cache.mjs) unless options.cache is false; a
// load whose cached copy fails its sha256 ({stage: "cache", evicted}) runs once more from the network.
import { bootPython, defaultAssets } from "./boot.mjs";
import { createBridge } from "./bridge.mjs";
import { chooseChampionBackend, prepareChampion } from "./champion_backends.mjs";
import { checkModels } from "./model_check.mjs";
import { warmUp, warmupRequests } from "./warmup.mjs";
import { adapterDescription, agreeing, calibrationKey, driftTracker, measureCalibration, openCalibrationCache, spotCheck,
  usableCached, withinDrift } from "./calibrate.mjs";
import { codedError, errorPayload } from "../protocol.mjs";

/** Call a Python method by name, destroying the bound-method proxy and any proxy it returns
 *  unless `keep`. */
function callPy(obj, name, args, keep = false) {
  const fn = obj[name];
  try {
    const out = fn(...args);
    if (!keep && out && typeof out.destroy === "function") { out.destroy(); return undefined; }
    return out;
  } finally {
    fn.destroy?.();
  }
}

/** Why there is no draft, as the session says it after "E_DRAFT_LOST: speculate=draft needs a
 *  draft model: ": the cause's sentence without its code (one code per error; ready.info.draft_error
 *  keeps the cause's own code). */
const draftWhy = (err) => err.message;

export const CALIBRATE_MODES = ["auto", "force", "off"];
/** A background draft begins its load this long after ready unless a request came first (startDraftWhenIdle). */
export const DRAFT_START_GRACE_MS = 100;

/** The WASM builds next to this module (web/build/), unless the page's assets say otherwise. */
function wasmAssets(assets) {
  const build = assets.build ?? new URL("../build/", import.meta.url).href;
  return { draftWasmUrl: new URL("cpu.wasm", build).href, championWasmUrl: new URL("cpu.wasm", build).href };
}

/** models with local folders: {champion, draft, files: {"champion/config.json": File, ...}}; the
 *  draft then runs inline (its own worker could not read the page's files). */
function placementFor(models, requested) {
  return models.files && requested !== "inline" ? "inline" : requested;
}

export function createPyodideRuntime({ counters, post, fetchHooks = null }) {
  let py = null;              // { pyodide, timing_ms, backend }
  let loaded = null;          // { bridge (handle), session (PyProxy), generate (PyProxy fn), faults }
  let lateDraft = null;       // the draft loading behind a ready champion (draftInBackground), or null
  let draftStarted = false;   // whether that draft's load has begun (startDraftWhenIdle, draftFor)
  let warmOption = false;     // whether this load warms up (options.warm_up): a late draft is warmed too
  let lateWarm = null;        // a late draft's warm-up, due at the next idle moment ({maxBlock, vocabSize}), or null
  let current = null;         // the running generate envelope (bridge notices go to its caller)
  // calibration (calibrate.mjs): the cache (opened once per worker), the load's mode and notify, the
  // measurement in flight between requests, whether one is due, the drift run and a test's override
  let cachePromise = null;
  const cal = { mode: "auto", notify: () => {}, running: null, due: false, dueFromDrift: false, drift: driftTracker(), override: null };
  const notifyRequest = (payload) => {
    if (current) post({ kind: "progress", request_id: current.request_id, seq: 0, epoch: current.epoch, payload });
  };

  function runtimeInfo() {
    return {
      runtime_version: py ? `pyodide-${py.pyodide.version}/python-${py.pythonVersion}` : "pyodide-unknown",
      pyodide_heap_bytes: py ? py.pyodide._module.HEAP8.buffer.byteLength : 0,
    };
  }

  function unload() {
    if (!loaded) return;
    const { bridge, session, generate } = loaded;
    loaded = null;
    session.destroy();
    generate.destroy();
    bridge.close();
  }

  async function boot(assets) {
    if (py) return { pyodide: 0, install: 0 };
    const { pyodide, timing_ms, snapshot, codeKey } = await bootPython({ ...defaultAssets(), ...assets });
    const backend = pyodide.pyimport("exactspec.pyodide.browser_backend");
    const sys = pyodide.pyimport("sys");
    const vi = sys.version_info;
    py = { pyodide, backend, pythonVersion: `${vi.major}.${vi.minor}`, snapshot, codeKey };
    vi.destroy();
    sys.destroy();
    return timing_ms;
  }

  async function loadPair(models, options, notify) {
    const t0 = performance.now();
    const mode = options.calibrate ?? "auto";
    if (!CALIBRATE_MODES.includes(mode)) throw codedError("E_BAD_ARGUMENT", `calibrate must be one of ${CALIBRATE_MODES.join(", ")}, got ${JSON.stringify(mode)}`);
    await cal.running?.catch(() => {});         // a calibration between requests uses the bridge
    unload();                                   // a second load frees the first
    Object.assign(cal, { mode, notify, due: false, dueFromDrift: false, drift: driftTracker(), override: null });
    const assets = options.assets ?? {};
    const choice = await chooseChampionBackend(options.champion_backend ?? "auto",
      { softwareAdapterCounts: !!options.faults && !!options.fault_adapter_is_hardware });   // tests: auto's WebGPU path on SwiftShader
    const prepared = prepareChampion(choice.kind);   // device + pipelines while Python boots
    if (choice.kind === "webgpu") {
      notify({ stage: "prepare", what: "WebGPU device and shader pipelines", done: false });
      prepared.pipelines?.then(() => notify({ stage: "prepare", what: "WebGPU device and shader pipelines", done: true }), () => {});
    }
    let pyTiming, checked, built;
    try {
      notify({ stage: "python" });
      pyTiming = await boot(assets);
      notify({ stage: "check" });
      // configs through the shared validator, before any weights (a GGUF's check from the derived cache when allowed)
      // a draft that loads after ready has its files checked then, in the background, before its weights
      checked = await checkModels(py.pyodide, models, { codeKey: options.cache !== false ? py.codeKey : null,
        deferDraft: !!options.draft_in_background && !!models.draft });
    } catch (err) {
      prepared.close();
      throw err;
    }
    notify({ stage: "models" });
    built = await createBridge({ choice, prepared, ...wasmAssets(assets),
      championUrl: models.champion, championConfig: checked.champion_config ?? null,
      draftUrl: models.draft || null, draftConfig: checked.draft_config ?? null, counters, runtimeInfo,
      faults: !!options.faults, refuseAllocAfter: options.refuse_alloc_after ?? -1, batchVariantFault: !!options.fault_batch_variant,
      championBackend: options.champion_backend ?? "auto", threads: options.threads ?? "auto", matmul: options.matmul ?? "auto",
      draftPlacement: placementFor(models, options.draft_placement ?? "auto"),
      notify: notifyRequest,
      draftInBackground: !!options.draft_in_background, draftDelayMs: options.draft_delay_ms ?? 0, draftCheck: checked.checkDraft,
      cache: options.cache !== false, calibrateMode: mode, gpuMemoryBudget: options.gpu_memory_budget ?? "auto",
      xgrammarUrl: assets.xgrammar ?? null,
    });
    let session;
    try {
      checked.verifyRunArtifacts(built.info);
      built.bridge.useTokenizer(checked.tokenizer_json);   // response_format constraints compile for it
      session = callPy(py.backend, "make_session", [built.bridge, checked.tokenizer_json, checked.tokenizer_config_json,
        checked.generation_config_json, JSON.stringify(built.info.champion),
        built.info.draft ? JSON.stringify(built.info.draft) : "",
        built.info.draft_error ? draftWhy(built.info.draft_error) : built.info.draft_loading ? "the draft is still loading" : "",
        checked.chat_template_jinja], true);
      loaded = { bridge: built, session, generate: py.backend.generate, faults: !!options.faults };
    } catch (err) {
      built.close();
      throw err;
    }
    const chatTemplate = !!(checked.chat_template_jinja || JSON.parse(checked.tokenizer_config_json).chat_template?.length);
    // warm-up: the whole round path once per mode before ready (not with refuseAllocAfter, which
    // counts the GPU allocations a test expects of the load itself; nor with options.warm_up false)
    let warm = null;
    warmOption = options.warm_up !== false && (options.refuse_alloc_after ?? -1) < 0;
    lateWarm = null;
    if (warmOption) {
      notify({ stage: "warmup" });
      let n = 0;
      warm = await warmUp((payload) => runQuiet(payload, `warmup-${n++}`), warmupRequests({
        maxBlock: built.info.champion.max_block, vocabSize: built.info.champion.vocab_size, draft: !!built.info.draft, chat: chatTemplate }),
      typeof options.warm_up === "object" && options.warm_up ? options.warm_up : {});   // {minCalls, budgetMs}
    }
    let calibration = null, calibrationMs = 0;
    if (mode !== "off") {
      notify({ stage: "calibrate" });
      const tc = performance.now();
      calibration = await calibrate(mode);
      calibrationMs = performance.now() - tc;
    }
    const late = built.whenDraft();
    lateDraft = late;
    draftStarted = false;
    if (late) {                                 // the draft arrives after ready: check it, attach it, say so
      setTimeout(startDraftWhenIdle, DRAFT_START_GRACE_MS);   // after ready; a request that starts first defers it
      late.then(async ({ draft, draft_error: failed }) => {
        await new Promise((r) => setTimeout(r, 0));       // after the load's "ready" reply, whatever the timing
        if (loaded?.session !== session) return;          // unloaded or replaced meanwhile
        let error = failed;
        if (draft) {
          try {
            checked.verifyRunArtifacts({ ...built.info, draft });
            callPy(session, "attach_draft", [JSON.stringify(draft)]);
          } catch (err) {
            built.refuseDraft(err);
            error = errorPayload(err, "E_MANIFEST_MISMATCH");
          }
        }
        if (error) callPy(session, "set_draft_error", [draftWhy(error)]);
        else {
          // its rounds warmed as the load warms a draft loaded before ready, then its costs join the
          // calibration ("force": measured anew); both when idle, before the next request
          lateWarm = warmOption && { maxBlock: built.info.champion.max_block, vocabSize: built.info.champion.vocab_size };
          if (cal.mode !== "off") cal.due = cal.mode;
          calibrateWhenIdle();
        }
        notify({ stage: "draft_ready", draft: error ? null : draft, draft_error: error ?? null,
          draft_load_ms: built.timing_ms.draft_load });
      });
    }
    return { timing_ms: { ...pyTiming, ...built.timing_ms, check: checked.ms, warmup: warm ? warm.ms : 0, calibration: calibrationMs,
      total: performance.now() - t0 },
      info: { ...built.info, manifest: checked.summary, pyodide_snapshot: py.snapshot,
        warmup: warm && { requests: warm.requests, rounds: warm.rounds, tokens: warm.tokens, errors: warm.errors },
        chat_template: chatTemplate, calibration } };   // the page's chat default
  }

  /** The calibration for what is loaded now, from the cache (mode "auto"; checked by timing V(1):
   *  "stale" when it disagrees) or measured ("force"), served to Python -> the calibration with
   *  cache: "hit" | "miss" | "stale" | "unavailable" (and spot_check {v1_ms, ratio}), or {error, key}
   *  when it failed (the calibration served before stays; at load there is none: Python's
   *  conservative default applies). Only between requests. */
  async function calibrate(mode) {
    const built = loaded.bridge;
    const info = built.info, draft = built.currentDraft();
    let key;
    try {
      const env = JSON.parse(built.bridge.environment());
      key = await calibrationKey({ champion: info.champion.identity, draft: draft?.identity ?? "none",
        draft_placement: draft?.placement ?? "none", backend: info.champion.backend, matmul: info.champion.matmul ?? "none",
        threads: String(info.champion.threads ?? "none"), hardware_class: env.hardware_class,
        adapter: info.champion.backend === "webgpu" ? await adapterDescription() : "", user_agent: globalThis.navigator?.userAgent ?? "" });
      cachePromise ??= openCalibrationCache();
      const cache = await cachePromise;
      const how = { backend: info.champion.backend, key, vocabSize: info.champion.vocab_size };
      let out = null, spot = null;
      if (cache && mode !== "force") {      // a cached entry, if V(1) timed now agrees with it
        const entry = await cache.get(key).catch(() => null);
        if (usableCached(entry, key, { hasDraft: !!draft })) {
          spot = await spotCheck(built.calibrationProbe(), entry, how);
          if (withinDrift(spot.ratio)) out = { ...entry, source: "cache", cache: "hit", spot_check: spot };
        }
      }
      if (!out) {
        const measured = await measureCalibration(built.calibrationProbe(), how);
        if (cache) await cache.put(measured).catch(() => {});
        out = { ...measured, cache: !cache ? "unavailable" : spot ? "stale" : "miss", ...(spot ? { spot_check: spot } : {}) };
      }
      const { cache: _, ...served } = out;
      built.setCalibration(served);
      return out;
    } catch (err) {                         // what was served stays served (at load: nothing)
      return { error: `${err?.code ? `${err.code}: ` : ""}${err?.message ?? err}`, key: key ?? null };
    }
  }

  /** A due calibration (and first a late draft's warm-up), run now unless a request is running (its
   *  end calls this again); the next request waits for them. Announced on the load's request
   *  ({stage: "draft_warmup"}, {stage: "calibration"}). */
  function calibrateWhenIdle() {
    if ((!cal.due && !lateWarm) || current || cal.running || !loaded) return;
    const mode = cal.due, fromDrift = cal.dueFromDrift, warmDraft = lateWarm;
    cal.due = cal.dueFromDrift = false;
    lateWarm = null;
    const forLoad = loaded;
    const before = JSON.parse(loaded.bridge.bridge.calibration() || "null");
    cal.running = (async () => {
      if (warmDraft) {                  // a late draft's rounds, as the load's warm-up runs them
        let n = 0;
        const w = await warmUp((payload) => runQuiet(payload, `warmup-draft-${n++}`),
          warmupRequests({ ...warmDraft, draftOnly: true }), { minCalls: 120, budgetMs: 750 });
        if (loaded === forLoad) cal.notify({ stage: "draft_warmup", ms: w.ms, requests: w.requests, rounds: w.rounds, errors: w.errors });
      }
      if (!mode || loaded !== forLoad) return;
      const calibration = await calibrate(mode);
      if (fromDrift) cal.drift.backoff(agreeing(before, calibration));   // a steady gap: rarer triggers
      if (loaded === forLoad) cal.notify({ stage: "calibration", calibration });
    })().finally(() => { cal.running = null; });
  }

  /** A background draft (draftInBackground) begins its load when no request runs: DRAFT_START_GRACE_MS
   *  after ready (a request sent at once, as a script or the CLI sends it, comes first and keeps the
   *  CPU: a one-shot answer never pays for a draft it would not amortise), or at the end of the
   *  request that deferred it (requests back to back: it loads beside the next one). */
  function startDraftWhenIdle() {
    if (!loaded || !lateDraft || current || draftStarted) return;
    draftStarted = true;
    cal.notify({ stage: "draft_start" });
    loaded.bridge.startDraft();
  }

  /** speculate "draft" asked while the background draft is still loading: wait for it (before any
   *  output; it begins now if it had not), and for the calibration it makes due. */
  async function draftFor(env) {
    const speculate = env.payload?.config?.speculate ?? "auto";
    if (speculate !== "draft" || !lateDraft || !loaded) return;
    const late = lateDraft;
    if (!draftStarted) {
      draftStarted = true;
      cal.notify({ stage: "draft_start", for: "speculate draft" });
      loaded.bridge.startDraft();
    }
    await late;
    await new Promise((r) => setTimeout(r, 0));   // its attach (the late.then above) runs first
    if (lateDraft === late) lateDraft = null;
    calibrateWhenIdle();
    await cal.running?.catch(() => {});
  }

  /** After a request: its drift (stats.auto.drift, or a test's override) into the run; two in a row
   *  outside DRIFT_RANGE drop the cached entry and make a calibration due. */
  async function observeDrift(result) {
    let drift = result?.stats?.auto?.drift ?? null;
    if (cal.override && cal.override.left > 0) { drift = cal.override.value; cal.override.left--; }
    if (cal.mode === "off" || !cal.drift.observe(drift)) return;
    const key = JSON.parse(loaded.bridge.bridge.calibration() || "{}").key;
    const cache = await (cachePromise ?? Promise.resolve(null));
    if (cache && key) await cache.delete(key).catch(() => {});
    cal.due = "force";
    cal.dueFromDrift = true;
  }

  /** One request through the loaded session with its events dropped (the warm-up) -> result JSON. */
  async function runQuiet(payload, requestId) {
    await loaded.bridge.beginRequest(0);
    const env = { kind: "generate", request_id: requestId, seq: 0, epoch: 0, payload };
    const coro = loaded.generate(loaded.session, JSON.stringify(env), () => {});
    try {
      return JSON.parse(await coro);
    } finally {
      coro.destroy?.();
    }
  }

  return {
    async load({ models, options = {} }, notify) {
      fetchHooks?.setListener((p) => notify({ stage: "fetch", ...p }));
      fetchHooks?.setLocalFiles(models.files);
      fetchHooks?.setCache(options.cache !== false);
      try {
        try {
          return await loadPair(models, options, notify);
        } catch (err) {   // a cached copy failed its sha256 and was removed: once more, from the network
          if (!err?.cacheEvicted) throw err;
          notify({ stage: "cache", evicted: err.detail ?? err.message });
          return await loadPair(models, options, notify);
        }
      } finally {   // a draft still loading in the background keeps reporting its bytes until it is in
        const late = lateDraft;
        if (late) late.finally(() => { if (lateDraft === late) fetchHooks?.setListener(null); });
        else fetchHooks?.setListener(null);
      }
    },

    async generate(env) {
      if (!loaded) throw codedError("E_BAD_ARGUMENT", "no model is loaded");
      await draftFor(env);                      // speculate "draft": the background draft first
      await cal.running?.catch(() => {});       // a calibration between requests ends first
      current = env;
      let result;
      try {
        await loaded.bridge.beginRequest(env.epoch);
        // each event crosses to the page as the JSON text Python wrote (the page parses it):
        // parsed here, it was one more pass over every event, and a structured clone of the object
        const coro = loaded.generate(loaded.session, JSON.stringify(env), post);
        try {
          result = JSON.parse(await coro);
        } finally {
          coro.destroy?.();
        }
      } finally {
        current = null;
      }
      await observeDrift(result);
      // announced before this result is posted (the same channel, in order): a caller that times
      // requests (the evaluation) waits for the measurement instead of running beside it
      if (cal.due && cal.dueFromDrift) cal.notify({ stage: "calibration_due", reason: "drift" });
      if (lateDraft) setTimeout(startDraftWhenIdle, 0);   // a background draft deferred by this request
      if (cal.due || lateWarm) setTimeout(calibrateWhenIdle, 0);   // after this result is posted; a request that starts first defers it
      return result;
    },

    cancel(epoch) {
      if (!loaded) return;
      callPy(loaded.session, "cancel_epoch", [epoch]);
      loaded.bridge.cancel(epoch);
    },

    fault(spec) {
      if (!loaded) throw codedError("E_BAD_ARGUMENT", "no model is loaded");
      if (spec.action === "report_drift") {     // tests: the next `requests` results report drift `value`
        if (!loaded.faults) throw codedError("E_BAD_ARGUMENT", "fault injection is off (load with options.faults = true)");
        cal.override = { value: spec.value ?? 2, left: spec.requests ?? 2 };
        return;
      }
      loaded.bridge.arm(spec);
    },

    memory() {
      const info = runtimeInfo();
      return { ...(loaded ? loaded.bridge.memory() : {}), pyodide_heap_bytes: info.pyodide_heap_bytes };
    },

    async terminate() {
      await cal.running?.catch(() => {});
      unload();
    },
  };
}
