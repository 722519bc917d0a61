// grammar_masks_harness.mjs — web/grammar/xgrammar_masks.mjs in Node, for tests/test_grammar_masks.py.
//   node web/tests/grammar_masks_harness.mjs cases.json out.json
// cases.json: {tokenizer: path, contexts: [{vocabSize, stopTokenIds, cases: [{name, spec, stops?, ops}]}],
//              bad: [spec...], timingSpec: spec, regexPatterns: [str], sentences: [str]}
// An op is ["mask"] (-> the mask's bytes, base64), ["accept", id] / ["reject", id] (-> accept's boolean),
// ["rollback", n] (-> null), ["terminated"] (-> boolean). The test runs the same ops on the Python twin.
import { readFileSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import * as G from "../grammar/xgrammar_masks.mjs";

const [inPath, outPath] = process.argv.slice(2);
const job = JSON.parse(readFileSync(inPath, "utf8"));
const tokenizerJson = JSON.parse(readFileSync(job.tokenizer, "utf8"));
const out = { contexts: [], bad: [], timings: {} };

const b64 = (words) => Buffer.from(words.buffer, words.byteOffset, words.byteLength).toString("base64");

function runOps(matcher, ops) {
  return ops.map(([op, arg]) => {
    try {
      return runOp(matcher, op, arg);
    } catch (e) {
      return { error: e.code ?? String(e) };   // the test names the op and what Python gave there
    }
  });
}

function runOp(matcher, op, arg) {
  switch (op) {
    case "mask": return b64(matcher.mask());
    case "accept": case "reject": return matcher.accept(arg);
    case "rollback": matcher.rollback(arg); return null;
    case "terminated": return matcher.terminated();
    default: throw new Error(`unknown op ${op}`);
  }
}

out.vocabSha256 = createHash("sha256").update(JSON.stringify(G.encodedVocab(tokenizerJson))).digest("hex");
out.regexTags = (job.regexPatterns ?? []).map(G.regexStructuralTag);
out.sentences = (job.sentences ?? []).map(G.xgrammarSentence);
out.canonical = (job.canonical ?? []).map(G.canonicalSpecJSON);

for (const [k, c] of job.contexts.entries()) {
  let t0 = performance.now();
  const context = await G.createGrammarContext(tokenizerJson, { vocabSize: c.vocabSize, stopTokenIds: c.stopTokenIds });
  const entry = { createMs: performance.now() - t0, nWords: context.nWords, tokenizerCount: context.tokenizerCount, cases: {} };
  if (k === 0) {
    // refused specs first: the matchers below then run on an instance that lived through them
    for (const spec of job.bad ?? []) {
      try {
        await context.compile(spec);
        out.bad.push({ compiled: true });
      } catch (e) {
        out.bad.push({ code: e.code, message: e.message });
      }
    }
    if (job.timingSpec) {
      const first = await context.compile(job.timingSpec);
      const again = await context.compile(job.timingSpec);
      out.timings = { contextMs: entry.createMs, firstCompileMs: first.compileMs, firstCached: first.cached,
                      cachedCompileMs: again.compileMs, cachedCached: again.cached, sameObject: first.compiled === again.compiled };
    }
  }
  for (const cs of c.cases) {
    t0 = performance.now();
    const { compiled, compileMs, cached } = await context.compile(cs.spec);
    const matcher = context.matcher(compiled, cs.stops ? { stopTokenIds: cs.stops } : {});
    const t1 = performance.now();
    const results = runOps(matcher, cs.ops);
    const nMasks = cs.ops.filter(([op]) => op === "mask").length;
    let rollbackError = null;
    try { matcher.rollback(matcher.steps + 1); } catch (e) { rollbackError = { code: e.code, message: e.message }; }
    matcher.dispose();
    let afterDispose = null;
    try { matcher.mask(); } catch (e) { afterDispose = e.code; }
    entry.cases[cs.name] = { results, compileMs, cached, msPerMaskStep: (performance.now() - t1) / Math.max(1, nMasks),
                             wallMs: performance.now() - t0, rollbackError, afterDispose };
  }
  context.dispose();
  let afterContextDispose = null;
  try { await context.compile({ type: "json_object" }); } catch (e) { afterContextDispose = e.code; }
  entry.afterContextDispose = afterContextDispose;
  out.contexts.push(entry);
}

writeFileSync(outPath, JSON.stringify(out));
