// The checks `exactspec convert` makes on a Hugging Face folder before a weight byte is read, in
// JS for the page: bounded strict JSON (py/exactspec/formats/config.py load_json_bounded), config.json
// (validate_config), the shard index (hf.shard_files), a safetensors header against the size of
// its file (safetensors.header_length, parse_header_json) and the tensors against the config
// (reference_llama._check_header). Each function is a port of the named Python one, refusing the
// same inputs with the same code (E_MODEL_LOAD) and a message of the same shape;
// tests/test_page_convert_hostile.py runs the same hostile folders and configs through both.
// Names from a file are data: every lookup is a Map or an own-property check, never obj[name].

export const MAX_CONFIG_BYTES = 1 << 20;
export const MAX_INDEX_BYTES = 16 << 20;
export const MAX_JSON_DEPTH = 64;
export const MAX_HEADER_BYTES = 100_000_000;
export const MAX_SHARDS = 1000;
export const WEIGHTS_FILE = "model.safetensors";
export const INDEX_FILE = "model.safetensors.index.json";
export const IGNORED_SUFFIXES = [".rotary_emb.inv_freq"];
export const FLOAT_DTYPES = ["F32", "F16", "BF16"];
export const DTYPE_BYTES = new Map([
  ["BOOL", 1], ["U8", 1], ["I8", 1], ["F8_E4M3", 1], ["F8_E5M2", 1], ["F8_E8M0", 1],
  ["I16", 2], ["U16", 2], ["F16", 2], ["BF16", 2], ["I32", 4], ["U32", 4], ["F32", 4],
  ["I64", 8], ["U64", 8], ["F64", 8], ["C64", 8],
]);
const INT_BOUNDS = new Map([
  ["vocab_size", [1, 1 << 20]], ["hidden_size", [1, 1 << 16]], ["intermediate_size", [1, 1 << 18]],
  ["num_hidden_layers", [1, 1024]], ["num_attention_heads", [1, 1024]], ["num_key_value_heads", [1, 1024]],
  ["head_dim", [2, 1024]], ["max_position_embeddings", [1, 1 << 20]],
]);
const ARCHITECTURES = new Map([["llama", "LlamaForCausalLM"], ["qwen2", "Qwen2ForCausalLM"]]);
const ROPE_KEYS = new Map([
  ["default", ["rope_type", "type", "rope_theta"]],
  ["linear", ["rope_type", "type", "rope_theta", "factor"]],
  ["llama3", ["rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"]],
]);
const SHARD_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.safetensors$/;

export function modelLoadError(message) {
  return Object.assign(new Error(`E_MODEL_LOAD: ${message}`), { code: "E_MODEL_LOAD", detail: message });
}
const refuse = (where, problem) => { throw modelLoadError(`${where}: ${problem}`); };
const own = (obj, key) => Object.prototype.hasOwnProperty.call(obj, key);
const get = (obj, key) => (own(obj, key) && obj[key] !== null ? obj[key] : undefined);   // Python's dict.get: null is None
const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Number);
const cut = (s, n) => String(s).slice(0, n);

/** Python's repr of a value (for messages), cut to 60 characters as config._describe does. */
function describe(v) {
  const text = v === undefined || v === null ? "None" : v === true ? "True" : v === false ? "False"
    : v instanceof Number ? (Number.isInteger(+v) ? `${+v}.0` : String(+v)) : typeof v === "string" ? `'${v}'` : JSON.stringify(v);
  return text.length <= 60 ? text : text.slice(0, 57) + "...";
}
const pyTuple = (shape) => `(${shape.join(", ")}${shape.length === 1 ? "," : ""})`;

// ---------------------------------------------------------------------------------------------
// Bounded strict JSON: objects without a prototype, floats (a '.' or an exponent) boxed as Number
// objects so that 256.0 is not the integer 256 (JSON.parse cannot tell them apart), duplicate
// keys, NaN/Infinity literals and overflowing numbers refused, nesting bounded without recursion
// past maxDepth.
// ---------------------------------------------------------------------------------------------

