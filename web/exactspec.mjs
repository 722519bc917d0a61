// exactspec — the embeddable engine (one ES module). Workers and assets resolve relative to this
// module (import.meta.url) or to the baseUrl option, so it runs from any path or origin.
//   import { createEngine } from "https://your.site/exactspec/web/exactspec.mjs";
//   const engine = await createEngine({ onProgress: (p) => console.log(p) });   // the shipped pair
//   const result = await engine.generate("In the beginning", { speculate: "auto" },   // the default
//                                        (ev) => ev.kind === "tokens" && show(ev.payload));
//   engine.cancel();  await engine.terminate();
// Types: exactspec.d.ts. Full reference: docs/browser.md ("The embeddable module").
import { Engine, engineAssets, startModuleWorker } from "./orchestrator/engine.mjs";
import { codedError } from "./protocol.mjs";
import { localModelUrl } from "./fetch_progress.mjs";
import { RESTRICTED_TENSORS, readBlobSafetensorsHeader } from "./formats/model_checks.mjs";

export { codedError };
/** The verified weight cache of this origin (web/weight_cache.mjs): listCachedModels() ->
 *  [{sha256, bytes, name, urls, stored_at}]; forgetCachedModel(sha256), or null for all. */
export { forgetCachedModel, listCachedModels } from "./weight_cache.mjs";

const modelFileTables = new Map();   // URL -> promise of the table

/** py/exactspec/formats/model_files.json, the one table of a model folder's files (Python's too):
 *  {required, optional, run_artifact: {champion, draft}}; `pyUrl` the folder of the Python package
 *  (engineAssets(...).py). Fetched once per URL. */
export function loadModelFiles(pyUrl) {
  const url = new URL("formats/model_files.json", pyUrl).href;
  if (!modelFileTables.has(url)) {
    modelFileTables.set(url, fetch(url).then(async (res) => {
      if (!res.ok) throw codedError("E_MODEL_LOAD", `${url}: HTTP ${res.status}`);
      return res.json();
    }));
    modelFileTables.get(url).catch(() => modelFileTables.delete(url));   // a failed fetch is retried next time
  }
  return modelFileTables.get(url);
}

/** The top-level files of a picked folder (FileList of <input webkitdirectory>, or File[]) by name. */
function filesByName(fileList) {
  const byName = new Map();
  for (const f of Array.from(fileList ?? [])) {
    const rel = (f.webkitRelativePath || f.name).split("/");
    const name = rel.length > 1 ? rel.slice(1).join("/") : rel[0];   // drop the folder's own name
    if (!name.includes("/")) byName.set(name, f);
  }
  return byName;
}

/** By file names: a champion folder without model.q8.safetensors but with a Hugging Face
 *  checkpoint (model.safetensors or sharded with model.safetensors.index.json), or a draft folder
 *  with only the sharded checkpoint: it can be converted here. A draft's single model.safetensors
 *  that is not all F32 (bf16/f16 as transformers writes them) needs its header read:
 *  draftNeedsConversion. */
export function needsConversion(role, fileList) {
  const byName = filesByName(fileList);
  const sharded = byName.has("model.safetensors.index.json");
  if (role === "draft") return !byName.has("model.safetensors") && sharded;
  return role === "champion" && !byName.has("model.q8.safetensors") && (byName.has("model.safetensors") || sharded);
}

/** A picked draft folder the WASM draft cannot run as it is: sharded, or a model.safetensors
 *  holding a tensor that is not F32 (its header alone is read; a restricted draft's I32
 *  exactspec.head_ids / exactspec.embed_rows run as they are). */
export async function draftNeedsConversion(fileList) {
  if (needsConversion("draft", fileList)) return true;
  const weights = filesByName(fileList).get("model.safetensors");
  if (!weights) return false;                     // folderFiles names the missing file
  const { entries } = await readBlobSafetensorsHeader(weights, "draft/model.safetensors");
  return [...entries].some(([name, e]) => e.dtype !== "F32" && !(e.dtype === "I32" && RESTRICTED_TENSORS.includes(name)));
}

/** Convert a picked Hugging Face folder to the run artifact of `role` in a worker
 *  (web/convert/convert_worker.mjs, byte-identical to `exactspec convert [--role draft]`), with
 *  {stage: "convert"} progress (named `runArtifact`, the file it writes); -> Blob. */
export function convertFolder(role, fileList, { onProgress = null, workerUrl, runArtifact = "run artifact" } = {}) {
  const files = Object.fromEntries(filesByName(fileList));
  const worker = startModuleWorker(workerUrl ?? new URL("./convert/convert_worker.mjs", import.meta.url).href);
  const name = `${role}/${runArtifact} (converting here)`;
  return new Promise((resolve, reject) => {
    worker.onmessage = ({ data }) => {
      if (data.type === "progress") {
        onProgress?.({ stage: "convert", url: `convert:${role}`, name, loaded: data.bytes_done, total: data.bytes_total, done: false });
        return;
      }
      worker.terminate();
      if (data.type === "done") {
        onProgress?.({ stage: "convert", url: `convert:${role}`, name, loaded: data.bytes, total: data.bytes, done: true });
        resolve(data.blob);
      } else reject(codedError(data.code ?? "E_MODEL_LOAD", `${role} folder conversion: ${data.message}`));
    };
    worker.onerror = (ev) => { worker.terminate(); reject(codedError("E_MODEL_LOAD", `the converter failed: ${ev.message || "error"}`)); };
    worker.postMessage({ files, role });
  });
}

