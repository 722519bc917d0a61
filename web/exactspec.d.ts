// Type declarations of web/exactspec.mjs, the embeddable exactspec engine.

export type ErrorCode = `E_${string}`;

/** Every failure: a code from py/exactspec/core/protocol.json "errors" and a plain sentence. */
export interface CodedError extends Error { code: ErrorCode; detail?: string }

/** A URL (a folder, or a file ending in .gguf), a picked folder, or a picked .gguf File: champion or draft. */
export type ModelSource = string | FileList | File[] | File | null;

export type LoadProgress =
  | { stage: "prepare"; what: string; done: boolean }
  | { stage: "python" | "check" | "models" | "warmup" | "calibrate" }
  /** The device was calibrated again after ready (drift, a late draft): ready.info.calibration is replaced. */
  | { stage: "calibration"; calibration: Calibration | { error: string; key: string | null } }
  /** cache (weight files): "hit" (from the weight cache, the server's validators unchanged), "hit-offline"
   *  (the server could not be reached), "miss" (from the network, stored as it was read), "not-stored"
   *  (no length, or not enough storage quota); absent for other files, and with cache: false. */
  | { stage: "fetch" | "convert"; url: string; name: string; loaded: number; total: number; done: boolean;
      cache?: "hit" | "hit-offline" | "miss" | "not-stored" }
  /** A cached weight file failed its sha256 check: it was removed, and the load runs once more from the network. */
  | { stage: "cache"; evicted: string }
  /** draftInBackground: the draft arrived after ready (draft null and draft_error set if it failed). */
  | { stage: "draft_ready"; draft: Record<string, unknown> | null; draft_error: { code: ErrorCode; message: string } | null;
      draft_load_ms: number };

export interface EngineOptions {
  champion?: ModelSource;               // default: the shipped champion (models/champion/ under baseUrl)
  draft?: ModelSource;                  // default: the shipped draft; null: champion alone
  manifest?: string | null;             // a pair manifest URL; null: none (the pair is still checked)
  championBackend?: "auto" | "webgpu" | "wasm";
  /** WASM champion threads: "auto" (min(cores, 4) in a cross-origin isolated page, kept only when
   *  timed faster at load; else 1) or a count (docs/browser.md, "Threads"). */
  threads?: "auto" | number;
  /** The champion's quantised matmul: "q8act" (q8act-v1, weights in their blocks,
   *  docs/quant_kernels.md), "f32" (the float function, blocks dequantised at load), "auto" (on the
   *  WASM champion q8act where the weights allow it; on WebGPU the float kernels, docs/gpu.md).
   *  ready.info.champion.matmul says which ran. */
  matmul?: "auto" | "q8act" | "f32";
  draftPlacement?: "auto" | "inline" | "worker";
  /** Ready as soon as the champion is; the draft loads when the engine is idle and follows
   *  ("draft_ready" progress, then a calibration). Until then speculate "auto" runs without it and
   *  "draft" waits for it. Default true in createEngine (docs/browser.md, "Usable as soon as the champion is"). */
  draftInBackground?: boolean;
  /** The load's warm-up requests through every mode (default true; ready.timing_ms.warmup). */
  warmUp?: boolean | { minCalls?: number; budgetMs?: number };
  /** This device's costs for speculate "auto", after the warm-up (docs/browser.md, "Calibration at
   *  load"): "auto" (default) from the IndexedDB cache or measured within 300 ms; "force" measured
   *  anew; "off" none (auto then starts from its conservative default). */
  calibrate?: "auto" | "force" | "off";
  /** The verified weight cache (docs/browser.md, "Weight cache"): weight files read from Cache Storage
   *  when their server still serves the same file (or cannot be reached), keyed by sha256 and checked on
   *  read; kept there when read from the network. Default true; false: neither read nor written. */
  cache?: boolean;
  /** The WebGPU champion's memory budget in bytes (0: none; "auto", the default: half of
   *  navigator.deviceMemory, none where the browser does not say): a plan over it is refused before
   *  the weights are fetched, E_OUT_OF_MEMORY naming the maxContext that would fit; under
   *  championBackend "auto" the WASM champion runs instead (ready.info.champion_fallback). */
  gpuMemoryBudget?: "auto" | number;
  whenBusy?: "queue" | "refuse";
  baseUrl?: string;                     // the folder holding exactspec.mjs (default: import.meta.url's)
  assets?: Partial<Record<"worker" | "pyodide" | "py" | "pyFiles" | "protocol" | "build" | "models" | "snapshot" | "xgrammar", string>>;
  timeoutMs?: number;
  /** A running request that hears nothing from the engine's worker for this long rejects
   *  E_TIMEOUT and ends the engine (later calls: E_TERMINATED saying why). Default 300000. */
  silenceTimeoutMs?: number;
  onProgress?: (progress: LoadProgress) => void;
}

