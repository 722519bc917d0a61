// Load-time model checks, in the orchestrator worker: fetch each model's small files, hash them
// with WebCrypto, and run exactspec.pyodide.model_check.check_models in Pyodide (the same config
// validator, manifest fields and pair check as under CPython). Stage 1 runs before any weights
// are fetched, and its validated configs are what the champion and draft loaders receive (no
// second fetch or parse of config.json); stage 2 (verifyRunArtifacts) after the champion and draft
// loaded, with the sha256 of the very bytes they run.
import { codedError } from "../protocol.mjs";
import { sha256Hex } from "../sha256.mjs";
import { derivedKey, readDerived, writeDerived } from "../derived_cache.mjs";
import { declaredSize, ggufLabel, isGgufUrl, readGgufHeader } from "../gguf/gguf_reader.mjs";

export { isGgufUrl };

/** fn's first call's promise, for every call. */
const once = (fn) => { let p = null; return () => (p ??= fn()); };

const MAX_SMALL_FILE = 64 << 20;          // tokenizer.json of a real model is a few MB

/** The file's bytes; null for an optional file the server (or the picked folder) answers 404 to. */
async function fetchBytes(url, limit, optional = false) {
  const res = await fetch(url);
  if (optional && res.status === 404) return null;
  if (!res.ok) throw codedError("E_MODEL_LOAD", `${new URL(url, location.href).pathname}: HTTP ${res.status}`);
  const declared = Number(res.headers.get("content-length") ?? 0);
  if (declared > limit) throw codedError("E_MODEL_LOAD", `${new URL(url, location.href).pathname}: ${declared} bytes is over ${limit}`);
  const bytes = new Uint8Array(await res.arrayBuffer());
  if (bytes.byteLength > limit) throw codedError("E_MODEL_LOAD", `${new URL(url, location.href).pathname}: over ${limit} bytes`);
  return bytes;
}

/** The manifest that covers the model folders of `folderRoles`: models.manifest (a URL, or null for
 *  none); by default web/models/manifest.json (next to this module's folder) when every one of them
 *  is served from under web/models/ (a GGUF model is a file no manifest lists: not among them). */
function manifestUrl(models, folderRoles) {
  if (models.manifest !== undefined) return models.manifest;
  const shipped = new URL("../models/", import.meta.url).href;
  const under = (u) => new URL(u, location.href).href.startsWith(shipped);
  return folderRoles.length && folderRoles.every((r) => under(models[r])) ? new URL("manifest.json", shipped).href : null;
}

/** The manifest entry a served model folder is checked against: models.<the folder's name>
 *  ("champion", "draft", "smollm2-draft"), whichever role it plays. */
function folderName(url) {
  const path = new URL(url, location.href).pathname.replace(/\/+$/, "");
  return decodeURIComponent(path.slice(path.lastIndexOf("/") + 1));
}

/** py/exactspec/formats/model_files.json, the one table of a folder's files, from Python:
 *  {required, optional, run_artifact: {role: file}}. */
function modelFiles(pyodide) {
  const fn = pyodide.pyimport("exactspec.pyodide.model_check").model_files;
  try {
    return JSON.parse(fn());
  } finally {
    fn.destroy();
  }
}

/** -> {ok: summary, validated_configs: {role: LlamaConfig fields}} */
function runPy(pyodide, specJson, blobs) {
  const check = pyodide.pyimport("exactspec.pyodide.model_check").check_models;
  try {
    const out = JSON.parse(check(specJson, (key) => blobs.get(key)));
    if (out.error) throw codedError(out.error.code, out.error.message);
    return out;
  } finally {
    check.destroy();
  }
}

