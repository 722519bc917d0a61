// cpu_harness.mjs — the CPU round (roundNow, web/champion_wasm/cpu_session.mjs) against the
// composition of the separate calls (draft propose, champion forward, champion decide) on separate
// instances, for tests/test_cpu_module.py (Node):
//
//   node web/tests/cpu_harness.mjs cases.json out.json
//
// cases.json: {wasm, fused_wasm, fused_threads, champion_dir, draft_dir, max_block, runs: [{policy, draft_policy, greedy, seed,
//   prompt, stops, max_new, rounds: [{kind: "draft" | "lookup" | "baseline", k, lookup, nan_draft}],
//   mutate: "" | "context_without_next"}], statuses: bool}
// fused_wasm / fused_threads: the module and thread count of the instance that runs roundNow
// (default: wasm, 1); the composition always runs on `wasm`, one thread.
// statuses: the raw statuses both halves' exports return for the same failures (fresh instances),
// each with the code the one JS table (web/wasm_status.mjs) gives it. failures: bad calls and
// failing rounds -> [what, thrown code | {status, n_proposed, decision_error, next_token, failure}].
// -> {runs: [{fused: [record...], composed: [record...], timing: [[kind, draft_us, verify_us]...]}]}:
// records as int arrays, the timing words (draft_us, verify_us) zeroed in both (timing: roundNow's). mutate makes the composition deliberately wrong (its context
// misses the latest next token), which the comparison must catch.
import { readFileSync } from "node:fs";
import path from "node:path";
import { createWasmChampion } from "../champion_wasm/champion_wasm.mjs";
import { createDraft } from "../draft/draft.mjs";
import { RECORD } from "./champion_harness.mjs";
import { WASM_STATUS, wasmStatusCode } from "../wasm_status.mjs";
import { cpuImports } from "../champion_wasm/cpu_module.mjs";
import { validatedConfigFromJson } from "../formats/model_config.mjs";

const AT = RECORD.at;

function loadChampion(wasm, dir, maxBlock, draftDir = null, threads = 1) {
  return createWasmChampion({ threads,
    wasmBytes: readFileSync(wasm), configJson: validatedConfigFromJson(readFileSync(path.join(dir, "config.json"))),
    weightsBytes: new Uint8Array(readFileSync(path.join(dir, "model.q8.safetensors"))), maxBlock,
    draft: draftDir ? draftSource(draftDir) : null,
  });
}

function draftSource(dir) {
  return { configJson: validatedConfigFromJson(readFileSync(path.join(dir, "config.json"))),
    weightsBytes: new Uint8Array(readFileSync(path.join(dir, "model.safetensors"))) };
}

function prefill(champion, draft, prompt) {
  const n = prompt.length - 1;                     // the last prompt token is the pending one
  for (let s = 0; s < n; s += champion.maxBlock) {
    champion.forwardNow(Int32Array.from(prompt.slice(s, Math.min(n, s + champion.maxBlock))), s);
  }
  if (n > 0) draft.forward(prompt.slice(0, n), 0);
}

/** One round as the separate calls compose it -> the record (timing words 0). */
function composedRound(champion, draft, run, r, state, roundId, context) {
  const V = champion.vocabSize;
  const seed = run.seed;
  let proposals = [], pDraft = null, status = 0;
  if (r.kind === "draft") {
    if (r.nan_draft) draft.injectNaNOnce();
    const p = draft.propose({ feed: state.draftFeed, startPos: state.draftStart, k: r.k, policy: run.draft_policy,
      seed, roundId, stopTokenIds: run.stops, contextIds: context });
    if (p.error_code) status = RECORD.status.draft_invalid;
    else { proposals = Array.from(p.tokens); pDraft = p.pDraft; }
  } else if (r.kind === "lookup") {
    proposals = r.lookup.slice();
    pDraft = new Float32Array(proposals.length * V);
    proposals.forEach((y, i) => { pDraft[i * V + y] = 1; });
  }
  champion.forwardNow(Int32Array.from([state.pending, ...proposals]), state.champStart);
  const words = champion.decideNow({ nRows: proposals.length + 1, proposals, pDraft: run.greedy ? null : pDraft,
    contextIds: context, policy: run.policy, seed, roundId, stopTokenIds: run.stops, remaining: state.remaining,
    greedy: run.greedy });
  const record = new Int32Array(RECORD.fixed + proposals.length);
  record.set(words);
  record[AT.status] = status;
  record[AT.n_proposed] = proposals.length;
  record.set(proposals, RECORD.fixed);
  return record;
}