/** Every option is type-checked before the request queues (py/exactspec/core/protocol.json
 *  "generate_config"): integers must be integers, numbers finite, flags booleans; anything else
 *  is refused E_BAD_ARGUMENT naming the option and the value. */
export interface GenerateOptions {
  chat?: boolean;                       // a text prompt in the model's chat template (its text never read as special tokens)
  /** A text prompt whose special-token markers (<|im_end|>, ...) stay ordinary text. Default false:
   *  without chat, markers written in the prompt are control tokens, as transformers reads them. */
  raw_text?: boolean;
  /** Default "auto": per round, champion alone, prompt lookup or the draft (and k) by expected cost
   *  per token on this device's calibration, with a margin (docs/core.md); round.auto says what it chose. */
  speculate?: "auto" | "none" | "draft" | "lookup";
  k?: number;                           // ignored under "auto" (it picks k in 0..min(8, max_k))
  scheduler?: "static" | "adaptive";   // adaptive: a k <= k per round (py/exactspec/core/scheduler.py)
  temperature?: number;                 // 0: greedy
  top_k?: number;
  top_p?: number;
  repetition_penalty?: number;
  seed?: number;
  max_new_tokens?: number;
  /** Default true: each model starts from the K/V it holds for the longest common prefix of the
   *  previous request's ids and this prompt (a chat's history is not recomputed); exact, the
   *  tokens equal a fresh request's (docs/core.md "Prefix reuse"). stats.prompt_reused says how many. */
  prefix_reuse?: boolean;
  stop_strings?: string[];
  stop_token_ids?: number[];
  suppress_token_ids?: number[];
  allowed_token_ids?: number[];          // non-empty; leave it out to allow every token
  /** Structured output (docs/grammar.md): the answer is constrained token by token with xgrammar,
   *  the champion's rows and the draft's alike, so it stays exact; ids the constraint leaves alone
   *  are "forced" and verified in one block with the proposals. Refused E_BAD_ARGUMENT before any
   *  output when too large or deep, a nested-quantifier regex, a grammar without a root rule, or
   *  one no token can start; an answer that reaches a dead end ends E_GRAMMAR_DEAD_END. Not with
   *  allowed_token_ids. */
  response_format?: ResponseFormat | null;
  /** Default true: forced ids go to the champion in the round's block; false decides each as its
   *  own row (the same tokens; for measuring what the batching gains). */
  forced_batching?: boolean;
  silenceTimeoutMs?: number;            // this request's limit on the worker's silence (EngineOptions)
}

export type ResponseFormat =
  | { type: "json_schema"; schema: Record<string, unknown> | string }   // an object, or its JSON text
  | { type: "regex"; pattern: string }
  | { type: "grammar"; ebnf: string }                                   // xgrammar EBNF with a `root` rule
  | { type: "json_object" };

/** One turn of a conversation (roles: protocol.json generate_request.messages.roles). */
export interface ChatMessage { role: "system" | "user" | "assistant" | "tool"; content: string }

/** forced: the only token the response_format allowed there (committed without a decision) */
export type TokenSource = "accepted" | "correction" | "extra" | "baseline" | "forced";

export interface TokensEvent {
  kind: "tokens";
  payload: {
    token_ids: number[]; text: string; sources: TokenSource[];
    round: { proposed: number; accepted: number; forced: number; draft_ms: number; verify_ms: number };
  };
}
export interface OtherEvent { kind: "progress" | "error"; payload: Record<string, unknown> }
export type GenerateEvent = TokensEvent | OtherEvent;

/** Privacy-safe: identities, hashes, counts, timings and codes; never text or token ids. */
export type Receipt = Record<string, string | number | number[] | Record<string, number>>;