/** A GGUF model (champion or draft): only the bytes before its data section are read here (the
 *  body is cancelled there), and exactspec.pyodide.model_check.check_gguf turns them into the config and the four model
 *  files the file implies, in Pyodide (gguf.py, gguf_model, gguf_tokenizer: the CLI's code).
 *  With `codeKey` (the Python sources' identity, boot.mjs) its result is kept in the derived cache
 *  (web/derived_cache.mjs) under the header bytes' sha256, the size, the label and codeKey, and a
 *  later load of the same file by the same code reads it there (summary.gguf.check_cache "hit").
 *  -> {name (the run artifact's name), files: name -> text (config.json among them), summary} */
async function readGguf(pyodide, url, codeKey = null) {
  const label = ggufLabel(url);
  let res;
  try {
    res = await fetch(url);
  } catch (err) {
    throw codedError("E_MODEL_LOAD", `${label}: cannot fetch: ${err.message}`);
  }
  if (!res.ok) throw codedError("E_MODEL_LOAD", `${label}: HTTP ${res.status}`);
  const size = declaredSize(res);
  if (size === null) throw codedError("E_MODEL_LOAD", `${label}: the server did not declare the file's size (Content-Length)`);
  const { prefix } = await readGgufHeader(res, size, label);
  const key = codeKey ? await derivedKey({ kind: "gguf-check", header_sha256: await sha256Hex(prefix), size, label, code: codeKey }) : null;
  let text = key ? await readDerived(key) : null;
  const state = !key ? "off" : text ? "hit" : "miss";
  if (!text) {
    const check = pyodide.pyimport("exactspec.pyodide.model_check").check_gguf;
    try {
      text = check(prefix, size, label);
    } finally {
      check.destroy();
    }
  }
  const out = JSON.parse(text);
  if (out.error) throw codedError(out.error.code, out.error.message);
  if (state === "miss") await writeDerived(key, text);
  out.ok.summary.gguf = { ...out.ok.summary.gguf, check_cache: state };
  return { name: label.split("/").pop(), ...out.ok };
}

/** -> {tokenizer_json, tokenizer_config_json, generation_config_json, chat_template_jinja (text or
 *  null), champion_config, draft_config (validate_config's result for each role, a folder's or
 *  the one a GGUF file's metadata implies; null without a draft), summary, ms, verifyRunArtifacts(info),
 *  checkDraft (deferDraft only)}
 *  codeKey: the Python sources' identity, for the derived cache of a GGUF's check (null: not used).
 *  deferDraft (a draft that loads after ready): only the champion's files are checked now;
 *  checkDraft() -> promise of the draft's validated config checks the draft's (fetched, hashed,
 *  validated: the same stage 1), for the background load to run before the draft's weights, and
 *  verifyRunArtifacts covers the draft from then on. */
