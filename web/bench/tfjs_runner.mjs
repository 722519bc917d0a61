// tfjs_runner.mjs — one transformers.js runner (onnxruntime-web, WASM backend) in its own iframe of
// web/bench/peer.html (tools/bench/peer.py --tfjs): onnxruntime-web fixes its thread count when its
// WASM module starts, once per realm, so each thread count lives in a document of its own.
// Offline: transformers.js and onnxruntime-web's .wasm come from the bench server's /node_modules/
// mounts (build/tfjs/, tools/bench/setup_onnx.sh), the model from a local folder; nothing remote.
// Times are this document's performance.now(): first_token_ms = request start -> first generated
// token handed to the streamer; total_ms = request start -> generate() returned.
// window.tfjsRunner = {load, generate, unload}; window.tfjsReady once loaded.
const TRANSFORMERS = "/node_modules/@huggingface/transformers/dist/transformers.js";
const ORT_DIST = "/node_modules/onnxruntime-web/dist/";
let tf = null, model = null, tokenizer = null;

const coded = (err) => ({ code: err?.code ?? "E_INTERNAL", message: String(err?.message ?? err) });

/** Load the model folder at modelUrl ("/models/tfjs/": localModelPath "/models/", id "tfjs") with
 *  onnx dtype "fp32" | "int8" on `threads` WASM threads. -> {load_ms, threads, cross_origin_isolated,
 *  version} or {refused}. */
async function load(modelUrl, dtype, threads) {
  const t0 = performance.now();
  try {
    tf = await import(TRANSFORMERS);
    const { env } = tf;
    env.allowRemoteModels = false;
    env.allowLocalModels = true;
    env.useBrowserCache = false;
    env.useWasmCache = false;               // else a blob: module the page's CSP forbids
    const wasm = env.backends.onnx.wasm;
    wasm.wasmPaths = { mjs: ORT_DIST + "ort-wasm-simd-threaded.asyncify.mjs", wasm: ORT_DIST + "ort-wasm-simd-threaded.asyncify.wasm" };
    wasm.numThreads = threads;
    wasm.proxy = false;
    const trimmed = modelUrl.replace(/\/+$/, "");
    const cut = trimmed.lastIndexOf("/");
    env.localModelPath = trimmed.slice(0, cut + 1);
    const id = trimmed.slice(cut + 1);
    tokenizer = await tf.AutoTokenizer.from_pretrained(id);
    model = await tf.AutoModelForCausalLM.from_pretrained(id, { dtype, device: "wasm" });
    return { load_ms: performance.now() - t0, threads: wasm.numThreads, cross_origin_isolated: self.crossOriginIsolated,
             version: tf.env.version };
  } catch (err) {
    return { refused: coded(err) };
  }
}

/** One completion of `prompt`: from the token ids `ids` when given (our engine's prompt ids, so
 *  both sides continue the same input), else from the text as the model's own tokenizer encodes it
 *  (as a user of transformers.js would); prompt_ids is always that tokenizer's encoding of the
 *  text, for the check: with chat (the text is a rendered chat template, which holds its own
 *  special tokens) without adding special tokens, as transformers.js's apply_chat_template does. Greedy at temperature 0, else sampling from the full distribution at
 *  `temperature` (top_k 0, top_p 1; transformers.js samples with Math.random, no seed).
 *  -> {token_ids, prompt_ids, n_tokens, first_token_ms, total_ms} or {refused}. */
async function generate(prompt, { maxTokens = 32, temperature = 0, ids = null, chat = false } = {}) {
  try {
    const promptIds = Array.from(tokenizer(prompt, { add_special_tokens: !chat }).input_ids.data, Number);
    const input = ids ?? promptIds;
    const inputs = { input_ids: new tf.Tensor("int64", BigInt64Array.from(input, BigInt), [1, input.length]),
                     attention_mask: new tf.Tensor("int64", new BigInt64Array(input.length).fill(1n), [1, input.length]) };
    let tFirst = null, puts = 0;
    const streamer = { put() { if (puts++ === 1) tFirst = performance.now(); }, end() {} };   // put #0: the prompt
    const sampling = temperature > 0 ? { do_sample: true, temperature, top_k: 0, top_p: 1 } : { do_sample: false };
    const t0 = performance.now();
    const out = await model.generate({ ...inputs, max_new_tokens: maxTokens, ...sampling, streamer });
    const t1 = performance.now();
    const generated = Array.from(out.data, Number).slice(input.length);
    return { token_ids: generated, prompt_ids: promptIds, n_tokens: generated.length,
             first_token_ms: tFirst === null ? null : tFirst - t0, total_ms: t1 - t0 };
  } catch (err) {
    return { refused: coded(err) };
  }
}

async function unload() {
  await model?.dispose();
  model = null;
}

window.tfjsRunner = { load, generate, unload };
window.tfjsReady = true;
