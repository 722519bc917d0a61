// The JS side of the Pyodide adapter (py/exactspec/pyodide/browser_backend.py): a request is
// bridge.begin() once, then bridge.round() once per round (session.mjs: one crossing, an O(k)
// record back), then bridge.end(). Owns the champion backend (WebGPU or WASM,
// champion_backends.mjs) and the draft: a client of the draft worker, or the WASM draft in this
// thread (draft_inline.mjs); recovers both between requests (a lost device is rebuilt, a dead draft
// worker respawned), arms test faults, and reports counters and memory for receipts.
import { threadCacheFor } from "./thread_cache.mjs";
import { InlineDraft } from "../draft/draft_inline.mjs";
import { DraftWorkerClient } from "../draft/draft_worker.mjs";
import { codedError, errorPayload, loadSchema, roundRecordLayout } from "../protocol.mjs";
import { createSession } from "./session.mjs";
import { chooseChampionBackend, openChampion } from "./champion_backends.mjs";
import { batchVariantError, checkBatchInvariance } from "./batch_check.mjs";
import { mailWaiting, shouldYield } from "./mailbox.mjs";

export const MAX_BLOCK = 9;            // k <= 8 proposals + the pending token
const FAULT_POINTS = ["championForward", "championRound", "draftForward", "draftPropose"];
const FAULT_ACTIONS = ["kill_draft", "destroy_device", "nan_champion", "nan_draft", "stall"];
// Faults that act at once, at no point: "stale_draft" posts an envelope of an older epoch (and of
// another request) straight into the draft worker, which must drop and count it.
const IMMEDIATE_FAULTS = ["stale_draft"];

/** Where the draft runs: "inline" (in the orchestrator's thread) next to a CPU champion, whose
 *  rounds are sequential anyway, so one bridge call does a whole round; in its own worker
 *  next to a GPU champion. "worker" / "inline" force it. */
export function chooseDraftPlacement(placement, championKind) {
  if (placement === "auto") return championKind === "wasm" ? "inline" : "worker";
  if (placement === "inline" || placement === "worker") return placement;
  throw codedError("E_BAD_ARGUMENT", `draft_placement must be auto, inline or worker, got ${placement}`);
}

/** The WebGPU champion's memory budget -> {bytes (0: none), source}: a number of bytes as given;
 *  "auto" half of navigator.deviceMemory (GiB, as the browser rounds it), none where it is not said. */
export function resolveGpuBudget(value) {
  if (value === "auto") {
    const gib = globalThis.navigator?.deviceMemory;
    return Number.isFinite(gib) && gib > 0 ? { bytes: Math.floor((gib / 2) * 2 ** 30), source: "deviceMemory" } : { bytes: 0, source: "none" };
  }
  if (!(Number.isSafeInteger(value) && value >= 0)) {
    throw codedError("E_BAD_ARGUMENT", `gpuMemoryBudget must be "auto" or a whole number of bytes >= 0, got ${JSON.stringify(value)}`);
  }
  return { bytes: value, source: value > 0 ? "option" : "none" };
}

/**
 * -> { bridge, info: {champion, draft, draft_error}, timing_ms, close() }
 * `counters()` / `runtimeInfo()` (from the worker's runtime) join the bridge's own counts and
 * versions; `faults` enables fault injection (tests); `refuseAllocAfter` >= 0 refuses the GPU
 * allocation after that many (tests). `draftCheck` (with draftInBackground): a function -> promise
 * of the draft's validated config (model_check.mjs checkDraft), run when the background load begins,
 * before its weights; a refusal becomes the draft's error, as a failed load does.
 */
