// Live statistics of one answer, from its "tokens" events (pure: the page passes the clock).
//   const live = createLiveStats(t0);  live.onTokens(payload, now);  live.snapshot(now, result?)
// snapshot: tokens/s, time to first token, the survival curve S_i (fraction of speculative rounds
// whose first i proposals were all accepted), accepted tokens per round, and the latency
// waterfall. While streaming, prefill is the first token's wait less its round's draft and
// verify time; after the result, the orchestrator's own timing_ms replaces every estimate. Under
// speculate "auto", `auto` is the last round's choice (round.auto; a final last-token round skipped)
// and `autoCounts` its rounds by method.

import { countMethods } from "./auto_panel.mjs";

export const SOURCES = ["accepted", "correction", "extra", "baseline"];

export function createLiveStats(t0) {
  const st = { t0, firstTokenAt: null, tokens: 0, rounds: [], bySource: Object.fromEntries(SOURCES.map((s) => [s, 0])) };
  return {
    onTokens(payload, now) {
      if (st.firstTokenAt === null) st.firstTokenAt = now;
      st.tokens += payload.token_ids.length;
      for (const s of payload.sources ?? []) if (s in st.bySource) st.bySource[s]++;
      if (payload.round) st.rounds.push({ ...payload.round, emitted: payload.token_ids.length });
    },
    snapshot(now, result = null) { return snapshotOf(st, now, result); },
  };
}

/** S_i for i = 0..maxK from per-round {proposed, accepted} (rounds that proposed nothing skipped). */
export function survivalCurve(rounds) {
  const spec = rounds.filter((r) => r.proposed > 0);
  if (!spec.length) return [];
  const maxK = Math.max(...spec.map((r) => r.proposed));
  return Array.from({ length: maxK + 1 }, (_, i) => spec.filter((r) => r.accepted >= i).length / spec.length);
}

/** Waterfall segments [{label, ms}] in the order they happen: load stages, then the answer's. */
export function waterfall(loadTiming, answer) {
  const load = loadTiming ?? {};
  const segs = [
    ["Pyodide start", load.pyodide], ["Python install", load.install], ["model checks", load.check],
    ["champion load", load.champion_load], ["champion warm-up", load.champion_warmup], ["draft load", load.draft_load],
    ["warm-up", load.warmup], ["calibration", load.calibration],
    ["prefills", answer.prefill], ["draft", answer.draft], ["verify", answer.verify],
    ["sampling", answer.sampling], ["sync / other", answer.sync],
  ];
  return segs.filter(([, ms]) => Number.isFinite(ms) && ms > 0).map(([label, ms]) => ({ label, ms }));
}

/** The latest round's auto choice; at the answer's end, the last one that was weighed (a final
 *  "last_token" round, champion alone by necessity, does not hide what auto was doing). */
function lastChoice(rounds) {
  const autos = rounds.filter((r) => r.auto).map((r) => r.auto);
  return autos.findLast((a) => a.reason !== "last_token") ?? autos.at(-1) ?? null;
}

function snapshotOf(st, now, result) {
  const elapsed = Math.max(0, now - st.t0);
  const draft = st.rounds.reduce((a, r) => a + (r.draft_ms ?? 0), 0);
  const verify = st.rounds.reduce((a, r) => a + (r.verify_ms ?? 0), 0);
  const ttft = st.firstTokenAt === null ? null : st.firstTokenAt - st.t0;
  const first = st.rounds[0];
  let answer = { prefill: ttft === null ? elapsed : Math.max(0, ttft - (first ? (first.draft_ms ?? 0) + (first.verify_ms ?? 0) : 0)),
    draft, verify, sampling: 0 };
  answer.sync = Math.max(0, elapsed - answer.prefill - draft - verify);
  const t = result?.timing_ms;
  if (t && Number.isFinite(t.total)) {      // the orchestrator's own clock, once the answer is over
    answer = { prefill: t.prefill, draft: t.draft, verify: t.verify, sampling: t.accept };
    answer.sync = Math.max(0, t.total - t.prefill - t.draft - t.verify - t.accept);
  }
  const decodeMs = ttft === null ? 0 : elapsed - ttft;
  return {
    tokens: st.tokens,
    rounds: st.rounds.reduce((a, r) => a + (r.steps ?? 1), 0),   // a chain's event: its steps (rounds)
    ttftMs: t?.first_token ?? ttft,
    tokensPerS: st.tokens > 1 && decodeMs > 0 ? (1000 * (st.tokens - 1)) / decodeMs : null,
    acceptedPerRound: st.rounds.map((r) => r.accepted),
    proposedPerRound: st.rounds.map((r) => r.proposed),
    survival: survivalCurve(st.rounds),
    bySource: { ...st.bySource },
    auto: lastChoice(st.rounds),
    autoCounts: countMethods(st.rounds),
    answer,
  };
}
