// vratio.mjs — the WASM champion on a GGUF file (weights in their blocks, q8act) or a q8 folder, in
// Node (V8, as Chromium): ms per block forward of n = 1..9 positions at a fixed position, the
// verification ratio V(n)/V(1), and the weight bytes; per module (cpu / relaxed) and thread count.
// Not a test: numbers depend on the machine and its load (run it on a quiet machine).
//
//   python tools/bench/vratio.py MODEL.gguf|Q8_FOLDER [--reps 15] [--threads 1,2]   (the driver: GGUF config)
//   node --experimental-wasm-relaxed-simd tools/bench/vratio.mjs MODEL [REPS] [THREADS,...] [OUT.json] [CONFIG.json]
import { readFileSync, statSync, writeFileSync, mkdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createWasmChampion } from "../../web/champion_wasm/champion_wasm.mjs";
import { validatedConfigFromJson } from "../../web/formats/model_config.mjs";
import { ggufTensorMap } from "../../web/gguf/gguf_tensors.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const [model, repsArg = "15", threadsArg = "1,2", outArg, configArg] = process.argv.slice(2);
const reps = Number(repsArg), threadCounts = threadsArg.split(",").map(Number);
const build = (name) => readFileSync(path.join(ROOT, "web/build", name));
const relaxedOk = process.execArgv.includes("--experimental-wasm-relaxed-simd");

async function load(wasmName, threads) {
  if (model.endsWith(".gguf")) {
    const bytes = new Uint8Array(readFileSync(model));
    const raw = JSON.parse(readFileSync(configArg, "utf8"));           // GGUFModel(path).config (vratio.py)
    const tensors = ggufTensorMap(bytes, raw, model, { blocks: true });
    return createWasmChampion({ wasmBytes: build(wasmName), configJson: validatedConfigFromJson(JSON.stringify(raw)), tensors, identity: "bench",
                                threads, maxBlock: 9, maxContext: Math.min(1024, raw.max_position_embeddings), matmul: "q8act" });
  }
  const configJson = validatedConfigFromJson(readFileSync(path.join(model, "config.json")));
  return createWasmChampion({ wasmBytes: build(wasmName), threads, maxBlock: 9, matmul: "q8act", configJson,
    maxContext: Math.min(1024, JSON.parse(readFileSync(path.join(model, "config.json"), "utf8")).max_position_embeddings),
    weightsBytes: new Uint8Array(readFileSync(path.join(model, "model.q8.safetensors"))) });
}

function median(xs) { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; }

async function measure(wasmName, threads) {
  const champion = await load(wasmName, threads);
  const V = champion.vocabSize, start = 64;
  const ids = Array.from({ length: start + 9 }, (_, i) => (i * 7919 + 13) % V);
  for (let s = 0; s < start; s += 8) champion.forwardNow(Int32Array.from(ids.slice(s, s + 8)), s);
  const ms = {};
  for (let r = 0; r < 3; r++) for (let n = 1; n <= 9; n++) champion.forwardNow(Int32Array.from(ids.slice(start, start + n)), start);
  for (let n = 1; n <= 9; n++) ms[n] = [];
  for (let r = 0; r < reps; r++)                          // interleaved: load changes fall on every n
    for (let n = 1; n <= 9; n++) {
      const t0 = performance.now();
      champion.forwardNow(Int32Array.from(ids.slice(start, start + n)), start);
      ms[n].push(performance.now() - t0);
    }
  const med = Object.fromEntries(Object.entries(ms).map(([n, v]) => [n, +median(v).toFixed(2)]));
  const row = { module: wasmName, threads: champion.threads, matmul: champion.matmulFunction,
    weight_bytes: champion.weightBytes, memory_bytes: champion.memoryBytes, ms: med,
    v_ratio: Object.fromEntries(Object.keys(med).map((n) => [n, +(med[n] / med[1]).toFixed(2)])) };
  champion.destroy();
  return row;
}

const rows = [];
const modules = [["cpu.wasm", "cpu_mt.wasm"], ...(relaxedOk ? [["cpu_relaxed.wasm", "cpu_mt_relaxed.wasm"]] : [])];
for (const [one, many] of modules)
  for (const t of threadCounts) {
    const row = await measure(t > 1 ? many : one, t);
    rows.push(row);
    console.log(`${row.module.padEnd(22)} threads ${t}: V(1) ${row.ms[1]} ms, V(5) ${row.ms[5]} ms, V(9) ${row.ms[9]} ms; ` +
                `V(5)/V(1) ${row.v_ratio[5]}, V(9)/V(1) ${row.v_ratio[9]}; weights ${(row.weight_bytes / 1e6).toFixed(1)} MB`);
  }
const out = { model: path.relative(ROOT, path.resolve(model)), file_bytes: statSync(model).isFile() ? statSync(model).size : null,
              reps, position: 64, rows };
if (outArg && outArg !== "-") { mkdirSync(path.dirname(outArg), { recursive: true }); writeFileSync(outArg, JSON.stringify(out, null, 1)); }
