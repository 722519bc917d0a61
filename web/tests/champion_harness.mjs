// champion_harness.mjs — drives web/champion_wasm/champion_wasm.mjs through a JSON list of cases
// for tests/test_wasm_champion.py and tools/bench/wasm_champion.py (Node):
//
//   node web/tests/champion_harness.mjs cases.json out.json
//
// cases.json: {wasm, model_dir, max_block, max_context, forward: [...], decide: {...},
//              errors: [...], load_errors: [...], timing: {...}}; float arrays travel as base64.
import { createWasmChampion } from "../champion_wasm/champion_wasm.mjs";
import { fromBase64, toBase64 } from "./draft_harness.mjs";
import { validateConfig } from "../formats/model_checks.mjs";
import { roundRecordLayout } from "../protocol.mjs";

const { readFileSync, existsSync } = await import("node:fs");
const PROTOCOL = ["core/protocol.json", "protocol.json"].map((p) => new URL(`../../py/exactspec/${p}`, import.meta.url))
  .find((url) => existsSync(url));
export const RECORD = roundRecordLayout(JSON.parse(readFileSync(PROTOCOL, "utf8")));

/** decide()'s decision words (Int32Array 8) as protocol.mjs's one reader gives them (decodeDecision). */
export const decisionOf = (words) => RECORD.decodeDecision(words);

// forward: [[[ids, start], ...], ...]: each sequence runs in order on the same instance (the KV
// cache is shared on purpose: rollback and re-feed are part of what is tested) -> base64 rows.
export async function runForward(champion, sequences) {
  const out = [];
  for (const seq of sequences) {
    const rows = [];
    for (const [ids, start] of seq) {
      await champion.forward(Int32Array.from(ids), start);
      rows.push(toBase64(await champion.readLogits(ids.length)));
    }
    out.push(rows);
  }
  return out;
}

// decide: {sets: [{logits (n*V f32 b64), n} | {forward: [[ids, start], ...]}, p_draft (b64 | "")],
//          jobs: [{set, proposals, policy, contextIds, seed, roundId, stopTokenIds, remaining, greedy}]}
// A forward set's rows (the last block) come back as base64 so the reference sees the same floats.
export async function runDecide(champion, { sets, jobs }) {
  const V = champion.vocabSize;
  const results = [], setLogits = new Array(sets.length).fill(null);
  let current = -1, pDraft = null;
  for (const job of jobs) {
    if (job.set !== current) {
      current = job.set;
      const s = sets[current];
      if (s.forward) {
        for (const [ids, start] of s.forward) await champion.forward(Int32Array.from(ids), start);
        const n = s.forward[s.forward.length - 1][0].length;
        setLogits[current] ??= toBase64(await champion.readLogits(n));
      } else {
        const rows = fromBase64(s.logits, Float32Array);
        champion.setLogitsForTest(rows, rows.length / V);
      }
      pDraft = s.p_draft ? fromBase64(s.p_draft, Float32Array) : null;
    }
    const m = job.proposals.length;
    try {
      results.push(decisionOf(await champion.decide({ ...job, nRows: m + 1, pDraft: pDraft && m ? pDraft.subarray(0, m * V) : null })));
    } catch (err) {
      results.push({ thrown: err.code ?? String(err) });
    }
  }
  return { results, setLogits };
}

// calls that must throw a coded error -> the codes ("" if nothing was thrown)
export async function runErrors(champion, cases) {
  const codes = [];
  for (const c of cases) {
    try {
      if (c.op === "forward") await champion.forward(Int32Array.from(c.ids), c.start);
      else if (c.op === "readLogits") await champion.readLogits(c.n);
      else if (c.op === "poison") champion.poisonLogits(c.n);
      else {
        codes.push(decisionOf(await champion.decide(c.args)).error_code);   // a decision's own error word
        continue;
      }
      codes.push("");
    } catch (err) {
      codes.push(err.code ?? `uncoded: ${err.message}`);
    }
  }
  return codes;
}

// ms per forward of n tokens after a prompt of promptLen, n = 1..maxBlock; median and minimum.
export async function timeForward(champion, { promptLen = 32, reps = 30, warmup = 10 } = {}) {
  const V = champion.vocabSize;
  const prompt = Int32Array.from({ length: promptLen }, (_, i) => (i * 7919 + 13) % V);
  for (let s = 0; s < promptLen; s += champion.maxBlock) {
    await champion.forward(prompt.subarray(s, Math.min(promptLen, s + champion.maxBlock)), s);
  }
  const out = {};
  for (let n = 1; n <= champion.maxBlock; n++) {
    const ids = Int32Array.from({ length: n }, (_, i) => (i * 31 + 5) % V);
    for (let r = 0; r < warmup; r++) await champion.forward(ids, promptLen);
    const ms = [];
    for (let r = 0; r < reps; r++) {
      const t0 = performance.now();
      await champion.forward(ids, promptLen);
      ms.push(performance.now() - t0);
    }
    ms.sort((a, b) => a - b);
    out[n] = { median: ms[ms.length >> 1], min: ms[0] };
  }
  return out;
}

