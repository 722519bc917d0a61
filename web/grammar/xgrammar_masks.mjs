// xgrammar_masks.mjs — token masks of a response_format constraint from xgrammar (npm
// @mlc-ai/web-xgrammar 0.1.27, WASM), in a page, a module worker or Node. The CPython twin is
// py/exactspec/reference/xgrammar_masks.py (PyPI xgrammar 0.1.27); both build everything the same
// way, so a spec's masks are equal word for word (tests/test_grammar_masks.py; docs/grammar.md,
// "Masks"):
//   - one TokenizerInfo per tokenizer: encodedVocab = model.vocab and added_tokens of the
//     tokenizer.json in id order ("" for an id neither names, "" up to vocabSize: what Python's
//     TokenizerInfo.from_huggingface builds), byte_level, add_prefix_space false, vocabSize = the
//     model's vocabulary rows, the given stop ids;
//   - a spec is parsed into a Grammar (fromJSONSchema / fromStructuralTag / fromEBNF /
//     builtinJSONGrammar), then compiled with compileGrammar (xgrammar's cache off: the context
//     caches per spec); a regex is the structural tag {type: "regex", pattern} (no compileRegex).
//
// Why every spec is first parsed on a separate "validator" instance: the WASM build has no C++
// exceptions, so a grammar xgrammar refuses ends in abort(): a RuntimeError whose text is only
// "Aborted()", xgrammar's message printed through console.error, and the instance's stack pointer
// never restored (each abort leaks stack; a few thousand corrupt the memory: wrong masks, then
// traps), and a refused spec compiled through the compiler's cache hangs the next time it is asked
// (an unfinished cache entry). So the validator parses untrusted text, its console output is
// captured for the message, and an instance that aborted is dropped (the next spec gets a fresh
// one); the instance that holds the tokenizer and the matchers only ever sees text the validator
// parsed. Whoever creates an xgrammar handle releases it: matcher.dispose(), context.dispose().
import { codedError } from "../protocol.mjs";

export const XGRAMMAR_VERSION = "0.1.27";
export const JSON_SCHEMA_OPTIONS = Object.freeze({ anyWhitespace: false, indent: -1, separators: [", ", ": "], strictMode: true });
// indent -1: "no indent" in the JS API (None in Python): one line, separators as given.
const SPEC_FIELDS = { json_schema: ["schema"], regex: ["pattern"], grammar: ["ebnf", "root"], json_object: [] };
const MAX_MESSAGE_CHARS = 200;
const BUNDLE = "@mlc-ai/web-xgrammar/lib/index.js";
const DEFAULT_URL = new URL("../../node_modules/@mlc-ai/web-xgrammar/lib/index.js", import.meta.url).href;
const isNode = typeof process === "object" && typeof process.versions?.node === "string" && typeof window === "undefined";

// ---------------------------------------------------------------- instances

let loadQueue = Promise.resolve();   // imports one at a time (the bundle writes globalThis.xgrammar)
let instanceCount = 0;
let shared = null;                   // Promise<instance>: the one loadXGrammar() gives
let validator = null;                // Promise<instance> | null: parses specs; dropped after an abort

async function evaluateBundle(url, fresh) {
  if (isNode) {
    const { readFileSync } = await import("node:fs");
    const { createRequire } = await import("node:module");
    const { fileURLToPath } = await import("node:url");
    const here = createRequire(import.meta.url);
    const path = url === DEFAULT_URL ? here.resolve("@mlc-ai/web-xgrammar") : fileURLToPath(url);
    // lib/index.js is a UMD bundle in a "type": "module" package: Node would run it as ESM, where
    // its `require` is undefined; evaluated as CommonJS it fills module.exports (a new instance
    // each time)
    const module = { exports: {} };
    new Function("exports", "module", "require", "__filename", "__dirname", readFileSync(path, "utf8"))(
      module.exports, module, createRequire(path), path, path.slice(0, path.lastIndexOf("/")));
    return module.exports;
  }
  // in a page or a module worker the UMD bundle, imported as a module, sets globalThis.xgrammar;
  // a fresh instance needs a new module record, hence a query on the URL
  const before = globalThis.xgrammar;
  await import(fresh ? `${url}${url.includes("?") ? "&" : "?"}instance=${fresh}` : url);
  const xg = globalThis.xgrammar;
  if (fresh) globalThis.xgrammar = before;
  return xg;
}

