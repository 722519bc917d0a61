// restricted_harness.mjs — the page's code on restricted-vocabulary drafts, in Node, for
// tests/test_restricted_vocab.py: the folder checks + conversion the page runs on a picked
// folder (web/convert/q8_artifact.mjs over web/formats/model_checks.mjs) and the WASM draft's loader
// (web/draft/draft.mjs). Files are opened as Blobs, as a picked folder's File objects are.
//
//   node web/tests/restricted_harness.mjs cases.json out.json
//
// cases.json: {cases: [{op: "convert", dir, role, out} | {op: "load", wasm, dir} | {op: "needs_conversion", dir}]}
// out.json:   {results: [{ok: true, value?} | {ok: false, code, message}]}
import { openAsBlob } from "node:fs";
import { readdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { writeRunArtifact } from "../convert/q8_artifact.mjs";
import { draftNeedsConversion } from "../exactspec.mjs";
import { createDraft } from "../draft/draft.mjs";
import { validatedConfigFromJson } from "../formats/model_config.mjs";

async function convert({ dir, role, out }) {
  const files = {};
  for (const name of await readdir(dir)) files[name] = await openAsBlob(join(dir, name));
  const chunks = [];
  await writeRunArtifact(files, { role, onChunk: (c) => chunks.push(Buffer.from(c)) });
  await writeFile(out, Buffer.concat(chunks));
}

async function load({ wasm, dir }) {
  await createDraft({
    wasmBytes: await readFile(wasm),
    configJson: validatedConfigFromJson(await readFile(join(dir, "config.json"))),
    weightsBytes: new Uint8Array(await readFile(join(dir, "model.safetensors"))),
  });
}

async function needsConversion({ dir }) {     // the page's question on a picked draft folder
  const files = [];
  for (const name of await readdir(dir)) files.push(new File([await openAsBlob(join(dir, name))], name));
  return draftNeedsConversion(files);
}

const [casesPath, outPath] = process.argv.slice(2);
const { cases } = JSON.parse(await readFile(casesPath, "utf8"));
const results = [];
for (const c of cases) {
  try {
    const ops = { convert, load, needs_conversion: needsConversion };
    const value = await ops[c.op](c);
    results.push(value === undefined ? { ok: true } : { ok: true, value });
  } catch (err) {
    results.push({ ok: false, code: err.code ?? `uncoded ${err.name}`, message: err.detail ?? err.message });
  }
}
await writeFile(outPath, JSON.stringify({ results }));
