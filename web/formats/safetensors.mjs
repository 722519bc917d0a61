// safetensors readers for the engine's loaders: a whole file in memory (parseSafetensors, views,
// no copies) and a fetched one read header first (readSafetensorsResponse). The header rules are
// the CLI's, in one place: web/formats/model_checks.mjs (safetensors.header_length, parse_header_json).
import { checkSafetensorsHeader, DTYPE_BYTES, headerLength, modelLoadError } from "./model_checks.mjs";
import { noteArtifact } from "../weight_cache.mjs";
import { declaredSize } from "../gguf/gguf_reader.mjs";
import { StreamedFile } from "./streamed_file.mjs";

const fail = (label, problem) => { throw modelLoadError(`safetensors file ${label}: ${problem}`); };

/** Parse a whole safetensors file (an ArrayBuffer).
 *  Returns {tensors: Map(name -> {dtype, shape, bytes: Uint8Array view}), metadata}.
 *  Refuses a short file, an absurd or non-JSON header, unknown dtypes, bad shapes, offsets out of
 *  bounds or reversed, byte lengths that disagree with the shape, and overlaps/gaps/trailing bytes. */
export function parseSafetensors(arrayBuffer, label = "<buffer>") {
  const total = arrayBuffer.byteLength;
  const n = headerLength(new Uint8Array(arrayBuffer, 0, Math.min(8, total)), total, label);
  const { entries, metadata } = checkSafetensorsHeader(new Uint8Array(arrayBuffer, 8, n), total - 8 - n, label);
  const tensors = new Map();
  for (const [name, { dtype, shape, begin, end }] of entries) {
    tensors.set(name, { dtype, shape, bytes: new Uint8Array(arrayBuffer, 8 + n + begin, end - begin) });
  }
  return { tensors, metadata };
}

/** The body of a fetched safetensors file as one ArrayBuffer, read in this order: the 8-byte
 *  header length and the header, checked against Content-Length (when the response declares it,
 *  uncompressed) before a data byte is read; then exactly the bytes the header covers into one
 *  buffer of that size. A body longer than its header says (trailing bytes) is refused without
 *  reading past one more chunk; a shorter one is refused when it ends. */
export async function readSafetensorsResponse(response, label) {
  const declared = response.headers.get("content-length");
  const size = declared !== null && /^\d+$/.test(declared) && !response.headers.get("content-encoding") ? Number(declared) : null;
  if (!response.body) fail(label, "the response has no body");
  const reader = response.body.getReader();
  let chunk = new Uint8Array(0), at = 0;                    // the unread part of the last chunk: chunk[at..]
  const fill = async (target, offset, n) => {              // exactly n bytes into target[offset..]
    while (n > 0) {
      if (at === chunk.byteLength) {
        const { done, value } = await reader.read();
        if (done) fail(label, `the file ended early (${offset} bytes read, ${offset + n} expected at least)`);
        chunk = value instanceof Uint8Array ? value : new Uint8Array(value);
        at = 0;
      }
      const take = Math.min(n, chunk.byteLength - at);
      target.set(chunk.subarray(at, at + take), offset);
      at += take; offset += take; n -= take;
    }
  };
  try {
    const prefix = new Uint8Array(8);
    await fill(prefix, 0, 8);
    const n = headerLength(prefix, size, label);
    const raw = new Uint8Array(n);
    await fill(raw, 0, n);
    const { dataLen } = checkSafetensorsHeader(raw, size === null ? null : size - 8 - n, label);
    const whole = new Uint8Array(8 + n + dataLen);
    whole.set(prefix, 0);
    whole.set(raw, 8);
    await fill(whole, 8 + n, dataLen);
    while (at === chunk.byteLength) {                       // the end must come now: no trailing bytes
      const { done, value } = await reader.read();
      if (done) return noteArtifact(response, whole.buffer);   // the weight cache's ticket, settled by its hash
      chunk = value; at = 0;
    }
    fail(label, `trailing bytes after the ${8 + n + dataLen} bytes its header covers`);
  } finally {
    reader.cancel().catch(() => {});                        // stop the download: nothing more is read
  }
}

/** The ok response of fetchFn(url); a failed fetch or an HTTP error is E_MODEL_LOAD naming the URL. */
export async function fetchModelFile(fetchFn, url) {
  let response;
  try {
    response = await fetchFn(url);
  } catch (err) {
    throw modelLoadError(`cannot fetch ${url}: ${err.message}`);
  }
  if (!response.ok) throw modelLoadError(`cannot fetch ${url}: HTTP ${response.status}`);
  return response;
}

/** A fetched safetensors file opened for streaming (streamed_file.mjs): {file: a StreamedFile past
 *  its header, tensors: Map(name -> {dtype, shape, source: {offset, nbytes}, bytes: the staged
 *  view, readable only while file.stage has that tensor's range}), end: the bytes the header
 *  covers, headerBytes: 8 + the header's length, size: the declared Content-Length or null, response}. The header is checked (against
 *  the declared size) before a data byte is read, as readSafetensorsResponse does. */
export async function openSafetensorsStream(fetchFn, url, label = String(url), transient = undefined) {
  const response = await fetchModelFile(fetchFn, url);
  const size = declaredSize(response);
  const file = new StreamedFile(response, `safetensors file ${label}`, transient);
  try {
    const prefix = await file.read(8);
    const n = headerLength(prefix, size, label);
    const raw = await file.read(n);
    const { entries, dataLen } = checkSafetensorsHeader(raw, size === null ? null : size - 8 - n, label);
    file.forget(8 + n);
    const tensors = new Map();
    for (const [name, { dtype, shape, begin, end }] of entries) {
      const source = { offset: 8 + n + begin, nbytes: end - begin };
      tensors.set(name, { dtype, shape, source, get bytes() { return file.current(source); } });
    }
    return { file, tensors, headerBytes: 8 + n, end: 8 + n + dataLen, size, response };
  } catch (err) {
    file.cancel();
    throw err;
  }
}

/** fetchModelFile, then readSafetensorsResponse. */
export async function fetchSafetensors(fetchFn, url, label = String(url)) {
  return readSafetensorsResponse(await fetchModelFile(fetchFn, url), label);
}

/** One tensor of a map, checked for dtype and shape; throws E_MODEL_LOAD naming `where` (what the
 *  map came from, e.g. "safetensors file /m/model.q8.safetensors") and what differs. */
export function expectTensor(tensors, name, dtype, shape, where = "tensor map") {
  const refuse = (problem) => { throw modelLoadError(`${where}: ${problem}`); };
  const t = tensors.get(name);
  if (!t) refuse(`missing tensor ${name}`);
  if (t.dtype !== dtype) refuse(`tensor ${name} is ${t.dtype}, expected ${dtype}`);
  if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    refuse(`tensor ${name} has shape ${JSON.stringify(t.shape)}, expected ${JSON.stringify(shape)}`);
  }
  const size = shape.reduce((a, d) => a * d, DTYPE_BYTES.get(dtype));   // a hand-made map is not checked by a parser
  if (!(t.bytes instanceof Uint8Array)) refuse(`tensor ${name}: its bytes are not a Uint8Array`);
  if (t.bytes.byteLength !== size) refuse(`tensor ${name} holds ${t.bytes.byteLength} bytes, its shape needs ${size}`);
  return t;
}
