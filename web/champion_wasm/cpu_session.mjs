// cpu_session.mjs — the CPU round as one call (wasm/cpu.c): the WASM champion and, loaded into the
// same instance, the WASM draft; per-request state set once (beginNow), then one roundNow per round,
// which returns the whole round record (protocol.json round_record: 13 fixed words + the proposals).
//   const champion = await createWasmChampion({ ..., draft: { modelUrl } });    // one instance
//   champion.beginNow({ policy, draftPolicy, stopTokenIds, seed: [lo, hi], contextIds, greedy });
//   const record = champion.roundNow({ k, roundId, remaining, proposals: null, champFeed, champStart,
//                                      draftFeed, draftStart });                // Int32Array
// Three kinds of round: the draft proposes (proposals null, k > 0), given proposals (prompt lookup:
// one-hot rows), none (k = 0: a baseline step). The context marks of the repetition penalty live in
// C from beginNow on: each round adds its committed tokens (accepted + next), so no round re-sends
// the context. A run of baseline steps can be one call too: chainNow({h, ...}) -> h records.
// docs/champion_wasm.md, "CPU round".
import { codedError } from "../protocol.mjs";
import { statusError } from "./cpu_module.mjs";
import { wasmStatusCode } from "../wasm_status.mjs";
import { checkedPolicy } from "../sampling_policy.mjs";

const FIXED_WORDS = 13;                          // REC_FIXED_WORDS (protocol.json round_record; test_cpu_module checks)
const STATUS_WORD = 8, N_PROPOSED_WORD = 11;     // REC_STATUS, REC_N_PROPOSED
const DRAFT_FAILED = 2;                          // round_record.status.draft_failed
/** The most baseline steps one chainNow runs (its records' buffer). */
export const MAX_CHAIN = 32;

const badArgument = (message) => codedError("E_BAD_ARGUMENT", message);
const isUint = (v, limit) => Number.isInteger(v) && v >= 0 && v < limit;

export class CpuSession {
  /** champion: a WasmChampion; draft: a Draft loaded into the champion's instance, or null. */
  constructor(champion, draft = null) {
    this.champion = champion;
    this.draft = draft;
    this.begun = false;
    this._failure = null;
    const B = champion.maxBlock;
    this._record = champion._alloc(4 * (FIXED_WORDS + B));       // (13 + B,) int32
    this._given = champion._alloc(4 * B);                        // (B,) int32
    this._champFeed = champion._alloc(4 * B);                    // (B,) int32
    this._draftFeedCap = 0;
  }

  get _wasm() { return this.champion._liveExports(); }

  _ints(ptr, values) {
    const view = this.champion._view(Int32Array, ptr, values.length);
    for (let i = 0; i < values.length; i++) view[i] = Number(values[i]);
    return values.length;
  }

