// draft_harness.mjs — drives web/draft/draft.mjs through a JSON list of cases for
// tests/test_wasm_draft.py. The same module runs in Node (CLI below) and in the page
// web/tests/draft_harness.html (window.draftHarness).
//
//   node web/tests/draft_harness.mjs cases.json out.json
//
// cases.json: {wasm, model_dir, forward: [...], process: [...], sample: [...], propose: [...],
//              timing: {...}}; float arrays travel as base64 (little-endian f32 / f64).
import { createDraft } from "../draft/draft.mjs";
import { validatedConfigFromJson } from "../formats/model_config.mjs";

export function toBase64(typed) {
  const bytes = new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);
  if (typeof Buffer !== "undefined") return Buffer.from(bytes).toString("base64");
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

export function fromBase64(text, Type) {
  let bytes;
  if (typeof Buffer !== "undefined") {
    bytes = new Uint8Array(Buffer.from(text, "base64"));
  } else {
    const s = atob(text);
    bytes = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  }
  return new Type(bytes.buffer, 0, bytes.byteLength / Type.BYTES_PER_ELEMENT);
}

// Run every case against one draft instance, in order (forward and propose cases share the
// KV cache on purpose: rollback and re-feed are part of what is tested).
export function runCases(draft, cases) {
  const out = { forward: [], process: [], sample: [], propose: [], plog: null, exp: null, sincos: null };
  for (const seq of cases.forward ?? []) {
    const rows = [];
    for (const [ids, start] of seq) rows.push(toBase64(draft.forward(ids, start)));
    out.forward.push(rows);
  }
  for (const c of cases.process ?? []) {
    const r = draft.processRow(fromBase64(c.logits, Float32Array), c.context, c.policy);
    out.process.push({ error_code: r.error_code, probs64: r.probs64 ? toBase64(r.probs64) : null,
      probs: r.probs ? toBase64(r.probs) : null });
  }
  for (const c of cases.sample ?? []) {
    const w = fromBase64(c.weights, Float64Array);
    out.sample.push(draft.sampleWeights(w, c.seed, c.domain, c.round, c.position));
    (out.sample_plain ??= []).push(draft.sampleWeights(w, c.seed, c.domain, c.round, c.position, true));
  }
  for (const c of cases.propose ?? []) {
    const r = draft.propose({ feed: c.feed, startPos: c.start_pos, k: c.k, policy: c.policy, seed: c.seed,
      roundId: c.round_id, stopTokenIds: c.stop, contextIds: c.context });
    out.propose.push({ tokens: Array.from(r.tokens), p_draft: toBase64(r.pDraft), error_code: r.error_code });
  }
  out.errors = [];
  for (const c of cases.errors ?? []) {           // calls that must throw a coded DraftError
    try {
      if (c.op === "forward") draft.forward(c.ids, c.start);
      else draft.propose({ feed: c.ids, startPos: c.start, k: c.k ?? 2, policy: c.policy ?? {}, seed: [0, 0],
        contextIds: c.context ?? [] });
      out.errors.push("");
    } catch (err) {
      out.errors.push(err.code ?? String(err));
    }
  }
  if (cases.plog) {
    const x = fromBase64(cases.plog, Float64Array);
    out.plog = toBase64(Float64Array.from(x, (v) => draft.wasm.draft_plog(v)));
    out.exp = toBase64(Float64Array.from(x, (v) => draft.wasm.draft_exp(-v)));
  }
  if (cases.sincos) {
    const x = fromBase64(cases.sincos, Float64Array);
    const both = new Float64Array(2 * x.length);
    x.forEach((v, i) => { both[2 * i] = draft.wasm.draft_sin(v); both[2 * i + 1] = draft.wasm.draft_cos(v); });
    out.sincos = toBase64(both);
  }
  return out;
}

// ms per draft token (forward + processors + sample): rounds of k proposals after a prompt.
// The machines this runs on are shared and noisy: report the median and the minimum per round.
export function timePropose(draft, { promptLen = 32, k = 8, reps = 20, policy = { temperature: 1.0 } } = {}) {
  const V = draft.vocabSize;
  const prompt = Array.from({ length: promptLen }, (_, i) => (i * 7919 + 13) % V);
  const round = (r, seed) => draft.propose({ feed: [prompt[promptLen - 1]], startPos: promptLen - 1, k, policy,
    seed, roundId: r, contextIds: prompt });
  draft.propose({ feed: prompt, startPos: 0, k: 1, policy, seed: [1, 0], roundId: 0, contextIds: prompt });
  for (let r = 0; r < 10; r++) round(r, [r, 7]);          // warm-up: let V8 tier the module up
  const perToken = [];
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    const res = round(r, [r + 1, 0]);
    perToken.push((performance.now() - t0) / res.tokens.length);
  }
  const perForward = [];
  for (let r = 0; r < reps * k; r++) {
    const t0 = performance.now();
    draft.forward([prompt[r % promptLen]], promptLen + (r % k));
    perForward.push(performance.now() - t0);
  }
  const median = (a) => { const b = [...a].sort((x, y) => x - y); return b[Math.floor(b.length / 2)]; };
  return { ms_per_token: median(perToken), ms_per_token_min: Math.min(...perToken),
    forward_ms: median(perForward), forward_ms_min: Math.min(...perForward), reps, k, prompt_len: promptLen,
    tokens: reps * k };
}

const isNodeMain = typeof process !== "undefined" && process.argv && process.argv[1] &&
  import.meta.url === (await import("node:url")).pathToFileURL(process.argv[1]).href;

if (isNodeMain) {
  const fs = await import("node:fs");
  const path = await import("node:path");
  const cases = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const draft = await createDraft({
    wasmBytes: fs.readFileSync(cases.wasm),
    configJson: validatedConfigFromJson(fs.readFileSync(path.join(cases.model_dir, "config.json"))),
    weightsBytes: new Uint8Array(fs.readFileSync(path.join(cases.model_dir, "model.safetensors"))),
  });
  const out = runCases(draft, cases);
  if (cases.timing) out.timing = timePropose(draft, cases.timing);
  fs.writeFileSync(process.argv[3], JSON.stringify(out));
}