/** Convert a Hugging Face champion folder to model.q8.safetensors (convertFolder("champion", ...)). */
export const convertChampion = (fileList, options = {}) => convertFolder("champion", fileList, options);

/** A picked folder as {"role/name": File} for the top-level files `role` needs (`table`:
 *  loadModelFiles', its required files and the role's run artifact); throws E_MODEL_LOAD naming a
 *  missing one. Nothing is read or uploaded here: the engine's worker reads the files at load.
 *  `converted`: the role's run artifact made by convertFolder (it stands for the folder's own
 *  model.q8.safetensors / model.safetensors). */
export function folderFiles(role, fileList, table, converted = null) {
  const byName = filesByName(fileList);
  const runArtifact = table.run_artifact[role];
  if (converted) byName.set(runArtifact, converted);
  const missing = [...table.required, runArtifact].filter((n) => !byName.has(n));
  if (missing.length) {
    const more = role === "champion" && missing.includes(runArtifact)
      ? " (a champion folder must hold the q8 artifact that `exactspec convert` writes, or a Hugging Face model.safetensors to convert)" : "";
    throw codedError("E_MODEL_LOAD", `${role} folder lacks ${missing.join(", ")}${more}`);
  }
  const out = {};
  for (const [name, f] of byName) out[`${role}/${name}`] = f;
  return out;
}

/** A picked GGUF file (a File or Blob with a name ending in .gguf): a champion or a draft on its own. */
const isGgufFile = (value) => typeof Blob !== "undefined" && value instanceof Blob && /\.gguf$/i.test(value.name ?? "");

/** models for Engine.load from {champion, draft} where each is a URL string, a picked .gguf File or
 *  a picked folder (FileList / File[]); folders become virtual URLs answered from the files in the worker; a
 *  champion folder with only a Hugging Face checkpoint is converted to q8 here first, a draft
 *  folder that is sharded or not all F32 (bf16/f16) to the all-F32 model.safetensors. `table`:
 *  loadModelFiles' (a picked folder is checked against it). */
export async function resolveModels({ champion, draft, manifest }, defaults, onProgress, table) {
  const picked = (v) => v && typeof v !== "string" && !isGgufFile(v);
  const convert = (role, files) => convertFolder(role, files, { onProgress, runArtifact: table.run_artifact[role] });
  const converted = {
    champion: picked(champion) && needsConversion("champion", champion) ? await convert("champion", champion) : null,
    draft: picked(draft) && await draftNeedsConversion(draft) ? await convert("draft", draft) : null,
  };
  const models = {}, files = {};
  for (const [role, value] of [["champion", champion ?? defaults.champion], ["draft", draft === undefined ? defaults.draft : draft]]) {
    if (value === null || value === undefined || value === "") continue;
    if (typeof value === "string") { models[role] = value; continue; }
    if (isGgufFile(value)) {      // one picked .gguf: read in the worker, nothing uploaded
      files[`${role}/${value.name}`] = value;
      models[role] = localModelUrl(role) + encodeURIComponent(value.name);
      continue;
    }
    Object.assign(files, folderFiles(role, value, table, converted[role]));
    models[role] = localModelUrl(role);
  }
  if (Object.keys(files).length) {
    models.files = files;
    models.manifest = manifest ?? null;           // a local folder is checked without the shipped manifest
  } else if (manifest !== undefined) models.manifest = manifest;
  return models;
}

/** generate()'s option names, from protocol.json (the one table, `schema`): `config`, the
 *  generation options (generate_config) that go to the orchestrator as they are; `fields`, the
 *  request's flags besides its prompt (generate_request's entries that are not a prompt). */
export function optionNames(schema) {
  const keys = (table, keep = () => true) => Object.entries(table).filter(([k, rule]) => !k.startsWith("_") && keep(rule)).map(([k]) => k);
  return { config: keys(schema.generate_config), fields: keys(schema.generate_request, (rule) => !("prompt" in rule)) };
}

/** {prompt | prompt_ids | messages, chat?, raw_text?, config} from generate()'s arguments, sorted
 *  by protocol.json (`schema`, loadSchema's); unknown options are refused here, every type by the
 *  engine (the same table and rules as Python). A prompt that is an array of objects is a
 *  conversation ([{role, content}, ...], in the model's chat template), any other array token ids;
 *  anything else must be a string. */