const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;

function parseStrict(text, maxDepth, fail) {
  let i = 0;
  const bad = (why) => fail(`is not valid JSON (${why} at char ${i})`);
  const space = () => { while (i < text.length && " \t\n\r".includes(text[i])) i++; };
  const string = () => {
    const start = i++;
    for (;;) {
      if (i >= text.length) bad("unterminated string");
      const ch = text.charCodeAt(i);
      if (ch === 0x22) break;
      if (ch < 0x20) bad("control character in string");
      i += ch === 0x5c ? 2 : 1;
    }
    i++;
    try { return JSON.parse(text.slice(start, i)); } catch { return bad("invalid escape"); }
  };
  const value = (depth) => {
    space();
    const ch = text[i];
    if (ch === "{" || ch === "[") {
      if (depth + 1 > maxDepth) fail(`JSON nests too deep (over the limit of ${maxDepth})`);
      i++;
      const out = ch === "{" ? Object.create(null) : [];
      space();
      if (text[i] === (ch === "{" ? "}" : "]")) { i++; return out; }
      for (;;) {
        if (ch === "{") {
          space();
          if (text[i] !== '"') bad("expecting a property name");
          const key = string();
          if (own(out, key)) fail(`duplicate key '${cut(key, 80)}'`);
          space();
          if (text[i++] !== ":") bad("expecting ':'");
          out[key] = value(depth + 1);
        } else {
          out.push(value(depth + 1));
        }
        space();
        const sep = text[i++];
        if (sep === ",") continue;
        if (sep === (ch === "{" ? "}" : "]")) return out;
        bad("expecting ',' or a closing bracket");
      }
    }
    if (ch === '"') return string();
    for (const [word, v] of [["true", true], ["false", false], ["null", null]]) {
      if (text.startsWith(word, i)) { i += word.length; return v; }
    }
    for (const word of ["NaN", "Infinity", "-Infinity"]) {
      if (text.startsWith(word, i)) fail(`JSON literal ${word} is not allowed (numbers must be finite)`);
    }
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (!m) bad("expecting a value");
    i = NUMBER.lastIndex;
    const v = Number(m[0]);
    if (!(m[1] || m[2])) return v;                           // an integer (Python int)
    if (!Number.isFinite(v)) fail(`number ${cut(m[0], 40)} overflows a float`);
    return new Number(v);                                    // a float (Python float)
  };
  const out = value(0);
  space();
  if (i < text.length) bad("extra data");
  return out;
}

/** config.load_json_bounded: UTF-8 bytes (or a string) -> a value; E_MODEL_LOAD `${source}: ...`. */
export function parseJsonBounded(data, { maxBytes = MAX_CONFIG_BYTES, maxDepth = MAX_JSON_DEPTH, source = "config.json" } = {}) {
  let text = data;
  if (typeof data !== "string") {
    const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
    if (bytes.byteLength > maxBytes) refuse(source, `is ${bytes.byteLength} bytes, over the ${maxBytes}-byte limit`);
    try {
      text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes);
    } catch {
      refuse(source, "is not UTF-8");
    }
  } else if (text.length > maxBytes) refuse(source, `is over ${maxBytes} bytes`);
  return parseStrict(text, maxDepth, (problem) => refuse(source, problem));
}

/** The bytes of a small file (a Blob) of at most maxBytes, refused from its size before reading. */
export async function readSmallBlob(blob, maxBytes, label) {
  if (blob.size > maxBytes) refuse(label, `is ${blob.size} bytes, over the ${maxBytes}-byte limit`);
  return new Uint8Array(await blob.arrayBuffer());
}

// ---------------------------------------------------------------------------------------------
// config.json -> the validated hyper-parameters (config.validate_config, LlamaConfig's fields)
// ---------------------------------------------------------------------------------------------

