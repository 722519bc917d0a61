// runner.mjs — headless entry of web/runner.html: window.exactspecRunner and window.runnerReady
// (a file, not an inline script, so the server's Content-Security-Policy can be script-src 'self').
import { Engine } from "/web/engine.mjs";
let engine = null;
window.exactspecRunner = {
  async load(models) { engine = await Engine.create(models); return engine.ready; },
  // cancelAfterTokens: call engine.cancel() once that many "tokens" events have arrived
  async generate(payload, { cancelAfterTokens = 0 } = {}) {
    const events = [];
    let nTokenEvents = 0;
    const result = await engine.generate(payload, (env) => {
      events.push({ kind: env.kind, payload: env.payload });
      if (env.kind === "tokens" && ++nTokenEvents === cancelAfterTokens) engine.cancel();
    });
    return { result, events, staleDropped: engine.staleDropped };
  },
};
window.runnerReady = true;
