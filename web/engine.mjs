import { loadProtocol } from "/web/protocol.mjs";

// Main-thread engine API (embeddable): one orchestrator worker, promise per request, event stream.
//   const engine = await Engine.create({ champion: "/web/models/champion/", draft: "/web/models/draft/" });
//   const result = await engine.generate({ prompt: "…", config: { speculate: "draft", k: 4 } }, onEvent);
export class Engine {
  constructor(worker, validate) {
    this.worker = worker;
    this.validate = validate;
    this.invalidDropped = 0;
    this.seq = 0;
    this.epoch = 0;
    this.pending = new Map();            // request_id -> { resolve, reject, onEvent }
    this.staleDropped = 0;
    worker.onmessage = (ev) => this._onMessage(ev.data);
    worker.onerror = (ev) => this._failAll({ code: "E_DEVICE_LOST", message: ev.message || "worker error" });
  }

  static async create(models, { timeoutMs = 300000 } = {}) {
    const validate = await loadProtocol();
    const worker = new Worker("/web/orchestrator/worker.mjs", { type: "module" });
    const engine = new Engine(worker, validate);
    engine.ready = await engine._request("load", { models }, null, timeoutMs);
    return engine;
  }

  _send(kind, request_id, payload) {
    this.worker.postMessage({ kind, request_id, seq: this.seq++, epoch: this.epoch, payload });
  }

  _request(kind, payload, onEvent, timeoutMs = 0) {
    const request_id = `${kind}-${this.seq}-${Math.random().toString(16).slice(2, 10)}`;
    return new Promise((resolve, reject) => {
      this.pending.set(request_id, { resolve, reject, onEvent, epoch: this.epoch });
      if (timeoutMs) setTimeout(() => this._settle(request_id, null, { code: "E_TIMEOUT", message: `${kind} timed out` }), timeoutMs);
      this._send(kind, request_id, payload);
    });
  }

  generate(payload, onEvent = null) { return this._request("generate", payload, onEvent); }

  cancel() {                              // the running request ends "cancelled" at its next round
    this._send("cancel", "", {});
  }

  _settle(id, value, error) {
    const p = this.pending.get(id);
    if (!p) return;
    this.pending.delete(id);
    if (error) p.reject(Object.assign(new Error(`${error.code}: ${error.message}`), { code: error.code }));
    else p.resolve(value);
  }

  _failAll(error) { for (const id of [...this.pending.keys()]) this._settle(id, null, error); }

  _onMessage(env) {
    try { this.validate(env); } catch { this.invalidDropped++; return; }
    const p = this.pending.get(env.request_id);
    if (!p) { this.staleDropped++; return; }
    if (env.kind === "ready" || env.kind === "result") this._settle(env.request_id, env.payload, null);
    else if (env.kind === "error" && env.payload.fatal) this._settle(env.request_id, null, env.payload);
    else if (p.onEvent) p.onEvent(env);   // tokens, progress, and a visible mid-answer error event
  }
}