const isInt = (v) => typeof v === "number" && Number.isInteger(v);
const isNumber = (v) => (typeof v === "number" || v instanceof Number) && Number.isFinite(+v);

function intField(cfg, key, source, fallback) {
  let value = get(cfg, key);
  if (value === undefined) {
    if (fallback === undefined) refuse(source, `missing config field '${key}'`);
    value = fallback;
  }
  if (!isInt(value)) refuse(source, `${key} must be an integer, got ${describe(value)}`);
  const [low, high] = INT_BOUNDS.get(key);
  if (!(value >= low && value <= high)) refuse(source, `${key} ${describe(value)} is outside [${low}, ${high}]`);
  return value;
}

function floatField(value, key, source) {
  if (!isNumber(value)) refuse(source, `${key} must be a finite number, got ${describe(value)}`);
  return +value;
}

function boolField(cfg, key, source) {
  const value = get(cfg, key) ?? false;
  if (typeof value !== "boolean") refuse(source, `${key} must be true or false, got ${describe(value)}`);
  return value;
}

function ropeFields(cfg, source) {
  const found = ["rope_parameters", "rope_scaling"].filter((k) => get(cfg, k) !== undefined);
  for (const k of found) if (!isObject(cfg[k])) refuse(source, `${k} must be an object or null, got ${describe(cfg[k])}`);
  if (found.length === 2) refuse(source, "both rope_parameters and rope_scaling are set; give one");
  const key = found[0] ?? "None";
  const params = found.length ? cfg[key] : Object.create(null);
  const typeKey = own(params, "rope_type") ? "rope_type" : "type";
  const ropeType = own(params, typeKey) ? params[typeKey] : "default";
  if (typeof ropeType !== "string" || !ROPE_KEYS.has(ropeType)) {
    refuse(source, `${key}.${typeKey}=${describe(ropeType)} is not supported (supported: ${[...ROPE_KEYS.keys()].join(", ")})`);
  }
  const unknown = Object.keys(params).filter((k) => !ROPE_KEYS.get(ropeType).includes(k)).sort();
  if (unknown.length) refuse(source, `${key}.${unknown[0]} is not supported with rope type '${ropeType}'`);
  const theta = floatField(get(params, "rope_theta") ?? get(cfg, "rope_theta") ?? 10000.0, "rope_theta", source);
  if (!(theta >= 1 && theta <= 1e12)) refuse(source, `rope_theta ${theta} is outside [1.0, 1000000000000.0]`);
  const out = { rope_theta: theta, rope_type: ropeType, rope_factor: 1.0, rope_low_freq_factor: 0.0,
    rope_high_freq_factor: 0.0, rope_original_max_position_embeddings: 0 };
  if (ropeType === "default") return out;
  const number = (name, lowest, inclusive = true) => {
    const value = floatField(get(params, name), `${key}.${name}`, source);
    if (!(inclusive ? value >= lowest : value > lowest) || value > 1e6) {
      refuse(source, `${key}.${name} ${value} is outside ${inclusive ? "[" : "("}${lowest}, 1e6]`);
    }
    return value;
  };
  out.rope_factor = number("factor", 1.0);
  if (ropeType === "llama3") {
    out.rope_low_freq_factor = number("low_freq_factor", 0.0, false);
    out.rope_high_freq_factor = number("high_freq_factor", 0.0, false);
    if (!(out.rope_high_freq_factor > out.rope_low_freq_factor)) refuse(source, `${key}.high_freq_factor must be greater than low_freq_factor`);
    const original = get(params, "original_max_position_embeddings");
    const top = INT_BOUNDS.get("max_position_embeddings")[1];
    if (!isInt(original) || !(original >= 1 && original <= top)) {
      refuse(source, `${key}.original_max_position_embeddings must be an integer in [1, ${top}], got ${describe(original)}`);
    }
    out.rope_original_max_position_embeddings = original;
  }
  return out;
}

