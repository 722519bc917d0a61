// session.mjs — one request on the bridge: begin() once with the request's constant state (policy,
// draft policy, stop ids, seed, context), then one call per round that returns the round record
// (protocol.json round_record: the decision words the WGSL or C decider wrote, then status, timings
// and the proposals), then end(). docs/round.md draws the path.
//
// The committed context is mirrored here (Python's LogicalCache stays authoritative: each round
// passes its committed length, and a disagreement is E_CACHE_STATE), so per-round traffic is O(k).
// A round runs synchronously when everything under it can (a WASM champion, an inline draft, no
// fault armed): Python then gets the record without an event-loop hop; otherwise it returns a
// promise of it. Both go through the same code (`then` below), so there is one round, not two.
import { codedError, errorPayload } from "../protocol.mjs";
import { createGrammarRound } from "./grammar_round.mjs";

const EMPTY = new Int32Array(0);

/** Length of the common prefix of `held` (ids, or null) and ids[:upto]. */
function commonPrefix(held, ids, upto) {
  if (!held) return 0;
  const n = Math.min(held.length, upto);
  let i = 0;
  while (i < n && held[i] === ids[i]) i++;
  return i;
}

/** f(x), or x.then(f) when x is a promise: one code path for synchronous and asynchronous steps. */
const then = (x, f) => (x instanceof Promise ? x.then(f) : f(x));

/** fn(), with onError for a synchronous throw and a rejected promise alike. */
function attempt(fn, onError) {
  let r;
  try { r = fn(); } catch (err) { return onError(err); }
  return r instanceof Promise ? r.catch(onError) : r;
}

/** Committed token ids (a growing Int32Array) and how far each model has consumed them. */
class Mirror {
  constructor(ids) {
    this.ids = new Int32Array(Math.max(64, ids.length * 2));
    this.ids.set(ids);
    this.length = ids.length;
    this.championAt = 0;        // tokens ids[:championAt] are in the champion's KV cache
    this.draftAt = 0;           // ... and in the draft's
  }

  get committed() { return this.ids.subarray(0, this.length); }

  push(tokens) {
    if (this.length + tokens.length > this.ids.length) {
      const grown = new Int32Array(2 * (this.length + tokens.length));
      grown.set(this.committed);
      this.ids = grown;
    }
    this.ids.set(tokens, this.length);
    this.length += tokens.length;
  }

  /** A round whose result is not used: the pending token must be fed again (LogicalCache.abort). */
  abort() {
    this.championAt = Math.min(this.championAt, Math.max(this.length - 1, 0));
    this.draftAt = Math.min(this.draftAt, Math.max(this.length - 1, 0));
  }

  /** Keep n accepted proposals and the next token (LogicalCache.commit_prefix + append_authoritative). */
  commit(proposals, nAccepted, nextToken) {
    this.push(proposals.subarray(0, nAccepted));
    this.championAt = Math.min(this.championAt, this.length);
    this.draftAt = Math.min(this.draftAt, this.length);
    if (nextToken >= 0) this.push(Int32Array.of(nextToken));
  }
}

/**
 * -> a session over `env`: { champion(): the live champion backend (throws when lost),
 *   championError(err): err as the champion's failure (E_DEVICE_LOST when its device is gone),
 *   draft(): the live draft (throws E_DRAFT_LOST), draftCanRunNow(): whether it has proposeNow,
 *   cpuRound(useDraft): whether this round can be the CPU module's one call (the champion has
 *   roundNow and, for a draft round, the live draft lives in its instance), canRunNow(): whether synchronous calls are
 *   allowed now, hit(point, roundId): null or a promise (test faults), takeNaN(): whether a
 *   nan_champion fault is armed for this round, maxBlock, layout: roundRecordLayout(schema),
 *   held(): {champion, draft}: the ids whose K/V each model holds from the last request (null:
 *   unknown), keep(championIds, draftIds | undefined): what they hold when this session ends,
 *   constraint({key}): a new matcher of the compiled response_format `key` (bridge.compileConstraint) }.
 * `request`: {policy, draft_policy, stop_token_ids, seed: [lo, hi], context_ids, greedy, mode,
 *   prefix_reuse (default true), max_new_tokens (the K/V room reserved at begin), constraint
 *   (null, or {key}: a response_format compiled by the bridge; its rounds are grammar_round.mjs's)}.
 */
