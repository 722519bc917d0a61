// gguf_tensors.mjs — a GGUF file as a champion tensor map, under Hugging Face names, q/k rows put back
// from llama.cpp's RoPE order (gguf_model.py). Two ways to read a tensor:
// - float32 (every loader can take it): dequantised exactly as gguf_dequant.py computes it. The map is
//   what parseSafetensors gives for a safetensors file: Map(name -> {dtype: "F32", shape, bytes:
//   Uint8Array}); both champion loaders take it as is (F32 linears with no scale). A row holding inf
//   or NaN is refused naming the tensor and row.
// - in its blocks ({blocks: true}: the WASM champion's q8act matmul, docs/quant_kernels.md): a tensor
//   of a block type (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) comes as {dtype: its type name, ggmlType: the
//   GGUF type id, shape, rowBytes, bytes: the raw block bytes read straight from the file (rows of
//   q/k re-ordered as whole rows of blocks), float32(): the float32 entry above}; a block whose f16
//   scale (or min) is inf or NaN is refused naming the tensor and row. F32/F16/BF16 tensors stay
//   float32 entries (F16/BF16 widened exactly).
//
//   const { bytes, identity } = await fetchGgufFile(fetchFn, url);     // the whole file, and its sha256
//   const tensors = ggufTensorMap(bytes, config, label);               // config: gguf_model's, validated
//   const blocks = ggufTensorMap(bytes, config, label, { lazy: true, blocks: true });
//   const { file, header } = await openGgufStream(fetchFn, url, label, transient);   // streamed (the WASM champion):
//   const map = ggufHeaderTensorMap(header, (t) => file.current(t), config, label, { lazy: true, blocks: true });
import { dequantize } from "./gguf_dequant.mjs";
import { declaredSize, NeedMoreBytes, parseGgufHeader, refuse, pyRepr, TENSOR_TYPES } from "./gguf_reader.mjs";
import { StreamedFile } from "../formats/streamed_file.mjs";
import { fetchModelFile } from "../formats/safetensors.mjs";
import { artifactIdentity, noteArtifact } from "../weight_cache.mjs";

const GLOBAL_NAMES = { "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight" };
const LAYER_NAMES = { attn_norm: "input_layernorm", ffn_norm: "post_attention_layernorm", attn_q: "self_attn.q_proj",
  attn_k: "self_attn.k_proj", attn_v: "self_attn.v_proj", attn_output: "self_attn.o_proj", ffn_gate: "mlp.gate_proj",
  ffn_up: "mlp.up_proj", ffn_down: "mlp.down_proj" };
const LAYER_TENSOR = /^blk\.(0|[1-9][0-9]{0,5})\.([a-z_]+)\.(weight|bias)$/;

/** The Hugging Face name of a llama.cpp tensor name, or null (gguf_model.hf_name). */
export function hfName(ggufName) {
  if (Object.hasOwn(GLOBAL_NAMES, ggufName)) return GLOBAL_NAMES[ggufName];
  const m = LAYER_TENSOR.exec(ggufName);
  if (!m || !Object.hasOwn(LAYER_NAMES, m[2])) return null;
  return `model.layers.${m[1]}.${LAYER_NAMES[m[2]]}.${m[3]}`;
}

/** GGUF type name -> type id, for the block types the WASM champion multiplies in their blocks. */
export const BLOCK_TYPE_IDS = Object.fromEntries([...TENSOR_TYPES].filter(([, [, per]]) => per > 1).map(([id, [name]]) => [name, id]));

/** llama.cpp's q/k row order (per head: adjacent pairs) back to HF's (per head: halves), as a new
 *  array of w's type: w is rows (nHeads * headDim) x cols elements (or, for raw blocks, bytes). */
export function unpermuteRopeRows(w, nHeads, cols) {
  const headDim = w.length / cols / nHeads, half = headDim / 2;
  const out = new w.constructor(w.length);
  for (let h = 0; h < nHeads; h++) {
    for (let j = 0; j < half; j++) {
      for (let s = 0; s < 2; s++) {        // llama.cpp row 2j + s holds HF row j + s * half
        const src = (h * headDim + 2 * j + s) * cols, dst = (h * headDim + s * half + j) * cols;
        out.set(w.subarray(src, src + cols), dst);
      }
    }
  }
  return out;
}

/** The whole file from fetchFn(url) (one buffer, sized from Content-Length when declared) and its
 *  sha256: the champion's identity. */