export function requestPayload(prompt, options, schema) {
  const { config: configNames, fields: fieldNames } = optionNames(schema);
  const rest = { ...(options ?? {}) };
  delete rest.silenceTimeoutMs;                   // the engine's, not the request's
  const unknown = Object.keys(rest).filter((k) => !configNames.includes(k) && !fieldNames.includes(k));
  if (unknown.length) {
    throw codedError("E_BAD_ARGUMENT", `unknown option ${unknown[0]} (known: ${[...fieldNames, ...configNames].join(", ")})`);
  }
  const defined = (entries) => Object.fromEntries(entries.filter(([, v]) => v !== undefined));
  const config = defined(Object.entries(rest).filter(([k]) => configNames.includes(k)));
  const fields = defined(fieldNames.map((k) => [k, rest[k]]));
  const isConversation = Array.isArray(prompt) && prompt[0] !== null && typeof prompt[0] === "object";
  const promptField = isConversation ? "messages" : Array.isArray(prompt) ? "prompt_ids" : "prompt";
  return { [promptField]: prompt, ...fields, config };
}

class ExactSpecEngine {
  constructor(engine) { this.engine = engine; }

  /** What the load reported: {timing_ms, info: {champion, draft, draft_error, manifest}}. */
  get ready() { return this.engine.ready; }

  /** Generate one answer (queued behind a running one). onEvent sees {kind: "tokens"|"progress"|
   *  "error", payload}; resolves with the result (text, token_ids, finish_reason, stats,
   *  timing_ms, error, receipt); rejects with .code when refused before it started, and with
   *  E_TIMEOUT when the worker fell silent for silenceTimeoutMs (the engine is then ended). */
  generate(prompt, options = {}, onEvent = null) {
    let payload;
    try { payload = requestPayload(prompt, options, this.engine.schema.schema); } catch (err) { return Promise.reject(err); }
    const silence = options?.silenceTimeoutMs;
    return this.engine.generate(payload, onEvent, silence === undefined ? {} : { silenceTimeoutMs: silence });
  }

  /** End the running answer at its next round boundary ("cancelled"); true if one was running. */
  cancel() { return this.engine.cancel(); }

  /** Bytes held, by category: GPU buffers, WASM champion and draft memory, Pyodide heap. */
  memory() { return this.engine.memory(); }

  /** Load another pair in place (same options as createEngine's models and onProgress). */
  async load(models, options = {}) {
    const table = await loadModelFiles(this.urls.py);
    return this.engine.load(await resolveModels(models, this.defaults, options.onProgress, table),
      { draftInBackground: true, ...options });   // createEngine's default
  }

  /** Free everything; later calls are refused E_TERMINATED. */
  terminate() { return this.engine.terminate(); }
}

/** Create an engine and load a pair. options: {champion, draft (URL, picked folder, or null for
 *  none; default the shipped pair), manifest, championBackend: "auto"|"webgpu"|"wasm", threads, matmul,
 *  draftPlacement, whenBusy, baseUrl, assets, timeoutMs, silenceTimeoutMs, onProgress, draftInBackground, warmUp, calibrate, cache, gpuMemoryBudget}.
 *  gpuMemoryBudget ("auto" default: half of navigator.deviceMemory | bytes | 0: none): a WebGPU
 *  champion whose plan exceeds it is refused before its weights are fetched (under championBackend
 *  "auto" the WASM champion runs instead: ready.info.champion_fallback, E_OUT_OF_MEMORY).
 *  cache (default true): weight files come from and go to the verified weight cache (Cache Storage,
 *  keyed by sha256; listCachedModels / forgetCachedModel; docs/browser.md, "Weight cache"); false: neither.
 *  warmUp (default true; false, or {minCalls, budgetMs}): the load's warm-up requests (docs/browser.md).
 *  calibrate ("auto" default | "force" | "off"): this device's costs for speculate "auto" (the
 *  default mode), cached per device and model; ready.info.calibration (docs/browser.md, "Calibration at load").
 *  draftInBackground (default true): resolve as soon as the champion is ready; the draft loads when
 *  the engine is idle (a request sent at once comes first), onProgress then sees {stage: "draft_ready",
 *  draft, draft_error} and a calibration; until then speculate "auto" runs without it and "draft"
 *  waits for it. false: ready only once the draft is in (docs/browser.md, "Usable as soon as the champion is"). */
export async function createEngine(options = {}) {
  const { champion, draft, manifest, baseUrl, assets, onProgress, championBackend = "auto", threads = "auto", matmul = "auto",
    draftPlacement = "auto", whenBusy = "queue", timeoutMs, silenceTimeoutMs, draftInBackground = true, warmUp = true, calibrate = "auto",
    cache = true, gpuMemoryBudget = "auto" } = options;
  const urls = engineAssets(baseUrl ?? new URL("./", import.meta.url).href, assets);
  const defaults = { champion: new URL("champion/", urls.models).href, draft: new URL("draft/", urls.models).href };
  const models = await resolveModels({ champion, draft, manifest }, defaults, onProgress, await loadModelFiles(urls.py));
  const engine = await Engine.create(models, { baseUrl, assets, championBackend, threads, matmul, draftPlacement, whenBusy,
    onProgress, draftInBackground, warmUp, calibrate, cache, gpuMemoryBudget, ...(timeoutMs ? { timeoutMs } : {}), ...(silenceTimeoutMs ? { silenceTimeoutMs } : {}) });
  const wrapped = new ExactSpecEngine(engine);
  wrapped.defaults = defaults;
  wrapped.urls = urls;
  return wrapped;
}
