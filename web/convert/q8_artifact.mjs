// The run artifact of a Hugging Face folder, streamed tensor by tensor and row block by row block
// from File/Blob objects (Blob.slice), the same bytes `exactspec convert [--role draft]` writes
// (py/exactspec/reference/convert.py). Role "champion": model.q8.safetensors (scheme q8-sym-row-v1), every
// 2-D tensor but the embedding as <name>.q8 int8 + <name>.scale float32 per row, the rest
// float32. Role "draft": the WASM draft's all-float32 model.safetensors, every tensor under its
// own name, no `quantization` metadata. Both: the same plan (tied lm_head and rotary inv_freq
// dropped), the same layout (descending element size, then
// name; header JSON compact, space-padded to 8 bytes; metadata merged over shards, sorted, with
// `quantization`), the same quantiser in float32 (amax = max|row| clamped to f32(1e-12),
// scale = f32(amax / 127), q = clip(rint(f32(w / scale)), -127, 127), ties to even).
// Peak working memory: one block of rows (CHUNK_VALUES values as float32 plus their source bytes
// and int8 copy) and the per-row scales of one tensor; never a tensor, never the model.
// Before a weight byte is read, the folder passes the checks of `exactspec convert`
// (web/formats/model_checks.mjs: config, index, headers against file sizes, shapes against the config);
// a row holding inf or NaN is refused while converting, named, as the CLI refuses it.

import {
  HEAD_IDS, IGNORED_SUFFIXES, INDEX_FILE, MAX_CONFIG_BYTES, MAX_INDEX_BYTES, RESTRICTED_TENSORS, WEIGHTS_FILE,
  checkRestrictedValues, checkTensorsAgainstConfig, modelLoadError, parseJsonBounded, readBlobSafetensorsHeader, readSmallBlob,
  shardFiles, validateConfig,
} from "../formats/model_checks.mjs";
import { codedError } from "../protocol.mjs";

export const CHUNK_VALUES = 1 << 20;
export const EMBEDDING = "model.embed_tokens.weight";
export const QUANTIZATION = "int8 symmetric per output row; w = q8 * scale[:,None]";
const ELEMENT_BYTES = { F32: 4, F16: 2, BF16: 2, I8: 1, I32: 4 };
const F32_TINY = Math.fround(1e-12);

const fail = modelLoadError;

/** The picked files as a Map name -> File/Blob (a plain object's own entries, or a Map). */
function filesMap(files) {
  return files instanceof Map ? files : new Map(Object.entries(files ?? {}));
}

/** The checkpoint of a folder given as {name -> File} (or a Map), checked as `exactspec convert`
 *  checks it before a weight byte is read (web/formats/model_checks.mjs): config.json validated first;
 *  then model.safetensors if present (transformers' first choice), else the shards of
 *  model.safetensors.index.json, each shard holding exactly the tensors the index maps to it;
 *  every header against its file's size; a tensor in two files refused; names, dtypes and shapes
 *  against the config (role "draft": the restricted-vocabulary tensors allowed, their values
 *  checked). -> {tensors: Map name -> {dtype, shape, begin, end, file, path},
 *  metadata (merged; a key differing between shards dropped), config (validated)} */