function checkAttentionKind(cfg, modelType, source) {
  if (modelType === "llama") {
    for (const flag of ["attention_bias", "mlp_bias"]) if (boolField(cfg, flag, source)) refuse(source, `${flag}=true is not supported`);
  }
  if (boolField(cfg, "use_sliding_window", source)) refuse(source, "use_sliding_window=true is not supported");
  const layerTypes = get(cfg, "layer_types");
  if (layerTypes !== undefined && (!Array.isArray(layerTypes) || layerTypes.some((t) => t !== "full_attention"))) {
    refuse(source, `layer_types ${describe(layerTypes)} is not supported (only full_attention)`);
  }
  const prf = get(cfg, "partial_rotary_factor");
  if (prf !== undefined && !(prf === true || (isNumber(prf) && +prf === 1))) {   // Python: prf != 1.0 (True == 1.0)
    refuse(source, `partial_rotary_factor ${describe(prf)} is not supported`);
  }
}

/** config.validate_config: a parsed config.json -> {model_type, vocab_size, hidden_size,
 *  intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
 *  max_position_embeddings, rms_norm_eps, tie_word_embeddings, qkv_bias, rope_*}. Give it
 *  parseJsonBounded's value: from JSON.parse 256.0 would pass as the integer 256. */
export function validateConfig(cfg, source = "config.json") {
  if (!isObject(cfg)) refuse(source, `config must be a JSON object, got ${Array.isArray(cfg) ? "list" : typeof cfg}`);
  const modelType = own(cfg, "model_type") ? cfg.model_type : "llama";
  if (typeof modelType !== "string" || !ARCHITECTURES.has(modelType)) {
    refuse(source, `model_type ${describe(modelType)} is not supported (supported: ${[...ARCHITECTURES.keys()].join(", ")})`);
  }
  const archs = get(cfg, "architectures");
  const arch = ARCHITECTURES.get(modelType);
  if (archs !== undefined && !(Array.isArray(archs) && archs.length === 1 && archs[0] === arch)) {
    refuse(source, `architectures ${describe(archs)} is not supported for model_type '${modelType}' (only ['${arch}'])`);
  }
  const act = own(cfg, "hidden_act") ? cfg.hidden_act : "silu";
  if (act !== "silu") refuse(source, `hidden_act ${describe(act)} is not supported (only silu)`);
  checkAttentionKind(cfg, modelType, source);
  const vocab = intField(cfg, "vocab_size", source);
  const hidden = intField(cfg, "hidden_size", source);
  const intermediate = intField(cfg, "intermediate_size", source);
  const layers = intField(cfg, "num_hidden_layers", source);
  const heads = intField(cfg, "num_attention_heads", source);
  const kvHeads = intField(cfg, "num_key_value_heads", source, heads);
  if (get(cfg, "head_dim") === undefined && hidden % heads !== 0) {
    refuse(source, `num_attention_heads ${heads} does not divide hidden_size ${hidden} (and no head_dim is given)`);
  }
  const headDim = intField(cfg, "head_dim", source, Math.floor(hidden / heads));
  const context = intField(cfg, "max_position_embeddings", source);
  if (heads % kvHeads !== 0) refuse(source, `num_key_value_heads ${kvHeads} does not divide num_attention_heads ${heads}`);
  if (headDim % 2 !== 0) refuse(source, `head_dim ${headDim} must be even for RoPE`);
  for (const [key, value] of [["hidden_size", hidden], ["intermediate_size", intermediate], ["head_dim", headDim]]) {
    if (value % 4 !== 0) refuse(source, `${key} ${value} must be a multiple of 4 (int8 weights are packed 4 per word)`);
  }
  const eps = floatField(get(cfg, "rms_norm_eps") ?? 1e-6, "rms_norm_eps", source);
  if (!(eps > 0 && eps < 1)) refuse(source, `rms_norm_eps ${eps} must be > 0 and < 1`);
  const layerTypes = get(cfg, "layer_types");
  if (Array.isArray(layerTypes) && layerTypes.length !== layers) {
    refuse(source, `layer_types has ${layerTypes.length} entries for ${layers} layers`);
  }
  return {
    model_type: modelType, vocab_size: vocab, hidden_size: hidden, intermediate_size: intermediate,
    num_hidden_layers: layers, num_attention_heads: heads, num_key_value_heads: kvHeads, head_dim: headDim,
    max_position_embeddings: context, rms_norm_eps: eps, tie_word_embeddings: boolField(cfg, "tie_word_embeddings", source),
    qkv_bias: modelType === "qwen2", ...ropeFields(cfg, source),
  };
}

