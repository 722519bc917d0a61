// batch_check_harness.mjs — the load-time batch-invariance check (web/orchestrator/batch_check.mjs) on the
// WASM champion in Node, for tests/test_batch_check.py:
//
//   node web/tests/batch_check_harness.mjs cases.json out.json
//
// cases.json: {wasm, model_dir, runs: [{fault, threads, max_context, positions, check (default true)}], bits: [[a, b], ...]}
// -> {runs: [check result + first_row_head: position 0's first logits, forwarded after it], bits: [first differing index]}
import { createWasmChampion } from "../champion_wasm/champion_wasm.mjs";
import { checkBatchInvariance, checkIds, firstBitDifference } from "../orchestrator/batch_check.mjs";
import { validateConfig } from "../formats/model_checks.mjs";

const fs = await import("node:fs");
const path = await import("node:path");
const cases = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const out = { runs: [], bits: [] };
for (const run of cases.runs ?? []) {
  const champion = await createWasmChampion({
    wasmBytes: fs.readFileSync(run.threads > 1 ? cases.wasm.replace(/cpu\.wasm$/, "cpu_mt.wasm") : cases.wasm),
    configJson: validateConfig(JSON.parse(fs.readFileSync(path.join(cases.model_dir, "config.json"), "utf8"))),
    weightsBytes: new Uint8Array(fs.readFileSync(path.join(cases.model_dir, "model.q8.safetensors"))),
    maxBlock: 9, maxContext: run.max_context ?? 0, threads: run.threads ?? 1,
  });
  // the backend's interface as champion_backends.mjs gives it (kind, forward, readLogits, vocabSize, maxContext)
  const backend = { kind: "wasm", vocabSize: champion.vocabSize, maxContext: champion.maxContext,
    forward: (ids, at) => champion.forward(ids, at), readLogits: (n) => champion.readLogits(n) };
  if (run.fault) champion.setBatchVariantFault();
  const result = run.check === false ? {}
    : await checkBatchInvariance(backend, { maxBlock: 9, ...(run.positions ? { positions: run.positions } : {}) });
  // after the check, a request's prefill from position 0 must see the same rows as on a fresh champion
  const ids = checkIds(champion.vocabSize, 4);
  await champion.forward(ids.subarray(0, 1), 0);
  const first = await champion.readLogits(1);
  out.runs.push({ ...result, first_row_head: Array.from(first.subarray(0, 8)) });
  champion.destroy();
}
for (const [a, b] of cases.bits ?? []) {
  const fa = Float32Array.from(a.map((x) => (x === "nan" ? NaN : x === "-0" ? -0 : x)));
  const fb = Float32Array.from(b.map((x) => (x === "nan" ? NaN : x === "-0" ? -0 : x)));
  out.bits.push(firstBitDifference(fa, fb));
}
fs.writeFileSync(process.argv[3], JSON.stringify(out));
