// qmatmul_shapes.mjs — where a forward's matmul time goes: the q8act kernel (champion_qmatmul, one
// thread) on each linear shape of a model, for blocks of n = 1, 2, 5, 9 positions: per-shape ms, the
// whole forward's matmul ms (x layers) and V(n)/V(1) of the matmuls alone, and the fixed cost (weight
// decode, per block of 4 rows: the intercept) against the per-position cost (the dot products: the
// slope). Node; not a test (numbers depend on the machine's load).
//
//   node --experimental-wasm-relaxed-simd tools/bench/qmatmul_shapes.mjs [smollm2-135m|smollm2-360m] [REPS]
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { cpuImports } from "../../web/champion_wasm/cpu_module.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const SHAPES = {   // [name, rows, cols, GGUF format id, bytes per 32 (or 256), elements per block, count per forward]
  "smollm2-135m": { layers: 30, mats: [["q|k|v", 960, 576, 3], ["o", 576, 576, 3], ["gate|up", 3072, 576, 3], ["down", 576, 1536, 3], ["head", 49152, 576, 8]] },
  "smollm2-360m": { layers: 32, mats: [["q|k|v", 1280, 960, 3], ["o", 960, 960, 3], ["gate|up", 5120, 960, 3], ["down", 960, 2560, 3], ["head", 49152, 960, 8]] },
};
const BLOCK_BYTES = { 3: 20, 8: 34, 2: 18 };
const [shapeName = "smollm2-135m", repsArg = "7"] = process.argv.slice(2);
const shape = SHAPES[shapeName], reps = Number(repsArg), NS = [1, 2, 5, 9];
const relaxed = process.execArgv.includes("--experimental-wasm-relaxed-simd");

async function exportsOf(name) {
  const m = await WebAssembly.compile(readFileSync(path.join(ROOT, "web/build", name)));
  return (await WebAssembly.instantiate(m, cpuImports(null))).exports;
}

function median(xs) { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; }

for (const name of ["cpu.wasm", ...(relaxed ? ["cpu_relaxed.wasm"] : [])]) {
  const e = await exportsOf(name);
  const total = Object.fromEntries(NS.map((n) => [n, 0]));
  const lines = [];
  for (const [label, rows, cols, fmt] of shape.mats) {
    const wBytes = rows * cols / 32 * BLOCK_BYTES[fmt];
    const w = e.champion_alloc(wBytes), x = e.champion_alloc(9 * cols * 4), out = e.champion_alloc(9 * rows * 4);
    const u8 = new Uint8Array(e.memory.buffer);
    for (let i = 0; i < wBytes; i++) u8[w + i] = (i * 2654435761 >>> 24) & 0xff;
    for (let b = 0; b < wBytes; b += BLOCK_BYTES[fmt]) { u8[w + b] = 0x00; u8[w + b + 1] = 0x20; if (fmt === 3) { u8[w + b + 2] = 0; u8[w + b + 3] = 0xa0; } }
    const f = new Float32Array(e.memory.buffer, x, 9 * cols);
    for (let i = 0; i < f.length; i++) f[i] = Math.sin(i * 0.37) * (i % 97 === 0 ? 40 : 1);
    const ms = Object.fromEntries(NS.map((n) => [n, []]));
    for (let r = 0; r < reps + 1; r++)
      for (const n of NS) {
        const t0 = performance.now();
        const st = e.champion_qmatmul(fmt, w, 0, x, n, rows, cols, out);
        if (st) throw new Error(`status ${st}`);
        if (r) ms[n].push(performance.now() - t0);
      }
    const med = Object.fromEntries(NS.map((n) => [n, median(ms[n])]));
    const count = label === "head" ? 1 : shape.layers;
    for (const n of NS) total[n] += med[n] * count;
    const slope = (med[9] - med[1]) / 8;
    lines.push(`  ${label.padEnd(8)} ${rows}x${cols} ${fmt === 8 ? "Q8_0" : "Q4_1"}: n=1 ${med[1].toFixed(3)} ms, n=5 ${med[5].toFixed(3)}, n=9 ${med[9].toFixed(3)}; ` +
               `per position ${slope.toFixed(3)} ms, fixed ${(med[1] - slope).toFixed(3)} ms (x${count})`);
  }
  const slope = (total[9] - total[1]) / 8;
  console.log(`${name} ${shapeName}: the forward's matmuls ${total[1].toFixed(1)} ms at n=1, ${total[5].toFixed(1)} at n=5, ${total[9].toFixed(1)} at n=9: ` +
              `V(5)/V(1) ${(total[5] / total[1]).toFixed(2)}; fixed (decode) ${(total[1] - slope).toFixed(1)} ms + ${slope.toFixed(1)} ms per position`);
  for (const l of lines) console.log(l);
}
