// gguf_harness.mjs: drives web/gguf/ under node for tests/test_gguf_browser_js.py.
//   node gguf_harness.mjs cases.json out.json
// cases: {dequant: [{type, raw (base64)}], headers: [{label, file (base64)}], models: [{label, file, config, lazy}],
//         champions: [{wasm (path), path (a .gguf), config, forward: [[[ids, start], ...]], greedy: {prompt, n},
//                      matmul ("f32", default: every tensor float32; "auto" / "q8act": block tensors as blocks)}]}
// out: dequant -> base64 of the float32 bytes; headers -> {ok: summary} | {error: message};
//      models -> {ok: {name: [shape, base64 of float32 bytes]}} | {error: message}
//      champions -> {identity, matmulFunction, forward: base64 logits rows per sequence, greedy: ids, ms_per_token}
//      streams ({path, chunk, size}: the file as a streamed body of `chunk`-byte pieces, declaring
//      `size`) -> {ok: {pulled (bytes the reader took), prefix, data_offset, n_tensors}} | {error}
import { readFileSync, writeFileSync } from "node:fs";
import { dequantize, BLOCKS } from "../gguf/gguf_dequant.mjs";
import { parseGgufHeader, readGgufHeader } from "../gguf/gguf_reader.mjs";
import { ggufTensorMap } from "../gguf/gguf_tensors.mjs";
import { createWasmChampion } from "../champion_wasm/champion_wasm.mjs";
import { sha256Hex } from "../sha256.mjs";
import { validateConfig } from "../formats/model_checks.mjs";
import { runForward } from "./champion_harness.mjs";

/** integerLinears: every linear's values rounded to integers in [-127, 127] (x 100 first), held as
 *  float32 `<name>` ("f32") or as `<name>.q8` + `<name>.scale` of 1.0 ("q8"): the same numbers in
 *  both forms, so the two champions must give the same bits. */
function integerLinears(tensors, form) {
  for (const [name, t] of [...tensors]) {
    if (!/(_proj|lm_head)\.weight$/.test(name)) continue;
    const values = new Float32Array(t.bytes.buffer, t.bytes.byteOffset, t.bytes.byteLength / 4);
    const ints = Int8Array.from(values, (v) => Math.max(-127, Math.min(127, Math.round(v * 100))));
    if (form === "f32") {
      tensors.set(name, { ...t, bytes: new Uint8Array(Float32Array.from(ints).buffer) });
    } else {
      tensors.delete(name);
      tensors.set(`${name}.q8`, { dtype: "I8", shape: t.shape, bytes: new Uint8Array(ints.buffer) });
      tensors.set(`${name}.scale`, { dtype: "F32", shape: [t.shape[0]], bytes: new Uint8Array(new Float32Array(t.shape[0]).fill(1).buffer) });
    }
  }
  return tensors;
}

/** The WASM champion on a GGUF file's tensor map: its forward rows, and greedy decisions. */
async function runChampion({ wasm, path, config, forward = [], greedy = null, integer_linears: form = null,
                             matmul = "f32", threads = 1 }) {
  const bytes = new Uint8Array(readFileSync(path));
  let tensors = ggufTensorMap(bytes, config, path, { blocks: matmul !== "f32" });
  if (form) tensors = integerLinears(tensors, form);
  const champion = await createWasmChampion({ wasmBytes: readFileSync(wasm), configJson: validateConfig(config),
    tensors, identity: await sha256Hex(bytes), threads, ...(matmul === "f32" ? { weightStorage: "f32" } : { matmul }) });
  const out = { identity: champion.identity, matmulFunction: champion.matmulFunction,
    forward: await runForward(champion, forward) };
  if (greedy) {
    const ids = [...greedy.prompt];
    let start = 0;
    const t0 = performance.now();
    while (ids.length < greedy.prompt.length + greedy.n) {
      // the prompt but its last token in blocks, then that token alone: the decision reads row 0
      const end = start < ids.length - 1 ? Math.min(ids.length - 1, start + champion.maxBlock) : ids.length;
      const feed = ids.slice(start, end);
      champion.forwardNow(Int32Array.from(feed), start);
      start += feed.length;
      if (start < ids.length) continue;
      const d = champion.decideNow({ nRows: 1, proposals: [], contextIds: ids, policy: {}, seed: [0, 0], roundId: 0,
        stopTokenIds: [], remaining: 1, greedy: true });
      ids.push(d[1]);                    // the decision words' next_token (protocol.json round_record)
    }
    out.greedy = ids.slice(greedy.prompt.length);
    out.ms_total = performance.now() - t0;
  }
  champion.destroy();
  return out;
}

const [, , cin, cout] = process.argv;
const cases = JSON.parse(readFileSync(cin, "utf8"));
const bytesOf = (b64) => new Uint8Array(Buffer.from(b64, "base64"));
const b64Of = (u8) => Buffer.from(u8.buffer, u8.byteOffset, u8.byteLength).toString("base64");
const attempt = (fn) => { try { return { ok: fn() }; } catch (err) { return { error: err.message }; } };

const out = {
  dequant: (cases.dequant ?? []).map(({ type, raw }) => {
    const bytes = bytesOf(raw);
    const [perBlock, blockBytes] = BLOCKS[type];
    const values = new Float32Array(bytes.byteLength / blockBytes * perBlock);
    dequantize(bytes, type, values);
    return b64Of(new Uint8Array(values.buffer));
  }),
  headers: (cases.headers ?? []).map(({ label, file }) => attempt(() => {
    const bytes = bytesOf(file);
    const h = parseGgufHeader(bytes, bytes.byteLength, label);
    return { version: h.version, n_kv: h.metadata.size, data_offset: h.dataOffset,
      tensors: [...h.tensors.values()].map((t) => [t.name, t.typeName, t.dims, t.offset, t.nbytes]) };
  })),
  models: (cases.models ?? []).map(({ label, file, config, lazy = false }) => attempt(() => {
    const tensors = ggufTensorMap(bytesOf(file), config, label, { lazy });
    return Object.fromEntries([...tensors].map(([name, t]) => [name, [t.shape, b64Of(t.bytes)]]));
  })),
};
/** readGgufHeader over a counted stream of the file: how far it read before it stopped. */
async function runStream({ path, chunk, size }) {
  const bytes = new Uint8Array(readFileSync(path));
  let at = 0;
  const body = new ReadableStream({
    pull(controller) {
      if (at >= bytes.byteLength) { controller.close(); return; }
      controller.enqueue(bytes.slice(at, at + chunk));
      at += chunk;
    },
  }, { highWaterMark: 0 });
  try {
    const { header, prefix } = await readGgufHeader(new Response(body), size ?? bytes.byteLength, path);
    return { ok: { pulled: Math.min(at, bytes.byteLength), prefix: prefix.byteLength, data_offset: header.dataOffset,
      n_tensors: header.tensors.size } };
  } catch (err) {
    return { error: err.message };
  }
}

out.streams = [];
for (const c of cases.streams ?? []) out.streams.push(await runStream(c));
out.champions = [];
for (const c of cases.champions ?? []) out.champions.push(await runChampion(c));
writeFileSync(cout, JSON.stringify(out));
