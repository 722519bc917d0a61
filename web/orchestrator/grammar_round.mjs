// grammar_round.mjs — one round of a request with a response_format: xgrammar's masks on this side
// of the round contract (web/grammar/xgrammar_masks.mjs has no Pyodide twin to run in Python).
// The round opens with the forced ids (while the constraint leaves exactly one valid id that is
// not a stop id: committed without a decision), then the proposals, each valid in turn (the draft
// proposes one step at a time under its step's mask; given proposals are cut at the first id the
// constraint forbids), then ONE champion block [pending, forced..., proposals...] decided on its
// last rows with one mask per row. The matcher follows: it holds the committed answer between
// rounds, and a round rolls back what the decision did not keep. docs/grammar.md, "Rounds".
import { codedError } from "../protocol.mjs";

const bit = (words, id) => (words[id >>> 5] >>> (id & 31)) & 1;

/** Ids set in `words` (Uint32Array) -> count; and the one id when there is exactly one, else -1. */
function census(words) {
  let count = 0, only = -1;
  for (let w = 0; w < words.length; w++) {
    let x = words[w];
    while (x) {
      const low = x & -x;
      if (++count === 1) only = w * 32 + (31 - Math.clz32(low));
      x ^= low;
      if (count > 1) return { count: 2, only: -1 };
    }
  }
  return { count, only };
}

/** Given proposals (prompt lookup's, searched on the committed ids) after a forced run: the part
 *  after the forced ids when they begin with them, else none (backends.py given_after_forced). */
export function givenAfterForced(proposals, forced) {
  for (let i = 0; i < forced.length; i++) if (proposals[i] !== forced[i]) return [];
  return proposals.slice(forced.length);
}

/**
 * -> {round(k, roundId, remaining, proposals, useDraft) -> record | promise, dispose()} for one
 * request. `matcher`: web/grammar/xgrammar_masks.mjs's (mask(), accept(id), rollback(n)), at the
 * start of the answer; `s`: the session's pieces {env, mirror, base, draftPolicy, record, given,
 * then, attempt, championFailed, setFailure}.
 */