/** The bookkeeping both sides share (Python's caches): committed ids, pending, feeds. -> false at the end. */
function advance(state, r, record) {
  const m = record[AT.n_proposed], nAcc = record[AT.n_accepted], next = record[AT.next_token];
  if (r.kind === "draft" && record[AT.status] !== RECORD.status.draft_failed) {
    state.draftStart += state.draftFeed.length + (record[AT.status] === 0 ? Math.min(nAcc, Math.max(m - 1, 0)) : 0);
  }
  if (record[AT.decision_error] !== 0 || next < 0) return false;
  const accepted = Array.from(record.subarray(RECORD.fixed, RECORD.fixed + nAcc));
  state.committed.push(...accepted, next);
  state.champStart += 1 + nAcc;
  state.pending = next;
  state.draftFeed = state.committed.slice(state.draftStart);
  state.remaining -= nAcc + 1;
  return state.remaining > 0 && (record[AT.ended_by] & 255) === 0;
}

async function runOne(cases, run) {
  const fused = await loadChampion(cases.fused_wasm ?? cases.wasm, cases.champion_dir, cases.max_block, cases.draft_dir,
    cases.fused_threads ?? 1);
  const champion = await loadChampion(cases.wasm, cases.champion_dir, cases.max_block);
  const draft = await createDraft({ wasmBytes: readFileSync(cases.wasm), ...draftSource(cases.draft_dir) });
  prefill(fused, fused.draft, run.prompt);
  prefill(champion, draft, run.prompt);
  const fresh = () => ({ committed: run.prompt.slice(), pending: run.prompt.at(-1), champStart: run.prompt.length - 1,
    draftStart: run.prompt.length - 1, draftFeed: [run.prompt.at(-1)], remaining: run.max_new });
  const a = fresh(), b = fresh();
  const out = { fused: [], composed: [], timing: [] };
  fused.beginNow({ policy: run.policy, draftPolicy: run.draft_policy, stopTokenIds: run.stops, seed: run.seed,
    contextIds: run.prompt, greedy: run.greedy });
  let contextB = run.prompt.slice();             // the composition's context ids (mutate: missing next tokens)
  for (let i = 0; i < run.rounds.length; i++) {
    const r = { ...run.rounds[i] };
    if (r.kind !== "baseline") r.k = Math.min(r.k ?? r.lookup.length, a.remaining);
    if (r.kind === "lookup") r.lookup = r.lookup.slice(0, r.k);
    if (r.kind !== "baseline" && r.k === 0) r.kind = "baseline";
    if (r.nan_draft) fused.draft.injectNaNOnce();
    const recA = fused.roundNow({ k: r.kind === "baseline" ? 0 : r.k, roundId: i, remaining: a.remaining,
      proposals: r.kind === "lookup" ? Int32Array.from(r.lookup) : null, champFeed: Int32Array.of(a.pending),
      champStart: a.champStart, draftFeed: Int32Array.from(a.draftFeed), draftStart: a.draftStart });
    const recB = composedRound(champion, draft, run, r, b, i, contextB);
    out.timing.push([r.kind, recA[AT.draft_us], recA[AT.verify_us]]);
    recA[AT.draft_us] = recA[AT.verify_us] = 0;
    out.fused.push(Array.from(recA));
    out.composed.push(Array.from(recB));
    const goA = advance(a, r, recA), goB = advance(b, r, recB);
    contextB = run.mutate === "context_without_next" ? b.committed.slice(0, -1) : b.committed.slice();
    if (!goA || !goB) break;
  }
  for (const m of [fused, champion]) m.destroy();
  return out;
}