// ---------------------------------------------------------------------------------------------
// The shard index (hf.shard_files)
// ---------------------------------------------------------------------------------------------

/** weight_map of a parsed model.safetensors.index.json as a Map tensor name -> shard file name,
 *  every value a plain file name of this folder ending in .safetensors, at most MAX_SHARDS. */
export function shardFiles(index, where = INDEX_FILE) {
  if (!isObject(index) || !own(index, "weight_map") || !isObject(index.weight_map)) refuse(where, "has no 'weight_map' object");
  const weightMap = new Map(Object.entries(index.weight_map));
  for (const [name, shard] of weightMap) {
    if (typeof shard !== "string" || !SHARD_NAME.test(shard)) {
      refuse(where, `weight_map['${cut(name, 80)}'] = '${cut(describe(shard).replace(/^'|'$/g, ""), 80)}' is not a shard file name ` +
        "in this folder (letters, digits, '.', '_', '-', ending in .safetensors)");
    }
  }
  const shards = new Set(weightMap.values()).size;
  if (shards > MAX_SHARDS) refuse(where, `names ${shards} shards, over the limit of ${MAX_SHARDS}`);
  return weightMap;
}

// ---------------------------------------------------------------------------------------------
// A safetensors header against the size of its file (safetensors.header_length, parse_header_json)
// ---------------------------------------------------------------------------------------------

/** N of the first 8 bytes, refused unless N <= MAX_HEADER_BYTES and 8 + N fits fileSize (null:
 *  the size is not known yet). */
export function headerLength(prefix, fileSize, path) {
  const where = `safetensors file ${path}`;
  if ((fileSize !== null && fileSize < 8) || prefix.byteLength < 8) {
    refuse(where, `file is ${fileSize ?? prefix.byteLength} bytes, shorter than the 8-byte header length`);
  }
  const n = new DataView(prefix.buffer, prefix.byteOffset, 8).getBigUint64(0, true);
  if (n > BigInt(MAX_HEADER_BYTES)) refuse(where, `header length ${n} exceeds the ${MAX_HEADER_BYTES}-byte limit`);
  if (fileSize !== null && 8 + Number(n) > fileSize) refuse(where, `header length ${n} exceeds the file size ${fileSize} - 8`);
  return Number(n);
}

/** The N header bytes against a data buffer of dataLen bytes (null: unknown, then the buffer is
 *  what the tensors cover). -> {entries: Map name -> {dtype, shape, begin, end} (offsets in the
 *  data buffer, tiling it exactly), metadata (a string map), dataLen}. */