// ms per decide() of a round of m proposals at temperature 1 on the last forward's m + 1 rows.
export async function timeDecide(champion, { m = 4, reps = 30 } = {}) {
  const V = champion.vocabSize;
  await champion.forward(Int32Array.from({ length: m + 1 }, (_, i) => (i * 131 + 7) % V), 0);
  const pDraft = new Float32Array(m * V).fill(1 / V);
  const ms = [];
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    await champion.decide({ nRows: m + 1, proposals: Array.from({ length: m }, (_, i) => i), pDraft, contextIds: [],
      policy: {}, seed: [r, 1], roundId: r, stopTokenIds: [], remaining: m, greedy: false });
    ms.push(performance.now() - t0);
  }
  ms.sort((a, b) => a - b);
  return { m, median: ms[ms.length >> 1], min: ms[0] };
}

async function loadFromDir(fs, path, dir, wasm, opts) {
  return createWasmChampion({
    wasmBytes: fs.readFileSync(wasm),
    // the config as the engine's model check hands it over: validated (a patched one may be refused here)
    configJson: validateConfig(opts.config ?? JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8"))),
    weightsBytes: opts.weights ?? new Uint8Array(fs.readFileSync(path.join(dir, "model.q8.safetensors"))),
    maxBlock: opts.maxBlock ?? 9, maxContext: opts.maxContext ?? 0, threads: opts.threads ?? 1,
    weightStorage: opts.weightStorage ?? "auto", matmul: opts.matmul ?? "auto",
  });
}

// load_errors: [{config_patch, max_block, max_context, threads, truncate, drop_tensor}] -> codes
async function runLoadErrors(fs, path, cases) {
  const dir = cases.model_dir;
  const config = JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8"));
  const file = new Uint8Array(fs.readFileSync(path.join(dir, "model.q8.safetensors")));
  const codes = [];
  for (const c of cases.load_errors) {
    let weights = c.truncate ? file.slice(0, file.byteLength - c.truncate) : file;
    if (c.rename_tensor) {           // same length: the header names a tensor the loader needs differently
      weights = file.slice();
      const text = new TextDecoder().decode(weights.subarray(0, 8 + Number(new DataView(weights.buffer).getBigUint64(0, true))));
      const at = text.indexOf(c.rename_tensor);
      weights.set(new TextEncoder().encode(c.rename_tensor.replace(/.$/, "X")), at);
    }
    try {
      await loadFromDir(fs, path, dir, cases.wasm, { config: { ...config, ...(c.config_patch ?? {}) }, weights,
        maxBlock: c.max_block, maxContext: c.max_context, threads: c.threads });
      codes.push("");
    } catch (err) {
      codes.push(err.code ?? `uncoded: ${err.message}`);
    }
  }
  return codes;
}

const isNodeMain = typeof process !== "undefined" && process.argv && process.argv[1] &&
  import.meta.url === (await import("node:url")).pathToFileURL(process.argv[1]).href;

if (isNodeMain) {
  const fs = await import("node:fs");
  const path = await import("node:path");
  const cases = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const out = {};
  if (cases.load_errors) out.load_errors = await runLoadErrors(fs, path, cases);
  const champion = await loadFromDir(fs, path, cases.model_dir, cases.wasm,
    { maxBlock: cases.max_block, maxContext: cases.max_context, threads: cases.threads, weightStorage: cases.weight_storage,
      matmul: cases.matmul });
  out.info = { identity: champion.identity, weightStorage: champion.weightStorage, vocabSize: champion.vocabSize, maxBlock: champion.maxBlock,
    maxContext: champion.maxContext, memoryBytes: champion.memoryBytes, artifactBytes: champion.artifactBytes,
    matmulFunction: champion.matmulFunction, weightBytes: champion.weightBytes, kvCapacity: champion.kvCapacity };
  if (cases.forward) out.forward = await runForward(champion, cases.forward);
  out.kvCapacityAfter = champion.kvCapacity;
  if (cases.decide) out.decide = await runDecide(champion, cases.decide);
  if (cases.errors) out.errors = await runErrors(champion, cases.errors);
  if (cases.timing) {
    out.timing = await timeForward(champion, cases.timing);
    out.timing_decide = await timeDecide(champion, cases.timing);
  }
  champion.destroy();
  try {
    await champion.forward(Int32Array.of(0), 0);
    out.after_destroy = "";
  } catch (err) {
    out.after_destroy = err.code;
  }
  fs.writeFileSync(process.argv[3], JSON.stringify(out));
}