export async function openFolder(files, role = "champion") {
  files = filesMap(files);
  const configFile = files.get("config.json");
  if (!configFile) throw fail("config.json: file not found");
  const config = validateConfig(parseJsonBounded(await readSmallBlob(configFile, MAX_CONFIG_BYTES, "config.json"),
    { source: "config.json" }), "config.json");
  let names = [WEIGHTS_FILE], namesPerFile = null, where = WEIGHTS_FILE;
  if (!files.has(WEIGHTS_FILE)) {
    const indexFile = files.get(INDEX_FILE);
    if (!indexFile) throw fail(`folder: has neither ${WEIGHTS_FILE} nor ${INDEX_FILE}`);
    const index = parseJsonBounded(await readSmallBlob(indexFile, MAX_INDEX_BYTES, INDEX_FILE),
      { maxBytes: MAX_INDEX_BYTES, source: INDEX_FILE });
    namesPerFile = new Map();
    for (const [name, shard] of shardFiles(index, INDEX_FILE)) {
      if (!namesPerFile.has(shard)) namesPerFile.set(shard, new Set());
      namesPerFile.get(shard).add(name);
    }
    names = [...namesPerFile.keys()].sort();
    where = INDEX_FILE;
  }
  const tensors = new Map();
  const merged = new Map();
  const conflicting = new Set();
  for (const path of names) {
    const file = files.get(path);
    if (!file) throw fail(`${path}: file not found`);
    const h = await readBlobSafetensorsHeader(file, path);
    if (namesPerFile) {
      const want = namesPerFile.get(path);
      const extra = [...h.entries.keys()].filter((n) => !want.has(n)).sort();
      const missing = [...want].filter((n) => !h.entries.has(n)).sort();
      if (extra.length) throw fail(`${path}: holds '${extra[0]}', which ${INDEX_FILE} does not map to it`);
      if (missing.length) throw fail(`${path}: lacks '${missing[0]}', which ${INDEX_FILE} maps to it`);
    }
    for (const [name, e] of h.entries) {
      if (tensors.has(name)) throw fail(`${path}: tensor '${name}' is also in ${tensors.get(name).path}`);
      tensors.set(name, { dtype: e.dtype, shape: e.shape, begin: h.dataStart + e.begin, end: h.dataStart + e.end, file, path });
    }
    for (const [k, v] of Object.entries(h.metadata)) {
      if (merged.has(k) && merged.get(k) !== v) conflicting.add(k);
      if (!merged.has(k)) merged.set(k, v);
    }
  }
  checkTensorsAgainstConfig(tensors, config, where, false, role);
  for (const name of RESTRICTED_TENSORS) {      // their values, before the long write (convert.py does the same)
    if (!tensors.has(name)) continue;
    const t = tensors.get(name);
    const raw = new Uint8Array(await t.file.slice(t.begin, t.end).arrayBuffer());
    if (raw.byteLength !== t.end - t.begin) throw fail(`${t.path}: ended after ${raw.byteLength} of ${t.end - t.begin} expected bytes (changed while read?)`);
    const limit = name === HEAD_IDS ? config.vocab_size : tensors.get(EMBEDDING).shape[0];
    checkRestrictedValues(name, new Int32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4).slice(), limit,
      (problem) => { throw fail(`${where}: ${problem}`); });
  }
  const metadata = new Map([...merged].filter(([k]) => !conflicting.has(k)));
  return { tensors, metadata, config };
}

/** Output name -> [dtype, shape, source, kind ("f32" | "q8" | "scale")], as convert.plan_outputs;
 *  quantise false: every tensor float32 under its own name (the draft's model.safetensors); a
 *  draft's restricted-vocabulary tensors (I32) pass through unchanged (kind "i32"). */
export function planOutputs(tensors, tied, q8Embedding = false, quantise = true) {
  const plan = new Map();
  for (const [name, t] of tensors) {
    if (IGNORED_SUFFIXES.some((s) => name.endsWith(s)) || (tied && name === "lm_head.weight")) continue;
    if (RESTRICTED_TENSORS.includes(name)) { plan.set(name, [String(t.dtype).toUpperCase(), t.shape, name, "i32"]); continue; }
    if (quantise && t.shape.length === 2 && (name !== EMBEDDING || q8Embedding)) {
      plan.set(`${name}.q8`, ["I8", t.shape, name, "q8"]);
      plan.set(`${name}.scale`, ["F32", t.shape.slice(0, 1), name, "scale"]);
    } else {
      plan.set(name, ["F32", t.shape, name, "f32"]);
    }
  }
  return plan;
}

const byCodePoints = (a, b) => (a < b ? -1 : a > b ? 1 : 0);   // ASCII names: code point order

/** JSON of [key, value] pairs as an object, in their order (a JS object would put integer-like
 *  keys first; Python's json.dumps keeps the order given). */
const jsonObject = (pairs) => `{${pairs.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(",")}}`;

/** [prefix bytes, [[name, nbytes], ...] in data order], as safetensors.safetensors_layout.
 *  plan: Map as planOutputs; metadata: Map key -> string, in the order to write. */