export function checkSafetensorsHeader(raw, dataLen, path) {
  const where = `safetensors file ${path}`;
  let text;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(raw);
  } catch {
    refuse(where, "header is not UTF-8");
  }
  if (!text.startsWith("{")) refuse(where, "header does not start with '{' (not a JSON object)");
  const header = parseStrict(text, MAX_JSON_DEPTH, (problem) => refuse(where, `header ${problem}`));
  let metadata = Object.create(null);
  if (own(header, "__metadata__") && header.__metadata__ !== null) {
    metadata = header.__metadata__;
    if (!isObject(metadata) || !Object.values(metadata).every((v) => typeof v === "string")) {
      refuse(where, "__metadata__ is not an object of string values");
    }
  }
  const entries = new Map();
  const nonNegativeInts = (list) => list.every((d) => isInt(d) && d >= 0 && Number.isSafeInteger(d));
  for (const [name, info] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const what = `tensor '${name}'`;
    if (!isObject(info)) refuse(where, `${what} entry is not an object`);
    for (const key of ["dtype", "shape", "data_offsets"]) if (!own(info, key)) refuse(where, `${what} is missing ${key}`);
    const extra = Object.keys(info).filter((k) => !["dtype", "shape", "data_offsets"].includes(k)).sort();
    if (extra.length) refuse(where, `${what} has unknown fields ${JSON.stringify(extra)}`);
    const { dtype, shape, data_offsets: offsets } = info;
    if (typeof dtype !== "string" || !DTYPE_BYTES.has(dtype)) refuse(where, `${what} has unknown dtype ${describe(dtype)}`);
    if (!Array.isArray(shape) || !nonNegativeInts(shape)) refuse(where, `${what} shape ${describe(shape)} is not a list of non-negative integers`);
    if (!Array.isArray(offsets) || offsets.length !== 2 || !nonNegativeInts(offsets)) {
      refuse(where, `${what} data_offsets ${describe(offsets)} is not [begin, end] of non-negative integers`);
    }
    const [begin, end] = offsets;
    if (begin > end) refuse(where, `${what} data_offsets begin ${begin} > end ${end}`);
    if (dataLen !== null && end > dataLen) refuse(where, `${what} data_offsets end ${end} is past the data buffer (${dataLen} bytes)`);
    const want = shape.reduce((a, d) => a * BigInt(d), 1n) * BigInt(DTYPE_BYTES.get(dtype));
    if (BigInt(end - begin) !== want) refuse(where, `${what} has ${end - begin} bytes but shape ${JSON.stringify(shape)} of ${dtype} needs ${want}`);
    entries.set(name, { dtype, shape: shape.slice(), begin, end });
  }
  let cursor = 0;
  for (const [name, { begin, end }] of [...entries].sort((a, b) => a[1].begin - b[1].begin || a[1].end - b[1].end)) {
    if (begin < cursor) refuse(where, `tensor '${name}' at [${begin}, ${end}) overlaps the previous tensor (ends at ${cursor})`);
    if (begin > cursor) refuse(where, `gap of ${begin - cursor} bytes in the data buffer before tensor '${name}' at ${begin}`);
    cursor = end;
  }
  if (dataLen !== null && cursor !== dataLen) {
    refuse(where, `${dataLen - cursor} trailing bytes after the last tensor (data buffer ${dataLen}, covered ${cursor})`);
  }
  return { entries, metadata, dataLen: dataLen ?? cursor };
}

/** The header of a safetensors Blob (a picked File), checked against blob.size before any data
 *  byte is read: {entries, metadata, dataStart (8 + N)}. */
export async function readBlobSafetensorsHeader(blob, path) {
  const n = headerLength(new Uint8Array(await blob.slice(0, 8).arrayBuffer()), blob.size, path);
  const raw = new Uint8Array(await blob.slice(8, 8 + n).arrayBuffer());
  if (raw.byteLength !== n) refuse(path, `ended after ${raw.byteLength} of ${n} expected bytes (changed while read?)`);
  return { ...checkSafetensorsHeader(raw, blob.size - 8 - n, path), dataStart: 8 + n };
}

// ---------------------------------------------------------------------------------------------
// The tensors against the config (reference_llama._expected_shapes, _check_header)
// ---------------------------------------------------------------------------------------------

