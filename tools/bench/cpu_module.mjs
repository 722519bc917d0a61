// cpu_module.mjs — measure the CPU module's threaded build before relying on it: the champion alone,
// ms per generated token (forward of the pending token + a greedy baseline decision), with
// cpu.wasm (one thread) and cpu_mt.wasm at 1 and 2 threads, and both modules' sizes. Node (V8, as
// Chromium). Not a test: the numbers depend on the machine and its load (docs/champion_wasm.md).
//
//   node tools/bench/cpu_module.mjs [MODEL_DIR (a q8 champion folder)] [TOKENS (default 64)]
import { readFileSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createWasmChampion } from "../../web/champion_wasm/champion_wasm.mjs";
import { validatedConfigFromJson } from "../../web/formats/model_config.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const dir = process.argv[2] ?? path.join(ROOT, "web/models/champion");
const tokens = Number(process.argv[3] ?? 64);
const build = (name) => path.join(ROOT, "web/build", name);

async function perToken(wasm, threads) {
  const champion = await createWasmChampion({ wasmBytes: readFileSync(wasm), threads, maxBlock: 9,
    configJson: validatedConfigFromJson(readFileSync(path.join(dir, "config.json"))),
    weightsBytes: new Uint8Array(readFileSync(path.join(dir, "model.q8.safetensors"))) });
  const V = champion.vocabSize;
  const ids = Array.from({ length: 32 }, (_, i) => (i * 7919 + 13) % V);
  for (let s = 0; s < 31; s += 9) champion.forwardNow(Int32Array.from(ids.slice(s, Math.min(31, s + 9))), s);
  const ms = [];
  let pending = ids[31], start = 31;
  for (let t = 0; t < tokens + 8; t++) {           // the first 8 warm up
    const t0 = performance.now();
    champion.forwardNow(Int32Array.of(pending), start);
    const words = champion.decideNow({ nRows: 1, proposals: [], contextIds: [], policy: { temperature: 0 }, seed: [0, 0],
      roundId: t, stopTokenIds: [], remaining: 1, greedy: true });
    if (t >= 8) ms.push(performance.now() - t0);
    pending = words[1];
    start += 1;
  }
  champion.destroy();
  ms.sort((a, b) => a - b);
  return { median_ms: +ms[ms.length >> 1].toFixed(3), min_ms: +ms[0].toFixed(3) };
}

const out = { model: path.relative(ROOT, dir), tokens,
  bytes: { "cpu.wasm": statSync(build("cpu.wasm")).size, "cpu_mt.wasm": statSync(build("cpu_mt.wasm")).size } };
out["cpu.wasm threads 1"] = await perToken(build("cpu.wasm"), 1);
out["cpu_mt.wasm threads 1"] = await perToken(build("cpu_mt.wasm"), 1);
out["cpu_mt.wasm threads 2"] = await perToken(build("cpu_mt.wasm"), 2);
console.log(JSON.stringify(out, null, 1));