/** {name: [status, code]} for the same failure in each half, every call on a fresh instance. */
async function statuses(wasm) {
  const module = await WebAssembly.compile(readFileSync(wasm));
  const fresh = () => new WebAssembly.Instance(module, cpuImports()).exports;
  // out of memory: one buffer of 0xFFFF0000 bytes cannot fit above the heap base of a 32-bit space
  const D = 4096, V = 0xFFFF0000 / 4 / D;              // the champion's f32 embedding (V, D)
  const calls = {
    // the weights are allocated after the formats are set: champion_alloc_weights refuses them
    champion_out_of_memory: (e) => e.champion_build_config(V, D, 4, 1, 1, 1, 4, 8, 1, 1e-5, 1e4, 0, 0, 1, 0) || e.champion_alloc_weights(),
    draft_out_of_memory: (e) => e.draft_build_config(0xFFFF0000 / 4, 4, 4, 1, 1, 1, 4, 8, 1e-5, 1e4),   // logits (V,)
    champion_bad_config: (e) => e.champion_build_config(16, 6, 4, 1, 1, 1, 4, 8, 1, 1e-5, 1e4, 0, 0, 1, 0),   // D % 4
    draft_bad_config: (e) => e.draft_build_config(16, 6, 4, 1, 1, 1, 4, 8, 1e-5, 1e4),
    champion_bad_policy: (e) => e.champion_set_policy(-1, 0, 1, 1),
    draft_bad_policy: (e) => e.draft_set_policy(-1, 0, 1, 1),
  };
  return Object.fromEntries(Object.entries(calls).map(([name, call]) => {
    const status = call(fresh());
    return [name, [status, wasmStatusCode(status)]];
  }));
}

/** The round's failures, in order on one instance: [what, thrown code | record summary]. */
async function failures(cases) {
  const champion = await loadChampion(cases.wasm, cases.champion_dir, cases.max_block, cases.draft_dir);
  const out = [];
  const attempt = (what, fn) => {
    try {
      const rec = fn();
      out.push([what, rec ? { status: rec[AT.status], n_proposed: rec[AT.n_proposed], decision_error: rec[AT.decision_error],
        next_token: rec[AT.next_token], failure: champion.lastFailure()?.code ?? "" } : ""]);
    } catch (err) {
      out.push([what, err.code ?? `uncoded: ${err.message}`]);
    }
  };
  const round = (extra) => champion.roundNow({ k: 2, roundId: 0, remaining: 10, proposals: null, champFeed: Int32Array.of(5),
    champStart: 0, draftFeed: Int32Array.of(5), draftStart: 0, ...extra });
  attempt("round before begin", () => round({}));
  attempt("begin bad policy", () => champion.beginNow({ policy: { top_p: 0 } }));
  attempt("begin bad context id", () => champion.beginNow({ policy: {}, contextIds: [champion.vocabSize] }));
  attempt("begin", () => champion.beginNow({ policy: {}, draftPolicy: {}, seed: [1, 2], contextIds: [5], stopTokenIds: [1] }));
  attempt("k beyond maxBlock - 1", () => round({ k: champion.maxBlock }));
  attempt("remaining below k", () => round({ remaining: 1 }));
  attempt("two pending tokens", () => round({ champFeed: Int32Array.of(5, 6) }));
  attempt("champStart beyond the cache", () => round({ champStart: 3 }));
  attempt("lookup id out of range", () => round({ proposals: Int32Array.of(champion.vocabSize) }));
  attempt("draft skips uncached positions", () => round({ draftStart: 7 }));    // the draft fails, the champion does not run
  attempt("champion rows NaN", () => { champion.injectRoundNaN(3); return round({}); });
  attempt("a fine round", () => round({}));
  champion.destroy();
  attempt("after destroy", () => round({}));
  return out;
}

const [, , cin, cout] = process.argv;
const cases = JSON.parse(readFileSync(cin, "utf8"));
const out = { runs: [], wasm_status: WASM_STATUS };
if (cases.statuses) out.statuses = await statuses(cases.wasm);
if (cases.failures) out.failures = await failures(cases);
for (const run of cases.runs ?? []) out.runs.push(await runOne(cases, run));
(await import("node:fs")).writeFileSync(cout, JSON.stringify(out));