  /** The request's state, once: policies (the champion's; the draft's), stop ids, seed, the
   *  committed context (its ids become the repetition penalty's marks), greedy. */
  beginNow({ policy, draftPolicy = null, stopTokenIds = [], seed = [0, 0], contextIds = [], greedy = false }) {
    const V = this.champion.vocabSize;
    const p = checkedPolicy(policy, V);
    const d = checkedPolicy(draftPolicy ?? policy, V);
    const [lo, hi] = seed;
    if (!isUint(lo, 2 ** 32) || !isUint(hi, 2 ** 32)) throw badArgument(`seed: ${seed}`);
    const context = Array.from(contextIds || [], Number);
    for (const id of context) if (!isUint(id, V)) throw badArgument(`context_ids: ${id}`);
    const stops = Array.from(stopTokenIds || [], Number);
    // the arena never frees: one scratch area per call, sized by this request, taken once and reused
    const lists = [p.suppress_token_ids, p.allowed_token_ids ?? [], d.suppress_token_ids, d.allowed_token_ids ?? [], stops, context];
    const need = lists.reduce((n, l) => n + l.length + 4, 0);
    if (!(need <= (this._scratchCap ?? 0))) {
      this._scratchCap = Math.max(need, 2 * (this._scratchCap ?? 0), 4096);
      this._scratch = this.champion._alloc(4 * this._scratchCap);
    }
    let at = this._scratch;
    const put = (list) => { const ptr = at; this._ints(ptr, list); at += 4 * (list.length + 1); return ptr; };
    const [pS, pA, dS, dA, pStops, pContext] = lists.map(put);
    this.begun = false;
    const status = this._wasm.cpu_begin(p.temperature, p.top_k, p.top_p, p.repetition_penalty,
      pS, p.suppress_token_ids.length, pA, p.allowed_token_ids === null ? -1 : p.allowed_token_ids.length,
      d.temperature, d.top_k, d.top_p, d.repetition_penalty,
      dS, d.suppress_token_ids.length, dA, d.allowed_token_ids === null ? -1 : d.allowed_token_ids.length,
      pStops, stops.length, lo >>> 0, hi >>> 0, pContext, context.length, greedy ? 1 : 0);
    if (status !== 0) throw statusError(status, "cpu begin");
    this.begun = true;
    this._failure = null;
  }

  /** One round -> Int32Array: the whole record (13 fixed words + n_proposed ids; the one-call round forces none), a copy.
   *  proposals: given ids (prompt lookup) or null (the draft proposes up to k; k = 0: a baseline
   *  step). champFeed: the champion's pending token at champStart; draftFeed: the draft's
   *  not-yet-fed ids at draftStart (draft rounds only). */
  roundNow({ k, roundId, remaining, proposals = null, champFeed, champStart, draftFeed = null, draftStart = 0 }) {
    const wasm = this._wasm;
    if (!this.begun) throw badArgument("roundNow before beginNow");
    const V = this.champion.vocabSize, B = this.champion.maxBlock;
    if (proposals) k = proposals.length;
    if (!(Number.isInteger(k) && k >= 0 && k + 1 <= B)) throw badArgument(`k ${k} outside [0, ${B - 1}]`);
    if (!isUint(roundId ?? 0, 2 ** 32)) throw badArgument(`roundId: ${roundId}`);
    if (k > 0 && !(Number.isInteger(remaining) && remaining >= k)) throw badArgument(`remaining: ${remaining} < k ${k}`);
    if (!champFeed || champFeed.length !== 1) throw codedError("E_CACHE_STATE", "the champion must have exactly one pending token");
    const cached = this.champion.nCached;
    if (!(Number.isInteger(champStart) && champStart >= 0 && champStart <= cached)) {
      throw badArgument(`champStart ${champStart} outside [0, ${cached}]`);
    }
    if (champStart + k + 1 > this.champion.maxContext) {
      throw codedError("E_CONTEXT_OVERFLOW", `positions up to ${champStart + k + 1} exceed maxContext ${this.champion.maxContext}`);
    }
    if (!isUint(Number(champFeed[0]), V)) throw badArgument(`token id ${champFeed[0]} outside [0, ${V})`);
    this._ints(this._champFeed, champFeed);
    let given = 0, draftPtr = 0, nDraft = 0;
    if (proposals) {
      for (const y of proposals) if (!isUint(Number(y), V)) throw badArgument(`proposals: ${y}`);
      given = this._given;
      this._ints(given, proposals);
    } else if (k > 0) {
      if (!this.draft) throw codedError("E_DRAFT_LOST", "no draft model loaded in the CPU module");
      nDraft = draftFeed ? draftFeed.length : 0;
      if (nDraft < 1) throw badArgument("draftFeed: the draft needs its pending id(s)");
      if (!(Number.isInteger(draftStart) && draftStart >= 0)) throw badArgument(`draftStart: ${draftStart}`);
      for (const t of draftFeed) if (!isUint(Number(t), V)) throw badArgument(`draft token id ${t} outside [0, ${V})`);
      if (nDraft > this._draftFeedCap) {
        this._draftFeedCap = Math.max(nDraft, 2 * this._draftFeedCap, 64);
        this._draftFeed = this.champion._alloc(4 * this._draftFeedCap);
      }
      draftPtr = this._draftFeed;
      this._ints(draftPtr, draftFeed);
    }
    this._failure = null;
    const call = () => wasm.cpu_round(k, (roundId ?? 0) >>> 0, Math.min(remaining ?? 0x7fffffff, 0x7fffffff), given,
      this._champFeed, 1, champStart, draftPtr, nDraft, draftStart, this._record);
    const status = draftPtr && this.draft ? this.draft.withArmedFault(call) : call();
    if (status !== 0) throw statusError(status, "cpu round");
    const head = this.champion._view(Int32Array, this._record, FIXED_WORDS);
    const record = this.champion._view(Int32Array, this._record, FIXED_WORDS + head[N_PROPOSED_WORD]).slice();
    if (record[STATUS_WORD] === DRAFT_FAILED) {
      const code = wasmStatusCode(wasm.cpu_draft_failure()) || "E_INTERNAL";
      this._failure = { code, message: `the draft failed in round ${roundId ?? 0} (${code})` };
    }
    return record;
  }

