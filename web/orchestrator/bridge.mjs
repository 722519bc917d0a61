// The JS side of the Pyodide adapter (py/exactspec/pyodide/browser_backend.py): one call per round step,
// or one per whole speculative round when the draft runs inline (speculativeRound).
// Owns the champion backend (WebGPU or WASM, champion_backends.mjs) and the draft: a client of the
// draft worker, or the WASM draft in this thread (draft_inline.mjs); recovers both between requests (a lost device is rebuilt, a dead draft worker
// respawned), arms test faults, and reports counters and memory for receipts. Values arriving
// from Python are JS arrays (to_js); p_draft rows stay a Float32Array end to end.
import { InlineDraft } from "../draft/draft_inline.mjs";
import { DraftWorkerClient } from "../draft/draft_worker.mjs";
import { codedError, errorPayload } from "../protocol.mjs";
import { chooseChampionBackend, openChampion } from "./champion_backends.mjs";

export const MAX_BLOCK = 9;            // k <= 8 proposals + the pending token
const FAULT_POINTS = ["championForward", "championRound", "draftForward", "draftPropose"];
const FAULT_ACTIONS = ["kill_draft", "destroy_device", "nan_champion", "nan_draft", "stall"];
// Faults that act at once, at no point: "stale_draft" posts an envelope of an older epoch (and of
// another request) straight into the draft worker, which must drop and count it.
const IMMEDIATE_FAULTS = ["stale_draft"];

/** Where the draft runs: "inline" (in the orchestrator's thread) next to a CPU champion, whose
 *  rounds are sequential anyway, so one bridge call does a whole round; in its own worker
 *  next to a GPU champion. "worker" / "inline" force it. */
export function chooseDraftPlacement(placement, championKind) {
  if (placement === "auto") return championKind === "wasm" ? "inline" : "worker";
  if (placement === "inline" || placement === "worker") return placement;
  throw codedError("E_BAD_ARGUMENT", `draft_placement must be auto, inline or worker, got ${placement}`);
}

/**
 * -> { bridge, info: {champion, draft, draft_error}, timing_ms, close() }
 * `counters()` / `runtimeInfo()` (from the worker's runtime) join the bridge's own counts and
 * versions; `faults` enables fault injection (tests); `refuseAllocAfter` >= 0 refuses the GPU
 * allocation after that many (tests).
 */