export function createSession(env, request) {
  const { layout } = env;
  const at = layout.at;
  const mirror = new Mirror(Int32Array.from(request.context_ids));
  const base = { policy: request.policy, seed: request.seed, stopTokenIds: request.stop_token_ids, greedy: !!request.greedy };
  const draftPolicy = request.draft_policy ?? request.policy;
  let lastFailure = null, ended = false, usesDraft = false;
  // how each round ran (receipts' stats): one call into the CPU module (a chain's steps counted
  // each), separate calls; chain_calls: calls that ran a chain of baseline steps
  const counts = { one_call_rounds: 0, separate_call_rounds: 0, chain_calls: 0 };

  const championFailed = (err) => {
    mirror.abort();
    throw env.championError(err);
  };

  /** The draft's proposal from its unconsumed ids -> {tokens, pDraft, error_code}. */
  function propose(k, roundId, sync) {
    const draft = env.draft();
    const n = mirror.length;
    const args = { feed: mirror.ids.slice(mirror.draftAt, n), startPos: mirror.draftAt, k, policy: draftPolicy,
      seed: base.seed, roundId, stopTokenIds: base.stopTokenIds, contextIds: mirror.committed };
    return then(sync ? draft.proposeNow(args) : draft.propose(args), (r) => {
      mirror.draftAt = n;             // the draft consumed its pending ids
      if (!r.error_code && r.tokens.length) mirror.draftAt = n + r.tokens.length - 1;
      return r;
    });
  }

  /** Lookup's proposals (given): one-hot p_draft rows, built only when sampling needs them. */
  function given(proposals) {
    const tokens = Int32Array.from(proposals);
    let pDraft = null;
    if (!base.greedy && tokens.length) {
      const V = env.champion().vocabSize;
      pDraft = new Float32Array(tokens.length * V);
      tokens.forEach((y, i) => { pDraft[i * V + y] = 1; });
    }
    return { tokens, pDraft, error_code: "" };
  }

  /** The champion over [pending, tokens] and the round's decision -> its decision words. */
  function verify(tokens, pDraft, roundId, remaining, sync) {
    const champ = env.champion();
    const n = mirror.length;
    const pending = mirror.ids.subarray(mirror.championAt, n);
    if (pending.length !== 1) throw codedError("E_CACHE_STATE", `the champion must have exactly one pending token, has ${pending.length}`);
    const feed = new Int32Array(1 + tokens.length);
    feed.set(pending);
    feed.set(tokens, 1);
    const start = mirror.championAt;
    const decideArgs = { nRows: feed.length, proposals: tokens, pDraft: base.greedy ? null : pDraft, contextIds: mirror.committed,
      policy: base.policy, seed: base.seed, roundId, stopTokenIds: base.stopTokenIds, remaining, greedy: base.greedy };
    return then(sync ? champ.forwardNow(feed, start) : champ.forward(feed, start), () => {
      mirror.championAt = n + tokens.length;
      if (env.takeNaN()) champ.injectNaN(feed.length);
      return then(sync ? champ.decideNow(decideArgs) : champ.decide(decideArgs), (words) => {
        if (champ.lost) throw codedError("E_DEVICE_LOST", "the champion's device was lost during verification");
        return words;
      });
    });
  }

  /** The round record from the decision words (null: the champion did not run); `forced`: the
   *  grammar-forced ids that opened the round (grammar_round.mjs). */
  function record(decision, tokens, status, draftMs, verifyMs, forced = EMPTY) {
    const out = new Int32Array(layout.fixed + forced.length + tokens.length);
    if (decision) out.set(decision.subarray(0, layout.decisionWords));
    else out[at.next_token] = out[at.rejected_at] = -1;    // the champion did not run: nothing decided
    out[at.status] = status;
    out[at.draft_us] = Math.round(draftMs * 1000);
    out[at.verify_us] = Math.round(verifyMs * 1000);
    out[at.n_proposed] = tokens.length;
    out[at.n_forced] = forced.length;
    out.set(forced, layout.fixed);
    out.set(tokens, layout.fixed + forced.length);
    return settle(out);
  }

  /** The mirror commits what a record decided (or aborts the round); -> the record. */
  function settle(out) {
    if (out[at.status] !== layout.status.draft_failed && out[at.decision_error] === 0) {
      const nForced = out[at.n_forced];
      mirror.push(out.subarray(layout.fixed, layout.fixed + nForced));
      mirror.commit(out.subarray(layout.fixed + nForced), out[at.n_accepted], out[at.next_token]);
    } else {
      mirror.abort();
    }
    return out;
  }

  // A response_format: its rounds compose the separate calls with a mask per row (grammar_round.mjs)
  const grammar = request.constraint ? createGrammarRound(env.constraint(request.constraint), {
    env, mirror, base, draftPolicy, record, then, attempt, championFailed, promptLength: mirror.length,
    forcedBatching: request.forced_batching !== false,
    setFailure: (err) => { lastFailure = errorPayload(err, "E_DRAFT_LOST"); } }) : null;

  // The CPU round in one call (wasm/cpu.c, champion_wasm/cpu_session.mjs): the WASM champion with
  // the draft loaded into its own instance. Its request state is set once (beginNow); a round that
  // took the separate calls (a fault was armed) leaves it stale, and the next one sets it again.
  let cpuBegun = false;
  function cpuBegin(champ) {
    if (!cpuBegun) {
      champ.beginNow({ policy: base.policy, draftPolicy, stopTokenIds: base.stopTokenIds, seed: base.seed,
        contextIds: mirror.committed, greedy: base.greedy });
      cpuBegun = true;
    }
  }
  function cpuRound(k, roundId, remaining, proposals, useDraft) {
    const champ = env.champion();
    cpuBegin(champ);
    const n = mirror.length;
    const out = champ.roundNow({ k, roundId, remaining, proposals: proposals == null ? null : Int32Array.from(proposals),
      champFeed: mirror.ids.slice(mirror.championAt, n), champStart: mirror.championAt,
      draftFeed: useDraft ? mirror.ids.slice(mirror.draftAt, n) : null, draftStart: mirror.draftAt });
    const status = out[at.status];
    if (status === layout.status.draft_failed) {
      lastFailure = champ.lastFailure() ?? { code: "E_DRAFT_LOST", message: "the draft failed" };
    } else {
      const m = out[at.n_proposed];
      mirror.championAt = n + m;
      if (useDraft) mirror.draftAt = status === layout.status.draft_invalid || m === 0 ? n : n + m - 1;
    }
    return settle(out);
  }

  return {
    /** Prefill: the champion (in blocks of maxBlock) and, for mode "draft", the draft consume all
     *  but the last context token (mode "auto": the draft catches up in its first draft round, so
     *  a request that never drafts never runs it), each after the ids it holds from the last
     *  request (prefix reuse). -> {draft_failure: null | {code, message}, reused: {champion,
     *  draft (null: no draft in this session)}} (the champion's failure throws). */
    async begin() {
      const upto = mirror.length - 1;
      // prefix reuse: each model starts after the ids it already holds (the longest common prefix
      // with the last request's, never the pending token); exact where positions' K/V do not
      // depend on their grouping, which the load's batch-invariance check established
      usesDraft = request.mode === "draft" || request.mode === "auto";
      const held = request.prefix_reuse === false ? {} : env.held?.() ?? {};
      mirror.championAt = commonPrefix(held.champion, mirror.ids, upto);    // <= upto
      if (usesDraft) mirror.draftAt = commonPrefix(held.draft, mirror.ids, upto);
      const reused = { champion: mirror.championAt, draft: usesDraft ? mirror.draftAt : null };
      env.keep?.(null, usesDraft ? null : undefined);   // unknown until end(): a failure may leave it half-written
      // the WASM champion's K/V caches grow on demand: room for the whole request at once
      const room = mirror.length + (request.max_new_tokens ?? 0) + env.maxBlock;
      await attempt(() => env.champion().reserve?.(room), championFailed);
      await env.hit("championForward", 0);
      while (mirror.championAt < upto) {
        const end = Math.min(upto, mirror.championAt + env.maxBlock);
        await attempt(() => env.champion().forward(mirror.ids.slice(mirror.championAt, end), mirror.championAt), championFailed);
        mirror.championAt = end;
      }
      if (request.mode !== "draft" || mirror.draftAt >= upto) return { draft_failure: null, reused };
      try {
        await env.hit("draftForward", 0);
        await env.draft().forward(mirror.ids.slice(mirror.draftAt, upto), mirror.draftAt);
        mirror.draftAt = upto;
      } catch (err) {
        return { draft_failure: errorPayload(err, "E_DRAFT_LOST"), reused };
      }
      return { draft_failure: null, reused };
    },

    /** One round -> the record (Int32Array), or a promise of it. k = 0: a baseline step;
     *  `proposals` (an array, or null): given proposals (prompt lookup) instead of the draft's. */
    round(k, roundId, remaining, nCommitted, proposals) {
      if (ended) throw codedError("E_CACHE_STATE", "round after the session ended");
      if (nCommitted !== mirror.length) {
        throw codedError("E_CACHE_STATE", `the caller has ${nCommitted} committed tokens, the session ${mirror.length}`);
      }
      const useDraft = proposals == null && k > 0;
      if (grammar) {
        counts.separate_call_rounds++;
        cpuBegun = false;
        return grammar.round(k, roundId, remaining, proposals, useDraft);
      }
      if (env.cpuRound(useDraft)) {
        counts.one_call_rounds++;
        return cpuRound(k, roundId, remaining, proposals, useDraft);
      }
      counts.separate_call_rounds++;
      cpuBegun = false;                 // the separate calls below change what cpu.c was told
      const sync = env.canRunNow() && (!useDraft || env.draftCanRunNow());
      const t0 = performance.now();
      const proposed = proposals != null ? given(proposals) : !useDraft ? { tokens: EMPTY, error_code: "" }
        : attempt(() => then(env.hit("draftPropose", roundId), () => propose(k, roundId, sync)), (err) => ({ failed: err }));
      return then(proposed, (p) => {
        const t1 = performance.now();
        if (p.failed) {
          lastFailure = errorPayload(p.failed, "E_DRAFT_LOST");
          return record(null, EMPTY, layout.status.draft_failed, t1 - t0, 0);
        }
        const invalid = !!p.error_code;
        const tokens = invalid ? EMPTY : p.tokens;
        const status = invalid ? layout.status.draft_invalid : layout.status.verified;
        const decided = attempt(() => then(env.hit("championRound", roundId), () => verify(tokens, p.pDraft, roundId, remaining, sync)),
          championFailed);
        return then(decided, (words) => record(words, tokens, status, t1 - t0, performance.now() - t1));
      });
    },

    /** Up to h baseline steps as one call into the CPU module (cpu_session.mjs chainNow) -> their
     *  records, concatenated (Int32Array, n x the fixed words; n < h when a step ended the answer
     *  or its decision failed). Where a round is not one CPU call (WebGPU, a fault armed, a
     *  response_format), one baseline step: round(0, ...)'s record. */
    chain(h, roundId, remaining, nCommitted) {
      if (grammar || h <= 1 || !env.cpuRound(false) || !env.champion().chainNow) {
        return this.round(0, roundId, remaining, nCommitted, null);
      }
      if (ended) throw codedError("E_CACHE_STATE", "round after the session ended");
      if (nCommitted !== mirror.length) {
        throw codedError("E_CACHE_STATE", `the caller has ${nCommitted} committed tokens, the session ${mirror.length}`);
      }
      const champ = env.champion();
      cpuBegin(champ);
      const n = mirror.length;
      const out = champ.chainNow({ h, roundId, remaining, champFeed: mirror.ids.slice(mirror.championAt, n),
        champStart: mirror.championAt });
      const steps = out.length / layout.fixed;
      counts.one_call_rounds += steps;
      counts.chain_calls++;
      for (let i = 0; i < steps; i++) {
        mirror.championAt = mirror.length;          // the step consumed the pending token
        settle(out.subarray(i * layout.fixed, (i + 1) * layout.fixed));
      }
      return out;
    },

    /** {code, message} of the last round whose draft failed (status draft_failed). */
    lastFailure: () => lastFailure,
    /** -> {one_call_rounds, separate_call_rounds, chain_calls}: rounds that were one call into the CPU module,
     *  and rounds composed of separate draft, forward and decide calls. */
    end() {
      if (!ended) env.keep?.(mirror.ids.slice(0, mirror.championAt), usesDraft ? mirror.ids.slice(0, mirror.draftAt) : undefined);
      if (!ended) grammar?.dispose();
      ended = true;
      return { ...counts };
    },
    get committedLength() { return mirror.length; },
  };
}