/** Map of every tensor name the checkpoint must hold -> its HF shape. c: validateConfig's value. */
export function expectedShapes(c) {
  const d = c.hidden_size, f = c.intermediate_size, v = c.vocab_size;
  const qDim = c.num_attention_heads * c.head_dim, kvDim = c.num_key_value_heads * c.head_dim;
  const shapes = new Map([["model.embed_tokens.weight", [v, d]], ["model.norm.weight", [d]]]);
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}.`;
    for (const [name, shape] of [["input_layernorm.weight", [d]], ["post_attention_layernorm.weight", [d]],
      ["self_attn.q_proj.weight", [qDim, d]], ["self_attn.k_proj.weight", [kvDim, d]], ["self_attn.v_proj.weight", [kvDim, d]],
      ["self_attn.o_proj.weight", [d, qDim]], ["mlp.gate_proj.weight", [f, d]], ["mlp.up_proj.weight", [f, d]],
      ["mlp.down_proj.weight", [d, f]]]) shapes.set(p + name, shape);
    if (c.qkv_bias) {
      for (const [name, shape] of [["self_attn.q_proj.bias", [qDim]], ["self_attn.k_proj.bias", [kvDim]],
        ["self_attn.v_proj.bias", [kvDim]]]) shapes.set(p + name, shape);
    }
  }
  if (!c.tie_word_embeddings) shapes.set("lm_head.weight", [v, d]);
  return shapes;
}

// ---------------------------------------------------------------------------------------------
// Restricted-vocabulary drafts (py/exactspec/reference/restricted_vocab.py, line-by-line twin): two optional
// I32 tensors. exactspec.head_ids (N,) strictly ascending ids in [0, V): lm_head.weight is (N, D)
// and every other id's logit is -inf. exactspec.embed_rows (V,) values in [0, M): token t's
// embedding is row embed_rows[t] of model.embed_tokens.weight (M, D). Untied heads only; drafts only.
// ---------------------------------------------------------------------------------------------

export const HEAD_IDS = "exactspec.head_ids";
export const EMBED_ROWS = "exactspec.embed_rows";
export const RESTRICTED_TENSORS = [HEAD_IDS, EMBED_ROWS];
const INDEX_DTYPE = "I32";

/** Map name -> expected shape that a draft's restriction tensors add or change (themselves,
 *  lm_head.weight (N, D), model.embed_tokens.weight (M, D)); empty when unrestricted.
 *  entries: Map name -> {dtype, shape}; c: {vocab_size, hidden_size, tie_word_embeddings};
 *  fault(problem, tensorName) throws. Dtypes, ranks and lengths only: values by checkRestrictedValues. */
export function restrictedShapes(entries, c, fault) {
  const v = c.vocab_size, d = c.hidden_size;
  const shapes = new Map();
  for (const name of RESTRICTED_TENSORS) {
    if (!entries.has(name)) continue;
    const dtype = String(entries.get(name).dtype).toUpperCase(), shape = entries.get(name).shape;
    if (dtype !== INDEX_DTYPE) fault(`tensor '${name}' has dtype ${dtype}, expected ${INDEX_DTYPE}`, name);
    if (c.tie_word_embeddings) fault(`tensor '${name}' needs an untied LM head (config tie_word_embeddings is true)`, name);
    if (name === HEAD_IDS) {
      if (shape.length !== 1 || !(shape[0] >= 1 && shape[0] <= v)) fault(`tensor '${name}' has shape ${pyTuple(shape)}, expected (N,) with 1 <= N <= ${v}`, name);
      shapes.set(name, shape.slice());
      shapes.set("lm_head.weight", [shape[0], d]);
    } else {
      if (shape.length !== 1 || shape[0] !== v) fault(`tensor '${name}' has shape ${pyTuple(shape)}, expected ${pyTuple([v])}`, name);
      shapes.set(name, shape.slice());
      const embed = entries.get("model.embed_tokens.weight");
      const m = embed && embed.shape.length === 2 ? embed.shape[0] : 0;
      if (!(m >= 1 && m <= v)) fault(`tensor 'model.embed_tokens.weight' needs 1 to ${v} rows with '${name}' present`, "model.embed_tokens.weight");
      shapes.set("model.embed_tokens.weight", [m, d]);
    }
  }
  return shapes;
}

/** values (Int32Array read from the file) against [0, limit) and, for head_ids, strictly
 *  ascending; fault(problem, tensorName) throws at the first fault. */
export function checkRestrictedValues(name, values, limit, fault) {
  for (let i = 0; i < values.length; i++) {
    if (values[i] < 0 || values[i] >= limit) fault(`tensor '${name}' holds ${values[i]} at index ${i}, outside [0, ${limit})`, name);
  }
  if (name === HEAD_IDS) {
    for (let i = 1; i < values.length; i++) {
      if (values[i] <= values[i - 1]) fault(`tensor '${name}' is not strictly ascending at index ${i} (${values[i - 1]} then ${values[i]})`, name);
    }
  }
}

/** Tensor names, dtypes and shapes (entries: Map name -> {dtype, shape}) against the config,
 *  before a tensor byte is read; quantised: `<n>.q8` (I8) + `<n>.scale` may stand for `<n>`.
 *  role "draft" (float weights only) also accepts the restriction tensors; for "champion" they
 *  are unexpected tensors. */
export function checkTensorsAgainstConfig(entries, c, path, quantised = false, role = "champion") {
  if (role !== "champion" && role !== "draft") throw Object.assign(new Error(`E_BAD_ARGUMENT: role must be champion or draft, got ${role}`), { code: "E_BAD_ARGUMENT" });
  const expected = expectedShapes(c);
  const stored = new Map();   // base name -> the entry that provides it
  if (role === "draft" && !quantised) {
    for (const [name, shape] of restrictedShapes(entries, c, (problem) => refuse(path, problem))) expected.set(name, shape);
  }
  const sameShape = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
  for (const [name, { dtype, shape }] of entries) {
    if (name.endsWith(".bias") && !expected.has(name)) refuse(path, `bias tensor '${name}' is not supported`);
    let base = name, form = "float";
    if (quantised && name.endsWith(".q8")) [base, form] = [name.slice(0, -3), "q8"];
    else if (quantised && name.endsWith(".scale") && entries.has(name.slice(0, -6) + ".q8")) [base, form] = [name.slice(0, -6), "scale"];
    let want = expected.get(base);
    if (want === undefined && base === "lm_head.weight" && c.tie_word_embeddings) want = [c.vocab_size, c.hidden_size];
    if (want === undefined) {
      if (IGNORED_SUFFIXES.some((s) => name.endsWith(s)) && shape.length === 1 && shape[0] <= c.head_dim) continue;
      refuse(path, `unexpected tensor '${name}'`);
    }
    let wantDtypes = FLOAT_DTYPES, wantShape = form === "float" ? want : want.slice(0, 1);
    if (RESTRICTED_TENSORS.includes(base)) wantDtypes = [INDEX_DTYPE];
    if (form === "q8") {
      [wantDtypes, wantShape] = [["I8"], want];
      if (want.length !== 2) refuse(path, `tensor '${name}' must be 2-D I8`);
      if (!entries.has(base + ".scale")) refuse(path, `'${name}' has no '${base}.scale'`);
    }
    if (!wantDtypes.includes(String(dtype).toUpperCase())) refuse(path, `tensor '${name}' has dtype ${dtype}, expected one of ${wantDtypes.join(", ")}`);
    if (!sameShape(shape, wantShape)) refuse(path, `tensor '${name}' has shape ${pyTuple(shape)}, expected ${pyTuple(wantShape)}`);
    if (form !== "scale") {
      if (stored.has(base)) refuse(path, `tensor '${base}' is stored twice ('${stored.get(base)}' and '${name}')`);
      stored.set(base, name);
    }
  }
  for (const name of expected.keys()) if (!stored.has(name)) refuse(path, `missing tensor '${name}'`);
}
