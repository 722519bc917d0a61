// The WebGPU champion's hyper-parameters from a Hugging Face config.json, and its RoPE table (pure).

const refuse = (why) => { throw Object.assign(new Error(`E_MODEL_LOAD: config.json: ${why}`), { code: "E_MODEL_LOAD" }); };
export const DEFAULT_MAX_CONTEXT = 4096;   // KV positions when the caller asks for none (capped by the config)
const ROPE_TYPES = ["default", "linear", "llama3"];

/** The RoPE fields of either config form: `rope_parameters` (transformers >= 5) or
 *  `rope_theta` + `rope_scaling` (the published configs). Returns {type, theta, ...scaling}.
 *  Shared with the WASM draft (web/draft/draft.mjs). */
export function ropeOf(cfg) {
  for (const field of ["rope_parameters", "rope_scaling"]) {
    const v = cfg[field];
    if (v !== undefined && v !== null && (typeof v !== "object" || Array.isArray(v))) refuse(`${field} ${JSON.stringify(v)} is not supported`);
  }
  const params = cfg.rope_parameters && typeof cfg.rope_parameters === "object" ? cfg.rope_parameters : null;
  const scaling = cfg.rope_scaling && typeof cfg.rope_scaling === "object" ? cfg.rope_scaling : null;
  const field = params ? "rope_parameters" : "rope_scaling";
  const r = { ...(scaling ?? {}), ...(params ?? {}) };
  const type = r.rope_type ?? r.type ?? "default";
  if (!ROPE_TYPES.includes(type)) refuse(`${field}.rope_type ${JSON.stringify(type)} is not supported (only ${ROPE_TYPES.join(", ")})`);
  if ((r.partial_rotary_factor ?? 1) !== 1) refuse(`${field}.partial_rotary_factor ${r.partial_rotary_factor} is not supported`);
  const num = (k) => {
    if (!(typeof r[k] === "number" && Number.isFinite(r[k]) && r[k] > 0)) refuse(`${field}.${k} must be a positive number, got ${JSON.stringify(r[k])}`);
    return r[k];
  };
  const out = { type, theta: r.rope_theta ?? cfg.rope_theta ?? 10000.0 };
  if (type === "linear") out.factor = num("factor");
  if (type === "llama3") {
    for (const k of ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]) out[k] = num(k);
    if (!(out.high_freq_factor > out.low_freq_factor)) refuse(`${field}.high_freq_factor must exceed low_freq_factor`);
  }
  return out;
}

/** Hyper-parameters from config.json (HF Llama or Qwen2), refusing what the kernels cannot run
 *  with E_MODEL_LOAD naming the field. */
export function parseConfig(cfg) {
  const need = (k) => {
    if (!(Number.isSafeInteger(cfg[k]) && cfg[k] > 0)) refuse(`${k} must be a positive integer, got ${JSON.stringify(cfg[k])}`);
    return cfg[k];
  };
  const modelType = cfg.model_type ?? "llama";
  if (modelType !== "llama" && modelType !== "qwen2") refuse(`model_type ${JSON.stringify(modelType)} is not llama or qwen2`);
  const heads = need("num_attention_heads");
  const hp = {
    modelType, vocab: need("vocab_size"), hidden: need("hidden_size"), inter: need("intermediate_size"),
    layers: need("num_hidden_layers"), heads, kvHeads: cfg.num_key_value_heads ?? heads,
    headDim: cfg.head_dim ?? need("hidden_size") / heads, eps: cfg.rms_norm_eps ?? 1e-6,
    maxPositions: need("max_position_embeddings"),
    tied: cfg.tie_word_embeddings === true,   // HF's default for both families is false
    qkvBias: modelType === "qwen2",           // Qwen2: q/k/v projections carry biases, o does not
    rope: ropeOf(cfg),
  };
  if ((cfg.hidden_act ?? "silu") !== "silu") refuse(`hidden_act ${cfg.hidden_act} is not silu`);
  if (cfg.mlp_bias === true) refuse("mlp_bias true is not supported");
  if (modelType === "llama" && cfg.attention_bias === true) refuse("attention_bias true is not supported (o_proj bias)");
  if (cfg.use_sliding_window === true) refuse("use_sliding_window true is not supported (sliding_window attention)");
  if (Array.isArray(cfg.layer_types) && cfg.layer_types.some((t) => t !== "full_attention")) {
    refuse("layer_types other than full_attention are not supported (sliding_window attention)");
  }
  if ((cfg.pretraining_tp ?? 1) !== 1) refuse(`pretraining_tp ${cfg.pretraining_tp} is not supported`);
  if (!(Number.isSafeInteger(hp.kvHeads) && hp.kvHeads > 0)) refuse(`num_key_value_heads ${hp.kvHeads} must be a positive integer`);
  if (!Number.isSafeInteger(hp.headDim) || hp.headDim <= 0) refuse(`head_dim ${hp.headDim} must be a positive integer`);
  if (heads % hp.kvHeads) refuse("num_attention_heads must be a multiple of num_key_value_heads");
  for (const [k, name] of [["hidden", "hidden_size"], ["inter", "intermediate_size"], ["headDim", "head_dim"]]) {
    if (hp[k] % 4) refuse(`${name} ${hp[k]} must be a multiple of 4 (int8 packed 4 per word)`);
  }
  return hp;
}

/** The context the KV cache is sized for: the caller's maxContext, else min(config, 4096). */
export function resolveMaxContext(hp, maxContext) {
  const ctx = maxContext || Math.min(hp.maxPositions, DEFAULT_MAX_CONTEXT);
  if (!(Number.isSafeInteger(ctx) && ctx >= 1 && ctx <= hp.maxPositions)) {
    throw Object.assign(new Error(`E_BAD_ARGUMENT: maxContext ${maxContext} outside [1, ${hp.maxPositions}] (max_position_embeddings)`),
      { code: "E_BAD_ARGUMENT" });
  }
  return ctx;
}

/** RoPE inverse frequencies (hd/2) in float64: transformers' formulas (default, linear, llama3 of
 *  modeling_rope_utils, which runs them in float32) evaluated in float64 in the same order as
 *  exactspec.formats.config.rope_inv_freq, so the reference, the WASM champion and this one share them. */
export function ropeInvFreq(hp) {
  const { headDim: dim, rope } = hp;
  const inv = Float64Array.from({ length: dim / 2 }, (_, i) => 1.0 / Math.pow(rope.theta, (2 * i) / dim));
  if (rope.type === "linear") return inv.map((f) => f / rope.factor);
  if (rope.type !== "llama3") return inv;
  const { factor, low_freq_factor: low, high_freq_factor: high, original_max_position_embeddings: old } = rope;
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

/** RoPE table (maxContext, hd/2) of (cos, sin) pairs as float32; angles p * inv_freq in float64. */
export function ropeTable(hp, maxContext) {
  const half = hp.headDim / 2, invFreq = ropeInvFreq(hp), table = new Float32Array(maxContext * half * 2);
  for (let p = 0; p < maxContext; p++) {
    for (let i = 0; i < half; i++) {
      const angle = p * invFreq[i];
      table[2 * (p * half + i)] = Math.cos(angle);
      table[2 * (p * half + i) + 1] = Math.sin(angle);
    }
  }
  return table;
}
