// Load progress as rows for the page (pure): one row per stage and one per fetched artifact with
// its bytes. applyProgress(rows, p) folds one progress payload from the engine into the rows.

const STAGES = {
  prepare: "Preparing the WebGPU device and shader pipelines",
  python: "Starting Python (Pyodide)",
  check: "Checking the model files (configs, tokenizers, manifest)",
  models: "Loading the champion, then the draft (WASM or GPU upload)",
  warmup: "Warming up: a few small requests through every mode (the first answer runs warm)",
  calibrate: "Measuring this device for auto: champion steps, blocks of rows, the draft (or read from the cache)",
};

/** What the weight cache did with a file (p.cache, web/weight_cache.mjs), as the row says it. */
export const CACHE_WORDS = {
  hit: "from cache",
  "hit-offline": "from cache (the server could not be reached)",
  miss: "downloaded, kept in the cache",
  "not-stored": "downloaded, not kept (no length, or not enough storage)",
};

/** rows: Map key -> {label, loaded, total, done}. Returns the same map. */
export function applyProgress(rows, p) {
  if (p.stage === "fetch" || p.stage === "convert") {   // bytes fetched, or converted in the page
    const key = `fetch:${p.url}`;
    const label = CACHE_WORDS[p.cache] ? `${p.name} — ${CACHE_WORDS[p.cache]}` : p.name;
    rows.set(key, { label, loaded: p.loaded, total: p.total, done: p.done, bytes: true, cache: p.cache ?? null });
    return rows;
  }
  if (p.stage === "cache") {   // a cached copy failed its sha256: removed, and the load starts over
    rows.set(`cache:${rows.size}`, { label: `A cached copy failed its check and was removed; loading again from the network (${p.evicted})`, done: true });
    return rows;
  }
  if (p.stage === "prepare") {
    rows.set("prepare", { label: STAGES.prepare, done: !!p.done });
    return rows;
  }
  if (STAGES[p.stage]) {
    for (const [k, r] of rows) if (!k.startsWith("fetch:") && k !== "prepare") r.done = true;   // stages run in order
    rows.set(p.stage, { label: STAGES[p.stage], done: false });
  }
  return rows;
}

/** Mark every row done (the load finished). */
export function finishRows(rows) {
  for (const r of rows.values()) r.done = true;
  return rows;
}

/** "3.1 of 8.6 MB" for a bytes row, "" otherwise. */
export function bytesText(r) {
  if (!r.bytes) return "";
  const mb = (b) => (b / 1e6).toFixed(b < 1e5 ? 2 : 1);
  return r.total ? `${mb(r.loaded)} of ${mb(r.total)} MB` : `${mb(r.loaded)} MB`;
}

const SMALL_BYTES = 200_000;

/** The rows worth a line each: stages and artifacts of 200 kB or more (or of unknown size); the
 *  small files (Python sources, configs) fold into one "N small files" row. */
export function displayRows(rows) {
  const out = [], small = { label: "", loaded: 0, total: 0, done: true, bytes: true, n: 0 };
  for (const r of rows.values()) {
    if (r.bytes && r.total && r.total < SMALL_BYTES) {
      small.n++; small.loaded += r.loaded; small.total += r.total; small.done &&= r.done;
    } else out.push(r);
  }
  if (small.n) out.push({ ...small, label: `${small.n} small files (Python sources, configs, tokenizers)` });
  return out;
}