async function newInstance(url, fresh) {
  const run = loadQueue.then(async () => {
    let xg;
    try {
      xg = await evaluateBundle(url, fresh);
    } catch (e) {
      throw codedError("E_MODEL_LOAD", `xgrammar (${BUNDLE}) did not load: ${e?.message ?? e}`);
    }
    if (!xg || typeof xg.GrammarCompiler?.createGrammarCompiler !== "function") {
      throw codedError("E_MODEL_LOAD", `xgrammar (${BUNDLE}) loaded without its API`);
    }
    // The WASM module binds its stderr (console.error) when it starts, on its first call: bind it
    // to a sink that captures xgrammar's messages while we call it and forwards them otherwise.
    const sink = { lines: null };
    const original = console.error;
    console.error = function xgrammarStderr(...args) {
      if (sink.lines) sink.lines.push(args.map(String).join(" "));
      else original.apply(console, args);
    };
    try {
      (await xg.Grammar.builtinJSONGrammar()).dispose();
    } finally {
      console.error = original;
    }
    return { xg, sink, aborted: false, classes: null };
  });
  loadQueue = run.catch(() => {});
  return run;
}

/** The xgrammar module object (Grammar, GrammarCompiler, GrammarMatcher, TokenizerInfo, ...), loaded
 *  once: in Node from node_modules, in a page or worker from `url` (the dev server serves
 *  /node_modules/@mlc-ai/web-xgrammar/lib/). */
export async function loadXGrammar(url = DEFAULT_URL) {
  return (await sharedInstance(url)).xg;
}

function sharedInstance(url = DEFAULT_URL) {
  shared ??= newInstance(url, 0).catch((e) => { shared = null; throw e; });
  return shared;
}

/** Run `fn` (sync or async) on an instance with its stderr captured; a throw becomes an Error whose
 *  message is xgrammar's in one sentence (.xgrammarAbort: the instance aborted, it is spent). */
