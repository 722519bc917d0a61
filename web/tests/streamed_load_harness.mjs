// streamed_load_harness.mjs: streamed loading under node for tests/test_streamed_load.py.
//   node streamed_load_harness.mjs cases.json out.json
// cases: {sha: [{data (base64), pieces: [sizes]}],
//         files: [{data (base64), chunk, size (declared or null), ops: [["read", n] | ["stage", offset, n] |
//                  ["finish", end, drain]]}],
//         champions: [{wasm, path, kind ("gguf" | "safetensors"), config, chunk, forward: [[ids, start], ...],
//                      matmul, broken ("" | "whole")}]}
// out: sha -> hex per case; files -> {ok: [results], transient} | {error};
//      champions -> {streamed: {identity, logits, transient}, whole: {identity, logits}} | {error}
import { readFileSync, writeFileSync } from "node:fs";
import { Sha256Stream } from "../sha256_stream.mjs";
import { LoadTransient, StreamedFile } from "../formats/streamed_file.mjs";
import { ggufTensorMap } from "../gguf/gguf_tensors.mjs";
import { parseSafetensors } from "../formats/safetensors.mjs";
import { createWasmChampion } from "../champion_wasm/champion_wasm.mjs";
import { sha256Hex } from "../sha256.mjs";
import { runForward } from "./champion_harness.mjs";

const b64 = (s) => new Uint8Array(Buffer.from(s, "base64"));

/** A response whose body is `bytes` in `chunk`-byte pieces, declaring `size` (null: no length). */
function streamed(bytes, chunk, size = bytes.byteLength) {
  let at = 0;
  const body = new ReadableStream({
    pull(c) {
      if (at >= bytes.byteLength) { c.close(); return; }
      c.enqueue(bytes.slice(at, at + chunk));        // a copy: what a network read hands over
      at += chunk;
    },
  }, { highWaterMark: 0 });
  return new Response(body, { headers: size === null ? {} : { "content-length": String(size) } });
}

async function runFile({ data, chunk, size, ops }) {
  const transient = new LoadTransient();
  const file = new StreamedFile(streamed(b64(data), chunk, size), "test.bin", transient);
  const ok = [];
  try {
    for (const [op, a, b] of ops) {
      if (op === "read") ok.push(Buffer.from(await file.read(a)).toString("base64"));
      else if (op === "stage") ok.push(Buffer.from(await file.stage(a, b, 64)).toString("base64"));
      else if (op === "finish") ok.push(await file.finish(a, { drain: !!b, size }));
    }
    return { ok, transient: transient.report() };
  } catch (err) {
    return { error: err.message, ok };
  }
}

async function runChampion({ wasm, path, kind, config, chunk, forward, matmul = "auto" }) {
  const wasmBytes = readFileSync(wasm);
  const bytes = new Uint8Array(readFileSync(path));
  const common = { wasmBytes, configJson: config, maxBlock: 9, matmul, maxContext: 256 };
  const url = kind === "gguf" ? "http://test.invalid/m/model.gguf" : "http://test.invalid/m/";
  const fetchFn = async () => streamed(bytes, chunk);
  let streamedChampion, wholeChampion;
  try {
    streamedChampion = await createWasmChampion({ ...common, fetchFn, ...(kind === "gguf" ? { ggufUrl: url } : { modelUrl: url }) });
    const identity = await sha256Hex(bytes);
    const tensors = kind === "gguf" ? ggufTensorMap(bytes, config, "model.gguf", { lazy: true, blocks: matmul !== "f32" })
      : parseSafetensors(bytes.slice().buffer, "model.q8.safetensors").tensors;
    wholeChampion = await createWasmChampion({ ...common, tensors, identity });
    return {
      streamed: { identity: streamedChampion.identity, logits: await runForward(streamedChampion, [forward]),
        transient: streamedChampion.transient.report(), artifactBytes: streamedChampion.artifactBytes,
        weightBytes: streamedChampion.weightBytes },
      whole: { identity, logits: await runForward(wholeChampion, [forward]), weightBytes: wholeChampion.weightBytes },
    };
  } catch (err) {
    return { error: `${err.code ?? ""} ${err.message}` };
  } finally {
    streamedChampion?.destroy();
    wholeChampion?.destroy();
  }
}

const [, , inPath, outPath] = process.argv;
const cases = JSON.parse(readFileSync(inPath, "utf8"));
const out = { sha: [], files: [], champions: [] };
for (const { data, pieces } of cases.sha ?? []) {
  const bytes = b64(data), h = new Sha256Stream();
  let at = 0;
  for (const n of pieces) { h.update(bytes.subarray(at, at + n)); at += n; }
  h.update(bytes.subarray(at));
  out.sha.push(h.hexDigest());
}
for (const c of cases.files ?? []) out.files.push(await runFile(c));
for (const c of cases.champions ?? []) out.champions.push(await runChampion(c));
writeFileSync(outPath, JSON.stringify(out));
