// peer.mjs — page of tools/bench/peer.py and tests/test_peer_wllama.py: wllama (llama.cpp compiled
// to WASM; a dev dependency that only the bench's own server serves) and our engine, driven one
// request at a time from Python. Every time is taken here, in the page, with one clock:
// first_token_ms = request start -> first token event; total_ms = request start -> done.
// Several wllama runners live side by side, one Wllama instance (one worker) each under its name
// ("wllama", "wllama@2t": peer.py --wllama-threads). window.peerBench; window.peerReady once loaded.
import { Engine } from "/web/orchestrator/engine.mjs";

const WLLAMA = "/node_modules/@wllama/wllama/esm/";
const wllamas = new Map();   // runner name -> Wllama
const engines = new Map();   // name -> Engine
const coded = (err) => ({ code: err?.code ?? "E_INTERNAL", message: String(err?.message ?? err) });

/** Rejects with E_IO when the page's CSP blocks something (wllama's blob: worker would otherwise
 *  wait forever: it only logs its worker's error event), with E_TIMEOUT after timeoutMs. */
function failOnBlockOrTimeout(timeoutMs, what) {
  let onViolation = null, timer = null;
  const failed = new Promise((_, reject) => {
    onViolation = (ev) => reject(new Error(`E_IO: ${what}: the Content-Security-Policy blocked ${ev.blockedURI} (${ev.violatedDirective})`));
    document.addEventListener("securitypolicyviolation", onViolation);
    timer = setTimeout(() => reject(new Error(`E_TIMEOUT: ${what} took over ${timeoutMs} ms`)), timeoutMs);
  });
  const stop = () => { document.removeEventListener("securitypolicyviolation", onViolation); clearTimeout(timer); };
  return { failed, stop };
}

/** Load a GGUF into wllama runner `name` (replacing that runner's instance, if any) on its WASM CPU
 *  path (n_gpu_layers 0) with nThreads threads. wllama 3.13 has one wasm build for both: it starts
 *  a pthread pool only for nThreads > 1 on a cross-origin-isolated page (SharedArrayBuffer), and
 *  silently runs 1 thread otherwise; hence the answer says what really runs:
 *  -> {load_ms, libllama, n_threads (wllama's getNumThreads), multithread, pthread_pool (the pool size
 *  its worker reports starting), cross_origin_isolated, info}; throws "E_MODEL_LOAD: ..." when
 *  llama.cpp refuses the file. */
async function loadWllama(ggufUrl, { name = "wllama", nThreads = 1, nCtx = 512, nativeLog = false, timeoutMs = 120000 } = {}) {
  const guard = failOnBlockOrTimeout(timeoutMs, `loading ${ggufUrl} into wllama`);
  try {
    return await Promise.race([startWllama(ggufUrl, { name, nThreads, nCtx, nativeLog }), guard.failed]);
  } finally {
    guard.stop();
  }
}

/** wllama's logger: keeps the worker's "Multithread enabled: B, pthreadPoolSize: N" line (the
 *  worker's own account of its pthread pool) and prints the rest only with nativeLog. */
function wllamaLogger(nativeLog, poolLines) {
  const keep = (level) => (...args) => {
    const text = args.map(String).join(" ");
    if (/pthreadPoolSize/.test(text)) poolLines.push(text);
    if (nativeLog || level === "error") console[level](...args);
  };
  return { debug: keep("debug"), log: keep("log"), warn: keep("warn"), error: keep("error") };
}

async function startWllama(ggufUrl, { name, nThreads, nCtx, nativeLog }) {
  const t0 = performance.now();
  const { Wllama } = await import(WLLAMA + "index.js");
  const res = await fetch(ggufUrl);
  if (!res.ok) throw new Error(`E_MODEL_LOAD: GET ${ggufUrl} -> ${res.status}`);
  const file = new File([await res.blob()], ggufUrl.split("/").pop(), { type: "application/octet-stream" });
  await wllamas.get(name)?.exit();
  wllamas.delete(name);
  const poolLines = [];
  // the worker's messages pass (suppressNativeLog false) so that its pool line reaches the logger;
  // llama.cpp itself logs errors only (log_level 4) unless nativeLog
  const wllama = new Wllama({ default: WLLAMA + "wasm/wllama.wasm" },
                            { suppressNativeLog: false, logger: wllamaLogger(nativeLog, poolLines), allowOffline: true });
  wllamas.set(name, wllama);     // before loading: unload() ends its worker even when the load fails
  await wllama.loadModel([file], { n_threads: nThreads, n_ctx: nCtx, n_gpu_layers: 0, seed: 0, log_level: nativeLog ? 2 : 4 });
  const info = wllama.getLoadedContextInfo();
  if (!info.success) throw new Error(`E_MODEL_LOAD: llama.cpp (wllama) refused ${ggufUrl}`);
  const pool = poolLines.map((line) => /pthreadPoolSize: (\d+)/.exec(line)).find(Boolean);
  return { load_ms: performance.now() - t0, libllama: Wllama.getLibllamaVersion(), n_threads: wllama.getNumThreads(),
           multithread: wllama.isMultithread(), pthread_pool: pool ? Number(pool[1]) : null,
           cross_origin_isolated: self.crossOriginIsolated === true, info };
}

