// gguf_reader.mjs — the GGUF container in JS, the twin of py/exactspec/formats/gguf.py: header, metadata and
// tensor table bounded and validated before any tensor byte is read, with gguf.py's limits, fields
// and sentences (`E_MODEL_LOAD: <file>: <field>: what is wrong`).
//
//   parseGgufHeader(bytes, fileSize, label) -> {version, metadata, valueTypes, alignment, dataOffset,
//                                               tensors: Map(name -> {name, typeName, dims, offset, nbytes})}
//   readGgufHeader(response, label) -> {header, prefix}: the header from a streamed body, read only
//                                      as far as the tensor table (the body is cancelled after)
// `bytes` may be a prefix of the file: a parse that needs more throws NeedMoreBytes (readGgufHeader
// then reads on); refusals are judged against fileSize, the whole file's.
import { modelLoadError } from "../formats/model_checks.mjs";
import { LOCAL_SCHEME } from "../fetch_progress.mjs";

export const LIMITS = {
  MAX_TENSORS: 2 ** 16, MAX_KV: 2 ** 16, MAX_KEY_BYTES: 2 ** 16, MAX_STRING_BYTES: 2 ** 24, MAX_ARRAY_LEN: 2 ** 21,
  MAX_HEADER_BYTES: 2 ** 26, MAX_NAME_BYTES: 256, MAX_DIMS: 4, MAX_ELEMENTS: 2 ** 40, MAX_ALIGNMENT: 2 ** 20,
};
const VERSIONS = [2, 3];
const DEFAULT_ALIGNMENT = 32;
// metadata value type -> [name, bytes] (0 bytes: string / array)
const VALUE_TYPES = [["UINT8", 1], ["INT8", 1], ["UINT16", 2], ["INT16", 2], ["UINT32", 4], ["INT32", 4], ["FLOAT32", 4],
  ["BOOL", 1], ["STRING", 0], ["ARRAY", 0], ["UINT64", 8], ["INT64", 8], ["FLOAT64", 8]];
const STRING = 8, ARRAY = 9, BOOL = 7;
// ggml tensor type -> [name, elements per block, bytes per block]: the types gguf_dequant.mjs reads
export const TENSOR_TYPES = new Map([[0, ["F32", 1, 4]], [1, ["F16", 1, 2]], [2, ["Q4_0", 32, 18]], [3, ["Q4_1", 32, 20]],
  [8, ["Q8_0", 32, 34]], [12, ["Q4_K", 256, 144]], [14, ["Q6_K", 256, 210]], [30, ["BF16", 1, 2]]]);
