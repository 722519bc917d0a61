// blocks_harness.mjs — the WASM champion loading weights in their blocks (matmul option), for tests/test_wasm_blocks.py.
//   node web/tests/blocks_harness.mjs cases.json out.json
// cases: {champions: [{wasm (path: cpu.wasm; threads > 1 load cpu_mt.wasm beside it), gguf (a .gguf path) | model_dir (a q8 folder), config (gguf: gguf_model's),
//                      matmul, weight_storage, threads, forward: [[[ids, start], ...], ...], greedy: {prompt, n},
//                      truncate_tensor: a name (gguf: a block tensor map whose tensor lost its last row)}]}
// out: champions -> {info: {matmul, weight_bytes, memory_bytes, artifact_bytes, weight_storage, formats},
//                    forward: base64 logits rows per sequence, greedy: ids} | {error: {code, message}}
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createWasmChampion } from "../champion_wasm/champion_wasm.mjs";
import { ggufTensorMap } from "../gguf/gguf_tensors.mjs";
import { validateConfig } from "../formats/model_checks.mjs";
import { runForward } from "./champion_harness.mjs";

/** Greedy tokens after `prompt`: all but its last token in blocks of maxBlock, then one position a
 *  step (a decision reads row 0 of the last forward: that forward is the last position alone). */
function greedyIds(champion, { prompt, n }) {
  const ids = [...prompt];
  let start = 0;
  while (ids.length < prompt.length + n) {
    const end = start < ids.length - 1 ? Math.min(ids.length - 1, start + champion.maxBlock) : ids.length;
    const feed = ids.slice(start, end);
    champion.forwardNow(Int32Array.from(feed), start);
    start += feed.length;
    if (start < ids.length) continue;
    const d = champion.decideNow({ nRows: 1, proposals: [], contextIds: ids, policy: {}, seed: [0, 0], roundId: 0,
      stopTokenIds: [], remaining: 1, greedy: true });
    ids.push(d[1]);                      // the decision words' next_token (protocol.json round_record)
  }
  return ids.slice(prompt.length);
}

async function load(c) {
  const wasmBytes = readFileSync((c.threads ?? 1) > 1 ? c.wasm.replace(/cpu\.wasm$/, "cpu_mt.wasm") : c.wasm);
  const opts = { wasmBytes, matmul: c.matmul ?? "auto", weightStorage: c.weight_storage ?? "auto", threads: c.threads ?? 1,
    maxBlock: c.max_block ?? 9 };
  if (c.truncate_tensor) {               // a hand-made block tensor map, one tensor short of its last row
    const bytes = new Uint8Array(readFileSync(c.gguf));
    const tensors = ggufTensorMap(bytes, c.config, c.gguf, { blocks: true });
    const t = tensors.get(c.truncate_tensor);
    tensors.set(c.truncate_tensor, { ...t, bytes: t.bytes.subarray(0, t.bytes.byteLength - t.rowBytes) });
    return createWasmChampion({ ...opts, tensors, identity: "test", configJson: validateConfig(c.config) });
  }
  if (c.gguf) {                          // the loader's own GGUF path, the file served from disk
    const bytes = new Uint8Array(readFileSync(c.gguf));
    const fetchFn = async () => new Response(bytes, { headers: { "content-length": String(bytes.byteLength) } });
    return createWasmChampion({ ...opts, ggufUrl: `file:///${c.gguf.split("/").pop()}`, fetchFn, configJson: validateConfig(c.config) });
  }
  const config = validateConfig(c.config ?? JSON.parse(readFileSync(join(c.model_dir, "config.json"), "utf8")));
  return createWasmChampion({ ...opts, configJson: config, weightsBytes: new Uint8Array(readFileSync(join(c.model_dir, "model.q8.safetensors"))) });
}

async function runChampion(c) {
  let champion;
  try {
    champion = await load(c);
  } catch (err) {
    return { error: { code: err.code ?? "uncoded", message: err.message } };
  }
  const out = { info: { matmul: champion.matmulFunction, weight_bytes: champion.weightBytes, memory_bytes: champion.memoryBytes,
    artifact_bytes: champion.artifactBytes, weight_storage: champion.weightStorage, identity: champion.identity,
    formats: Object.fromEntries(champion._linears.map((lin) => [lin.name, lin.fmt])) } };
  if (c.forward) out.forward = await runForward(champion, c.forward);
  if (c.greedy) out.greedy = greedyIds(champion, c.greedy);
  champion.destroy();
  return out;
}

const [, , cin, cout] = process.argv;
const cases = JSON.parse(readFileSync(cin, "utf8"));
const out = { champions: [] };
for (const c of cases.champions ?? []) out.champions.push(await runChampion(c));
writeFileSync(cout, JSON.stringify(out));