/** One raw completion of `prompt` by wllama runner `name`: a string (llama.cpp tokenizes it, BOS as
 *  the file says) or an array of token ids (taken as they are, nothing added: the ids our engine prefilled). withIds
 *  asks llama.cpp for each token's probability entry, which names the token id (slightly more
 *  work per token, so timed runs leave it off). Prompt caching is off: every request prefills. */
async function wllamaGenerate(prompt, { name = "wllama", maxTokens = 32, temperature = 0, seed = 0, withIds = false } = {}) {
  const wllama = wllamas.get(name);
  if (!wllama) throw new Error(`E_BAD_ARGUMENT: no wllama runner ${name} loaded`);
  const ids = [];
  let text = "", nChunks = 0, last = null, tFirst = null;
  const t0 = performance.now();
  await wllama.createCompletion({
    prompt, max_tokens: maxTokens, temperature, seed, top_k: 0, top_p: 1, min_p: 0, cache_prompt: false,
    stream: true, ...(withIds ? { n_probs: 1 } : {}),
    onData: (chunk) => {
      const choice = chunk.choices?.[0];
      if (choice?.text) { tFirst ??= performance.now(); text += choice.text; nChunks++; }
      for (const entry of choice?.logprobs?.content ?? []) ids.push(entry.id);
      last = chunk;
    },
  });
  const t1 = performance.now();
  return { token_ids: withIds ? ids : null, text, n_tokens: last?.usage?.completion_tokens ?? nChunks,
           prompt_tokens: last?.usage?.prompt_tokens ?? null, finish_reason: last?.choices?.[0]?.finish_reason ?? null,
           first_token_ms: tFirst === null ? null : tFirst - t0, total_ms: t1 - t0, timings: last?.timings ?? null };
}

/** Load our engine under `name` (options: Engine.create's, e.g. {championBackend: "wasm"});
 *  moduleUrl: another build's engine module (peer.py --baseline: the engine of an earlier commit,
 *  which finds its workers, Python and WASM beside it), else this one.
 *  -> {load_ms, ready} or {refused: {code, message}} (e.g. a backend this engine lacks). */
async function loadEngine(name, models, options = {}, moduleUrl = null) {
  const t0 = performance.now();
  try {
    const Built = moduleUrl ? (await import(moduleUrl)).Engine : Engine;
    const engine = await Built.create(models, options);
    engines.set(name, engine);
    return { load_ms: performance.now() - t0, ready: engine.ready };
  } catch (err) {
    return { refused: coded(err) };
  }
}

/** One request of our engine `name`: {result, first_token_ms, total_ms} or {refused}. */
async function engineGenerate(name, payload) {
  const engine = engines.get(name);
  let tFirst = null;
  const t0 = performance.now();
  try {
    const result = await engine.generate(payload, (env) => {
      if (env.kind === "tokens" && env.payload.token_ids.length) tFirst ??= performance.now();
    });
    return { result, first_token_ms: tFirst === null ? null : tFirst - t0, total_ms: performance.now() - t0 };
  } catch (err) {
    return { refused: coded(err) };
  }
}

/** Terminate our engine `name` (a second load in the same page starts from nothing of it). */
async function unloadEngine(name) {
  await engines.get(name)?.terminate();
  engines.delete(name);
}

async function unload() {
  for (const engine of engines.values()) await engine.terminate();
  engines.clear();
  for (const wllama of wllamas.values()) await wllama.exit();
  wllamas.clear();
}

window.peerBench = { loadWllama, wllamaGenerate, loadEngine, engineGenerate, unloadEngine, unload };
window.peerReady = true;
