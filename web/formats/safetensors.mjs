// safetensors readers for the engine's loaders: a whole file in memory (parseSafetensors, views,
// no copies) and a fetched one streamed, header first (openSafetensorsStream). The header rules are
// the CLI's, in one place: web/formats/model_checks.mjs (safetensors.header_length, parse_header_json).
import { checkSafetensorsHeader, DTYPE_BYTES, headerLength, modelLoadError } from "./model_checks.mjs";
import { declaredSize } from "../gguf/gguf_reader.mjs";
import { StreamedFile } from "./streamed_file.mjs";


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
 *  declared size) before a data byte is read: a body longer than its header says is refused at
 *  the end of what the header covers (file.finish), a shorter one when it ends. */
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