export interface GenerateResult {
  text: string;
  token_ids: number[];
  prompt_ids: number[];
  finish_reason: "eos" | "stop" | "length" | "cancelled" | "error";
  stats: Record<string, unknown> & {
    rounds: number; proposed: number; accepted: number; baseline_steps: number;
    accepted_count_histogram: number[]; rejection_position_histogram: number[];
    /** the most bytes one round moved between Python and JS (docs/round.md: O(k), not O(context)) */
    round_bytes_max: number;
    /** how the rounds ran: one call into the CPU module (WASM champion, draft in its instance), or
     *  composed of separate draft, forward and decide calls */
    session: { one_call_rounds: number; separate_call_rounds: number };
    /** prompt ids each model started from the K/V of the engine's previous request (prefix_reuse);
     *  draft null when the request's session had no draft */
    prompt_reused: { champion: number; draft: number | null };
    /** ids the response_format forced (0 without one) */
    forced: number;
    /** a request with a response_format: its type and hash, the compile's time (cached: this
     *  engine had compiled it before) and the forced count */
    structured?: { type: ResponseFormat["type"]; sha256: string; compile_ms: number; cached: boolean; forced: number };
  };
  /** prefill, draft, verify, total, first_token, decode, per_round {draft, verify}, and phases
   *  {choose, call, commit, emit, pause}: the decode rounds' wall time by part (docs/core.md) */
  timing_ms: Record<string, number | null | Record<string, number>>;
  error: { code: ErrorCode; message: string } | null;
  receipt: Receipt;
}

/** This device's calibration (web/orchestrator/calibrate.mjs); times in ms. */
export interface Calibration {
  version: 1; key: string; source: "measured" | "cache"; measured_at: string; ms: number; backend: "wasm" | "webgpu";
  verify_ms: (number | null)[];         // [null, V1..V9]: a verification of n rows (pending + n - 1 proposals), decided
  verify_sampled_extra_ms_per_row: number | null;
  measured_n: number[];                 // the n timed; the rest interpolated
  draft_ms_per_proposal: number | null; draft_catchup_ms_per_token: number | null; lookup_ms: number | null;
  budget_ms: number; skipped: string[]; // what the budget left untimed
  cache?: "hit" | "miss" | "stale" | "unavailable";   // ready.info only; stale: the cached entry's V(1) disagreed with now
  spot_check?: { v1_ms: number; ratio: number };    // a cached entry's check (V(1) timed at this load)
}

/** Bytes of the champion's weights file the load held in JS memory at most: a streamed load (both
 *  backends, from a URL) holds one tensor's staging buffer, a 128 KiB read and any slice it converts
 *  (ratio: peak / the largest tensor it had to hold); streamed false: the file was held whole. */
export interface LoadTransient { peak: number; largest_tensor: number | null; ratio: number | null; streamed: boolean }

export interface ReadyInfo {
  timing_ms: Record<string, number>;
  info: {
    champion: { backend: "webgpu" | "wasm"; backend_why: string; identity: string; vocab_size: number; max_context: number;
                matmul: "q8act-v1" | "f32" | null; weight_bytes: number | null;   // the matmul function; WASM: weight bytes held
                simd: "relaxed" | "simd128" | null;                                // WASM: the module build (relaxed SIMD where it is right)
                load_transient: LoadTransient | null;                              // what the load held of the weights' file in JS
                gpu_memory_budget?: { bytes: number; source: "option" | "deviceMemory" | "none" };   // WebGPU (and a fallback from it)
                threads?: number; threads_why?: string;                            // WASM: threads in use, and the plan / calibration
                warmup_ms?: { forwards_ms: number; calibrate_ms: number } };       // WASM: the champion's warm forwards, calibration
    draft: { identity: string; placement: "inline" | "worker" } | null;
    draft_error: { code: ErrorCode; message: string } | null;
    draft_loading: boolean;             // draftInBackground: true until "draft_ready"
    pyodide_snapshot: string;           // "used", or why Pyodide booted the ordinary way
    chat_template: boolean;             // the champion has a chat template (a conversation can be sent)
    warmup: { requests: number; rounds: number; tokens: number; errors: string[] } | null;   // null: warmUp false
    /** null with calibrate "off"; {error, key} when measuring failed (the load still succeeds) */
    calibration: Calibration | { error: string; key: string | null } | null;
    /** The load-time batch-invariance check of the champion that runs (docs/browser.md, "Batch invariance at load"). */
    batch_check: BatchCheck;
    /** null, or: auto's WebGPU champion was batch-variant here, or its plan exceeded gpuMemoryBudget
     *  (refused before its weights were fetched), so the WASM champion runs (receipts: champion_fallback_code). */
    champion_fallback: { code: "E_BATCH_VARIANT"; message: string; from: "webgpu"; batch_check: BatchCheck }
      | { code: "E_OUT_OF_MEMORY"; message: string; from: "webgpu"; gpu_memory_budget: { bytes: number; source: string } } | null;
  };
}