export async function fetchGgufFile(fetchFn, url, label = String(url)) {
  const response = await fetchModelFile(fetchFn, url);
  const bytes = new Uint8Array(noteArtifact(response, await response.arrayBuffer()));
  if (bytes.byteLength === 0) throw refuse(label, "magic", "the file does not start with 'GGUF' (not a GGUF file)");
  return { bytes, identity: await artifactIdentity(bytes) };   // checked against the weight cache's key when it came from there
}

/** A fetched GGUF opened for streaming: {file: a StreamedFile past its header, header, end (where
 *  its last tensor ends), size (the
 *  declared Content-Length, or null), response}. The header is parsed from the body's first bytes
 *  (read in doubling steps, at most LIMITS.MAX_HEADER_BYTES past what it needs); the bytes read
 *  past it are given back to the file. Nothing of the data section is held. */
export async function openGgufStream(fetchFn, url, label = String(url), transient = undefined) {
  const response = await fetchModelFile(fetchFn, url);
  const size = declaredSize(response);
  const file = new StreamedFile(response, label, transient);
  let buf = new Uint8Array(0), want = 1 << 16;
  try {
    for (;;) {
      const more = (size === null ? want : Math.min(want, size)) - buf.byteLength;
      if (more > 0) {
        const got = await file.readUpTo(more);
        const grown = new Uint8Array(buf.byteLength + got.byteLength);
        grown.set(buf);
        grown.set(got, buf.byteLength);
        file.forget(more + buf.byteLength);
        file.transient.hold(grown.byteLength);
        buf = grown;
      }
      if (buf.byteLength === 0) throw refuse(label, "magic", "the file does not start with 'GGUF' (not a GGUF file)");
      try {
        const header = parseGgufHeader(buf, size ?? Number.MAX_SAFE_INTEGER, label);
        file.unread(buf.slice(Math.min(header.dataOffset, buf.byteLength)));   // a copy: the header's buffer goes
        file.forget(buf.byteLength);
        const end = Math.max(header.dataOffset, ...[...header.tensors.values()].map((t) => t.offset + t.nbytes));
        return { file, header, end, size, response };
      } catch (err) {
        if (!(err instanceof NeedMoreBytes)) throw err;
        if (buf.byteLength < want) throw refuse(label, "file", `ended after ${buf.byteLength} bytes, inside its header`);
        want = Math.max(err.upTo, 2 * buf.byteLength);
      }
    }
  } catch (err) {
    file.cancel();
    throw err;
  }
}

/** See the header comment. config: the validated HF config dict (num_attention_heads, num_key_value_heads,
 *  model_type) from the model check. lazy: each tensor's bytes are dequantised when read, and only
 *  the last one read is kept (a loader that copies tensors one by one then holds the file and one
 *  float32 tensor, not the whole float32 model twice); refusals of a weight then come at that read.
 *  blocks: block-typed tensors come in their blocks (the header comment), checked when read. */
export function ggufTensorMap(bytes, config, label, { lazy = false, blocks = false } = {}) {
  const header = parseGgufHeader(bytes, bytes.byteLength, label);
  return ggufHeaderTensorMap(header, (t) => bytes.subarray(t.offset, t.offset + t.nbytes), config, label, { lazy, blocks });
}

/** ggufTensorMap over a parsed header, each tensor's raw bytes from rawOf(t) (t: the header's
 *  tensor entry): a streamed file's staging buffer (openGgufStream) as well as a whole file. */
