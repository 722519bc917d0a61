// gguf_draft.mjs — a GGUF file as the WASM draft's weights: the file fetched whole and hashed (its
// sha256 is the draft's identity, as for a GGUF champion), every tensor dequantised to float32
// under its Hugging Face name with q/k rows un-permuted (gguf_tensors.mjs: the champion's code), and
// laid out as the all-F32 model.safetensors the draft runs (web/draft/draft.mjs).
//
//   const { weightsBytes, identity, artifactBytes } = await ggufDraftWeights(fetchFn, url, config);
// config: the validated config the model check derived from the file's metadata (check_gguf, then
// validate_config in Pyodide, web/formats/model_config.mjs), passed in: the draft has no Python of its own.
import { fetchGgufFile, ggufTensorMap } from "./gguf_tensors.mjs";
import { ggufLabel } from "./gguf_reader.mjs";
import { codedError } from "../protocol.mjs";
import { validatedConfig } from "../formats/model_config.mjs";

/** A safetensors file (header JSON space-padded to 8 bytes) of F32 tensors, written one at a time
 *  from `tensors` (Map name -> {dtype: "F32", shape, bytes}; a lazy map holds one float32 tensor). */
export function f32Safetensors(tensors) {
  const header = {};
  let offset = 0;
  for (const [name, t] of tensors) {
    const nbytes = 4 * t.shape.reduce((a, d) => a * d, 1);
    header[name] = { dtype: "F32", shape: t.shape, data_offsets: [offset, offset + nbytes] };
    offset += nbytes;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (json.length % 8)) % 8);           // ASCII: tensor names are HF names
  const out = new Uint8Array(8 + json.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(new TextEncoder().encode(json), 8);
  const dataStart = 8 + json.length;
  for (const [name, t] of tensors) out.set(t.bytes, dataStart + header[name].data_offsets[0]);
  return out;
}

/** See the header comment. */
export async function ggufDraftWeights(fetchFn, url, config) {
  if (!config) throw codedError("E_BAD_ARGUMENT", `${ggufLabel(url)}: config: a GGUF draft needs the config the model check derived from it`);
  const parsed = validatedConfig(typeof config === "string" ? JSON.parse(config) : config);
  const { bytes, identity } = await fetchGgufFile(fetchFn, url, ggufLabel(url));
  const tensors = ggufTensorMap(bytes, parsed, ggufLabel(url), { lazy: true });
  return { weightsBytes: f32Safetensors(tensors), identity, artifactBytes: bytes.byteLength };
}