/** A block of `positions` against the same positions one by one, logits compared as bits; ms. */
export interface BatchCheck {
  backend: "webgpu" | "wasm"; positions: number; ms: number;
  result: "invariant" | "variant" | "unchecked";          // unchecked: a context too short for a block of 2
  first_mismatch: { position: number; index: number } | null;
}

export interface ExactSpecEngine {
  readonly ready: ReadyInfo;
  /** prompt: text; token ids; or a conversation, rendered by the model's chat template with
   *  message text never read as special tokens (for token ids and a conversation, chat and
   *  raw_text do not apply). */
  generate(prompt: string | number[] | ChatMessage[], options?: GenerateOptions, onEvent?: (event: GenerateEvent) => void): Promise<GenerateResult>;
  cancel(): boolean;
  memory(): Promise<Record<string, number | string | boolean>>;
  load(models: Pick<EngineOptions, "champion" | "draft" | "manifest">, options?: Pick<EngineOptions, "championBackend" | "threads" | "matmul" | "draftPlacement" | "onProgress" | "warmUp" | "calibrate" | "cache" | "gpuMemoryBudget">): Promise<ReadyInfo>;
  terminate(): Promise<void>;
}

export function createEngine(options?: EngineOptions): Promise<ExactSpecEngine>;
/** py/exactspec/formats/model_files.json (the one table of a model folder's files), from the Python package's folder URL. */
export function loadModelFiles(pyUrl: string): Promise<ModelFileTable>;
export interface ModelFileTable { required: string[]; optional: string[]; run_artifact: { champion: string; draft: string } }
export function folderFiles(role: "champion" | "draft", files: FileList | File[], table: ModelFileTable, converted?: Blob | null): Record<string, File | Blob>;
/** By file names: a champion folder holding a Hugging Face checkpoint but no model.q8.safetensors, or a sharded draft folder. */
export function needsConversion(role: "champion" | "draft", files: FileList | File[]): boolean;
/** A draft folder that is sharded or whose model.safetensors is not all F32 (its header is read). */
export function draftNeedsConversion(files: FileList | File[]): Promise<boolean>;
/** Convert such a folder to its role's run artifact in a worker (as `exactspec convert [--role draft]` does). */
export function convertFolder(role: "champion" | "draft", files: FileList | File[], options?: { onProgress?: (p: LoadProgress) => void; workerUrl?: string; runArtifact?: string }): Promise<Blob>;
/** convertFolder("champion", ...): model.q8.safetensors. */
export function convertChampion(files: FileList | File[], options?: { onProgress?: (p: LoadProgress) => void; workerUrl?: string }): Promise<Blob>;
/** generate()'s option names from protocol.json (`schema`: the parsed py/exactspec/core/protocol.json):
 *  `config`, its generate_config options; `fields`, the request's flags (chat, raw_text). */
export function optionNames(schema: object): { config: string[]; fields: string[] };
/** generate()'s arguments as a generate request, sorted by protocol.json (`schema`). */
export function requestPayload(prompt: string | number[] | ChatMessage[], options: GenerateOptions | undefined, schema: object): object;
export function codedError(code: ErrorCode, message: string): CodedError;

/** One file in the verified weight cache. */
export interface CachedModel {
  sha256: string;                       // its key: the sha256 of its bytes
  bytes: number;
  name: string | null;                  // the last two segments of the newest URL it was stored from
  urls: string[];                       // every URL it is served for
  stored_at: string | null;             // ISO time
}
/** The weight files this origin has cached, largest first. */
export function listCachedModels(): Promise<CachedModel[]>;
/** Forget one cached file and its URLs (by sha256), or all of them (null). A malformed sha256 is E_BAD_ARGUMENT. */
export function forgetCachedModel(sha256: string | null): Promise<void>;