export async function checkModels(pyodide, models, { codeKey = null, deferDraft = false } = {}) {
  const t0 = performance.now();
  const table = modelFiles(pyodide);
  const [chatTemplateFile] = table.optional;   // transformers' own file, wins over tokenizer_config's
  const allRoles = models.draft ? ["champion", "draft"] : ["champion"];
  const roles = deferDraft ? ["champion"] : [...allRoles];   // the roles checked so far (checkDraft adds the draft)
  // a GGUF side: its implied files stand for a folder's; no manifest lists it (a deferred draft's:
  // whether its URL names a .gguf decides which manifest applies, as when it is checked at once)
  const gguf = {};                      // role -> readGguf's
  const folderRoles = allRoles.filter((r) => !isGgufUrl(models[r]));
  const mUrl = manifestUrl(models, folderRoles);
  const entries = Object.fromEntries(allRoles.map((r) => [r, mUrl && folderRoles.includes(r) ? folderName(models[r]) : null]));
  const blobs = new Map();              // "role/name" -> Uint8Array
  const served = {};                    // role -> name -> [sha256, bytes]
  /** One role's files into blobs and served: a GGUF's header (its implied files) or a folder's. */
  const readRole = async (role) => {
    served[role] = {};
    if (isGgufUrl(models[role])) {
      gguf[role] = await readGguf(pyodide, models[role], codeKey);
      for (const [name, text] of Object.entries(gguf[role].files)) blobs.set(`${role}/${name}`, new TextEncoder().encode(text));
      return;
    }
    const base = models[role].endsWith("/") ? models[role] : models[role] + "/";
    await Promise.all([...table.required, chatTemplateFile].map(async (name) => {
      const bytes = await fetchBytes(base + name, MAX_SMALL_FILE, name === chatTemplateFile);
      if (!bytes) return;
      blobs.set(`${role}/${name}`, bytes);
      served[role][name] = [await sha256Hex(bytes), bytes.byteLength];
    }));
  };
  for (const role of roles.filter((r) => isGgufUrl(models[r]))) await readRole(role);   // GGUF first, in order
  const [manifest] = await Promise.all([
    mUrl ? fetchBytes(mUrl, MAX_SMALL_FILE).then((b) => JSON.parse(new TextDecoder().decode(b))) : null,
    ...roles.filter((r) => !isGgufUrl(models[r])).map(readRole),
  ]);
  const optional = {};
  const optionalOf = (r) => { optional[r] = blobs.has(`${r}/${chatTemplateFile}`) ? [chatTemplateFile] : []; };
  roles.forEach(optionalOf);
  const stage1 = runPy(pyodide, JSON.stringify({ roles, optional }), blobs);   // stage 1: configs
  let summary = stage1.ok;
  const text = (name) => new TextDecoder().decode(blobs.get(`champion/${name}`));
  const withGguf = (s) => ({ ...s, ...(gguf.champion ? { gguf: gguf.champion.summary.gguf } : {}),
    ...(gguf.draft ? { gguf_draft: gguf.draft.summary.gguf } : {}) });
  summary = withGguf(summary);
  const ms = performance.now() - t0;
  const runWeights = {};                // role -> a GGUF's run artifact name
  const nameRuns = () => { for (const [role, g] of Object.entries(gguf)) runWeights[role] = g.name; };
  nameRuns();
  return {
    tokenizer_json: text("tokenizer.json"),
    tokenizer_config_json: text("tokenizer_config.json"),
    generation_config_json: text("generation_config.json"),
    // checked as UTF-8 in stage 1; null when the champion has none
    chat_template_jinja: blobs.has(`champion/${chatTemplateFile}`) ? text(chatTemplateFile) : null,
    champion_config: stage1.validated_configs.champion,
    draft_config: stage1.validated_configs.draft ?? null,
    ms,
    get summary() { return summary; },
    /** deferDraft: the draft's files checked now (stage 1) -> its validated config; verifyRunArtifacts
     *  covers it from then on. A second call returns the first's answer. */
    checkDraft: deferDraft && models.draft ? once(async () => {
      await readRole("draft");
      optionalOf("draft");
      roles.push("draft");
      nameRuns();
      const both = runPy(pyodide, JSON.stringify({ roles, optional }), blobs);
      summary = withGguf({ ...summary, configs: both.ok.configs });
      return both.validated_configs.draft;
    }) : null,
    /** Stage 2, given the bridge's info: the run artifacts' sha256 and bytes, as loaded. */
    verifyRunArtifacts(info) {
      const run = { champion: info.champion, draft: info.draft };
      const present = roles.filter((r) => run[r]);          // a draft that failed to load is not checked
      const runFile = (role) => manifest?.models?.[entries[role]]?.run_artifact?.file ?? runWeights[role]
        ?? table.run_artifact[role];
      for (const role of present) served[role][runFile(role)] = [run[role].identity, run[role].artifact_bytes];
      summary = runPy(pyodide, JSON.stringify({ roles: present, optional, manifest, entries, served,
        run_weights: runWeights, gguf_pair: Object.keys(gguf).length > 0 }), blobs).ok;
      summary = withGguf(summary);
      return summary;
    },
  };
}
