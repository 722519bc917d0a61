// The validated config (exactspec.formats.config.validate_config's LlamaConfig fields) mapped onto each kernel's arguments, and the RoPE tables; no rules of its own.
//
// The one set of config rules is Python's validator: in the browser the model check runs it in
// Pyodide (exactspec.pyodide.browser_backend.check_models, stage 1, before any weight loads) and
// hands its result, a plain object of LlamaConfig's fields, to the champion and draft loaders.
// Callers outside the engine (Node harnesses, tools) get the same object from readValidatedConfig,
// which runs web/formats/model_checks.mjs's validateConfig, the line-by-line port of that validator that
// tests keep equal to it. A loader given anything else (a raw config.json) refuses with E_INTERNAL:
// it never guesses defaults or re-checks fields.
import { parseJsonBounded, validateConfig } from "./model_checks.mjs";
import { codedError } from "../protocol.mjs";
import { fetchModelFile } from "./safetensors.mjs";

export const DEFAULT_MAX_CONTEXT = 4096;   // KV positions when the caller asks for none (capped by the config)

/** The fields of a validated config (LlamaConfig) and their JS types. */
const FIELDS = {
  model_type: "string", vocab_size: "integer", hidden_size: "integer", intermediate_size: "integer",
  num_hidden_layers: "integer", num_attention_heads: "integer", num_key_value_heads: "integer", head_dim: "integer",
  max_position_embeddings: "integer", rms_norm_eps: "number", rope_theta: "number", tie_word_embeddings: "boolean",
  qkv_bias: "boolean", rope_type: "string", rope_factor: "number", rope_low_freq_factor: "number",
  rope_high_freq_factor: "number", rope_original_max_position_embeddings: "integer",
};
const OF_TYPE = { string: (v) => typeof v === "string", integer: Number.isSafeInteger, number: Number.isFinite,
  boolean: (v) => typeof v === "boolean" };

/** `config` itself when it holds every LlamaConfig field with its type, else E_INTERNAL: a loader
 *  was handed something that did not come from the validator. */
export function validatedConfig(config) {
  if (config === null || typeof config !== "object" || Array.isArray(config)) {
    throw codedError("E_INTERNAL", `config: expected the validated config (validate_config's fields), got ${config === null ? "null" : typeof config}`);
  }
  for (const [field, type] of Object.entries(FIELDS)) {
    if (!OF_TYPE[type](config[field])) {
      throw codedError("E_INTERNAL", `config: not a validated config (validate_config's fields): ${field} is ${JSON.stringify(config[field])}, not ${type === "integer" ? "an" : "a"} ${type}`);
    }
  }
  return config;
}

/** config.json bytes (or text) -> the validated config, through the validator's JS port; for
 *  callers outside the engine, whose model check hands the loaders Pyodide's result instead. */
export function validatedConfigFromJson(data, source = "config.json") {
  return validateConfig(parseJsonBounded(data, { source }), source);
}

/** fetch + validatedConfigFromJson of `url` (a model folder's config.json), E_MODEL_LOAD when it
 *  cannot be fetched. For callers outside the engine only (see the header). */
export async function readValidatedConfig(url, fetchFn = globalThis.fetch?.bind(globalThis)) {
  const res = await fetchModelFile(fetchFn, url);
  return validatedConfigFromJson(new Uint8Array(await res.arrayBuffer()));
}

/** The WebGPU champion's hyper-parameters (web/gpu/champion.mjs, champion_plan.mjs). */
export function gpuHyperParameters(config) {
  const c = validatedConfig(config);
  return {
    modelType: c.model_type, vocab: c.vocab_size, hidden: c.hidden_size, inter: c.intermediate_size,
    layers: c.num_hidden_layers, heads: c.num_attention_heads, kvHeads: c.num_key_value_heads, headDim: c.head_dim,
    eps: c.rms_norm_eps, maxPositions: c.max_position_embeddings, tied: c.tie_word_embeddings, qkvBias: c.qkv_bias,
    config: c,   // ropeTable's input
  };
}

/** The WASM kernels' arguments (web/draft/draft.mjs, web/champion_wasm/champion_wasm.mjs):
 *  rope_inv_freq is null for the default RoPE (the C side builds it from rope_theta). */
export function wasmKernelConfig(config) {
  const c = validatedConfig(config);
  return {
    vocab_size: c.vocab_size, hidden_size: c.hidden_size, intermediate_size: c.intermediate_size,
    num_layers: c.num_hidden_layers, num_heads: c.num_attention_heads, num_kv_heads: c.num_key_value_heads,
    head_dim: c.head_dim, rms_norm_eps: c.rms_norm_eps, max_context: c.max_position_embeddings, rope_theta: c.rope_theta,
    tie_word_embeddings: c.tie_word_embeddings, qkv_bias: c.qkv_bias, rope_type: c.rope_type,
    rope_inv_freq: c.rope_type === "default" ? null : Array.from(ropeInvFreq(c)),
  };
}

/** The context the KV cache is sized for: the caller's maxContext, else min(config, 4096). */
export function resolveMaxContext(hp, maxContext) {
  const ctx = maxContext || Math.min(hp.maxPositions, DEFAULT_MAX_CONTEXT);
  if (!(Number.isSafeInteger(ctx) && ctx >= 1 && ctx <= hp.maxPositions)) {
    throw codedError("E_BAD_ARGUMENT", `maxContext ${maxContext} outside [1, ${hp.maxPositions}] (max_position_embeddings)`);
  }
  return ctx;
}

/** RoPE inverse frequencies (head_dim/2) in float64: exactspec.formats.config.rope_inv_freq line by
 *  line (transformers' default, linear and llama3 formulas), so every backend shares them. */
export function ropeInvFreq(config) {
  const c = validatedConfig(config);
  const dim = c.head_dim;
  const inv = Float64Array.from({ length: dim / 2 }, (_, i) => 1.0 / Math.pow(c.rope_theta, (2 * i) / dim));
  if (c.rope_type === "linear") return inv.map((f) => f / c.rope_factor);
  if (c.rope_type !== "llama3") return inv;
  const factor = c.rope_factor, low = c.rope_low_freq_factor, high = c.rope_high_freq_factor;
  const old = c.rope_original_max_position_embeddings;
  const lowFreqWavelen = old / low, highFreqWavelen = old / high;
  return inv.map((f) => {
    const wavelen = 2 * Math.PI / f;
    let scaled = wavelen > lowFreqWavelen ? f / factor : f;
    if (!(wavelen < highFreqWavelen) && !(wavelen > lowFreqWavelen)) {   // medium band
      const smooth = (old / wavelen - low) / (high - low);
      scaled = (1 - smooth) * scaled / factor + smooth * scaled;
    }
    return scaled;
  });
}

/** RoPE table (maxContext, head_dim/2) of (cos, sin) pairs as float32; angles p * inv_freq in float64. */
export function ropeTable(config, maxContext) {
  const half = config.head_dim / 2, invFreq = ropeInvFreq(config), table = new Float32Array(maxContext * half * 2);
  for (let p = 0; p < maxContext; p++) {
    for (let i = 0; i < half; i++) {
      const angle = p * invFreq[i];
      table[2 * (p * half + i)] = Math.cos(angle);
      table[2 * (p * half + i) + 1] = Math.sin(angle);
    }
  }
  return table;
}
