// scratch: champion step time with and without the draft loaded into the instance
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createWasmChampion } from "../../web/champion_wasm/champion_wasm.mjs";
import { createDraft } from "../../web/draft/draft.mjs";
import { validatedConfigFromJson } from "../../web/formats/model_config.mjs";
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const threads = Number(process.argv[2] ?? 2);
const wasmName = process.argv[3] ?? "cpu_mt_relaxed.wasm";
async function make(withDraft) {
  const dir = path.join(ROOT, "web/models/champion");
  const champion = await createWasmChampion({ wasmBytes: readFileSync(path.join(ROOT, "web/build", wasmName)), threads, maxBlock: 9,
    configJson: validatedConfigFromJson(readFileSync(path.join(dir, "config.json"))),
    weightsBytes: new Uint8Array(readFileSync(path.join(dir, "model.q8.safetensors"))) });
  if (withDraft) {
    const dd = path.join(ROOT, "web/models/draft");
    champion.draft = await createDraft({ configJson: validatedConfigFromJson(readFileSync(path.join(dd, "config.json"))),
      weightsBytes: new Uint8Array(readFileSync(path.join(dd, "model.safetensors"))),
      instance: { exports: champion.wasm, memory: champion.memory } });
  }
  return champion;
}
function request(champion, n) {
  const V = champion.vocabSize;
  const ids = Array.from({ length: 24 }, (_, i) => (i * 7919 + 13) % V);
  champion.reset?.();
  for (let s = 0; s < 23; s += 9) champion.forwardNow(Int32Array.from(ids.slice(s, Math.min(23, s + 9))), s);
  champion.beginNow({ policy: { temperature: 0 }, seed: [1, 0], contextIds: ids, greedy: true });
  let pending = ids[23], start = 23, done = 0;
  const t0 = performance.now();
  while (done < n) {
    const h = Math.min(32, n - done);
    const rec = champion.chainNow({ h, roundId: done, remaining: n - done, champFeed: [pending], champStart: start });
    const steps = rec.length / 13;
    done += steps; start += steps;
    pending = rec[(steps - 1) * 13 + 1];
  }
  return performance.now() - t0;
}
const A = await make(false), B = await make(true);
const res = { alone: [], spec: [] };
for (let i = 0; i < 40; i++) {
  for (const [name, c] of (i % 2 ? [["alone", A], ["spec", B]] : [["spec", B], ["alone", A]])) res[name].push(request(c, 64) / 64);
}
const med = (v) => v.slice(4).sort((a, b) => a - b)[(v.length - 4) >> 1];
console.log(JSON.stringify({ threads, wasmName, alone: med(res.alone).toFixed(4), spec: med(res.spec).toFixed(4) }));
process.exit(0);