  /** A chain of up to h baseline steps in one call (wasm/cpu_chain) -> Int32Array (n, 13): each
   *  step's whole record (k = 0), a copy; n <= h, fewer when a step ended the answer (a stop id,
   *  the length) or its decision failed: that step is the last. Step i is round roundId + i with
   *  remaining - i left, fed the previous step's next token; champFeed: the pending token at champStart. */
  chainNow({ h, roundId, remaining, champFeed, champStart }) {
    const wasm = this._wasm;
    if (!this.begun) throw badArgument("chainNow before beginNow");
    const V = this.champion.vocabSize;
    if (!(Number.isInteger(h) && h >= 1 && h <= MAX_CHAIN)) throw badArgument(`h ${h} outside [1, ${MAX_CHAIN}]`);
    if (!isUint(roundId ?? 0, 2 ** 32)) throw badArgument(`roundId: ${roundId}`);
    if (!(Number.isInteger(remaining) && remaining >= 1)) throw badArgument(`remaining: ${remaining}`);
    if (!champFeed || champFeed.length !== 1) throw codedError("E_CACHE_STATE", "the champion must have exactly one pending token");
    const cached = this.champion.nCached;
    if (!(Number.isInteger(champStart) && champStart >= 0 && champStart <= cached)) {
      throw badArgument(`champStart ${champStart} outside [0, ${cached}]`);
    }
    const steps = Math.min(h, remaining);
    if (champStart + steps > this.champion.maxContext) {
      throw codedError("E_CONTEXT_OVERFLOW", `positions up to ${champStart + steps} exceed maxContext ${this.champion.maxContext}`);
    }
    if (!isUint(Number(champFeed[0]), V)) throw badArgument(`token id ${champFeed[0]} outside [0, ${V})`);
    this._chain ??= this.champion._alloc(4 * FIXED_WORDS * MAX_CHAIN);    // (MAX_CHAIN, 13) int32
    this._failure = null;
    const n = wasm.cpu_chain(steps, (roundId ?? 0) >>> 0, remaining, Number(champFeed[0]), champStart, this._chain);
    if (n < 0) throw statusError(-n, "cpu chain");
    return this.champion._view(Int32Array, this._chain, n * FIXED_WORDS).slice();
  }

  /** {code, message} when the last round's record says draft_failed, else null. */
  lastFailure() { return this._failure; }

  /** Fault injection (tests): the next round's champion rows 0..nRows-1 are NaN after its forward. */
  injectNaN(nRows) { this._wasm.cpu_inject_nan(nRows); }
}