export function layout(plan, metadata) {
  const order = [...plan].map(([name, [dtype, shape]]) =>
    [name, dtype, shape, shape.reduce((a, b) => a * b, 1) * ELEMENT_BYTES[dtype]]);
  order.sort((x, y) => (ELEMENT_BYTES[y[1]] - ELEMENT_BYTES[x[1]]) || byCodePoints(x[0], y[0]));
  const pairs = [];
  if (metadata.size) pairs.push(["__metadata__", jsonObject([...metadata].map(([k, v]) => [k, JSON.stringify(v)]))]);
  let offset = 0;
  for (const [name, dtype, shape, nbytes] of order) {
    pairs.push([name, JSON.stringify({ dtype, shape, data_offsets: [offset, offset + nbytes] })]);
    offset += nbytes;
  }
  let raw = new TextEncoder().encode(jsonObject(pairs));
  const padded = new Uint8Array(raw.length + ((8 - (raw.length % 8)) % 8)).fill(0x20);
  padded.set(raw);
  raw = padded;
  const prefix = new Uint8Array(8 + raw.length);
  new DataView(prefix.buffer).setBigUint64(0, BigInt(raw.length), true);
  prefix.set(raw, 8);
  return [prefix, order.map(([name, , , nbytes]) => [name, nbytes])];
}

function f16ToF32(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** Float32Array of raw tensor bytes (F32, F16, BF16; exact widening). */
export function decodeFloat32(dtype, bytes) {
  if (dtype === "F32") return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  const halves = new Uint16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  const out = new Float32Array(halves.length);
  if (dtype === "BF16") {
    const bits = new Uint32Array(out.buffer);
    for (let i = 0; i < halves.length; i++) bits[i] = halves[i] << 16;
  } else if (dtype === "F16") {
    for (let i = 0; i < halves.length; i++) out[i] = f16ToF32(halves[i]);
  } else {
    throw fail(`unsupported dtype ${dtype} (supported: F32, F16, BF16)`);
  }
  return out;
}

function rintEven(x) {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** Where the first inf or NaN of a block of a tensor (values: rows begin.. of shape) lies, as
 *  convert.check_finite says it ("element 9", "row 5, column 7", "its value") and the value, or
 *  null when every value is finite. */
export function firstNonFinite(values, shape, begin) {
  const i = values.findIndex((v) => !Number.isFinite(v));
  if (i < 0) return null;
  const cols = shape.slice(1).reduce((a, b) => a * b, 1);
  const where = shape.length === 0 ? "its value" : shape.length === 1 ? `element ${begin + i}`
    : `row ${begin + Math.floor(i / cols)}` + (shape.length === 2 ? `, column ${i % cols}` : "");
  const value = Number.isNaN(values[i]) ? "nan" : values[i] > 0 ? "inf" : "-inf";
  return `${where} is ${value}`;
}

/** Per-row scales (Float32Array) of rows (Float32Array, rows x cols). */
export function rowScales(values, rows, cols) {
  const scales = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let amax = 0;
    for (let c = r * cols, e = c + cols; c < e; c++) amax = Math.max(amax, Math.abs(values[c]));
    scales[r] = Math.fround(Math.max(amax, F32_TINY) / 127);
  }
  return scales;
}

/** Int8Array of rows quantised against their scales. */
export function quantiseRows(values, rows, cols, scales) {
  const q = new Int8Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    const s = scales[r];
    for (let c = r * cols, e = c + cols; c < e; c++) q[c] = Math.min(127, Math.max(-127, rintEven(Math.fround(values[c] / s))));
  }
  return q;
}

/** The file each role's artifact is (the browser runs it): as convert.ROLES. */
export const ARTIFACT_FILES = { champion: "model.q8.safetensors", draft: WEIGHTS_FILE };

/** Stream the artifact of `role` ("champion": q8, "draft": all float32): onChunk(Uint8Array) in
 *  file order, onProgress({tensors_done, tensors, bytes_done, bytes_total, peak_block_bytes}).
 *  Returns {bytes, peak_block_bytes}. */
