// The orchestrator worker's runtime: Pyodide (booted once per worker) running
// exactspec.pyodide.browser_backend over a bridge to the WebGPU champion and the draft worker. Every
// PyProxy it makes is destroyed by it: per request, per cancel, and at unload/terminate.
// A load reports progress (notify): {stage: "prepare" | "python" | "check" | "models"}, and
// {stage: "fetch", url, name, loaded, total, done} for every artifact's bytes (the worker's fetch
// counts them, web/fetch_progress.mjs); asset URLs come from options.assets (the page resolves
// them from the engine module's URL), and local model folders arrive as models.files.
import { bootPython, defaultAssets } from "./boot.mjs";
import { createBridge } from "./bridge.mjs";
import { chooseChampionBackend, prepareChampion } from "./champion_backends.mjs";
import { checkModels } from "./model_check.mjs";
import { warmUp, warmupRequests } from "./warmup.mjs";
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
  let current = null;         // the running generate envelope (bridge notices go to its caller)
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
    const { pyodide, timing_ms, snapshot } = await bootPython({ ...defaultAssets(), ...assets });
    const backend = pyodide.pyimport("exactspec.pyodide.browser_backend");
    const sys = pyodide.pyimport("sys");
    const vi = sys.version_info;
    py = { pyodide, backend, pythonVersion: `${vi.major}.${vi.minor}`, snapshot };
    vi.destroy();
    sys.destroy();
    return timing_ms;
  }

  async function loadPair(models, options, notify) {
    const t0 = performance.now();
    unload();                                   // a second load frees the first
    const assets = options.assets ?? {};
    const choice = await chooseChampionBackend(options.champion_backend ?? "auto");
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
      checked = await checkModels(py.pyodide, models);   // configs through the shared validator, before any weights
    } catch (err) {
      prepared.close();
      throw err;
    }
    notify({ stage: "models" });
    built = await createBridge({ choice, prepared, ...wasmAssets(assets),
      championUrl: models.champion, championConfig: checked.champion_config ?? null,
      draftUrl: models.draft || null, draftConfig: checked.draft_config ?? null, counters, runtimeInfo,
      faults: !!options.faults, refuseAllocAfter: options.refuse_alloc_after ?? -1,
      championBackend: options.champion_backend ?? "auto", threads: options.threads ?? "auto", matmul: options.matmul ?? "auto",
      draftPlacement: placementFor(models, options.draft_placement ?? "auto"),
      notify: notifyRequest,
      draftInBackground: !!options.draft_in_background, draftDelayMs: options.draft_delay_ms ?? 0,
    });
    let session;
    try {
      checked.verifyRunArtifacts(built.info);
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
    if (options.warm_up !== false && (options.refuse_alloc_after ?? -1) < 0) {
      notify({ stage: "warmup" });
      let n = 0;
      warm = await warmUp((payload) => runQuiet(payload, `warmup-${n++}`), warmupRequests({
        maxBlock: built.info.champion.max_block, vocabSize: built.info.champion.vocab_size, draft: !!built.info.draft, chat: chatTemplate }),
      typeof options.warm_up === "object" && options.warm_up ? options.warm_up : {});   // {minCalls, budgetMs}
    }
    const late = built.whenDraft();
    lateDraft = late;
    if (late) {                                 // the draft arrives after ready: check it, attach it, say so
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
        notify({ stage: "draft_ready", draft: error ? null : draft, draft_error: error ?? null,
          draft_load_ms: built.timing_ms.draft_load });
      });
    }
    return { timing_ms: { ...pyTiming, ...built.timing_ms, check: checked.ms, warmup: warm ? warm.ms : 0, total: performance.now() - t0 },
      info: { ...built.info, manifest: checked.summary, pyodide_snapshot: py.snapshot,
        warmup: warm && { requests: warm.requests, rounds: warm.rounds, tokens: warm.tokens, errors: warm.errors },
        chat_template: chatTemplate } };   // the page's chat default
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
      try {
        return await loadPair(models, options, notify);
      } finally {   // a draft still loading in the background keeps reporting its bytes until it is in
        const late = lateDraft;
        if (late) late.finally(() => { if (lateDraft === late) fetchHooks?.setListener(null); });
        else fetchHooks?.setListener(null);
      }
    },

    async generate(env) {
      if (!loaded) throw codedError("E_BAD_ARGUMENT", "no model is loaded");
      current = env;
      try {
        await loaded.bridge.beginRequest(env.epoch);
        const coro = loaded.generate(loaded.session, JSON.stringify(env), (s) => post(JSON.parse(s)));
        try {
          return JSON.parse(await coro);
        } finally {
          coro.destroy?.();
        }
      } finally {
        current = null;
      }
    },

    cancel(epoch) {
      if (!loaded) return;
      callPy(loaded.session, "cancel_epoch", [epoch]);
      loaded.bridge.cancel(epoch);
    },

    fault(spec) {
      if (!loaded) throw codedError("E_BAD_ARGUMENT", "no model is loaded");
      loaded.bridge.arm(spec);
    },

    memory() {
      const info = runtimeInfo();
      return { ...(loaded ? loaded.bridge.memory() : {}), pyodide_heap_bytes: info.pyodide_heap_bytes };
    },

    async terminate() {
      unload();
    },
  };
}
