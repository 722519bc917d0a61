// The q8 run artifact (model.q8.safetensors, scheme q8-sym-row-v1) of a Hugging Face folder,
// streamed tensor by tensor and row block by row block from File/Blob objects (Blob.slice), the
// same bytes `exactspec convert` writes (py/exactspec/convert.py): the same plan (every 2-D
// tensor but the embedding as <name>.q8 int8 + <name>.scale float32 per row, the rest float32,
// tied lm_head and rotary inv_freq dropped), the same layout (descending element size, then
// name; header JSON compact, space-padded to 8 bytes; metadata merged over shards, sorted, with
// `quantization`), the same quantiser in float32 (amax = max|row| clamped to f32(1e-12),
// scale = f32(amax / 127), q = clip(rint(f32(w / scale)), -127, 127), ties to even).
// Peak working memory: one block of rows (CHUNK_VALUES values as float32 plus their source bytes
// and int8 copy) and the per-row scales of one tensor; never a tensor, never the model.

export const CHUNK_VALUES = 1 << 20;
export const EMBEDDING = "model.embed_tokens.weight";
export const QUANTIZATION = "int8 symmetric per output row; w = q8 * scale[:,None]";
const IGNORED_SUFFIXES = [".rotary_emb.inv_freq"];
const ELEMENT_BYTES = { F32: 4, F16: 2, BF16: 2, I8: 1 };
const F32_TINY = Math.fround(1e-12);

function fail(message) {
  return new Error(`E_MODEL_LOAD: ${message}`);
}

/** {tensors: name -> {dtype, shape, begin, end, file}, metadata} of one safetensors File. */
export async function readSafetensorsHeader(file) {
  const head = new DataView(await file.slice(0, 8).arrayBuffer());
  if (head.byteLength < 8) throw fail(`${file.name}: shorter than a safetensors header`);
  const n = Number(head.getBigUint64(0, true));
  if (n > 100 * 1024 * 1024 || 8 + n > file.size) throw fail(`${file.name}: header length ${n} does not fit the file`);
  const header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(await file.slice(8, 8 + n).arrayBuffer()));
  const tensors = {};
  let metadata = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === "__metadata__") { metadata = info ?? {}; continue; }
    const [b, e] = info.data_offsets;
    tensors[name] = { dtype: info.dtype, shape: info.shape, begin: 8 + n + b, end: 8 + n + e, file };
  }
  return { tensors, metadata };
}

/** The checkpoint of a folder given as {name -> File}: model.safetensors or the shards of
 *  model.safetensors.index.json. -> {tensors, metadata (merged; a key differing between shards
 *  dropped), config} */
export async function openFolder(files) {
  const config = JSON.parse(await files["config.json"].text());
  let names = ["model.safetensors"];
  if (files["model.safetensors.index.json"]) {
    const index = JSON.parse(await files["model.safetensors.index.json"].text());
    names = [...new Set(Object.values(index.weight_map))].sort();
  }
  const tensors = {};
  const merged = {};
  const conflicting = new Set();
  for (const name of names) {
    if (!files[name]) throw fail(`${name}: missing from the folder`);
    const h = await readSafetensorsHeader(files[name]);
    Object.assign(tensors, h.tensors);
    for (const [k, v] of Object.entries(h.metadata)) {
      if (k in merged && merged[k] !== v) conflicting.add(k);
      if (!(k in merged)) merged[k] = v;
    }
  }
  const metadata = {};
  for (const [k, v] of Object.entries(merged)) if (!conflicting.has(k)) metadata[k] = v;
  return { tensors, metadata, config };
}

/** Output name -> [dtype, shape, source, kind ("f32" | "q8" | "scale")], as convert.plan_outputs. */
export function planOutputs(tensors, tied, q8Embedding = false) {
  const plan = {};
  for (const [name, t] of Object.entries(tensors)) {
    if (IGNORED_SUFFIXES.some((s) => name.endsWith(s)) || (tied && name === "lm_head.weight")) continue;
    if (t.shape.length === 2 && (name !== EMBEDDING || q8Embedding)) {
      plan[`${name}.q8`] = ["I8", t.shape, name, "q8"];
      plan[`${name}.scale`] = ["F32", t.shape.slice(0, 1), name, "scale"];
    } else {
      plan[name] = ["F32", t.shape, name, "f32"];
    }
  }
  return plan;
}

