// What speculate "auto" chose and why, in words (pure: objects in, plain strings out; the page sets
// them as textContent). Inputs are the contracts of docs/core.md: a tokens event's round.auto, the
// result's stats.auto, ready.info.calibration, ready.info.batch_check / champion_fallback. Every
// function returns null (nothing to say) when its input is absent: an older engine, speculate none.

export const METHODS = ["draft", "lookup", "none"];
const METHOD_WORDS = { draft: "the draft", lookup: "prompt lookup", none: "champion alone" };
const BACKEND_WORDS = { webgpu: "WebGPU", wasm: "WASM" };

const finite = (x) => typeof x === "number" && Number.isFinite(x);

/** A duration for a sentence: "0.42 ms", "3.5 ms", "180 ms". */
export function msText(x) {
  const digits = x < 1 ? 2 : x < 100 ? 1 : 0;
  return `${x.toFixed(digits)} ms`;
}

const pct = (a) => `${Math.round(100 * a)}%`;
const ahead = (k) => `${k} token${k === 1 ? "" : "s"} ahead`;

/** One sentence for the round's auto object (common.md §2), or null when there is none. */
export function autoSentence(auto) {
  if (!auto || typeof auto !== "object" || !METHODS.includes(auto.method)) return null;
  const cost = auto.cost_per_token_ms ?? {}, acc = auto.acceptance ?? {};
  const alone = finite(cost.none) ? ` against ${msText(cost.none)} for the champion alone` : "";
  const accText = (m) => (finite(acc[m]) ? ` (acceptance ${pct(acc[m])})` : "");
  const k = Number.isInteger(auto.k) ? auto.k : 0;
  if (auto.method === "draft" || auto.method === "lookup") {
    const m = auto.method;
    if (!finite(cost[m])) {            // no estimate yet: what it is for, and what alone costs
      const aloneNow = finite(cost.none) ? ` (the champion alone: ${msText(cost.none)} a token)` : "";
      return m === "draft" && auto.reason !== "probe" ? `Using the draft, ${ahead(k)}: its cost is not known yet${aloneNow}`
        : m === "lookup" && auto.reason !== "probe" ? `Prompt lookup found a match, ${ahead(k)}: its cost is not known yet${aloneNow}`
        : `Trying ${METHOD_WORDS[m]}, ${ahead(k)}, to measure its cost and acceptance${aloneNow}`;
    }
    const own = `${msText(cost[m])} a token expected`;
    if (auto.reason === "probe") return `Trying ${METHOD_WORDS[m]}, ${ahead(k)}, to measure its acceptance: ${own}${alone}${accText(m)}`;
    if (m === "draft") return `Using the draft, ${ahead(k)}: it costs ${msText(cost.draft)} a token${alone}${accText("draft")}`;
    return `Prompt lookup found a match, ${ahead(k)}: ${own}${alone}${accText("lookup")}`;
  }
  // none: say what it was weighed against, else why there was nothing to weigh
  if (auto.reason === "last_token") return "Champion alone for the last token: nothing is left to speculate on";
  if (!finite(cost.none)) return "Speculation off: the champion alone runs until its step is timed";
  const options = ["draft", "lookup"].filter((m) => finite(cost[m])).sort((a, b) => cost[a] - cost[b]);
  if (options.length) {
    const m = options[0];
    const but = cost[m] >= cost.none ? "" : auto.reason === "margin" ? ", not cheaper by the margin"
      : `, but ${m === "draft" ? "its" : "lookup's"} acceptance is not measured enough yet`;
    const verb = cost[m] >= cost.none || auto.reason === "margin" ? "would" : "might";
    return `Speculation off: ${METHOD_WORDS[m]} ${verb} cost ${msText(cost[m])} a token against ${msText(cost.none)} alone${but}${accText(m)}`;
  }
  const why = auto.reason === "no_draft" ? "no draft is loaded and prompt lookup has nothing to propose"
    : auto.reason === "no_match" ? "prompt lookup found no match" : "nothing cheaper is known yet";
  return `Speculation off: ${why}; the champion alone costs ${msText(cost.none)} a token`;
}

