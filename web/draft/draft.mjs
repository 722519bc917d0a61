// draft.mjs — JS side of the WASM-SIMD draft (wasm/draft.c): loads config.json +
// model.safetensors (f32) into the module's memory and exposes forward / propose with the
// semantics of exactspec.core.backends.RunnerDraft.propose (docs/browser_contract.md, docs/draft_wasm.md).
// Runs in a page, a module worker or Node (pass bytes instead of URLs there).
import { readValidatedConfig, wasmKernelConfig } from "../formats/model_config.mjs";
import { checkedPolicy } from "../sampling_policy.mjs";
import { openSafetensorsStream } from "../formats/safetensors.mjs";
import { LoadTransient } from "../formats/streamed_file.mjs";
import { EMBED_ROWS, HEAD_IDS, checkRestrictedValues, checkSafetensorsHeader, headerLength, restrictedShapes } from "../formats/model_checks.mjs";
import { artifactIdentity, streamedIdentity } from "../weight_cache.mjs";
import { ggufDraftWeights } from "../gguf/gguf_draft.mjs";
import { isGgufUrl } from "../gguf/gguf_reader.mjs";
import { cpuImports, isThreadedModule } from "../champion_wasm/cpu_module.mjs";
import { wasmStatusCode } from "../wasm_status.mjs";

// tensor kinds of draft_set_tensor (wasm/draft.c)
const T = { embed: 0, final_norm: 1, lm_head: 2, attn_norm: 10, wq: 11, wk: 12, wv: 13, wo: 14,
  mlp_norm: 15, w_gate: 16, w_up: 17, w_down: 18, bq: 20, bk: 21, bv: 22 };
const LAYER_TENSORS = [
  ["input_layernorm.weight", T.attn_norm, (c) => [c.hidden_size]],
  ["self_attn.q_proj.weight", T.wq, (c) => [c.num_heads * c.head_dim, c.hidden_size]],
  ["self_attn.k_proj.weight", T.wk, (c) => [c.num_kv_heads * c.head_dim, c.hidden_size]],
  ["self_attn.v_proj.weight", T.wv, (c) => [c.num_kv_heads * c.head_dim, c.hidden_size]],
  ["self_attn.o_proj.weight", T.wo, (c) => [c.hidden_size, c.num_heads * c.head_dim]],
  ["post_attention_layernorm.weight", T.mlp_norm, (c) => [c.hidden_size]],
  ["mlp.gate_proj.weight", T.w_gate, (c) => [c.intermediate_size, c.hidden_size]],
  ["mlp.up_proj.weight", T.w_up, (c) => [c.intermediate_size, c.hidden_size]],
  ["mlp.down_proj.weight", T.w_down, (c) => [c.hidden_size, c.intermediate_size]],
];

export class DraftError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
    this.detail = message;
  }
}

function loadError(message) { return new DraftError("E_MODEL_LOAD", message); }
function badArgument(message) { return new DraftError("E_BAD_ARGUMENT", message); }

// safetensors bytes -> {headerBytes (8 + n), tensors: {name: {dtype, shape, begin, end}}}, the
// header checked as the CLI checks it (web/formats/model_checks.mjs): bounds, dtypes, byte sizes against
// shapes, offsets tiling the data exactly (no gaps, overlaps or trailing bytes)
export function parseSafetensorsHeader(bytes) {
  try {
    const n = headerLength(bytes.subarray(0, 8), bytes.byteLength, "model.safetensors");
    const { entries } = checkSafetensorsHeader(bytes.subarray(8, 8 + n), bytes.byteLength - 8 - n, "model.safetensors");
    const tensors = Object.create(null);
    for (const [name, { dtype, shape, begin, end }] of entries) tensors[name] = { dtype, shape, begin, end };
    return { headerBytes: 8 + n, tensors };
  } catch (err) {
    throw err.code === "E_MODEL_LOAD" ? loadError(err.detail) : err;
  }
}

