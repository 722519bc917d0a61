// The orchestrator worker's protocol handler as a plain function of (runtime, post): one request
// at a time, cancellation epochs, stale-epoch dropping, coded errors. Tests drive it in node with
// a mock runtime (tests/test_engine_handler.py); worker.mjs plugs in the Pyodide runtime.
//
// In (page -> worker): load {models, options}, generate {prompt|prompt_ids, config}, cancel {},
//   fault {action, at, min_round, ms}, memory {}, terminate {}.
// Out: ready {timing_ms, info}, progress {stage, ...}, tokens / result / error (the orchestrator's
//   own envelopes, in the request's epoch), error {code, message, fatal: true} for a request
//   refused before it started or a control message that failed, always in the epoch of the
//   message it answers (an envelope too broken to have one: the handler's epoch).
// Rules:
//   - load, generate and terminate run one at a time, in arrival order (a serial chain).
//   - cancel, fault and memory act at once, even while a request runs.
//   - The handler's epoch is the newest seen. cancel with epoch e (> the running request's)
//     cancels it at its next round boundary. A cancel or fault older than the handler's epoch is
//     stale: dropped and counted, never applied. A generate older than it is counted as stale and
//     answered as cancelled without running (the caller's promise always settles).
import { codedError, errorPayload } from "../protocol.mjs";

/**
 * runtime: { load(payload, notify) -> {timing_ms, info}, generate(env, post) -> result | {error},
 *            cancel(epoch), fault(payload), memory() -> object, terminate() }
 * post(envelope): to the page. validate(envelope): throws E_PROTOCOL. codes: the error table.
 */
export function createOrchestratorHandler({ runtime, post, validate, codes = null }) {
  const state = { epoch: 0, droppedStale: 0, droppedInvalid: 0, running: null, terminated: false, handled: 0 };
  let seq = 0;
  let chain = Promise.resolve();
  const send = (kind, requestId, epoch, payload) => post({ kind, request_id: requestId, seq: seq++, epoch, payload });
  const refuse = (env, err, fallback) =>
    send("error", env.request_id, env.epoch, { ...errorPayload(err, fallback, codes), fatal: true });

  async function runSerial(env) {
    if (state.terminated) return refuse(env, codedError("E_TERMINATED", "the engine was terminated"));
    try {
      if (env.kind === "load") {
        const ready = await runtime.load(env.payload, (p) => send("progress", env.request_id, env.epoch, p));
        send("ready", env.request_id, env.epoch, ready);
      } else if (env.kind === "generate") {
        state.running = env.request_id;
        const out = await runtime.generate(env, post);
        if (out?.error && !out.finish_reason) refuse(env, codedError(out.error.code, out.error.message));
      } else if (env.kind === "terminate") {
        state.terminated = true;
        await runtime.terminate();
        send("progress", env.request_id, env.epoch, { stage: "terminated" });
      }
    } catch (err) {
      refuse(env, err, env.kind === "load" ? "E_MODEL_LOAD" : "E_INTERNAL");
    } finally {
      state.running = null;
      state.handled++;
    }
  }

  function runNow(env) {
    try {
      if (env.kind === "cancel") runtime.cancel(state.epoch);
      else if (env.kind === "fault") {
        runtime.fault(env.payload);
        send("progress", env.request_id, env.epoch, { stage: "fault_armed", action: env.payload.action });
      } else if (env.kind === "memory") {
        send("progress", env.request_id, env.epoch, { stage: "memory", ...runtime.memory(), dropped_stale: state.droppedStale });
      } else {
        refuse(env, codedError("E_PROTOCOL", `the orchestrator worker does not take "${env.kind}" messages`));
      }
    } catch (err) {
      refuse(env, err, "E_INTERNAL");
    }
  }

  function onMessage(env) {
    try {
      validate(env);
    } catch (err) {
      state.droppedInvalid++;   // refused in the request's own epoch, so that its caller hears it (never 0 for all)
      const epoch = Number.isInteger(env?.epoch) && env.epoch >= 0 ? env.epoch : state.epoch;
      send("error", typeof env?.request_id === "string" ? env.request_id : "", epoch, { ...errorPayload(err, "E_PROTOCOL", codes), fatal: true });
      return chain;
    }
    const stale = env.epoch < state.epoch;
    if (stale && (env.kind === "cancel" || env.kind === "fault")) { state.droppedStale++; return chain; }
    if (stale && env.kind === "generate") state.droppedStale++;   // still answered: cancelled, not run
    state.epoch = Math.max(state.epoch, env.epoch);
    if (env.kind === "load" || env.kind === "generate" || env.kind === "terminate") {
      chain = chain.then(() => runSerial(env));
      return chain;
    }
    runNow(env);
    return chain;
  }

  return { state, onMessage };
}