/** Rounds by method from the rounds seen so far ({method: count}; a tokens event of a chain counts
 *  its `steps`), or null when none carried auto. */
export function countMethods(rounds) {
  const counts = Object.fromEntries(METHODS.map((m) => [m, 0]));
  let any = false;
  for (const r of rounds) {
    const m = r?.auto?.method;
    if (METHODS.includes(m)) { counts[m] += r.steps ?? 1; any = true; }   // a chain of baseline steps: its steps
  }
  return any ? counts : null;
}

/** "Rounds: 12 with the draft, 3 with prompt lookup, 1 champion alone; 2 switches", or null.
 *  `auto` (the result's stats.auto, once the answer is over) wins over the live counts. */
export function roundsText(counts, auto = null) {
  const c = auto?.rounds_by_method ?? counts;
  if (!c) return null;
  const words = { draft: "with the draft", lookup: "with prompt lookup", none: "champion alone" };
  const parts = METHODS.filter((m) => finite(c[m]) && c[m] > 0).map((m) => `${c[m]} ${words[m]}`);
  let text = `Rounds: ${parts.length ? parts.join(", ") : "none yet"}`;
  if (finite(auto?.switches)) text += `; ${auto.switches} switch${auto.switches === 1 ? "" : "es"} of method`;
  if (finite(auto?.drift)) text += `; champion steps ran at ${auto.drift.toFixed(2)}x the calibrated time`;
  return text;
}

/** The calibration (common.md §1) in one line, or null when there is none. */
export function calibrationSentence(cal) {
  if (cal && typeof cal === "object" && typeof cal.error === "string") {   // measuring failed (runtime.mjs)
    return `This device could not be measured (${cal.error}): auto keeps speculation off until it has timed its own rounds`;
  }
  if (!cal || typeof cal !== "object" || !Array.isArray(cal.verify_ms)) return null;
  const v = cal.verify_ms;
  const parts = [];
  if (finite(v[1])) parts.push(`a champion step ${msText(v[1])}`);
  const measured = (Array.isArray(cal.measured_n) ? cal.measured_n : []).filter((n) => n > 1 && finite(v[n]));
  const block = measured.length ? Math.max(...measured) : null;
  if (block !== null) parts.push(`a block of ${block} rows ${msText(v[block])}`);
  if (finite(cal.draft_ms_per_proposal)) parts.push(`a draft proposal ${msText(cal.draft_ms_per_proposal)}`);
  if (!parts.length) return null;
  const backend = BACKEND_WORDS[cal.backend] ? ` (${BACKEND_WORDS[cal.backend]})` : "";
  const took = finite(cal.ms) ? ` in ${msText(cal.ms)}` : "";
  const head = cal.source === "cache" ? `Measured on this device earlier${took}` : `Measured at load${took}`;
  const tail = cal.source === "cache" ? " (from cache)"
    : cal.cache === "unavailable" ? " (not cached: no IndexedDB here)"
    : cal.cache === "stale" ? " (the cached one no longer matched this device)" : "";
  return `${head}${backend}: ${parts.join(", ")}${tail}`;
}

/** The load-time batch-invariance check and any fallback it caused, in one line, or null. */
export function batchCheckSentence(info) {
  const check = info?.batch_check, fallback = info?.champion_fallback;
  const checked = check && typeof check === "object" && finite(check.ms)
    ? `${BACKEND_WORDS[check.backend] ?? String(check.backend)}, ${msText(check.ms)}` : null;
  if (fallback && typeof fallback === "object") {
    const code = fallback.code ?? "E_BATCH_VARIANT";
    const why = fallback.message ? `${code}: ${fallback.message}` : code;
    const then = check?.result === "invariant" && check.backend === "wasm" ? `; the WASM kernels checked batch-invariant (${checked})` : "";
    return `The GPU champion was not used (${why}): the champion runs on WASM, so greedy answers stay exactly the champion's${then}`;
  }
  if (!checked) return null;
  if (check.result === "invariant") return `Kernels checked batch-invariant (${checked})`;
  return `Kernels gave different logits as a block than one by one (${checked})`;
}