async function fetchBytes(fetchFn, url) {
  const response = await fetchFn(url);
  if (!response.ok) throw loadError(`cannot fetch ${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

/**
 * createDraft({wasmUrl, modelUrl, configJson}) in the browser, or
 * createDraft({wasmBytes, configJson, weightsBytes}) anywhere (Node tests).
 * configJson: the validated config (an object, web/formats/model_config.mjs): the engine passes
 * the one its model check got from Pyodide; absent, the folder's config.json is read through the
 * validator's JS port (callers outside the engine).
 * A modelUrl ending in .gguf is one GGUF file (configJson required: the config the model check
 * derived from it): its tensors as F32 (web/gguf/gguf_draft.mjs), its sha256 the draft's identity.
 * The module is the CPU module (web/build/cpu.wasm); `instance: {exports, memory}` loads the draft
 * into an instance that already holds the champion (one memory, one arena: cpu_session.mjs).
 */
export async function createDraft({ wasmUrl, modelUrl, wasmBytes, configJson, weightsBytes, fetchFn, instance: shared = null } = {}) {
  fetchFn = fetchFn ?? globalThis.fetch?.bind(globalThis);
  if (isGgufUrl(modelUrl)) {
    const gguf = await ggufDraftWeights(fetchFn, modelUrl, configJson);
    const draft = await createDraft({ wasmUrl, wasmBytes, configJson, weightsBytes: gguf.weightsBytes, fetchFn, instance: shared });
    draft.identity = gguf.identity;
    draft.artifactBytes = gguf.artifactBytes;
    return draft;
  }
  const base = modelUrl ? (modelUrl.endsWith("/") ? modelUrl : modelUrl + "/") : null;
  const url = base + "model.safetensors";
  const [wasm, config, file] = await Promise.all([
    shared ? null : wasmBytes ?? fetchBytes(fetchFn, wasmUrl),
    configJson ?? readValidatedConfig(base + "config.json", fetchFn),
    weightsBytes ?? openSafetensorsStream(fetchFn, url, url, new LoadTransient()),
  ]);
  const parsedConfig = typeof config === "string" ? JSON.parse(config) : config;
  if (file instanceof Uint8Array) {
    // = LlamaReference.identity (sha256 of model.safetensors); before anything is built: a cached copy
    // that fails it (web/weight_cache.mjs) leaves nothing in a shared instance's arena
    const identity = await artifactIdentity(file);
    const { exports, memory } = shared ?? await instantiateAlone(wasm);
    const draft = new Draft(exports, parsedConfig, file, memory ?? exports.memory);
    draft.identity = identity;
    draft.artifactBytes = file.byteLength;
    return draft;
  }
  // streamed: the file's bytes go straight into WASM memory, a read at a time (streamed_file.mjs),
  // hashed as they come; the identity is checked before the draft is built
  try {
    const { exports, memory } = shared ?? await instantiateAlone(wasm);
    const layout = { headerBytes: file.headerBytes, size: file.end, tensors: Object.fromEntries([...file.tensors].map(
      ([name, t]) => [name, { dtype: t.dtype, shape: t.shape, begin: t.source.offset - file.headerBytes, end: t.source.offset - file.headerBytes + t.source.nbytes }])) };
    const draft = new Draft(exports, parsedConfig, layout, memory ?? exports.memory);
    await draft._fill(file.file, file.end);
    const hex = await file.file.finish(file.end, { size: file.size });
    draft.identity = await streamedIdentity(file.response, hex);
    draft._build();
    draft.artifactBytes = file.end;
    draft.transient = file.file.transient;
    return draft;
  } catch (err) {
    file.file.cancel();
    throw err;
  }
}

/** A CPU module instance of its own -> {exports, memory}; the threaded build (cpu_mt.wasm) gets the
 *  shared memory it imports (its helper threads stay the champion's, unused by the draft). */
async function instantiateAlone(wasm) {
  const module = await WebAssembly.compile(wasm);
  const memory = isThreadedModule(module) ? new WebAssembly.Memory({ initial: 256, maximum: 65536, shared: true }) : null;
  const instance = await WebAssembly.instantiate(module, cpuImports(memory));
  return { exports: instance.exports, memory: memory ?? instance.exports.memory };
}

export class Draft {
  /** file: the whole model.safetensors (Uint8Array), or its layout {headerBytes, size, tensors:
   *  {name: {dtype, shape, begin, end}}} when its bytes are streamed in after (_fill, then _build). */
  constructor(exports, config, file, memory = exports.memory) {
    this.wasm = exports;
    this.memory = memory;                 // the CPU module's (shared with the champion when loaded into its instance)
    this.config = config;
    const c = wasmKernelConfig(config);   // the validated config onto the C side's arguments
    this.hp = c;
    this.vocabSize = c.vocab_size;
    this.maxContext = c.max_context;
    const whole = file instanceof Uint8Array;
    const { headerBytes, tensors } = whole ? parseSafetensorsHeader(file) : file;
    this._layout = { headerBytes, tensors };

    // the whole file, copied so that its data section starts 16-byte aligned in wasm memory
    const size = whole ? file.byteLength : file.size;
    const raw = this.wasm.draft_alloc(size + 16);
    if (!raw) throw loadError("out of wasm memory for the weights");
    this._base = raw + ((16 - ((raw + headerBytes) % 16)) % 16);
    if (!whole) return;                // createDraft streams the bytes in (_fill), then builds (_build)
    this._u8().set(file, this._base);
    this._build();
  }

  /** The file's bytes [headerBytes, end) from a StreamedFile into their place in WASM memory, one
   *  read at a time (a fresh view per read: memory may grow meanwhile). */
  async _fill(file, end) {
    const READ = 1 << 20;
    for (let at = this._layout.headerBytes; at < end; at += READ) {
      const piece = await file.stage(at, Math.min(READ, end - at), READ);
      this._u8().set(piece, this._base + at);
    }
  }

  /** Point the module at each tensor of the file in WASM memory, check them, and make the buffers. */
  _build() {
    const c = this.hp, { headerBytes, tensors } = this._layout;
    const dataStart = this._base + headerBytes;

    // restricted vocabulary (optional, web/formats/model_checks.mjs): shapes now, values once in memory
    const fault = (problem) => { throw loadError(`model.safetensors: ${problem}`); };
    const present = new Map(Object.entries(tensors));
    const restricted = restrictedShapes(present, c, fault);
    const embedShape = restricted.get("model.embed_tokens.weight") ?? [c.vocab_size, c.hidden_size];  // (M, D)
    const headShape = restricted.get("lm_head.weight") ?? [c.vocab_size, c.hidden_size];             // (N, D)

    check(this.wasm.draft_build_config(c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers,
      c.num_heads, c.num_kv_heads, c.head_dim, c.max_context, c.rms_norm_eps, c.rope_theta), "build");
    const place = (name, kind, layer, shape) => {
      const t = tensors[name];
      if (!t) throw loadError(`missing tensor ${name}`);
      if (t.dtype !== "F32") {
        throw loadError(`model.safetensors: tensor ${name} has dtype ${t.dtype}, the WASM draft runs F32 weights `
          + "(`exactspec convert --role draft` writes them; a folder picked in the page is converted there)");
      }
      if (JSON.stringify(t.shape) !== JSON.stringify(shape)) {
        throw loadError(`tensor ${name} has shape ${JSON.stringify(t.shape)}, expected ${JSON.stringify(shape)}`);
      }
      check(this.wasm.draft_set_tensor(kind, layer, dataStart + t.begin), name);
    };
    place("model.embed_tokens.weight", T.embed, 0, embedShape);
    place("model.norm.weight", T.final_norm, 0, [c.hidden_size]);
    if (!c.tie_word_embeddings) place("lm_head.weight", T.lm_head, 0, headShape);
    // (n,) int32 view of a restriction tensor in wasm memory, its values checked; 0 when absent
    const placeIds = (name, limit) => {
      if (!restricted.has(name)) return 0;
      const ptr = dataStart + tensors[name].begin;
      if (ptr % 4 !== 0) fault(`tensor '${name}' is not 4-byte aligned in the file`);
      checkRestrictedValues(name, new Int32Array(this.memory.buffer, ptr, restricted.get(name)[0]), limit, fault);
      return ptr;
    };
    const headIds = placeIds(HEAD_IDS, c.vocab_size), embedRows = placeIds(EMBED_ROWS, embedShape[0]);
    if (headIds || embedRows) {
      check(this.wasm.draft_set_restriction(headIds, headShape[0], embedRows, embedShape[0]), "restriction");
    }
    for (let l = 0; l < c.num_layers; l++) {
      for (const [suffix, kind, shape] of LAYER_TENSORS) place(`model.layers.${l}.${suffix}`, kind, l, shape(c));
    }
    if (c.qkv_bias) {                  // Qwen2: q/k/v biases
      for (let l = 0; l < c.num_layers; l++) {
        for (const [proj, kind, heads] of [["q_proj", T.bq, c.num_heads], ["k_proj", T.bk, c.num_kv_heads],
          ["v_proj", T.bv, c.num_kv_heads]]) place(`model.layers.${l}.self_attn.${proj}.bias`, kind, l, [heads * c.head_dim]);
      }
    }
    if (c.rope_inv_freq) {             // scaled RoPE (linear, llama3)
      const ptr = this.wasm.draft_alloc(8 * c.rope_inv_freq.length);
      if (!ptr) throw loadError("out of wasm memory for the RoPE frequencies");
      this._f64(ptr, c.rope_inv_freq.length).set(c.rope_inv_freq);
      check(this.wasm.draft_set_inv_freq(ptr), "rope");
    }
    check(this.wasm.draft_check(), "check");
    this._finalNorm = { ptr: dataStart + tensors["model.norm.weight"].begin, n: c.hidden_size };  // (H,) f32
    this._nanOnce = false;

    // argument / result buffers, allocated once (re-made only if k or a list grows)
    this._idsCap = Math.max(c.max_context, 1024);
    this._ids = this.wasm.draft_alloc(4 * this._idsCap);        // (idsCap,) int32 scratch
    this._ids2 = this.wasm.draft_alloc(4 * this._idsCap);       // (idsCap,) int32 scratch
    this._logitsIn = this.wasm.draft_alloc(4 * c.vocab_size);   // (V,) f32 (processRow input)
    this._rowOut = this.wasm.draft_alloc(4 * c.vocab_size);     // (V,) f32 (processRow output)
    this._kCap = 0;
    this._ensureK(16);
  }

  /** Bytes of WASM linear memory (it only grows: this is also its peak). */
  get memoryBytes() { return this.memory.buffer.byteLength; }

  /** Fault injection (tests): the next propose() runs with a NaN final-norm weight, so every
   *  logits row is NaN and the draft's own processors report E_PROCESSOR_INVALID. */
  injectNaNOnce() { this._nanOnce = true; }

  _u8() { return new Uint8Array(this.memory.buffer); }
  _i32(ptr, n) { return new Int32Array(this.memory.buffer, ptr, n); }
  _f32(ptr, n) { return new Float32Array(this.memory.buffer, ptr, n); }
  _f64(ptr, n) { return new Float64Array(this.memory.buffer, ptr, n); }

  _ensureK(k) {
    if (k <= this._kCap) return;
    this._kCap = Math.max(k, 2 * this._kCap);
    this._outTokens = this.wasm.draft_alloc(4 * this._kCap);                   // (kCap,) int32
    this._outRows = this.wasm.draft_alloc(4 * this._kCap * this.vocabSize);    // (kCap, V) f32
    if (!this._outTokens || !this._outRows) throw loadError("out of wasm memory for k rows");
  }

  _ensureIds(n) {
    if (n <= this._idsCap) return;
    this._idsCap = Math.max(n, 2 * this._idsCap);
    this._ids = this.wasm.draft_alloc(4 * this._idsCap);
    this._ids2 = this.wasm.draft_alloc(4 * this._idsCap);
  }

  _writeIds(ptr, ids) {
    const arr = Int32Array.from(ids, (v) => {
      if (!Number.isInteger(Number(v))) throw badArgument(`token id ${v} is not an integer`);
      return Number(v);
    });
    this._i32(ptr, arr.length).set(arr);
    return arr.length;
  }

  /** positions occupied in the KV cache (forward(…, startPos) needs startPos <= nCached) */
  get nCached() { return this.wasm.draft_n_cached(); }

  /** feed tokenIds at [startPos, startPos + n); returns the logits (V,) of the last one */
  forward(tokenIds, startPos) {
    if (!Number.isInteger(startPos) || startPos < 0) throw badArgument(`startPos: ${startPos}`);
    this._ensureIds(tokenIds.length);
    const n = this._writeIds(this._ids, tokenIds);
    check(this.wasm.draft_forward(this._ids, n, startPos), "forward");
    return this._f32(this.wasm.draft_logits(), this.vocabSize).slice();
  }

  /** policy + context (+ stop ids) into the C side; throws E_BAD_ARGUMENT on a bad policy */
  _setPolicy(policy, contextIds, stopTokenIds) {
    const p = checkedPolicy(policy, this.vocabSize);
    check(this.wasm.draft_set_policy(p.temperature, p.top_k, p.top_p, p.repetition_penalty), "policy");
    const suppress = p.suppress_token_ids, allowed = p.allowed_token_ids;
    this._ensureIds(Math.max(suppress.length, allowed ? allowed.length : 0, contextIds.length, stopTokenIds.length));
    const nS = this._writeIds(this._ids, suppress);
    const nA = allowed === null ? -1 : this._writeIds(this._ids2, allowed);
    check(this.wasm.draft_set_masks(this._ids, nS, this._ids2, nA), "masks");
    check(this.wasm.draft_set_context(this._ids, this._writeIds(this._ids, contextIds)), "context_ids");
    check(this.wasm.draft_set_stops(this._ids, this._writeIds(this._ids, stopTokenIds)), "stop_token_ids");
  }

  /**
   * RunnerDraft.propose: feed the unmaterialised ids at startPos, then up to k proposals, each
   * drawn from its processed row (processors-v1) at address (seed, draft_sample, roundId,
   * firstStep + i); stops after a stop token. Row i's context is contextIds + tokens[:i].
   * firstStep: k = 1 calls with firstStep 0, 1, 2, ... draw what one k-call draws (firstStep + k
   * <= 2^32). maskBits: null, or Uint32Array (ceil(V / 32)) allowed-id bits, bit (id & 31) of word
   * (id >> 5) (xgrammar's bitmask layout): every row is masked by them in processors step 3 (ANDed
   * with policy.allowed_token_ids), and pDraft holds the masked rows; no allowed token left is
   * error_code E_PROCESSOR_INVALID, as any invalid row.
   * -> {tokens: Int32Array m, pDraft: Float32Array m*V, error_code: "" | "E_PROCESSOR_INVALID"}
   */
  propose({ feed, startPos, k, policy, seed, roundId = 0, stopTokenIds = [], contextIds = [], firstStep = 0,
            maskBits = null }) {
    if (!Number.isInteger(k) || k < 0) throw badArgument(`k: ${k}`);
    if (!Number.isInteger(firstStep) || firstStep < 0 || firstStep + k > 2 ** 32) throw badArgument(`firstStep: ${firstStep}`);
    const nWords = Math.ceil(this.vocabSize / 32);
    if (maskBits !== null && !((maskBits instanceof Uint32Array || maskBits instanceof Int32Array) && maskBits.length === nWords)) {
      throw badArgument(`maskBits: need a Uint32Array of ceil(V / 32) = ${nWords} words`);
    }
    if (!Number.isInteger(startPos) || startPos < 0) throw badArgument(`startPos: ${startPos}`);
    if (!Number.isInteger(roundId) || roundId < 0 || roundId > 0xffffffff) throw badArgument(`roundId: ${roundId}`);
    const [lo, hi] = seed ?? [0, 0];
    for (const word of [lo, hi]) {
      if (!Number.isInteger(word) || word < 0 || word > 0xffffffff) throw badArgument(`seed word ${word} is not a uint32`);
    }
    this._setPolicy(policy, contextIds, stopTokenIds);
    this._ensureK(k);
    this._ensureIds(feed.length);
    const nFeed = this._writeIds(this._ids, feed);
    if (maskBits !== null) {
      this._maskBits ??= this.wasm.draft_alloc(4 * nWords);      // (ceil(V / 32),) uint32, made at first use
      if (!this._maskBits) throw new DraftError("E_OUT_OF_MEMORY", "out of wasm memory for the mask bits");
      new Uint32Array(this.memory.buffer, this._maskBits, nWords).set(new Uint32Array(maskBits.buffer, maskBits.byteOffset, nWords));
    }
    const status = this.withArmedFault(() => this.wasm.draft_propose(this._ids, nFeed, startPos, k, lo >>> 0, hi >>> 0,
      roundId >>> 0, this._outTokens, this._outRows, firstStep >>> 0, maskBits === null ? 0 : this._maskBits));
    const m = this.wasm.draft_n_proposed();
    const V = this.vocabSize;
    const tokens = this._i32(this._outTokens, m).slice();
    const pDraft = this._f32(this._outRows, m * V).slice();
    if (status === 1) return { tokens, pDraft, error_code: "E_PROCESSOR_INVALID" };
    check(status, "propose");
    return { tokens, pDraft, error_code: "" };
  }

  /** fn() with the armed fault (injectNaNOnce) in force: a NaN final-norm weight, restored after. */
  withArmedFault(fn) {
    const norm = this._nanOnce ? this._f32(this._finalNorm.ptr, this._finalNorm.n) : null;
    const saved = norm ? norm.slice() : null;
    if (norm) { norm.fill(NaN); this._nanOnce = false; }
    try {
      return fn();
    } finally {
      if (norm) this._f32(this._finalNorm.ptr, this._finalNorm.n).set(saved);
    }
  }

  /** processors-v1 on one logits row (tests): {probs (V,) f32, probs64 (V,) f64, error_code} */
  processRow(logits, contextIds = [], policy = {}) {
    this._setPolicy(policy, contextIds, []);
    this._f32(this._logitsIn, this.vocabSize).set(logits);
    const status = this.wasm.draft_process(this._logitsIn, this._rowOut);
    if (status === 1) return { probs: null, probs64: null, error_code: "E_PROCESSOR_INVALID" };
    check(status, "process");
    return {
      probs: this._f32(this._rowOut, this.vocabSize).slice(),
      probs64: this._f64(this.wasm.draft_work(), this.vocabSize).slice(),
      error_code: "",
    };
  }

  /** Gumbel-max over float64 weights at (seed, domain, round, position) (tests); -1 if invalid.
   *  plain = true: the reference loop without the (exact) prunings. */
  sampleWeights(weights, seed, domain, roundId, position, plain = false) {
    const n = weights.length;
    if (!(n <= this._weightsCap)) {                 // grown on demand; the arena never shrinks
      this._weightsCap = Math.max(n, this.vocabSize);
      this._weights = this.wasm.draft_alloc(8 * this._weightsCap);   // (cap,) f64
      this._scratch = this.wasm.draft_alloc(8 * this._weightsCap + 16);   // (2 cap + 4,) int32 scratch
    }
    this._f64(this._weights, n).set(weights);
    return this.wasm.draft_sample(this._weights, n, seed[0] >>> 0, seed[1] >>> 0, domain, roundId >>> 0,
      position >>> 0, plain ? 0 : this._scratch);
  }
}

function check(status, what) {
  if (status === 0) return;
  throw new DraftError(wasmStatusCode(status), `draft ${what} failed (status ${status})`);
}