export function ggufHeaderTensorMap(header, rawOf, config, label, { lazy = false, blocks = false } = {}) {
  const permuted = config.model_type === "llama";          // qwen2 files are stored unpermuted
  const tensors = new Map();
  let last = { name: null, bytes: null };
  for (const t of header.tensors.values()) {
    const name = hfName(t.name);
    if (name === null) throw refuse(label, `tensor ${pyRepr(t.name)}`, "is not a tensor of this model");
    const heads = !permuted ? 0 : name.endsWith(".q_proj.weight") ? config.num_attention_heads
      : name.endsWith(".k_proj.weight") ? config.num_key_value_heads : 0;
    const materialise = () => float32Tensor(rawOf(t), t, heads, label);
    const shape = [...t.dims].reverse();
    // rows(r0, r1): the float32 bytes of rows [r0, r1) alone (a loader that writes a big tensor a
    // slice at a time never holds all of it as float32); absent for rows re-ordered (llama q/k).
    // Not enumerable: a copy of the entry with other bytes ({...entry, bytes}) does not keep it.
    const withRows = (entry) => (heads ? entry : Object.defineProperty(entry, "rows",
      { value: (r0, r1) => float32Rows(rawOf(t), t, r0, r1, label), enumerable: false }));
    const floatEntry = () => withRows(lazy ? { dtype: "F32", shape, source: t, get bytes() {
      if (last.name !== name) {
        last = { name: null, bytes: null };   // the previous tensor's float32 goes before this one is made
        last = { name, bytes: materialise() };
      }
      return last.bytes;
    } } : { dtype: "F32", shape, bytes: materialise() });
    if (blocks && Object.hasOwn(BLOCK_TYPE_IDS, t.typeName)) {
      const raw = () => blockTensor(rawOf(t), t, heads, label);
      const rowBytes = t.nbytes / (t.dims.slice(1).reduce((a, d) => a * d, 1) || 1);
      let held = lazy ? null : raw();
      tensors.set(name, { dtype: t.typeName, ggmlType: BLOCK_TYPE_IDS[t.typeName], shape, rowBytes, source: t,
        get bytes() { return held ?? raw(); }, float32: floatEntry });
      continue;
    }
    tensors.set(name, floatEntry());
  }
  return tensors;
}

/** One block-typed tensor's raw bytes, straight from the file (a view) or, for q/k rows of a llama
 *  file, re-ordered as whole rows (a copy); every f16 scale / min finite. */
function blockTensor(raw, t, heads, label) {
  const cols = t.dims[0], rows = t.dims.slice(1).reduce((a, d) => a * d, 1);
  const rowBytes = t.nbytes / rows;
  const [, perBlock, blockBytes] = TENSOR_TYPES.get(BLOCK_TYPE_IDS[t.typeName]);
  const halves = SCALE_HALVES[t.typeName];
  for (let b = 0, nBlocks = t.nbytes / blockBytes; b < nBlocks; b++) {
    for (const at of halves) {
      const h = raw[b * blockBytes + at] | (raw[b * blockBytes + at + 1] << 8);
      if ((h & 0x7c00) === 0x7c00) {
        throw refuse(label, `tensor ${pyRepr(t.name)}`, `row ${Math.floor(b / (cols / perBlock))} holds a block whose f16 scale is inf or NaN`);
      }
    }
  }
  return heads ? unpermuteRopeRows(raw, heads, rowBytes) : raw;
}

// byte offsets of the f16 scales (and mins) inside one block of each block type (gguf_dequant.mjs)
const SCALE_HALVES = { Q8_0: [0], Q4_0: [0], Q4_1: [0, 2], Q4_K: [0, 2], Q6_K: [208] };

/** One tensor's float32 bytes: dequantised, every row finite, q/k rows un-permuted over `heads` (0: none). */
/** Rows [r0, r1) of a tensor as float32 bytes (dequantised or widened, every value finite): the
 *  same values as float32Tensor's rows, for a tensor whose rows keep their order. */
function float32Rows(raw, t, r0, r1, label) {
  const cols = t.dims[0], rowBytes = t.nbytes / (t.dims.slice(1).reduce((a, d) => a * d, 1) || 1);
  const values = new Float32Array((r1 - r0) * cols);
  dequantize(raw.subarray(r0 * rowBytes, r1 * rowBytes), t.typeName, values);
  for (let i = 0; i < values.length; i++) {
    if (!Number.isFinite(values[i])) throw refuse(label, `tensor ${pyRepr(t.name)}`, `row ${r0 + Math.floor(i / cols)} holds a value that is inf or NaN`);
  }
  return new Uint8Array(values.buffer);
}

function float32Tensor(raw, t, heads, label) {
  const cols = t.dims[0], rows = t.dims.slice(1).reduce((a, d) => a * d, 1);
  let values = new Float32Array(cols * rows);
  dequantize(raw, t.typeName, values);
  for (let r = 0; r < rows; r++) {
    for (let i = r * cols, end = i + cols; i < end; i++) {
      if (!Number.isFinite(values[i])) throw refuse(label, `tensor ${pyRepr(t.name)}`, `row ${r} holds a value that is inf or NaN`);
    }
  }
  if (heads) values = unpermuteRopeRows(values, heads, cols);
  return new Uint8Array(values.buffer);
}
