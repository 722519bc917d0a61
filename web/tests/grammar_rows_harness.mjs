// grammar_rows_harness.mjs — drives the CPU module's grammar-row arguments for tests/test_grammar_rows.py
// (Node): the WASM champion's decide({..., rowOffset, rowMasks}) and the WASM draft's
// propose({..., firstStep, maskBits}).
//
//   node web/tests/grammar_rows_harness.mjs cases.json out.json
//
// cases.json: {wasm, champion_dir?, draft_dir?, decide?: {sets, jobs}, decide_errors?: [...],
//              split?: [...], masked?: [...], draft_errors?: [...], worker?: [...]}; float and mask
//              arrays travel as base64 (little-endian f32 / u32).
import { createWasmChampion } from "../champion_wasm/champion_wasm.mjs";
import { createDraft } from "../draft/draft.mjs";
import { createHandler } from "../draft/draft_worker.mjs";
import { validateConfig } from "../formats/model_checks.mjs";
import { validatedConfigFromJson } from "../formats/model_config.mjs";
import { fromBase64, toBase64 } from "./draft_harness.mjs";
import { decisionOf } from "./champion_harness.mjs";

const masksOf = (b64) => (b64 ? fromBase64(b64, Uint32Array) : null);

// decide: {sets: [{logits (n*V f32 b64)}], jobs: [{set, proposals, policy, contextIds, seed, roundId,
//          stopTokenIds, remaining, greedy, rowOffset, rowMasks (b64 | null), pDraft (b64 | null)}]}
// -> decisions (decodeDecision), or {thrown: code}
export async function runDecide(champion, { sets, jobs }) {
  const V = champion.vocabSize;
  const out = [];
  let current = -1;
  for (const job of jobs) {
    if (job.set !== current) {
      current = job.set;
      const rows = fromBase64(sets[current].logits, Float32Array);
      champion.setLogitsForTest(rows, rows.length / V);
    }
    const m = job.proposals.length;
    try {
      out.push(decisionOf(await champion.decide({ ...job, nRows: job.nRows ?? m + 1, pDraft: job.pDraft ? fromBase64(job.pDraft, Float32Array) : null,
        rowMasks: masksOf(job.rowMasks) })));
    } catch (err) {
      out.push({ thrown: err.code ?? `uncoded: ${err.message}` });
    }
  }
  return out;
}

const propose = (draft, c, extra = {}) => draft.propose({ feed: c.feed, startPos: c.start_pos, k: c.k, policy: c.policy,
  seed: c.seed, roundId: c.round_id, stopTokenIds: c.stop ?? [], contextIds: c.context, ...extra });

// split: one k-call, then the same proposals as k = 1 calls with firstStep 0..k-1 (each feeding the
// previous token at the next position, its context grown by the proposals so far) -> both, base64
export function runSplit(draft, cases) {
  return cases.map((c) => {
    const whole = propose(draft, c);
    const tokens = [], rows = [], codes = [];
    let feed = c.feed, start = c.start_pos;
    for (let i = 0; i < c.k; i++) {
      const r = propose(draft, { ...c, feed, start_pos: start, k: 1, context: [...c.context, ...tokens] }, { firstStep: i });
      codes.push(r.error_code);
      if (r.tokens.length !== 1) break;
      tokens.push(r.tokens[0]);
      rows.push(r.pDraft);
      start += feed.length;
      feed = [r.tokens[0]];
    }
    const pieces = new Float32Array(rows.length * draft.vocabSize);
    rows.forEach((row, i) => pieces.set(row, i * draft.vocabSize));
    return { whole: { tokens: Array.from(whole.tokens), p_draft: toBase64(whole.pDraft), error_code: whole.error_code },
      split: { tokens, p_draft: toBase64(pieces), error_codes: codes } };
  });
}

// masked: calls run in order on one draft ({feed, start_pos, k, policy, seed, round_id, context,
// first_step, mask (b64 u32 | null)}) -> {tokens, p_draft, error_code} | {thrown}
export function runMasked(draft, cases) {
  return cases.map((c) => {
    try {
      const r = propose(draft, c, { firstStep: c.first_step ?? 0, maskBits: masksOf(c.mask) });
      return { tokens: Array.from(r.tokens), p_draft: toBase64(r.pDraft), error_code: r.error_code };
    } catch (err) {
      return { thrown: err.code ?? `uncoded: ${err.message}` };
    }
  });
}

// worker: masked's calls through the draft worker's protocol handler (createHandler, no Worker: the
// same code the worker runs), first_step and mask_bits in the propose payload -> the "proposals" replies
export async function runWorker(draft, cases) {
  const replies = [];
  const handler = createHandler(Promise.resolve(draft), (msg) => replies.push(msg));
  for (const [seq, c] of cases.entries()) {
    await handler.onMessage({ kind: "propose", request_id: "grammar", seq, epoch: 1, payload: {
      round_id: c.round_id, k: c.k, feed: c.feed, start_pos: c.start_pos, policy: c.policy, seed: c.seed,
      stop_token_ids: [], context_from: 0, context_tail: c.context, first_step: c.first_step, mask_bits: masksOf(c.mask) } });
  }
  return replies.map((r) => ({ kind: r.kind, tokens: r.payload.tokens, error_code: r.payload.error_code,
    p_draft: r.payload.p_draft ? toBase64(r.payload.p_draft) : null, code: r.payload.code ?? "" }));
}

const isNodeMain = typeof process !== "undefined" && process.argv && process.argv[1] &&
  import.meta.url === (await import("node:url")).pathToFileURL(process.argv[1]).href;

if (isNodeMain) {
  const fs = await import("node:fs");
  const path = await import("node:path");
  const cases = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const wasmBytes = fs.readFileSync(cases.wasm);
  const config = (dir) => JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8"));
  const out = {};
  if (cases.champion_dir) {
    const dir = cases.champion_dir;
    const champion = await createWasmChampion({ wasmBytes, configJson: validateConfig(config(dir)),
      weightsBytes: new Uint8Array(fs.readFileSync(path.join(dir, "model.q8.safetensors"))), maxBlock: cases.max_block ?? 9 });
    if (cases.decide) out.decide = await runDecide(champion, cases.decide);
    if (cases.decide_errors) out.decide_errors = await runDecide(champion, cases.decide_errors);
    champion.destroy();
  }
  if (cases.draft_dir) {
    const dir = cases.draft_dir;
    const draft = await createDraft({ wasmBytes, configJson: validatedConfigFromJson(fs.readFileSync(path.join(dir, "config.json"))),
      weightsBytes: new Uint8Array(fs.readFileSync(path.join(dir, "model.safetensors"))) });
    if (cases.split) out.split = runSplit(draft, cases.split);
    if (cases.masked) out.masked = runMasked(draft, cases.masked);
    if (cases.draft_errors) out.draft_errors = runMasked(draft, cases.draft_errors);
    if (cases.worker) out.worker = await runWorker(draft, cases.worker);
  }
  fs.writeFileSync(process.argv[3], JSON.stringify(out));
}