async function captured(inst, fn) {
  inst.sink.lines = [];
  try {
    return await fn(inst.xg);
  } catch (e) {
    const abort = e instanceof WebAssembly.RuntimeError || /Aborted\(/.test(String(e?.message ?? e));
    if (abort) inst.aborted = true;
    const text = inst.sink.lines.find((l) => l.includes("[FATAL]")) ?? inst.sink.lines[0] ?? String(e?.message ?? e);
    throw Object.assign(new Error(xgrammarSentence(text)), { xgrammarAbort: abort });
  } finally {
    inst.sink.lines = null;
  }
}

// ---------------------------------------------------------------- pure helpers (the Python twin has each)

/** xgrammar's message as one sentence: the log prefix ([time] or [FATAL], source file:line, "Check
 *  failed: ... is false:") dropped, the first line, cut after its first sentence, at most 200
 *  characters (xgrammar_sentence in Python: both sides name a bad constraint in the same words). */
export function xgrammarSentence(text) {
  const lines = String(text).split(/\r?\n/).map((l) => l.trim()).filter(Boolean);
  let line = lines.find((l) => l.includes("[FATAL]")) ?? lines[0] ?? "";
  if (line.includes("[FATAL]")) line = line.slice(line.indexOf("[FATAL]"));
  line = line.replace(/^(?:\[FATAL\]\s*|\[[0-9:]+\]\s*)?(?:\S+\.(?:cc|h|cpp):\d+:\s*)?(?:Check failed: .*? is false:\s*)?/, "").trim();
  const m = /^([\s\S]*?[.!?])(?=\s|$)/.exec(line);
  let sentence = m ? m[1] : line;
  // Python counts code points: so do we
  const chars = [...sentence];
  if (chars.length > MAX_MESSAGE_CHARS) sentence = chars.slice(0, MAX_MESSAGE_CHARS - 3).join("") + "...";
  return sentence || "xgrammar refused it";
}

function sortedKeys(value) {
  if (Array.isArray(value)) return value.map(sortedKeys);
  if (value && typeof value === "object") {
    const out = {};
    for (const k of Object.keys(value).sort()) out[k] = sortedKeys(value[k]);
    return out;
  }
  return value;
}

/** The cache key of a spec: its JSON with sorted keys. */
export function canonicalSpecJSON(spec) {
  return JSON.stringify(sortedKeys(spec));
}

/** The structural tag a regex spec compiles as (JSON text; the Python twin writes the same). */
export function regexStructuralTag(pattern) {
  return JSON.stringify({ type: "structural_tag", format: { type: "regex", pattern } });
}

/** The spec's type, after checking its shape (the fields of its type, strings). */
export function checkSpec(spec) {
  const shown = (() => { try { return JSON.stringify(spec)?.slice(0, 80); } catch { return String(spec); } })();
  if (!spec || typeof spec !== "object" || Array.isArray(spec) || !Object.hasOwn(SPEC_FIELDS, spec.type)) {
    throw codedError("E_BAD_ARGUMENT", `a constraint spec must be an object with type one of ${Object.keys(SPEC_FIELDS).join(", ")}, got ${shown}`);
  }
  const kind = spec.type;
  const fields = SPEC_FIELDS[kind];
  const extra = Object.keys(spec).filter((k) => k !== "type" && !fields.includes(k)).sort();
  const missing = fields.filter((f) => !(f in spec) && !(kind === "grammar" && f === "root"));
  if (extra.length || missing.length) {
    throw codedError("E_BAD_ARGUMENT", `a ${kind} spec has the fields ${["type", ...fields].join(", ")}` +
      (extra.length ? `; unknown: ${extra.join(", ")}` : "") + (missing.length ? `; missing: ${missing.join(", ")}` : ""));
  }
  for (const f of fields) {
    if (f in spec && typeof spec[f] !== "string") throw codedError("E_BAD_ARGUMENT", `a ${kind} spec's ${f} must be a string`);
  }
  return kind;
}

/** The token strings of a tokenizer.json in id order: model.vocab, then added_tokens (an added
 *  token wins its id), "" for an id neither names; length = the largest id + 1. */
export function encodedVocab(tokenizerJson) {
  const vocab = tokenizerJson?.model?.vocab;
  if (!vocab || typeof vocab !== "object" || Array.isArray(vocab)) {
    throw codedError("E_BAD_ARGUMENT", "the tokenizer.json has no model.vocab object (a BPE tokenizer is needed)");
  }
  const byId = new Map();
  for (const [token, id] of Object.entries(vocab)) byId.set(Number(id), token);
  for (const added of tokenizerJson.added_tokens ?? []) byId.set(Number(added.id), added.content);
  let max = -1;
  for (const id of byId.keys()) {
    if (!Number.isInteger(id) || id < 0) throw codedError("E_BAD_ARGUMENT", "the tokenizer.json's vocabulary is empty or has a negative id");
    if (id > max) max = id;
  }
  if (max < 0) throw codedError("E_BAD_ARGUMENT", "the tokenizer.json's vocabulary is empty or has a negative id");
  const out = new Array(max + 1).fill("");
  for (const [id, token] of byId) out[id] = token;
  return out;
}

/** How many ids a mask allows. */
export function countAllowed(mask) {
  let count = 0;
  for (let w = 0; w < mask.length; w++) {
    let x = mask[w] >>> 0;
    x -= (x >>> 1) & 0x55555555;
    x = (x & 0x33333333) + ((x >>> 2) & 0x33333333);
    count += (((x + (x >>> 4)) & 0x0f0f0f0f) * 0x01010101) >>> 24;
  }
  return count;
}

/** The one id a mask allows, or -1 when it allows none or several. */
export function onlyAllowed(mask) {
  let only = -1;
  for (let w = 0; w < mask.length; w++) {
    const x = mask[w] >>> 0;
    if (!x) continue;
    if (only >= 0 || (x & (x - 1)) !== 0) return -1;
    only = w * 32 + (31 - Math.clz32(x));
  }
  return only;
}

/** The ids a mask allows, ascending. */
export function allowedIds(mask) {
  const out = [];
  for (let w = 0; w < mask.length; w++) {
    let x = mask[w] >>> 0;
    while (x) {
      const low = x & -x;
      out.push(w * 32 + (31 - Math.clz32(low)));
      x = (x ^ low) >>> 0;
    }
  }
  return out;
}

const checkStops = (stops, count) => {
  if (!Array.isArray(stops) || !stops.length || !stops.every((i) => Number.isInteger(i) && i >= 0 && i < count)) {
    throw codedError("E_BAD_ARGUMENT", `stopTokenIds must be ids of the tokenizer, got ${JSON.stringify(stops)}`);
  }
  return stops.slice();
};
const sameIds = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// The matcher works synchronously (a round asks a mask per row): the JS API's createGrammarMatcher
// and getNextTokenBitmask are async only to await the module's start, and the WASM classes
// they call are not exported. Both are reached through a first matcher made the async way: its
// handle's constructor is the WASM GrammarMatcher class, and the bitmask it returns is a
// VectorInt (embind: size(), get(i), push_back(x), delete()). Found once an instance.
async function bindingClasses(inst, compiler, vocabSize) {
  if (inst.classes) return inst.classes;
  const { xg } = inst;
  const grammar = await xg.Grammar.fromEBNF('root ::= "a"', "root");
  let compiled = null, probe = null, vec = null;
  try {
    compiled = await compiler.compileGrammar(grammar);
    probe = await xg.GrammarMatcher.createGrammarMatcher(compiled, undefined, false, -1);
    vec = probe.handle.GetNextTokenBitmask(vocabSize);
    inst.classes = { Matcher: probe.handle.constructor, VectorInt: vec.constructor };
  } finally {
    vec?.delete();
    probe?.dispose();
    compiled?.dispose();
    grammar.dispose();
  }
  if (typeof inst.classes.Matcher !== "function" || typeof inst.classes.VectorInt !== "function") {
    throw codedError("E_INTERNAL", "xgrammar's WASM classes were not found (not web-xgrammar 0.1.27?)");
  }
  return inst.classes;
}

// ---------------------------------------------------------------- the context

/** One tokenizer's TokenizerInfo and GrammarCompiler (in the shared instance), with the compiled
 *  specs cached. `vocabSize`: the model's vocabulary rows (>= the tokenizer's ids). */
export async function createGrammarContext(tokenizerJson, { vocabSize, stopTokenIds, url = DEFAULT_URL } = {}) {
  const vocab = encodedVocab(tokenizerJson);
  const tokenizerCount = vocab.length;
  if (!Number.isInteger(vocabSize) || vocabSize < tokenizerCount) {
    throw codedError("E_BAD_ARGUMENT", `vocabSize ${vocabSize} is below the tokenizer's ${tokenizerCount} ids`);
  }
  const stops = checkStops(stopTokenIds, tokenizerCount);
  const inst = await sharedInstance(url);
  await validatorInstance(url);   // started now, not on the first compile (its time is load time)
  const { xg } = inst;
  // (createTokenizerInfo copies the vocabulary into a WASM vector it never frees: ~1 MB for 49k
  // tokens, once a context)
  // padded with "" to vocabSize, as the Python TokenizerInfo.from_huggingface does (pads are special ids)
  const padded = vocabSize > tokenizerCount ? vocab.concat(new Array(vocabSize - tokenizerCount).fill("")) : vocab;
  const tokenizerInfo = await xg.TokenizerInfo.createTokenizerInfo(padded, "byte_level", false, vocabSize, stops);
  let compiler;
  try {
    compiler = await xg.GrammarCompiler.createGrammarCompiler(tokenizerInfo, false);
    await bindingClasses(inst, compiler, vocabSize);
  } catch (e) {
    compiler?.dispose();
    tokenizerInfo.dispose();
    throw e;
  }
  return new GrammarContext({ inst, url, tokenizerInfo, compiler, vocabSize, tokenizerCount, stops });
}

/** Parse `spec` into a Grammar of `xg` (the caller disposes it). */
async function grammarOf(xg, spec) {
  switch (spec.type) {
    case "json_schema": {
      const o = JSON_SCHEMA_OPTIONS;
      return xg.Grammar.fromJSONSchema(spec.schema, o.anyWhitespace, o.indent, o.separators, o.strictMode);
    }
    case "regex": return xg.Grammar.fromStructuralTag(regexStructuralTag(spec.pattern));
    case "grammar": return xg.Grammar.fromEBNF(spec.ebnf, spec.root ?? "root");
    default: return xg.Grammar.builtinJSONGrammar();
  }
}

class GrammarContext {
  #inst; #url; #tokenizerInfo; #compiler; #cache = new Map(); #queue = Promise.resolve(); #disposed = false;

  constructor({ inst, url, tokenizerInfo, compiler, vocabSize, tokenizerCount, stops }) {
    this.#inst = inst;
    this.#url = url;
    this.#tokenizerInfo = tokenizerInfo;
    this.#compiler = compiler;
    this.vocabSize = vocabSize;
    this.tokenizerCount = tokenizerCount;
    this.nWords = Math.ceil(vocabSize / 32);
    this.stopTokenIds = stops;
  }

  /** {compiled, compileMs, cached}: the spec compiled for this tokenizer, cached per spec (its
   *  canonical JSON). A spec xgrammar refuses throws E_BAD_ARGUMENT naming the problem. */
  compile(spec) {
    const run = this.#queue.then(() => this.#compile(spec));
    this.#queue = run.catch(() => {});
    return run;
  }

  async #compile(spec) {
    const t0 = performance.now();
    this.#live();
    const kind = checkSpec(spec);
    const key = canonicalSpecJSON(spec);
    const hit = this.#cache.get(key);
    if (hit) return { compiled: hit, compileMs: performance.now() - t0, cached: true };
    await validate(spec, this.#url);
    let compiled;
    try {
      compiled = await captured(this.#inst, async (xg) => {
        const grammar = await grammarOf(xg, spec);
        try {
          return await this.#compiler.compileGrammar(grammar);
        } finally {
          grammar.dispose();
        }
      });
    } catch (e) {
      // the validator parsed it, so this is not the spec's text: the instance is spent
      if (this.#inst.aborted && shared && (await shared) === this.#inst) shared = null;
      throw codedError("E_INTERNAL", `the ${kind} constraint parsed but did not compile: ${e.message}`);
    }
    this.#cache.set(key, compiled);
    return { compiled, compileMs: performance.now() - t0, cached: false };
  }

  #live() {
    if (this.#disposed) throw codedError("E_BAD_ARGUMENT", "the grammar context was disposed");
    if (this.#inst.aborted) {
      throw codedError("E_INTERNAL", "the grammar context's xgrammar instance aborted; create a new context");
    }
  }

  /** A matcher at the start of `compiled` (stop ids: the context's unless given). Synchronous. */
  matcher(compiled, { stopTokenIds } = {}) {
    this.#live();
    const stops = stopTokenIds === undefined ? this.stopTokenIds : checkStops(stopTokenIds, this.tokenizerCount);
    const { Matcher, VectorInt } = this.#inst.classes;
    const override = new VectorInt();
    let handle;
    try {
      for (const id of stops) override.push_back(id);
      // (GrammarMatcher.createGrammarMatcher's own call: compiled, stop ids, terminate without a
      // stop token: no, max rollback: unlimited)
      handle = new Matcher(compiled.handle, override, false, -1);
    } finally {
      override.delete();
    }
    return new GrammarMatcher(new this.#inst.xg.GrammarMatcher(handle, this.vocabSize), this);
  }

  /** Release the compiled specs, the compiler and the TokenizerInfo (matchers: their own dispose). */
  dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const compiled of this.#cache.values()) compiled.dispose();
    this.#cache.clear();
    this.#compiler.dispose();
    this.#tokenizerInfo.dispose();
  }
}

/** Parse `spec` on the validator instance; E_BAD_ARGUMENT naming the problem when xgrammar refuses
 *  it (and the validator, having aborted, is dropped: the next spec gets a fresh instance). */
function validatorInstance(url) {
  if (!validator) {
    const fresh = ++instanceCount;
    validator = newInstance(url, fresh).catch((e) => { validator = null; throw e; });
  }
  return validator;
}

async function validate(spec, url) {
  const inst = await validatorInstance(url);
  try {
    await captured(inst, async (xg) => (await grammarOf(xg, spec)).dispose());
  } catch (e) {
    if (inst.aborted && validator && (await validator) === inst) validator = null;
    throw codedError("E_BAD_ARGUMENT", `the ${spec.type} constraint does not compile: ${e.message}`);
  }
}

// ---------------------------------------------------------------- the matcher

class GrammarMatcher {
  #matcher; #context;

  constructor(matcher, context) {
    this.#matcher = matcher;    // xgrammar's GrammarMatcher (JS class over the WASM handle)
    this.#context = context;
    this.steps = 0;             // tokens accepted and not rolled back: the most rollback(n) may undo
  }

  #live() {
    if (!this.#matcher) throw codedError("E_BAD_ARGUMENT", "the grammar matcher was disposed");
    return this.#matcher;
  }

  /** The ids allowed at the current state: Uint32Array(nWords), bit (id & 31) of word (id >> 5);
   *  ids at or beyond the tokenizer's own count are never allowed; none once terminated. */
  mask() {
    const matcher = this.#live();
    const { nWords, tokenizerCount, vocabSize } = this.#context;
    const words = new Uint32Array(nWords);
    if (matcher.isTerminated()) return words;
    const vec = matcher.handle.GetNextTokenBitmask(vocabSize);
    try {
      const n = vec.size();
      if (n !== nWords) throw codedError("E_INTERNAL", `xgrammar gave a mask of ${n} words, ${nWords} expected`);
      for (let w = 0; w < n; w++) words[w] = vec.get(w);
    } finally {
      vec.delete();
    }
    if (tokenizerCount < vocabSize) {
      let w = tokenizerCount >>> 5;
      const bit = tokenizerCount & 31;
      if (bit) words[w++] &= (2 ** bit - 1) >>> 0;
      words.fill(0, w);
    }
    return words;
  }

  /** Advance by one token; false (state unchanged) when the constraint does not allow it. */
  accept(id) {
    const matcher = this.#live();
    if (!Number.isInteger(id) || id < 0 || id >= this.#context.tokenizerCount || matcher.isTerminated()) return false;
    const ok = matcher.acceptToken(id);
    if (ok) this.steps++;
    return ok;
  }

  /** Undo the last n accepted tokens (0 <= n <= steps). */
  rollback(n) {
    const matcher = this.#live();
    if (!Number.isInteger(n) || n < 0 || n > this.steps) {
      throw codedError("E_BAD_ARGUMENT", `rollback(${n}): the matcher holds ${this.steps} accepted tokens`);
    }
    if (n) {
      matcher.rollBack(n);
      this.steps -= n;
    }
  }

  /** True once a stop token was accepted. */
  terminated() {
    return this.#live().isTerminated();
  }

  /** Release the xgrammar matcher. */
  dispose() {
    if (this.#matcher) this.#matcher.dispose();
    this.#matcher = null;
  }
}