const OTHER_TENSOR_TYPES = { 6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 13: "Q5_K", 15: "Q8_K",
  16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
  24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4" };

/** Thrown when `bytes` ends before the parse does but the file holds more. */
export class NeedMoreBytes extends Error {
  constructor(upTo) { super(`need bytes up to ${upTo}`); this.upTo = upTo; }
}

export const refuse = (label, field, problem) => modelLoadError(`${label}: ${field}: ${problem}`);

/** A model given as one GGUF file (a URL, or a picked File behind a local URL, ending in .gguf). */
export const isGgufUrl = (url) => typeof url === "string" && /\.gguf$/i.test(url.split(/[?#]/)[0]);

/** What refusals name a fetched GGUF by: its path on the server, or a picked file's name (behind a
 *  local URL). */
export function ggufLabel(url) {
  const path = String(url).split(/[?#]/)[0];
  if (path.startsWith(LOCAL_SCHEME)) return decodeURIComponent(path.split("/").pop());
  return decodeURIComponent(new URL(path, globalThis.location?.href).pathname);
}

/** Python's repr() of a str, as gguf.py writes keys and names into fields. */
export function pyRepr(s) {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = "";
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (ch === "\\") out += "\\\\";
    else if (ch === quote) out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (c < 0x20 || c === 0x7f) out += "\\x" + c.toString(16).padStart(2, "0");
    else out += ch;
  }
  return quote + out + quote;
}
const keyField = (key) => `metadata[${pyRepr([...key].slice(0, 80).join(""))}]`;

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Why bytes are not UTF-8, as CPython's decoder says it: "<reason> at byte <start>". */
export function utf8Problem(b) {
  for (let i = 0; i < b.length;) {
    const c = b[i];
    if (c < 0x80) { i++; continue; }
    const n = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0;
    if (!n) return `invalid start byte at byte ${i}`;
    const lo = c === 0xe0 ? 0xa0 : c === 0xf0 ? 0x90 : 0x80, hi = c === 0xed ? 0x9f : c === 0xf4 ? 0x8f : 0xbf;
    for (let k = 1; k <= n; k++) {
      if (i + k >= b.length) return `unexpected end of data at byte ${i}`;
      const [min, max] = k === 1 ? [lo, hi] : [0x80, 0xbf];
      if (b[i + k] < min || b[i + k] > max) return `invalid continuation byte at byte ${i}`;
    }
    i += n + 1;
  }
  return "";
}

class Cursor {
  constructor(bytes, size, label) {
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.size = size;
    this.label = label;
    this.pos = 0;
  }

  remaining() { return this.size - this.pos; }

  take(n, field) {
    if (n > this.remaining()) throw refuse(this.label, field, `needs ${n} bytes at offset ${this.pos}, but the file ends at ${this.size}`);
    if (this.pos + n > LIMITS.MAX_HEADER_BYTES) throw refuse(this.label, field, `runs past ${LIMITS.MAX_HEADER_BYTES} bytes of header and metadata`);
    if (this.pos + n > this.bytes.byteLength) throw new NeedMoreBytes(this.pos + n);
    const at = this.pos;
    this.pos += n;
    return at;
  }

  u32(field) { return this.view.getUint32(this.take(4, field), true); }
  /** A u64: a Number below 2^53, else a BigInt (exact in messages; every limit it meets refuses it). */
  u64(field) {
    const v = this.view.getBigUint64(this.take(8, field), true);
    return v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
  }

  string(field, limit = LIMITS.MAX_STRING_BYTES) {
    const n = this.u64(field);
    if (n > limit) throw refuse(this.label, field, `string of ${n} bytes is over the ${limit}-byte limit`);
    const at = this.take(n, field);
    const raw = this.bytes.subarray(at, at + n);
    try {
      return utf8.decode(raw);
    } catch {
      throw refuse(this.label, field, `string is not UTF-8 (${utf8Problem(raw)})`);
    }
  }

  scalar(vtype, field) { return this.scalarAt(vtype, this.take(VALUE_TYPES[vtype][1], field)); }

  /** The value of type vtype at byte `at` (already taken). */
  scalarAt(vtype, at) {
    const v = this.view;
    switch (vtype) {
      case 0: return v.getUint8(at);
      case 1: return v.getInt8(at);
      case 2: return v.getUint16(at, true);
      case 3: return v.getInt16(at, true);
      case 4: return v.getUint32(at, true);
      case 5: return v.getInt32(at, true);
      case 6: return v.getFloat32(at, true);
      case 7: return v.getUint8(at);
      case 10: return Number(v.getBigUint64(at, true));
      case 11: return Number(v.getBigInt64(at, true));
      default: return v.getFloat64(at, true);
    }
  }
}

function readValue(cur, vtype, field) {
  if (!(vtype >= 0 && vtype < VALUE_TYPES.length)) throw refuse(cur.label, field, `value type ${vtype} is not a GGUF type (0..12)`);
  if (vtype === STRING) return [cur.string(field), "STRING"];
  if (vtype === ARRAY) {
    const etype = cur.u32(field);
    const count = cur.u64(field);
    if (etype === ARRAY) throw refuse(cur.label, field, "arrays of arrays are not supported");
    if (!(etype < VALUE_TYPES.length)) throw refuse(cur.label, field, `array element type ${etype} is not a GGUF type (0..12)`);
    if (count > LIMITS.MAX_ARRAY_LEN) throw refuse(cur.label, field, `array of ${count} elements is over the limit of ${LIMITS.MAX_ARRAY_LEN}`);
    if (etype === STRING) {
      if (count * 8 > cur.remaining()) {
        throw refuse(cur.label, field, `array of ${count} strings cannot fit in the ${cur.remaining()} bytes left in the file`);
      }
      const out = new Array(count);
      for (let i = 0; i < count; i++) out[i] = cur.string(`${field}[${i}]`);
      return [out, "ARRAY[STRING]"];
    }
    const width = VALUE_TYPES[etype][1];
    const at = cur.take(count * width, field);               // every element's bytes checked at once
    const out = new Array(count);
    for (let i = 0; i < count; i++) out[i] = cur.scalarAt(etype, at + i * width);
    if (etype === BOOL) {
      if (out.some((v) => v > 1)) throw refuse(cur.label, field, "a bool array element is neither 0 nor 1");
      for (let i = 0; i < count; i++) out[i] = out[i] === 1;
    }
    return [out, `ARRAY[${VALUE_TYPES[etype][0]}]`];
  }
  const value = cur.scalar(vtype, field);
  if (vtype === BOOL) {
    if (value > 1) throw refuse(cur.label, field, `bool byte is ${value}, neither 0 nor 1`);
    return [value === 1, "BOOL"];
  }
  return [value, VALUE_TYPES[vtype][0]];
}

function tensorRecord(cur, i) {
  const label = cur.label;
  const name = cur.string(`tensor #${i} name`, LIMITS.MAX_NAME_BYTES);
  const field = `tensor ${pyRepr(name)}`;
  if (!name) throw refuse(label, `tensor #${i} name`, "is empty");
  const nDims = cur.u32(field);
  if (!(nDims >= 1 && nDims <= LIMITS.MAX_DIMS)) throw refuse(label, field, `n_dims ${nDims} is outside [1, ${LIMITS.MAX_DIMS}]`);
  const dims = [];
  for (let d = 0; d < nDims; d++) dims.push(cur.u64(field));
  const shown = `[${dims.join(", ")}]`;
  if (dims.some((d) => d < 1)) throw refuse(label, field, `dims ${shown} has a zero dimension`);
  const count = dims.reduce((a, d) => a * BigInt(d), 1n);
  if (count > BigInt(LIMITS.MAX_ELEMENTS)) throw refuse(label, field, `dims ${shown} hold ${count} elements, over the limit of ${LIMITS.MAX_ELEMENTS}`);
  const code = cur.u32(field);
  if (!TENSOR_TYPES.has(code)) {
    const known = OTHER_TENSOR_TYPES[code];
    const names = [...TENSOR_TYPES.values()].map(([n]) => n).join(", ");
    throw refuse(label, field, `ggml type ${code}${known ? ` (${known})` : ""} is not supported (supported: ${names})`);
  }
  const [typeName, block, blockBytes] = TENSOR_TYPES.get(code);
  if (dims[0] % block) throw refuse(label, field, `${typeName} needs the first dimension to be a multiple of ${block}, got ${dims[0]}`);
  const offset = cur.u64(field);
  return { name, dims, typeName, relOffset: offset, nbytes: Number(count) / block * blockBytes };
}

/** See the header comment. */
export function parseGgufHeader(bytes, fileSize, label) {
  const cur = new Cursor(bytes, fileSize, label);
  const magicLen = Math.min(4, fileSize);
  const at = cur.take(magicLen, "magic");
  if (magicLen < 4 || String.fromCharCode(...bytes.subarray(at, at + 4)) !== "GGUF") {
    throw refuse(label, "magic", "the file does not start with 'GGUF' (not a GGUF file)");
  }
  const version = cur.u32("version");
  if (!VERSIONS.includes(version)) {
    const hint = version >= 2 ** 16 ? " (a big-endian file?)" : "";
    throw refuse(label, "version", `version ${version} is not supported (supported: 2, 3)${hint}`);
  }
  const nTensors = cur.u64("tensor_count");
  const nKv = cur.u64("kv_count");
  if (nTensors > LIMITS.MAX_TENSORS) throw refuse(label, "tensor_count", `${nTensors} tensors is over the limit of ${LIMITS.MAX_TENSORS}`);
  if (nKv > LIMITS.MAX_KV) throw refuse(label, "kv_count", `${nKv} metadata entries is over the limit of ${LIMITS.MAX_KV}`);
  const metadata = new Map(), valueTypes = new Map();
  for (let i = 0; i < nKv; i++) {
    const key = cur.string(`metadata key #${i}`, LIMITS.MAX_KEY_BYTES);
    if (!key) throw refuse(label, `metadata key #${i}`, "is empty");
    if (metadata.has(key)) throw refuse(label, keyField(key), "the key appears twice");
    const vtype = cur.u32(keyField(key));
    const [value, typeName] = readValue(cur, vtype, keyField(key));
    metadata.set(key, value);
    valueTypes.set(key, typeName);
  }
  const alignment = metadata.has("general.alignment") ? metadata.get("general.alignment") : DEFAULT_ALIGNMENT;
  const alignField = "metadata['general.alignment']";
  if (metadata.has("general.alignment") && valueTypes.get("general.alignment") !== "UINT32") {
    throw refuse(label, alignField, `must be a UINT32, not ${valueTypes.get("general.alignment")}`);
  }
  if (!(alignment >= 1 && alignment <= LIMITS.MAX_ALIGNMENT) || (alignment & (alignment - 1))) {
    throw refuse(label, alignField, `${alignment} is not a power of two in [1, ${LIMITS.MAX_ALIGNMENT}]`);
  }
  const records = [];
  for (let i = 0; i < nTensors; i++) records.push(tensorRecord(cur, i));
  const dataOffset = Math.ceil(cur.pos / alignment) * alignment;
  const tensors = new Map();
  for (const r of records) {
    if (tensors.has(r.name)) throw refuse(label, `tensor ${pyRepr(r.name)}`, "the name appears twice in the tensor table");
    tensors.set(r.name, { name: r.name, typeName: r.typeName, dims: r.dims, relOffset: r.relOffset, nbytes: r.nbytes });
  }
  checkLayout(tensors, fileSize, dataOffset, alignment, label);
  for (const t of tensors.values()) {
    t.offset = dataOffset + t.relOffset;
    delete t.relOffset;
  }
  return { version, metadata, valueTypes, alignment, dataOffset, tensors };
}

/** Offsets aligned, every tensor inside the data section, no two overlapping (BigInt arithmetic:
 *  an offset may be any u64). */
function checkLayout(tensors, fileSize, dataOffset, alignment, label) {
  const dataSize = BigInt(fileSize - dataOffset);
  for (const t of tensors.values()) {
    const rel = BigInt(t.relOffset), end = rel + BigInt(t.nbytes);
    const field = `tensor ${pyRepr(t.name)}`;
    if (rel % BigInt(alignment)) throw refuse(label, field, `offset ${rel} is not a multiple of the alignment ${alignment}`);
    if (end > dataSize) {
      throw refuse(label, field, `bytes [${rel}, ${end}) of the data section run past its end ` +
        `(${dataSize > 0n ? dataSize : 0n} bytes: the file is truncated?)`);
    }
  }
  const ordered = [...tensors.values()].sort((a, b) => a.relOffset - b.relOffset);
  for (let i = 1; i < ordered.length; i++) {
    const [a, b] = [ordered[i - 1], ordered[i]];
    if (a.relOffset + a.nbytes > b.relOffset) throw refuse(label, `tensor ${pyRepr(b.name)}`, `overlaps tensor ${pyRepr(a.name)} in the data section`);
  }
}

/** The file size a response declares (Content-Length, uncompressed), or null. */
export function declaredSize(response) {
  const declared = response.headers.get("content-length");
  return declared !== null && /^\d+$/.test(declared) && !response.headers.get("content-encoding") ? Number(declared) : null;
}

/** {header, prefix: the bytes [0, dataOffset)} of a fetched GGUF whose size is known (fileSize),
 *  reading its body only as far as the parse needs; the body is cancelled after. */
export async function readGgufHeader(response, fileSize, label) {
  if (!response.body) throw refuse(label, "file", "the response has no body");
  const reader = response.body.getReader();
  let buf = new Uint8Array(1 << 16), have = 0, want = 1 << 16;
  try {
    for (;;) {
      while (have < Math.min(want, fileSize)) {
        const { done, value } = await reader.read();
        if (done) break;
        if (have + value.byteLength > buf.byteLength) {
          const bigger = new Uint8Array(Math.max(2 * buf.byteLength, have + value.byteLength));
          bigger.set(buf.subarray(0, have));
          buf = bigger;
        }
        buf.set(value, have);
        have += value.byteLength;
      }
      try {
        const header = parseGgufHeader(buf.subarray(0, have), fileSize, label);
        return { header, prefix: buf.slice(0, Math.min(header.dataOffset, have)) };
      } catch (err) {
        if (!(err instanceof NeedMoreBytes)) throw err;
        if (have >= fileSize) throw refuse(label, "file", `ended after ${have} of ${fileSize} bytes`);
        want = Math.max(err.upTo, 2 * have);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