export async function createBridge({ championUrl, championConfig = null, draftUrl, draftConfig = null, maxContext, draftWasmUrl = new URL("../build/draft.wasm", import.meta.url).href,
  championWasmUrl = new URL("../build/champion.wasm", import.meta.url).href, championBackend = "auto", threads = "auto", draftPlacement = "auto", choice = null, prepared = null,
  counters = () => ({}), runtimeInfo = () => ({}), faults = false, refuseAllocAfter = -1, notify = () => {},
  draftInBackground = false, draftDelayMs = 0 }) {
  const t0 = performance.now();
  choice ??= await chooseChampionBackend(championBackend);
  const openOpts = { championUrl, championConfig, maxContext, maxBlock: MAX_BLOCK, wasmUrl: championWasmUrl, threads };
  let champ = await openChampion(choice.kind, { ...openOpts, refuseAllocAfter, prepared });
  const t1 = performance.now();
  let draft = null, draftError = null, draftRespawns = 0, closed = false;
  let epoch = 0;
  const placement = chooseDraftPlacement(draftPlacement, choice.kind);
  const spawnDraft = () => (placement === "inline" ? InlineDraft : DraftWorkerClient).create({ wasmUrl: draftWasmUrl, modelUrl: draftUrl,
    configJson: draftConfig });     // draftConfig: the validated config from the model check (web/formats/model_config.mjs)
  // draftInBackground: the bridge is ready with the champion alone and the draft arrives later
  // (whenDraft()); until then speculate="draft" is refused before output, as for a failed draft.
  // draftDelayMs (tests, with faults on) holds the draft back to make that window observable.
  let draftLoading = null, backgroundDraft = null;
  const timing = { champion_load: t1 - t0, draft_load: 0 };
  if (draftUrl) {
    const delay = faults && draftDelayMs > 0 ? new Promise((r) => setTimeout(r, draftDelayMs)) : null;
    const attempt = (delay ?? Promise.resolve()).then(spawnDraft).then((d) => {
      if (closed) { d.terminate(); return; }
      draft = d;
      draft.setEpoch(epoch);
    }, (err) => {   // the champion alone still works; speculate="draft" is refused before output
      draftError = errorPayload(err, "E_DRAFT_LOST");
    }).finally(() => {
      timing.draft_load = performance.now() - t1;
      draftLoading = null;
    });
    if (draftInBackground) draftLoading = backgroundDraft = attempt;
    else await attempt;
  }
  const ints = (a) => Int32Array.from(a ?? []);
  const armed = [];                    // fault specs waiting for their point
  const NO_DRAFT_COUNTS = { draft_client: 0, draft_worker: 0 };
  const addCounts = (a, b) => ({ draft_client: a.draft_client + b.draft_client, draft_worker: a.draft_worker + b.draft_worker });
  let retired = NO_DRAFT_COUNTS;       // stale counts of draft clients since replaced
  let taken = {};
  const cumulative = () => ({ ...counters(), ...addCounts(retired, draft ? draft.staleCounts : NO_DRAFT_COUNTS) });

  const liveChampion = () => {
    if (champ.lost) throw codedError("E_DEVICE_LOST", `${champ.kind} champion lost (device destroyed)`);
    return champ;
  };
  const liveDraft = () => {
    if (!draft) {
      throw codedError("E_DRAFT_LOST", draftError ? draftError.message : draftLoading ? "the draft is still loading" : "no draft model loaded");
    }
    return draft;
  };
  // GPU work on a lost device fails with whatever the browser says; report it as device loss.
  const onChampion = async (fn) => {
    try {
      return await fn(liveChampion());
    } catch (err) {
      if (champ.lost) throw codedError("E_DEVICE_LOST", `${champ.kind} champion lost during the call: ${errorPayload(err).message}`);
      throw err;
    }
  };

  async function hit(point, roundId) {
    for (let i = 0; i < armed.length; i++) {
      const f = armed[i];
      if (f.at !== point || roundId < (f.min_round ?? 0)) continue;
      armed.splice(i--, 1);
      if (f.action === "kill_draft") draft?.kill();
      else if (f.action === "destroy_device") champ.loseDevice();
      else if (f.action === "nan_draft") await draft?.injectNaN();
      else if (f.action === "stall") {
        notify({ stage: "stalled", at: point, round_id: roundId });
        await new Promise((r) => setTimeout(r, f.ms ?? 300));
      } else if (f.action === "nan_champion") nanPending = true;   // this round's rows (championRound only)
    }
  }
  let nanPending = false;

  const decideArgs = (m, pDraft, contextIds, proposals, policyJson, seedLo, seedHi, roundId, stopIds, remaining, greedy) => ({
    nRows: m + 1, proposals, pDraft, contextIds, policy: JSON.parse(policyJson), seed: [seedLo >>> 0, seedHi >>> 0],
    roundId, stopTokenIds: Array.from(stopIds ?? []), remaining, greedy: !!greedy,
  });
  const checkFeed = (feed, m) => {
    if (feed.length !== m + 1) throw codedError("E_CACHE_STATE", "the champion must have exactly one pending token");
  };

  /** Champion forward over feed (the pending token + m proposals) and the round's decision. */
  async function verifyRound(feed, startPos, m, ...rest) {
    await hit("championRound", rest[6]);   // rest: pDraft, contextIds, proposals, policyJson, seedLo, seedHi, roundId, ...
    checkFeed(feed, m);
    return onChampion(async (g) => {
      await g.forward(feed, startPos);
      if (nanPending) {                  // fault: the champion's rows come out NaN
        nanPending = false;
        g.injectNaN(m + 1);
      }
      const r = await g.decide(decideArgs(m, ...rest));
      if (champ.lost) throw codedError("E_DEVICE_LOST", "the champion's device was lost during verification");
      return r;
    });
  }

  // A CPU champion's round (and an inline draft's proposal) is plain computation: run it
  // synchronously and Python gets its answer without an event-loop hop (~0.5 ms a round under
  // Pyodide). Only with no fault armed (a stall must wait) and a champion that has the twins.
  const canRunNow = () => armed.length === 0 && typeof champ.forwardNow === "function" && !champ.lost;
  let lastYield = performance.now();     // when this worker's event loop last ran other tasks
  const PAUSE_EVERY_MS = 10;

  function verifyNow(feed, startPos, m, ...rest) {
    checkFeed(feed, m);
    champ.forwardNow(feed, startPos);
    if (nanPending) {
      nanPending = false;
      champ.injectNaN(m + 1);
    }
    return champ.decideNow(decideArgs(m, ...rest));
  }
  const yielded = (value) => { lastYield = performance.now(); return value; };

  const bridge = {
    async championForward(ids, startPos) {
      await hit("championForward", 0);
      await onChampion((g) => g.forward(ints(ids), startPos));
    },
    /** JSON of the round's decision: a string at once for a CPU champion (canRunNow), else a
     *  promise of one. Python awaits only a promise. */
    championRound(feed, startPos, m, pDraft, committedIds, proposals, policyJson, seedLo, seedHi,
                  roundId, stopIds, remaining, greedy) {
      const args = [ints(feed), startPos, m, pDraft ?? null, ints(committedIds), ints(proposals),
        policyJson, seedLo, seedHi, roundId, stopIds, remaining, greedy];
      if (canRunNow()) return JSON.stringify(verifyNow(...args));
      return verifyRound(...args).then((r) => yielded(JSON.stringify(r)));
    },
    /** A whole speculative round with the inline draft: propose from the draft's pending ids
     *  (draftFeed at draftStart), verify the champion's pending ids (champFeed at champStart) plus
     *  the proposals, decide. committedIds (both caches hold the same committed tokens) are the
     *  processors' context. JSON {draft_failure: null | {code, message}, tokens, draft_error_code,
     *  decision: null (the champion did not run) | championRound's, draft_ms, verify_ms}: a
     *  string at once when everything can run synchronously, else a promise of one. */
    speculativeRound(draftFeed, draftStart, k, draftPolicyJson, champFeed, champStart, committedIds, policyJson,
                     seedLo, seedHi, roundId, stopIds, remaining, greedy) {
      const context = ints(committedIds);
      const proposeArgs = { feed: ints(draftFeed), startPos: draftStart, k, policy: JSON.parse(draftPolicyJson),
        seed: [seedLo >>> 0, seedHi >>> 0], roundId, stopTokenIds: Array.from(stopIds ?? []), contextIds: context };
      const now = canRunNow() && typeof draft?.proposeNow === "function";
      const t0 = performance.now();
      const failed = (err) => JSON.stringify({ draft_failure: errorPayload(err, "E_DRAFT_LOST"), tokens: [],
        draft_error_code: "", decision: null, draft_ms: performance.now() - t0, verify_ms: 0 });
      const verify = (r) => {
        const t1 = performance.now();
        const out = { draft_failure: null, tokens: Array.from(r.tokens), draft_error_code: r.error_code || "",
          decision: null, draft_ms: t1 - t0, verify_ms: 0 };
        if (out.draft_error_code || !r.tokens.length) return JSON.stringify(out);
        const pending = ints(champFeed);
        const feed = new Int32Array(pending.length + r.tokens.length);
        feed.set(pending);
        feed.set(r.tokens, pending.length);
        const args = [feed, champStart, r.tokens.length, greedy ? null : r.pDraft, context, r.tokens,
          policyJson, seedLo, seedHi, roundId, stopIds, remaining, greedy];
        const done = (decision) => JSON.stringify({ ...out, decision, verify_ms: performance.now() - t1 });
        return now ? done(verifyNow(...args)) : verifyRound(...args).then(done);
      };
      if (now) {
        let r;
        try { r = liveDraft().proposeNow(proposeArgs); } catch (err) { return failed(err); }
        return verify(r);
      }
      return (async () => {
        let r;
        try {
          await hit("draftPropose", roundId);
          r = await liveDraft().propose(proposeArgs);
        } catch (err) {
          return yielded(failed(err));
        }
        return yielded(await verify(r));
      })();
    },
    /** null while this worker's event loop ran less than PAUSE_EVERY_MS ago; else a promise that
     *  lets it run (queued messages such as a cancel are handled) and then resolves. Python
     *  awaits it between rounds, so synchronous rounds never starve the worker. */
    pause() {
      if (performance.now() - lastYield < PAUSE_EVERY_MS) return null;
      return new Promise((resolve) => {
        const channel = new MessageChannel();
        channel.port1.onmessage = () => { channel.port1.close(); resolve(yielded(null)); };
        channel.port2.postMessage(0);
      });
    },
    async championLogits(ids, startPos) {            // diagnostics and tests only
      return onChampion(async (g) => {
        await g.forward(ints(ids), startPos);
        return g.readLogits(ids.length);
      });
    },
    async draftForward(ids, startPos) {
      await hit("draftForward", 0);
      await liveDraft().forward(ints(ids), startPos);
    },
    async draftPropose(feed, startPos, k, policyJson, seedLo, seedHi, roundId, stopIds, contextIds) {
      await hit("draftPropose", roundId);
      const r = await liveDraft().propose({ feed: ints(feed), startPos, k, policy: JSON.parse(policyJson),
        seed: [seedLo >>> 0, seedHi >>> 0], roundId, stopTokenIds: Array.from(stopIds ?? []), contextIds: ints(contextIds) });
      return { tokens_json: JSON.stringify(Array.from(r.tokens)), pDraft: r.pDraft, error_code: r.error_code || "" };
    },
    /** JSON: stale-epoch drops by receiver since the previous call (one call per result, so
     *  every drop is reported exactly once). Counts of a replaced draft client carry over. */
    takeCounters() {
      const now = cumulative();
      const out = Object.fromEntries(Object.entries(now).map(([k, v]) => [k, v - (taken[k] ?? 0)]));
      taken = now;
      return JSON.stringify(out);
    },
    /** JSON: receipt environment (coarse hardware class, versions, peak bytes by category). */
    environment() {
      const info = runtimeInfo();
      const mem = champ.memory();
      return JSON.stringify({
        hardware_class: champ.hardwareClass(),
        browser_version: browserVersion(),
        runtime_version: info.runtime_version ?? "pyodide-unknown",
        champion_backend: champ.kind,
        peak_resident_bytes: { [mem.category]: mem.peak, wasm_draft: draft ? draft.memoryBytes : 0,
          pyodide_heap: info.pyodide_heap_bytes ?? 0 },
      });
    },
  };

  const draftInfo = () => (draft ? { vocab_size: draft.vocabSize, max_context: draft.maxContext, identity: draft.identity,
    artifact_bytes: draft.artifactBytes, placement } : null);
  return {
    bridge,
    info: {
      champion: { vocab_size: champ.vocabSize, max_context: maxContext ?? champ.maxContext ?? champ.config.max_position_embeddings,
        identity: champ.identity, artifact_bytes: champ.artifactBytes, max_block: MAX_BLOCK,
        backend: champ.kind, backend_why: choice.why },
      draft: draftInfo(),
      draft_error: draftError,
      draft_loading: draftLoading !== null,
    },
    timing_ms: timing,
    /** null, or (draftInBackground) a promise of {draft: info | null, draft_error: {code, message} | null}
     *  settled when the draft has loaded or failed. */
    whenDraft: () => backgroundDraft && backgroundDraft.then(() => ({ draft: draftInfo(), draft_error: draftError })),
    /** The late draft failed the load-time checks: drop it and remember why. */
    refuseDraft(err) {
      draft?.terminate();
      draft = null;
      draftError = errorPayload(err, "E_MANIFEST_MISMATCH");
    },
    /** Before each request: adopt its epoch; rebuild a lost GPU, respawn a dead draft worker. */
    async beginRequest(requestEpoch) {
      epoch = Math.max(epoch, requestEpoch);
      if (champ.lost) {
        const old = champ;
        champ = await openChampion(old.kind, openOpts);
        try { old.close(); } catch { /* already destroyed */ }
      }
      if (draft?.dead && draftUrl) {
        retired = addCounts(retired, draft.staleCounts);
        draft = null;
        try { draft = await spawnDraft(); draftRespawns++; } catch (err) { draftError = errorPayload(err, "E_DRAFT_LOST"); }
      }
      draft?.setEpoch(epoch);
    },
    /** A cancel: the draft client moves to the new epoch (its in-flight calls end E_CANCELLED). */
    cancel(newEpoch) {
      epoch = Math.max(epoch, newEpoch);
      draft?.setEpoch(epoch);
    },
    arm(spec) {
      if (!faults) throw codedError("E_BAD_ARGUMENT", "fault injection is off (load with options.faults = true)");
      if (IMMEDIATE_FAULTS.includes(spec.action)) {
        if (!draft || draft.dead) throw codedError("E_DRAFT_LOST", "no live draft worker to inject into");
        if (!draft.worker) throw codedError("E_BAD_ARGUMENT", "the draft runs inline: there is no worker to inject into");
        if (draft.epoch < 1) throw codedError("E_BAD_ARGUMENT", "no older epoch exists yet (cancel once first)");
        draft.worker.postMessage({ kind: "propose", request_id: "injected-stale", seq: 0, epoch: draft.epoch - 1,
          payload: { round_id: 0, k: 1, feed: [0], start_pos: 0, policy: {}, seed: [0, 0] } });
        return;
      }
      if (!FAULT_ACTIONS.includes(spec.action)) throw codedError("E_BAD_ARGUMENT", `unknown fault action ${spec.action}`);
      if (!FAULT_POINTS.includes(spec.at)) throw codedError("E_BAD_ARGUMENT", `unknown fault point ${spec.at}`);
      armed.push({ ...spec });
    },
    /** GPU buffers live now, bytes live and peak; the draft's WASM memory; respawns. */
    memory() {
      const m = champ.memory();
      return { champion_backend: champ.kind, gpu_buffers_live: m.buffers_live, gpu_bytes_live: m.category === "gpu_buffers" ? m.live : 0,
        gpu_bytes_peak: m.category === "gpu_buffers" ? m.peak : 0, wasm_champion_bytes: m.category === "wasm_champion" ? m.live : 0,
        wasm_draft_bytes: draft ? draft.memoryBytes : 0, draft_respawns: draftRespawns, device_lost: champ.lost };
    },
    close() {
      closed = true;
      draft?.terminate();
      draft = null;
      champ.close();
    },
  };
}

/** "chromium-156" from the user agent: the major version only (coarse, not a fingerprint). */
export function browserVersion() {
  const ua = globalThis.navigator?.userAgent ?? "";
  for (const [re, name] of [[/Edg\/(\d+)/, "edge"], [/Chrome\/(\d+)/, "chromium"], [/Firefox\/(\d+)/, "firefox"],
    [/Version\/(\d+).*Safari/, "safari"]]) {
    const m = re.exec(ua);
    if (m) return `${name}-${m[1]}`;
  }
  return "unknown";
}