const byCodePoints = (a, b) => (a < b ? -1 : a > b ? 1 : 0);   // ASCII names: code point order

/** [prefix bytes, [[name, nbytes], ...] in data order], as safetensors.safetensors_layout. */
export function layout(plan, metadata) {
  const order = Object.entries(plan).map(([name, [dtype, shape]]) =>
    [name, dtype, shape, shape.reduce((a, b) => a * b, 1) * ELEMENT_BYTES[dtype]]);
  order.sort((x, y) => (ELEMENT_BYTES[y[1]] - ELEMENT_BYTES[x[1]]) || byCodePoints(x[0], y[0]));
  const header = {};
  if (Object.keys(metadata).length) header.__metadata__ = metadata;
  let offset = 0;
  for (const [name, dtype, shape, nbytes] of order) {
    header[name] = { dtype, shape, data_offsets: [offset, offset + nbytes] };
    offset += nbytes;
  }
  let raw = new TextEncoder().encode(JSON.stringify(header));
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

/** Stream the artifact: onChunk(Uint8Array) in file order, onProgress({tensors_done, tensors,
 *  bytes_done, bytes_total, peak_block_bytes}). Returns {bytes, peak_block_bytes}. */
export async function writeQ8Artifact(files, { q8Embedding = false, onChunk, onProgress = () => {} } = {}) {
  const { tensors, metadata, config } = await openFolder(files);
  const meta = { ...metadata };
  delete meta.quantization;
  meta.quantization = QUANTIZATION;
  const sortedMeta = Object.fromEntries(Object.keys(meta).sort(byCodePoints).map((k) => [k, meta[k]]));
  const plan = planOutputs(tensors, config.tie_word_embeddings === true, q8Embedding);
  const [prefix, order] = layout(plan, sortedMeta);
  const total = prefix.length + order.reduce((a, [, n]) => a + n, 0);
  let done = 0;
  let peak = 0;
  const emit = (chunk) => { onChunk(chunk); done += chunk.byteLength; };
  emit(prefix);
  const scales = {};
  for (let i = 0; i < order.length; i++) {
    const [name] = order[i];
    const [, , source, kind] = plan[name];
    const t = tensors[source];
    const rows = t.shape.length ? t.shape[0] : 1;
    const cols = t.shape.length ? t.shape.slice(1).reduce((a, b) => a * b, 1) : 1;
    const rowBytes = cols * ELEMENT_BYTES[t.dtype];
    const per = Math.max(1, Math.floor(CHUNK_VALUES / Math.max(1, cols)));
    const parts = [];
    for (let begin = 0; begin < rows; begin += per) {
      const end = Math.min(rows, begin + per);
      const raw = new Uint8Array(await t.file.slice(t.begin + begin * rowBytes, t.begin + end * rowBytes).arrayBuffer());
      const values = decodeFloat32(t.dtype, raw);
      peak = Math.max(peak, raw.byteLength + values.byteLength * (kind === "f32" ? 1 : 1.25));
      if (kind === "f32") {
        emit(new Uint8Array(values.buffer));
      } else if (kind === "scale") {
        const s = rowScales(values, end - begin, cols);
        parts.push(s);
        emit(new Uint8Array(s.buffer));
      } else {
        const s = scales[source].subarray(begin, end);
        emit(new Uint8Array(quantiseRows(values, end - begin, cols, s).buffer));
      }
    }
    if (kind === "scale") {
      const all = new Float32Array(rows);
      let at = 0;
      for (const p of parts) { all.set(p, at); at += p.length; }
      scales[source] = all;
    }
    onProgress({ tensors_done: i + 1, tensors: order.length, bytes_done: done, bytes_total: total, peak_block_bytes: peak });
  }
  if (done !== total) throw fail(`wrote ${done} bytes, the header declares ${total}`);
  return { bytes: done, peak_block_bytes: peak };
}