export async function writeRunArtifact(files, { role = "champion", q8Embedding = false, onChunk, onProgress = () => {} } = {}) {
  if (!(role in ARTIFACT_FILES)) throw codedError("E_BAD_ARGUMENT", `role must be champion or draft, got ${role}`);
  if (q8Embedding && role !== "champion") throw codedError("E_BAD_ARGUMENT", "q8Embedding applies to the champion's q8 artifact only");
  const { tensors, metadata, config } = await openFolder(files, role);
  const meta = new Map(metadata);
  meta.delete("quantization");
  if (role === "champion") meta.set("quantization", QUANTIZATION);
  const sortedMeta = new Map([...meta].sort((a, b) => byCodePoints(a[0], b[0])));
  const plan = planOutputs(tensors, config.tie_word_embeddings, q8Embedding, role === "champion");
  const [prefix, order] = layout(plan, sortedMeta);
  const total = prefix.length + order.reduce((a, [, n]) => a + n, 0);
  let done = 0;
  let peak = 0;
  const emit = (chunk) => { onChunk(chunk); done += chunk.byteLength; };
  emit(prefix);
  const scales = new Map();
  for (let i = 0; i < order.length; i++) {
    const [name] = order[i];
    const [, , source, kind] = plan.get(name);
    const t = tensors.get(source);
    const rows = t.shape.length ? t.shape[0] : 1;
    const cols = t.shape.length ? t.shape.slice(1).reduce((a, b) => a * b, 1) : 1;
    const rowBytes = cols * ELEMENT_BYTES[t.dtype];
    const per = Math.max(1, Math.floor(CHUNK_VALUES / Math.max(1, cols)));
    const parts = [];
    if (kind === "i32") {        // restricted-vocabulary ids: the bytes as they are (checked in openFolder)
      const raw = new Uint8Array(await t.file.slice(t.begin, t.end).arrayBuffer());
      if (raw.byteLength !== t.end - t.begin) throw fail(`${t.path}: ended after ${raw.byteLength} of ${t.end - t.begin} expected bytes (changed while read?)`);
      emit(raw);
      onProgress({ tensors_done: i + 1, tensors: order.length, bytes_done: done, bytes_total: total, peak_block_bytes: peak });
      continue;
    }
    for (let begin = 0; begin < rows; begin += per) {
      const end = Math.min(rows, begin + per);
      const raw = new Uint8Array(await t.file.slice(t.begin + begin * rowBytes, t.begin + end * rowBytes).arrayBuffer());
      if (raw.byteLength !== (end - begin) * rowBytes) {   // the header was checked against the size: the file changed since
        throw fail(`${t.path}: ended after ${raw.byteLength} of ${(end - begin) * rowBytes} expected bytes (changed while read?)`);
      }
      const values = decodeFloat32(t.dtype, raw);
      const bad = kind === "q8" ? null : firstNonFinite(values, t.shape, begin);   // a .q8's rows were checked with its .scale
      if (bad) throw fail(`${source}: ${bad} (convert needs finite weights)`);
      peak = Math.max(peak, raw.byteLength + values.byteLength * (kind === "f32" ? 1 : 1.25));
      if (kind === "f32") {
        emit(new Uint8Array(values.buffer));
      } else if (kind === "scale") {
        const s = rowScales(values, end - begin, cols);
        parts.push(s);
        emit(new Uint8Array(s.buffer));
      } else {
        const s = scales.get(source).subarray(begin, end);
        emit(new Uint8Array(quantiseRows(values, end - begin, cols, s).buffer));
      }
    }
    if (kind === "scale") {
      const all = new Float32Array(rows);
      let at = 0;
      for (const p of parts) { all.set(p, at); at += p.length; }
      scales.set(source, all);
    }
    onProgress({ tensors_done: i + 1, tensors: order.length, bytes_done: done, bytes_total: total, peak_block_bytes: peak });
  }
  if (done !== total) throw fail(`wrote ${done} bytes, the header declares ${total}`);
  return { bytes: done, peak_block_bytes: peak };
}

/** The champion's q8 artifact (writeRunArtifact with role "champion"). */
export const writeQ8Artifact = (files, options = {}) => writeRunArtifact(files, { ...options, role: "champion" });
