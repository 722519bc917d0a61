// safetensors reader for the browser: validates the header and every tensor's bounds, no copies.

const MAX_HEADER_BYTES = 100_000_000;
const DTYPE_BYTES = {
  BOOL: 1, U8: 1, I8: 1, F8_E4M3: 1, F8_E5M2: 1, I16: 2, U16: 2, F16: 2, BF16: 2,
  I32: 4, U32: 4, F32: 4, I64: 8, U64: 8, F64: 8,
};

function fail(label, problem) {
  throw new Error(`E_MODEL_LOAD: safetensors ${label}: ${problem}`);
}

/** Parse a whole safetensors file.
 *  Returns {tensors: Map(name -> {dtype, shape, bytes: Uint8Array view}), metadata}.
 *  Refuses a short file, an absurd or non-JSON header, unknown dtypes, bad shapes, offsets out of
 *  bounds or reversed, byte lengths that disagree with the shape, and overlaps/gaps/trailing bytes. */
export function parseSafetensors(arrayBuffer, label = "<buffer>") {
  const total = arrayBuffer.byteLength;
  if (total < 8) fail(label, `file is ${total} bytes, shorter than the 8-byte header length`);
  const view = new DataView(arrayBuffer);
  const lo = view.getUint32(0, true), hi = view.getUint32(4, true);
  const headerLen = hi * 2 ** 32 + lo;
  if (headerLen > MAX_HEADER_BYTES) fail(label, `header length ${headerLen} exceeds ${MAX_HEADER_BYTES}`);
  if (8 + headerLen > total) fail(label, `header length ${headerLen} runs past the end of the file (${total} bytes)`);
  let header;
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array(arrayBuffer, 8, headerLen)));
  } catch (e) {
    fail(label, `header is not UTF-8 JSON (${e.message})`);
  }
  if (header === null || typeof header !== "object" || Array.isArray(header)) fail(label, "header is not a JSON object");
  const bodyStart = 8 + headerLen, bodyLen = total - bodyStart;
  const tensors = new Map();
  const spans = [];
  let metadata = {};
  for (const [name, e] of Object.entries(header)) {
    if (name === "__metadata__") { metadata = e; continue; }
    if (e === null || typeof e !== "object") fail(label, `entry ${name} is not an object`);
    const size = DTYPE_BYTES[e.dtype];
    if (!size) fail(label, `tensor ${name}: unknown dtype ${e.dtype}`);
    if (!Array.isArray(e.shape) || !e.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      fail(label, `tensor ${name}: malformed shape ${JSON.stringify(e.shape)}`);
    }
    const off = e.data_offsets;
    if (!Array.isArray(off) || off.length !== 2 || !off.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      fail(label, `tensor ${name}: malformed data_offsets ${JSON.stringify(off)}`);
    }
    const [begin, end] = off;
    if (begin > end) fail(label, `tensor ${name}: data_offsets reversed [${begin}, ${end}]`);
    if (end > bodyLen) fail(label, `tensor ${name}: data_offsets [${begin}, ${end}] past the data buffer (${bodyLen} bytes)`);
    const want = e.shape.reduce((a, d) => a * d, 1) * size;
    if (end - begin !== want) fail(label, `tensor ${name}: ${end - begin} bytes, shape ${JSON.stringify(e.shape)} ${e.dtype} needs ${want}`);
    spans.push([begin, end, name]);
    tensors.set(name, { dtype: e.dtype, shape: e.shape.slice(), bytes: new Uint8Array(arrayBuffer, bodyStart + begin, end - begin) });
  }
  spans.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let cursor = 0;
  for (const [begin, end, name] of spans) {
    if (begin !== cursor) fail(label, `tensor ${name}: ${begin < cursor ? "overlaps the previous tensor" : "leaves a gap"} at byte ${begin}`);
    cursor = end;
  }
  if (cursor !== bodyLen) fail(label, `${bodyLen - cursor} trailing bytes after the last tensor`);
  return { tensors, metadata };
}

/** One tensor, checked for dtype and shape; throws E_MODEL_LOAD naming what differs. */
export function expectTensor(tensors, name, dtype, shape, label = "") {
  const t = tensors.get(name);
  if (!t) fail(label, `missing tensor ${name}`);
  if (t.dtype !== dtype) fail(label, `tensor ${name} is ${t.dtype}, expected ${dtype}`);
  if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    fail(label, `tensor ${name} has shape ${JSON.stringify(t.shape)}, expected ${JSON.stringify(shape)}`);
  }
  return t;
}
