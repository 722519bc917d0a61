// thread_race_harness.mjs: the WASM champion's thread pool under stress, for tests/test_thread_race.py.
//   node thread_race_harness.mjs cases.json out.json
// cases: {wasm, wasm_mt (a build with -DCHAMPION_RACE_TEST: its race windows widened), model_dir,
//         threads, passes, positions}
// out: {blocks, mismatched: [[pass, pos, n, values differing]]}: every block's logits from `threads`
// threads against one thread, compared as bits.
import { readFileSync, writeFileSync } from "node:fs";
import { createWasmChampion } from "../champion_wasm/champion_wasm.mjs";
import { validatedConfigFromJson } from "../formats/model_config.mjs";

const [, , inPath, outPath] = process.argv;
const c = JSON.parse(readFileSync(inPath, "utf8"));
const weightsBytes = new Uint8Array(readFileSync(`${c.model_dir}/model.q8.safetensors`));
const configJson = validatedConfigFromJson(new Uint8Array(readFileSync(`${c.model_dir}/config.json`)));
const common = { weightsBytes, configJson, maxBlock: 9, maxContext: c.positions + 16 };
const one = await createWasmChampion({ ...common, wasmBytes: readFileSync(c.wasm) });
const many = await createWasmChampion({ ...common, wasmBytes: readFileSync(c.wasm_mt), threads: c.threads });
let seed = 1, blocks = 0;
const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
const mismatched = [];
for (let pass = 0; pass < c.passes; pass++) {
  for (let pos = 0; pos < c.positions;) {
    const n = 1 + Math.floor(rnd() * 9);
    const block = Int32Array.from({ length: n }, () => Math.floor(rnd() * one.vocabSize));
    one.forwardNow(block, pos);
    many.forwardNow(block, pos);
    const a = new Uint32Array((await one.readLogits(n)).buffer), b = new Uint32Array((await many.readLogits(n)).buffer);
    let differing = 0;
    for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) differing++;
    if (differing) mismatched.push([pass, pos, n, differing]);
    blocks++;
    pos += n;
  }
}
one.destroy();
many.destroy();
writeFileSync(outPath, JSON.stringify({ blocks, mismatched }));
process.exit(0);    // the helper threads do not end on their own