export function createGrammarRound(matcher, s) {
  const { env, mirror, base } = s;
  const V = env.champion().vocabSize;
  const nWords = Math.ceil(V / 32);
  // the policy's suppressed ids (and padding), and the special tokens a constrained answer never holds
  const suppressed = new Uint32Array(nWords);
  for (const id of [...(base.policy.suppress_token_ids ?? []), ...(matcher.excludedIds ?? [])]) {
    suppressed[id >>> 5] |= (1 << (id & 31)) >>> 0;
  }
  const stops = new Set(base.stopTokenIds ?? []);
  const open = new Uint32Array(nWords).fill(0xffffffff); // the row after a stop id: never decided on
  let tentative = 0;                                      // ids the matcher holds beyond the committed answer
  const room = env.maxBlock - 1;                          // ids after the pending one in one champion block

  /** The ids valid now: the matcher's mask without the suppressed ones. */
  function validNow() {
    if (matcher.terminated()) return open;
    const mask = matcher.mask();
    const valid = new Uint32Array(nWords);
    for (let w = 0; w < nWords; w++) valid[w] = mask[w] & ~suppressed[w];
    return valid;
  }
  function accept(id) {
    if (!matcher.accept(id)) throw codedError("E_INTERNAL", `the matcher refused id ${id}, which its own mask allowed`);
    tentative++;
  }
  /** Back to the committed answer, then forward over what the round committed. */
  function settleMatcher(out) {
    const { at, status, fixed } = env.layout;
    matcher.rollback(tentative);
    tentative = 0;
    if (out[at.status] === status.draft_failed || out[at.decision_error] !== 0) return out;
    const nForced = out[at.n_forced];
    for (let i = 0; i < nForced + out[at.n_accepted]; i++) accept(out[fixed + i]);
    if (out[at.next_token] >= 0) accept(out[at.next_token]);
    tentative = 0;
    return out;
  }

  function round(k, roundId, remaining, proposals, useDraft) {
    const t0 = performance.now();
    // 1. the forced run
    const forced = [];
    let valid = validNow();
    for (;;) {
      const { count, only } = census(valid);
      if (count === 0) {
        matcher.rollback(tentative);
        tentative = 0;
        throw codedError("E_GRAMMAR_DEAD_END", `the response_format allows no token after ${mirror.length - s.promptLength + forced.length} answer tokens`);
      }
      // at most remaining - 1 (a decided row follows), and a block of at most maxBlock rows
      if (count > 1 || forced.length >= (s.forcedBatching ? Math.min(remaining - 1, room) : 0) || stops.has(only)) break;
      accept(only);
      forced.push(only);
      valid = validNow();
    }
    const rid = roundId + forced.length, rem = remaining - forced.length;
    const capacity = Math.max(0, Math.min(rem - 1, room - forced.length));   // proposals the block can hold
    k = Math.min(k, capacity);
    const rowMasks = [valid];
    const context = () => { const c = new Int32Array(mirror.length + forced.length + tokens.length);
      c.set(mirror.committed); c.set(forced, mirror.length); c.set(tokens, mirror.length + forced.length); return c; };
    let tokens = [], pDraftRows = [], status = env.layout.status.verified;
    const keep = (y, row) => {
      accept(y);
      tokens.push(y);
      if (row) pDraftRows.push(row);
      valid = stops.has(y) ? open : validNow();
      rowMasks.push(valid);
    };
    // 2. the proposals, each valid in turn
    if (proposals != null) {
      for (const y of givenAfterForced(proposals, forced).slice(0, k)) {
        if (!bit(valid, y)) break;
        keep(y, null);
      }
    } else if (useDraft && k > 0) {
      const proposed = s.attempt(() => s.then(env.hit("draftPropose", roundId), () => draftSteps(k, capacity, rid, forced, context,
        keep, () => valid, () => { status = env.layout.status.draft_invalid; })), (err) => ({ failed: err }));
      return s.then(proposed, (p) => {
        if (p && p.failed) {
          matcher.rollback(tentative);
          tentative = 0;
          s.setFailure(p.failed);
          return s.record(null, new Int32Array(0), env.layout.status.draft_failed, performance.now() - t0, 0);
        }
        return verify(t0, roundId, rid, rem, forced, tokens, pDraftRows, rowMasks, status);
      });
    }
    return verify(t0, roundId, rid, rem, forced, tokens, pDraftRows, rowMasks, status);
  }

  /** The draft, one step at a time under each step's mask (k = 1 calls, step counters 0, 1, ...:
   *  the draws one k-call would make). A step whose mask leaves one id (the draft can only propose
   *  it, and it is accepted whenever the steps before it are) does not count against k; at most
   *  `capacity` proposals in all. -> null, or a promise of it (a draft in its worker). */
  function draftSteps(k, capacity, rid, forced, context, keep, validOf, invalid) {
    const draft = env.draft();
    const sync = typeof draft.proposeNow === "function" && env.canRunNow();
    const n = mirror.length;
    let feed = new Int32Array(n - mirror.draftAt + forced.length);
    feed.set(mirror.ids.subarray(mirror.draftAt, n));
    feed.set(forced, n - mirror.draftAt);
    let startPos = mirror.draftAt;
    let counted = 0;
    const step = (i) => {
      if (counted >= k || i >= capacity) return null;
      const single = census(validOf()).count === 1;
      const args = { feed, startPos, k: 1, policy: s.draftPolicy, seed: base.seed, roundId: rid,
        stopTokenIds: base.stopTokenIds, contextIds: context(), firstStep: i, maskBits: validOf() };
      return s.then(sync ? draft.proposeNow(args) : draft.propose(args), (r) => {
        startPos += feed.length;
        mirror.draftAt = startPos;     // the draft consumed its feed; its last proposal is pending
        if (r.error_code) {            // a step the draft cannot propose under its mask: stop here
          if (i === 0) invalid();
          return null;
        }
        const y = r.tokens[0];
        if (!bit(validOf(), y)) throw codedError("E_INTERNAL", `the draft proposed id ${y} outside its mask`);
        keep(y, r.pDraft.slice(0, V));
        if (!single) counted++;
        if (stops.has(y)) return null;
        feed = Int32Array.of(y);
        return step(i + 1);
      });
    };
    return step(0);
  }

  function verify(t0, roundId, rid, rem, forced, tokens, pDraftRows, rowMasks, status) {
    const t1 = performance.now();
    const tokensI = Int32Array.from(tokens), forcedI = Int32Array.from(forced);
    let pDraft = null;
    if (!base.greedy && tokens.length) {
      pDraft = new Float32Array(tokens.length * V);
      tokens.forEach((y, i) => { if (pDraftRows.length) pDraft.set(pDraftRows[i], i * V); else pDraft[i * V + y] = 1; });
    }
    // 3. one champion block: [pending, forced..., proposals...], decided on its last rows
    const masks = new Uint32Array(rowMasks.length * nWords);
    rowMasks.forEach((m, i) => masks.set(m, i * nWords));
    const champ = env.champion();
    const n = mirror.length;
    const pending = mirror.ids.subarray(mirror.championAt, n);
    if (pending.length !== 1) throw codedError("E_CACHE_STATE", `the champion must have exactly one pending token, has ${pending.length}`);
    const feed = new Int32Array(1 + forced.length + tokens.length);
    feed.set(pending);
    feed.set(forcedI, 1);
    feed.set(tokensI, 1 + forced.length);
    const start = mirror.championAt;
    const contextIds = new Int32Array(n + forced.length);
    contextIds.set(mirror.committed);
    contextIds.set(forcedI, n);
    const decideArgs = { nRows: tokens.length + 1, proposals: tokensI, pDraft, contextIds, policy: base.policy, seed: base.seed,
      roundId: rid, stopTokenIds: base.stopTokenIds, remaining: rem, greedy: base.greedy, rowOffset: forced.length, rowMasks: masks,
      logitsRows: feed.length };
    const failed = (err) => { matcher.rollback(tentative); tentative = 0; return s.championFailed(err); };
    const decided = s.attempt(() => s.then(env.hit("championRound", roundId), () => s.then(champ.forward(feed, start), () => {
      mirror.championAt = n + forced.length + tokens.length;
      if (env.takeNaN()) champ.injectNaN(feed.length);
      return champ.decide(decideArgs);
    })), failed);
    return s.then(decided, (words) => {
      if (champ.lost) return failed(codedError("E_DEVICE_LOST", "the champion's device was lost during verification"));
      return settleMatcher(s.record(words, tokensI, status, t1 - t0, performance.now() - t1, forcedI));
    });
  }

  return { round, dispose: () => matcher.dispose?.() };
}