export async function createBridge({ championUrl, championConfig = null, draftUrl, draftConfig = null, maxContext, draftWasmUrl = new URL("../build/cpu.wasm", import.meta.url).href,
  championWasmUrl = new URL("../build/cpu.wasm", import.meta.url).href, championBackend = "auto", threads = "auto", matmul = "auto", draftPlacement = "auto", choice = null, prepared = null,
  counters = () => ({}), runtimeInfo = () => ({}), faults = false, refuseAllocAfter = -1, notify = () => {},
  draftInBackground = false, draftDelayMs = 0, draftCheck = null, batchVariantFault = false, cache = false,
  calibrateMode = "off", gpuMemoryBudget = "auto", xgrammarUrl = null }) {
  const t0 = performance.now();
  const layout = roundRecordLayout((await loadSchema()).schema);
  choice ??= await chooseChampionBackend(championBackend);
  const openOpts = { championUrl, championConfig, maxContext, maxBlock: MAX_BLOCK, wasmUrl: championWasmUrl, threads, matmul };
  const gpuBudget = resolveGpuBudget(gpuMemoryBudget);
  let champ, championFallback = null;
  try {
    champ = await openChampion(choice.kind, { ...openOpts, refuseAllocAfter, prepared, memoryBudgetBytes: gpuBudget.bytes });
  } catch (err) {
    // a WebGPU plan over the budget (refused before its weights were fetched) or a device that ran out:
    // under "auto" the WASM champion instead, said in ready.info and every receipt
    if (err.code !== "E_OUT_OF_MEMORY" || choice.kind !== "webgpu" || championBackend !== "auto") throw err;
    championFallback = { code: err.code, message: err.message.replace(/^E_OUT_OF_MEMORY: /, ""), from: "webgpu", gpu_memory_budget: gpuBudget };
    choice = { kind: "wasm", why: `${choice.why}, but it does not fit this device's GPU memory budget (E_OUT_OF_MEMORY): the WASM champion instead` };
    champ = await openChampion("wasm", openOpts);
  }
  if (faults && batchVariantFault) champ.setBatchVariantFault();   // tests: the first champion opened
  let warmMs = 0;
  // WASM: every forward path warmed, threads calibrated (or a cached choice spot-checked: thread_cache.mjs)
  const warm = async (c) => {
    const threadCache = await threadCacheFor(c, calibrateMode).catch(() => null);
    const s = performance.now();
    const w = c.warmUp?.({ cachedThreads: threadCache?.entry ?? null }) ?? null;
    warmMs += performance.now() - s;
    if (w?.threads_measured) await threadCache?.store(w.threads_measured);
    return w && { forwards_ms: w.forwards_ms, calibrate_ms: w.calibrate_ms, ...(w.threads_cache ? { threads_cache: w.threads_cache } : {}) };
  };
  let championWarmup = await warm(champ);
  // the batch-invariance check (batch_check.mjs), before any request uses the champion (after the WASM
  // warm-up, whose forwards are discarded: warm, the check costs half): a variant WebGPU champion is
  // closed and the WASM one opened instead (E_BATCH_VARIANT in ready.info and every receipt), unless
  // WebGPU was asked for by name; a variant WASM champion fails the load
  const checked = async (c) => {       // -> the check; a variant or failed one closes the champion
    try {
      const check = await checkBatchInvariance(c, { maxBlock: MAX_BLOCK });
      if (check.result !== "variant") return check;
      throw Object.assign(batchVariantError(check), { check });
    } catch (err) {
      c.close();
      throw err;
    }
  };
  let batchCheck;
  try {
    batchCheck = await checked(champ);
  } catch (err) {
    if (err.code !== "E_BATCH_VARIANT" || champ.kind === "wasm" || championBackend === "webgpu") throw err;
    championFallback = { code: err.code, message: err.detail, from: champ.kind, batch_check: err.check };
    choice = { kind: "wasm", why: `${choice.why}, but its kernels are batch-variant (E_BATCH_VARIANT): the WASM champion instead` };
    champ = await openChampion("wasm", openOpts);
    championWarmup = await warm(champ);
    batchCheck = await checked(champ);
  }
  const checkMs = batchCheck.ms + (championFallback?.batch_check?.ms ?? 0);
  const t1 = performance.now();
  let draft = null, draftError = null, draftRespawns = 0, closed = false;
  let epoch = 0;
  const placement = chooseDraftPlacement(draftPlacement, choice.kind);
  // draftConfig: the validated config from the model check (web/formats/model_config.mjs). Inline
  // next to the WASM champion, the draft loads into the champion's own instance (one CPU module), so
  // a round is one call into it (session.mjs cpuRound).
  const spawnOnce = () => (placement === "inline" && champ.loadDraft
    ? champ.loadDraft({ modelUrl: draftUrl, configJson: draftConfig }).then((d) => Object.assign(new InlineDraft(d), { inChampionMemory: true }))
    : (placement === "inline" ? InlineDraft : DraftWorkerClient).create({ wasmUrl: draftWasmUrl, modelUrl: draftUrl,
      configJson: draftConfig, cache }));
  // a cached copy of the draft's weights that fails its sha256 is removed (web/weight_cache.mjs): once more, from the network
  const spawnDraft = () => spawnOnce().catch((err) => (err?.cacheEvicted ? spawnOnce() : Promise.reject(err)));
  // draftInBackground: the bridge is ready with the champion alone and the draft arrives later
  // (whenDraft()); its load begins when the runtime calls startDraft() (when no request runs: a
  // request that is already running keeps the CPU to itself). Until it is in, speculate="draft"
  // waits for it (runtime.mjs) and "auto" runs without it. draftDelayMs (tests, with faults on)
  // holds the draft back to make that window observable.
  let draftLoading = null, backgroundDraft = null, startBackground = null;
  // champion_load: the opens (a fallback's both); champion_warmup, batch_check: the warm-ups, the checks (both);
  // draft_load: from the draft's start to its arrival (in the background: after ready, not in the load's total)
  const timing = { champion_load: t1 - t0 - warmMs - checkMs, champion_warmup: warmMs, draft_load: 0, batch_check: checkMs };
  if (draftUrl) {
    const load = () => {
      const ts = performance.now();
      const delay = faults && draftDelayMs > 0 ? new Promise((r) => setTimeout(r, draftDelayMs)) : null;
      // draftCheck (a background draft whose files were not checked before ready): its load-time
      // check first, whose validated config the loader then takes; a refusal is the draft's error
      const before = draftCheck ? (delay ?? Promise.resolve()).then(draftCheck).then((c) => { draftConfig = c; }) : delay;
      return (before ?? Promise.resolve()).then(spawnDraft).then((d) => {
        if (closed) { d.terminate(); return; }
        draft = d;
        draft.setEpoch(epoch);
      }, (err) => {   // the champion alone still works; speculate="draft" is refused before output
        draftError = errorPayload(err, "E_DRAFT_LOST");
      }).finally(() => {
        timing.draft_load = performance.now() - ts;
        draftLoading = null;
      });
    };
    if (draftInBackground) {
      let go;
      const started = new Promise((r) => { go = r; });
      startBackground = () => { if (go) { const g = go; go = null; g(); } };
      draftLoading = backgroundDraft = started.then(() => (closed ? undefined : load()));
    } else {
      await load();
    }
  }
  const armed = [];                    // fault specs waiting for their point
  const NO_DRAFT_COUNTS = { draft_client: 0, draft_worker: 0 };
  const addCounts = (a, b) => ({ draft_client: a.draft_client + b.draft_client, draft_worker: a.draft_worker + b.draft_worker });
  let retired = NO_DRAFT_COUNTS;       // stale counts of draft clients since replaced
  let taken = {};
  const cumulative = () => ({ ...counters(), ...addCounts(retired, draft ? draft.staleCounts : NO_DRAFT_COUNTS) });

  // the draft's own WASM memory; 0 when it lives in the champion's instance (one memory: its bytes
  // are counted once, in the champion's, which grew by them)
  const draftOwnBytes = () => (draft && !draft.inChampionMemory ? draft.memoryBytes : 0);
  const liveChampion = () => {
    if (champ.lost) throw codedError("E_DEVICE_LOST", `${champ.kind} champion lost (device destroyed)`);
    return champ;
  };
  const liveDraft = () => {
    if (!draft) {
      throw codedError("E_DRAFT_LOST", draftError ? draftError.message : draftLoading ? "the draft is still loading" : "no draft model loaded");
    }
    return draft;
  };
  /** null when no fault is armed for this point, else a promise that acts out the armed ones. */
  function hit(point, roundId) {
    const due = armed.filter((f) => f.at === point && roundId >= (f.min_round ?? 0));
    if (!due.length) return null;
    forgetHeld();                      // a fault may leave either model's K/V in any state
    for (const f of due) armed.splice(armed.indexOf(f), 1);
    return (async () => {
      for (const f of due) {
        if (f.action === "kill_draft") draft?.kill();
        else if (f.action === "destroy_device") champ.loseDevice();
        else if (f.action === "nan_draft") await draft?.injectNaN();
        else if (f.action === "stall") {
          notify({ stage: "stalled", at: point, round_id: roundId });
          await new Promise((r) => setTimeout(r, f.ms ?? 300));
        } else if (f.action === "nan_champion") nanPending = true;   // this round's rows (championRound only)
      }
    })();
  }
  let nanPending = false;

  // A CPU champion's round (and an inline draft's proposal) is plain computation: the session runs
  // it synchronously and Python gets its record without an event-loop hop (~0.5 ms a round under
  // Pyodide). Only with no fault armed (a stall must wait) and a champion that has the twins.
  let lastYield = performance.now();     // when this worker's event loop last ran other tasks
  const yielded = (value) => { lastYield = performance.now(); return value; };
  const sessionEnv = {
    layout, maxBlock: MAX_BLOCK,
    champion: liveChampion,
    championError: (err) => (champ.lost ? codedError("E_DEVICE_LOST", `${champ.kind} champion lost during the call: ${errorPayload(err).message}`) : err),
    draft: liveDraft,
    draftCanRunNow: () => typeof draft?.proposeNow === "function",
    canRunNow: () => armed.length === 0 && typeof champ.forwardNow === "function" && !champ.lost,
    cpuRound: (useDraft) => armed.length === 0 && !champ.lost && typeof champ.roundNow === "function" &&
      (!useDraft || (!!draft && !draft.dead && champ.cpuDraft() === draft.draft)),
    hit,
    takeNaN: () => { const armedNaN = nanPending; nanPending = false; return armedNaN; },
  };
  let session = null;
  let calibration = null;              // the calibration served to Python (setCalibration), or null
  // Prefix reuse: the ids whose K/V the champion and the draft hold at positions 0.. after the
  // last request (session.mjs keep()), tied to the objects that hold them (a rebuilt champion or a
  // respawned draft holds nothing). Anything else that runs them (calibration, spot checks, a
  // fault) forgets them.
  const held = { champion: null, championOf: null, draft: null, draftOf: null };
  let poisoned = false;                // something else ran the models since the running session began
  const forgetHeld = () => { held.champion = held.draft = null; poisoned = true; };
  sessionEnv.held = () => ({      // never beyond what the champion says it holds (a guard, not the source)
    champion: held.championOf === champ && held.champion ? held.champion.subarray(0, champ.cachedLength?.() ?? 0) : null,
    draft: held.draftOf === draft && draft && !draft.dead ? held.draft : null });
  sessionEnv.keep = (championIds, draftIds) => {
    if (championIds === null) poisoned = false;      // a session begins: unknown until it ends
    else if (poisoned) { championIds = null; if (draftIds !== undefined) draftIds = null; }
    held.champion = championIds;
    held.championOf = champ;
    if (draftIds !== undefined) { held.draft = draftIds; held.draftOf = draft; }
  };
  const liveSession = () => {
    if (!session) throw codedError("E_CACHE_STATE", "no request session: begin() first");
    return session;
  };
  // response_format: one xgrammar context per set of stop ids for this engine's tokenizer, and the
  // compiled constraints by key (web/grammar/xgrammar_masks.mjs caches each spec's compile)
  const grammar = { tokenizerJson: null, contexts: new Map(), compiled: new Map() };
  sessionEnv.constraint = ({ key }) => {
    const c = grammar.compiled.get(key);
    if (!c) throw codedError("E_CACHE_STATE", "the request's response_format was not compiled by this engine");
    const matcher = c.context.matcher(c.compiled, { stopTokenIds: c.stops });
    matcher.excludedIds = c.excluded;     // grammar_round.mjs masks them with the suppressed ids
    return matcher;
  };

  const bridge = {
    /** Start a request: JSON {policy, draft_policy, stop_token_ids, seed: [lo, hi], context_ids,
     *  greedy, mode} (the only time its constant state crosses). Prefills both models. -> promise
     *  of JSON {draft_failure: null | {code, message}}; a champion failure rejects, coded. */
    async begin(requestJson) {
      session = createSession(sessionEnv, JSON.parse(requestJson));
      return yielded(JSON.stringify(await session.begin()));   // Python awaits it: the loop runs
    },
    /** One round (session.round): the record Int32Array at once when it ran synchronously, else a
     *  promise of it. Python awaits only a promise. */
    round(k, roundId, remaining, nCommitted, proposals) {
      const r = liveSession().round(k, roundId, remaining, nCommitted, proposals == null ? null : Array.from(proposals));
      return r instanceof Promise ? r.then(yielded) : r;
    },
    /** Up to h baseline steps (session.chain): their records, concatenated, or one step's record
     *  (a promise of it when that step ran asynchronously). */
    chain(h, roundId, remaining, nCommitted) {
      const r = liveSession().chain(h, roundId, remaining, nCommitted);
      return r instanceof Promise ? r.then(yielded) : r;
    },
    /** The engine's tokenizer.json text, for response_format constraints (compiled on first use). */
    useTokenizer(text) { grammar.tokenizerJson = text; },
    /** Compile a response_format (protocol: the ConstraintSpec's canonical JSON, and the request's
     *  stop ids as JSON) -> promise of JSON {key, compile_ms, cached}; a constraint xgrammar
     *  refuses, or one that allows no token at its start, rejects with E_BAD_ARGUMENT. */
    async compileConstraint(specJson, stopsJson) {
      if (!grammar.tokenizerJson) throw codedError("E_BAD_ARGUMENT", "response_format: this engine has no tokenizer to compile it for");
      const stops = JSON.parse(stopsJson);
      let context = grammar.contexts.get(stopsJson);
      if (!context) {
        const { createGrammarContext } = await import("../grammar/xgrammar_masks.mjs");
        context = await createGrammarContext(JSON.parse(grammar.tokenizerJson), { vocabSize: champ.vocabSize, stopTokenIds: stops,
          ...(xgrammarUrl ? { url: xgrammarUrl } : {}) });
        grammar.contexts.set(stopsJson, context);
      }
      let compiled, compileMs, cached;
      try {
        ({ compiled, compileMs, cached } = await context.compile(JSON.parse(specJson)));
      } catch (err) {                    // xgrammar's sentence, named as the request's field (as in CPython)
        const { code, message } = errorPayload(err, "E_BAD_ARGUMENT");
        throw codedError(code, `response_format: ${message}`);
      }
      const key = `${stopsJson}|${specJson}`;
      // special added tokens other than the stop ids are never allowed (constraints.py special_ids_excluded)
      const excluded = (JSON.parse(grammar.tokenizerJson).added_tokens ?? [])
        .filter((a) => a.special && !stops.includes(a.id)).map((a) => a.id).sort((a, b) => a - b);
      grammar.compiled.set(key, { context, compiled, stops, excluded });
      const probe = context.matcher(compiled, { stopTokenIds: stops });
      try {
        if (!probe.mask().some((w) => w !== 0)) {
          throw codedError("E_BAD_ARGUMENT", "response_format: the constraint allows no token at its start (no text this tokenizer can write satisfies it)");
        }
      } finally { probe.dispose(); }
      return JSON.stringify({ key, compile_ms: compileMs, cached: !!cached });
    },
    /** JSON {code, message} of the last round whose draft failed. */
    lastFailure: () => JSON.stringify(liveSession().lastFailure()),
    /** JSON of session.end()'s counts ({} when no session is open). */
    end() {
      const counts = session ? session.end() : {};
      session = null;
      return JSON.stringify(counts);
    },
    /** null while no yield is due (mailbox.mjs shouldYield: with the page's mailbox, a message
     *  waits or QUIET_MAX_MS passed since the worker's event loop last ran; without, PAUSE_EVERY_MS
     *  passed); else a promise that lets it run (queued messages such as a cancel are handled) and
     *  then resolves. Python awaits it between rounds, so synchronous rounds never starve the worker. */
    pause() {
      if (!shouldYield(performance.now() - lastYield, mailWaiting())) return null;
      return new Promise((resolve) => {
        const channel = new MessageChannel();
        channel.port1.onmessage = () => { channel.port1.close(); resolve(yielded(null)); };
        channel.port2.postMessage(0);
      });
    },
    /** JSON: stale-epoch drops by receiver since the previous call (one call per result, so
     *  every drop is reported exactly once). Counts of a replaced draft client carry over. */
    takeCounters() {
      const now = cumulative();
      const out = Object.fromEntries(Object.entries(now).map(([k, v]) => [k, v - (taken[k] ?? 0)]));
      taken = now;
      return JSON.stringify(out);
    },
    /** The device's calibration (calibrate.mjs; common contract §1) as a JSON string, "" when
     *  there is none (calibrate "off", or not measured yet): Python's "auto" policy reads it at
     *  each request's start. */
    calibration: () => (calibration ? JSON.stringify(calibration) : ""),
    /** JSON: receipt environment (coarse hardware class, versions, peak bytes by category). */
    environment() {
      const info = runtimeInfo();
      const mem = champ.memory();
      return JSON.stringify({
        hardware_class: champ.hardwareClass(),
        browser_version: browserVersion(),
        runtime_version: info.runtime_version ?? "pyodide-unknown",
        champion_backend: champ.kind,
        champion_fallback_code: championFallback?.code ?? null,   // E_BATCH_VARIANT / E_OUT_OF_MEMORY: WebGPU was variant / too big here
        calibration_key: calibration?.key ?? null,
        peak_resident_bytes: { [mem.category]: mem.peak, wasm_draft: draftOwnBytes(),
          pyodide_heap: info.pyodide_heap_bytes ?? 0, load_transient: champ.loadTransient?.peak ?? 0 },
      });
    },
  };

  const draftInfo = () => (draft ? { vocab_size: draft.vocabSize, max_context: draft.maxContext, identity: draft.identity,
    artifact_bytes: draft.artifactBytes, placement } : null);
  return {
    bridge,
    info: {
      champion: { vocab_size: champ.vocabSize, max_context: maxContext ?? champ.maxContext ?? champ.config.max_position_embeddings,
        identity: champ.identity, artifact_bytes: champ.artifactBytes, max_block: MAX_BLOCK,
        backend: champ.kind, backend_why: choice.why, matmul: champ.matmul ?? null, weight_bytes: champ.weightBytes ?? null,
        simd: champ.simd ?? null, load_transient: champ.loadTransient ?? null,
        ...(champ.kind === "webgpu" || championFallback?.gpu_memory_budget ? { gpu_memory_budget: gpuBudget } : {}),
        ...(champ.threads ? { threads: champ.threads().count, threads_why: champ.threads().why } : {}),
        ...(championWarmup ? { warmup_ms: championWarmup } : {}) },
      draft: draftInfo(),
      draft_error: draftError,
      batch_check: batchCheck,             // the champion that runs: {backend, positions, ms, result, first_mismatch}
      champion_fallback: championFallback, // null, or {code: E_BATCH_VARIANT, message, from: "webgpu", batch_check}
                                           // or {code: E_OUT_OF_MEMORY, message, from: "webgpu", gpu_memory_budget}
      draft_loading: draftLoading !== null,
    },
    timing_ms: timing,
    /** null, or (draftInBackground) a promise of {draft: info | null, draft_error: {code, message} | null}
     *  settled when the draft has loaded or failed. */
    whenDraft: () => backgroundDraft && backgroundDraft.then(() => ({ draft: draftInfo(), draft_error: draftError })),
    /** Begin the background draft's load (draftInBackground; once: later calls do nothing). */
    startDraft() { startBackground?.(); },
    /** The draft as it is now ({identity, placement, ...} or null; info.draft is the load's). */
    currentDraft: () => draftInfo(),
    /** Serve `c` (a calibration object, or null) to the requests from now on. */
    setCalibration(c) { calibration = c; },
    /** What calibrate.mjs times through (measureCalibration's probe): rounds of a session of its own
     *  over the synthetic context (the request path: one CPU call on WASM, forward + decide on
     *  WebGPU), and the draft's forward and proposal. Faults armed for a request are left alone. It
     *  writes KV positions from 0 as every request does (each begins its prefill at 0), so nothing
     *  needs releasing. Only between requests. */
    calibrationProbe() {
      forgetHeld();                    // its sessions and the draft's forwards write both models' K/V
      const probeEnv = { ...sessionEnv, hit: () => null, takeNaN: () => false, held: () => ({}), keep: () => {},
        canRunNow: () => typeof champ.forwardNow === "function" && !champ.lost,
        cpuRound: (useDraft) => !useDraft && !champ.lost && typeof champ.roundNow === "function" };
      const room = maxContext ?? champ.maxContext ?? champ.config.max_position_embeddings;
      const greedyPolicy = { temperature: 0, top_k: 0, top_p: 1, repetition_penalty: 1, suppress_token_ids: [], allowed_token_ids: null };
      const idsFrom = (at, n) => Array.from({ length: n }, (_, i) => ((at + i) * 7919 + 13) % champ.vocabSize);
      const check = (rec) => {
        if (rec[layout.at.status] !== layout.status.verified || rec[layout.at.decision_error] !== 0) {
          throw codedError("E_INTERNAL", `calibration round: status ${rec[layout.at.status]}, decision error ${rec[layout.at.decision_error]}`);
        }
      };
      return {
        maxRows: Math.min(MAX_BLOCK, room - 16 - 1),
        hasDraft: !!draft && !draft.dead,
        async open({ greedy, contextIds }) {
          const policy = greedy ? greedyPolicy : { ...greedyPolicy, temperature: 1 };
          const s = createSession(probeEnv, { policy, draft_policy: policy, stop_token_ids: [], seed: [0, 0],
            context_ids: contextIds, greedy, mode: "lookup" });
          await s.begin();
          let roundId = 0;
          return {
            canVerify: (n) => s.committedLength + n < room,
            /** -> {wall: the call's ms, verify: the record's verify time (forward + decide), ms} */
            async verify(n) {
              const t = performance.now();
              const r = s.round(n - 1, roundId++, 1 << 20, s.committedLength, idsFrom(s.committedLength, n - 1));
              const rec = r instanceof Promise ? await r : r;
              const ms = performance.now() - t;
              check(rec);
              return { wall: ms, verify: rec[layout.at.verify_us] / 1000 };
            },
            close: () => s.end(),
          };
        },
        /** The draft's forward over `ids` from position 0 -> ms. */
        async draftCatchup(ids) {
          const d = liveDraft();
          const t = performance.now();
          await d.forward(Int32Array.from(ids), 0);
          return performance.now() - t;
        },
        /** A greedy proposal of k after `at` ids in the draft's cache (draftCatchup's). */
        async draftPropose(k, at) {
          const d = liveDraft();
          const args = { feed: Int32Array.of(idsFrom(at, 1)[0]), startPos: at, k, policy: greedyPolicy, seed: [0, 0], roundId: 0,
            stopTokenIds: [], contextIds: Int32Array.from(idsFrom(0, at + 1)) };
          const t = performance.now();
          const r = typeof d.proposeNow === "function" ? d.proposeNow(args) : await d.propose(args);
          const ms = performance.now() - t;
          if (r.error_code) throw codedError("E_INTERNAL", `calibration proposal: ${r.error_code}`);
          return { ms, proposed: r.tokens.length };
        },
      };
    },
    /** The late draft failed the load-time checks: drop it and remember why. */
    refuseDraft(err) {
      draft?.terminate();
      draft = null;
      draftError = errorPayload(err, "E_MANIFEST_MISMATCH");
    },
    /** Before each request: adopt its epoch; rebuild a lost GPU, respawn a dead draft worker. */
    async beginRequest(requestEpoch) {
      epoch = Math.max(epoch, requestEpoch);
      if (champ.lost) {
        const old = champ;
        champ = await openChampion(old.kind, openOpts);
        champ.warmUp?.();
        try { old.close(); } catch { /* already destroyed */ }
      }
      if (draft?.dead && draftUrl) {
        retired = addCounts(retired, draft.staleCounts);
        draft = null;
        try { draft = await spawnDraft(); draftRespawns++; } catch (err) { draftError = errorPayload(err, "E_DRAFT_LOST"); }
      }
      draft?.setEpoch(epoch);
    },
    /** A cancel: the draft client moves to the new epoch (its in-flight calls end E_CANCELLED). */
    cancel(newEpoch) {
      epoch = Math.max(epoch, newEpoch);
      draft?.setEpoch(epoch);
    },
    arm(spec) {
      if (!faults) throw codedError("E_BAD_ARGUMENT", "fault injection is off (load with options.faults = true)");
      if (IMMEDIATE_FAULTS.includes(spec.action)) {
        if (!draft || draft.dead) throw codedError("E_DRAFT_LOST", "no live draft worker to inject into");
        if (!draft.worker) throw codedError("E_BAD_ARGUMENT", "the draft runs inline: there is no worker to inject into");
        if (draft.epoch < 1) throw codedError("E_BAD_ARGUMENT", "no older epoch exists yet (cancel once first)");
        draft.worker.postMessage({ kind: "propose", request_id: "injected-stale", seq: 0, epoch: draft.epoch - 1,
          payload: { round_id: 0, k: 1, feed: [0], start_pos: 0, policy: {}, seed: [0, 0] } });
        return;
      }
      if (!FAULT_ACTIONS.includes(spec.action)) throw codedError("E_BAD_ARGUMENT", `unknown fault action ${spec.action}`);
      if (!FAULT_POINTS.includes(spec.at)) throw codedError("E_BAD_ARGUMENT", `unknown fault point ${spec.at}`);
      armed.push({ ...spec });
    },
    /** GPU buffers live now, bytes live and peak; the draft's WASM memory; respawns. */
    memory() {
      const m = champ.memory();
      return { champion_backend: champ.kind, gpu_buffers_live: m.buffers_live, gpu_bytes_live: m.category === "gpu_buffers" ? m.live : 0,
        gpu_bytes_peak: m.category === "gpu_buffers" ? m.peak : 0, wasm_champion_bytes: m.category === "wasm_champion" ? m.live : 0,
        champion_weight_bytes: champ.weightBytes ?? 0, load_transient_bytes: champ.loadTransient?.peak ?? 0,
        wasm_draft_bytes: draftOwnBytes(), draft_respawns: draftRespawns, device_lost: champ.lost };
    },
    close() {
      closed = true;
      startBackground?.();             // a background draft never begun settles (as nothing)
      for (const context of grammar.contexts.values()) context.dispose?.();
      grammar.contexts.clear();
      grammar.compiled.clear();
      draft?.terminate();
      draft = null;
      champ.close();
    },
  };
}

/** "chromium-156" from the user agent: the major version only (coarse, not a fingerprint). */
export function browserVersion() {
  const ua = globalThis.navigator?.userAgent ?? "";
  for (const [re, name] of [[/Edg\/(\d+)/, "edge"], [/Chrome\/(\d+)/, "chromium"], [/Firefox\/(\d+)/, "firefox"],
    [/Version\/(\d+).*Safari/, "safari"]]) {
    const m = re.exec(ua);
    if (m) return `${name}-${m[1]}`;
  }
  return "unknown";
}
