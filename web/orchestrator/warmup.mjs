// warmup.mjs — the load's last phase: a few small requests through the whole round path (the Pyodide
// orchestrator, the JS session, the champion's forward and decide, lookup, the draft; the tokenizer
// and the chat template), outputs discarded, so that the first user request runs compiled, tiered-up
// code like the tenth (docs/browser.md, "Warm-up at load").

/** The warm-up requests: greedy alone (a text prompt, in the chat template when the model has one),
 *  greedy lookup at k = maxBlock - 1 on a repeating prompt, with a draft greedy and sampled
 *  draft rounds, and greedy "auto" (the default mode: its policy's code; the calibration comes
 *  after the warm-up, so it plans from its default) on the repeating prompt; a prompt of
 *  maxBlock + 2 ids prefills a full block and a partial one. draftOnly: the two draft requests alone
 *  (a draft that arrived after ready is warmed with them when the engine is idle). */
export function warmupRequests({ maxBlock, vocabSize, draft = false, chat = false, draftOnly = false }) {
  const k = Math.max(1, Math.min(8, maxBlock - 1));
  const n = maxBlock + 2;
  const ids = Array.from({ length: n }, (_, i) => (3 + (i % 3) * 7) % vocabSize);   // a, b, c, a, b, c, ...: lookup finds them
  const config = (c) => ({ temperature: 0, max_new_tokens: 6, seed: 0, ...c });
  const out = [
    { prompt: "Hello", chat, config: config({ speculate: "none" }) },
    { prompt_ids: ids, config: config({ speculate: "lookup", k }) },
  ];
  const drafts = [{ prompt_ids: ids, config: config({ speculate: "draft", k }) },
    { prompt_ids: ids, config: config({ speculate: "draft", k: Math.min(4, k), temperature: 1, top_k: 40 }) }];
  if (draftOnly) return drafts;        // a draft that arrived after ready: its rounds only (runtime.mjs)
  if (draft) out.push(...drafts);
  out.push({ prompt_ids: ids, config: config({ speculate: "auto" }) });
  return out;
}

/** Run the requests with run(payload) -> result, in turn and over again until `minCalls` champion
 *  calls (prefill blocks and rounds: stats.target_calls) have run or `budgetMs` has passed (at
 *  least the first request, and one pass within the budget; 48 calls left the toy pair's first answer alone 1.04-3.07x its later ones, 300
 *  made it 0.80-0.95x, measured: docs/performance.md), a failed
 *  one reported, never thrown (warm-up only saves time).
 *  -> {ms, requests, rounds (champion calls), tokens, errors: [sentence]} */
export async function warmUp(run, requests, { minCalls = 240, budgetMs = 1500 } = {}) {
  const t0 = performance.now();
  let tokens = 0, rounds = 0, ran = 0;
  const errors = [];
  const within = () => performance.now() - t0 < budgetMs;
  // the first pass too stops at the budget after its first request: on a large model (1.7B: ~0.2 s a
  // token) one request per mode would cost seconds of load, and its forwards tier up on their own
  for (let i = 0; (i < requests.length && (i === 0 || within())) || (rounds < minCalls && within() && !errors.length); i++) {
    const payload = requests[i % requests.length];
    ran++;
    try {
      const result = await run(payload);
      if (result?.error) errors.push(`${payload.config.speculate}: ${result.error.code}: ${result.error.message}`);
      tokens += result?.token_ids?.length ?? 0;
      rounds += result?.stats?.target_calls ?? 0;
    } catch (err) {
      errors.push(`${payload.config.speculate}: ${err?.message ?? err}`);
    }
  }
  return { ms: performance.now() - t0, requests: ran, rounds, tokens, errors };
}
