// Orchestrator worker: Pyodide runs the rounds (exactspec.browser_backend); the champion and the
// acceptance kernels run on WebGPU here; the draft runs in its own WASM worker. Speaks the
// envelope protocol of py/exactspec/protocol.json with the page.
import { bootPython, fetchOk } from "/web/orchestrator/boot.mjs";
import { createBridge } from "/web/orchestrator/bridge.mjs";
import { loadProtocol } from "/web/protocol.mjs";

// No top-level await: a message posted while this module is still evaluating would be lost.
const validatorReady = loadProtocol();

let state = null;          // { pyodide, session, backend }
let seq = 0;

function post(kind, request_id, epoch, payload) {
  self.postMessage({ kind, request_id, seq: seq++, epoch, payload });
}

function errorPayload(err) {
  const text = String(err?.message ?? err);
  const m = /^(?:Error: )?(E_[A-Z_]+): ?(.*)$/s.exec(text);
  return m ? { code: m[1], message: m[2] } : { code: "E_DEVICE_LOST", message: text };
}

async function load(env) {
  const t0 = performance.now();
  const { champion, draft } = env.payload.models;
  const [{ pyodide, timing_ms: pyTiming }, built, tokJson, tokCfg, genCfg] = await Promise.all([
    bootPython(),
    createBridge({ championUrl: champion, draftUrl: draft || null }),
    fetchOk(`${champion}tokenizer.json`), fetchOk(`${champion}tokenizer_config.json`),
    fetchOk(`${champion}generation_config.json`),
  ]);
  const backend = pyodide.pyimport("exactspec.browser_backend");
  const session = backend.make_session(built.bridge, tokJson, tokCfg, genCfg, JSON.stringify(built.info.champion),
                                       built.info.draft ? JSON.stringify(built.info.draft) : "");
  state = { pyodide, session, backend };
  post("ready", env.request_id, env.epoch,
       { timing_ms: { ...pyTiming, ...built.timing_ms, total: performance.now() - t0 }, info: built.info });
}

async function generate(env) {
  // The orchestrator streams every envelope itself, ending with "result" (the whole answer);
  // only a request refused before it started comes back here as a fatal error.
  const resultJson = await state.backend.generate(state.session, JSON.stringify(env), (s) => self.postMessage(JSON.parse(s)));
  const result = JSON.parse(resultJson);
  if (result.error && !result.finish_reason) post("error", env.request_id, env.epoch, { ...result.error, fatal: true });
}

self.onmessage = async (ev) => {
  const env = ev.data;
  try {
    (await validatorReady)(env);
    if (env.kind === "load") await load(env);
    else if (env.kind === "generate") await generate(env);
    else if (env.kind === "cancel") state?.session.cancel.cancel();
    else post("error", env.request_id, env.epoch, { code: "E_PROTOCOL", message: `unknown kind ${env.kind}` });
  } catch (err) {
    post("error", typeof env?.request_id === "string" ? env.request_id : "", Number.isInteger(env?.epoch) ? env.epoch : 0,
         { ...errorPayload(err), fatal: true });
  }
};
