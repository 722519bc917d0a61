// fetch with a byte counter over the response body, and local model files behind virtual URLs.
//   const f = progressFetch(fetch, (p) => ...);   // p = {url, name, loaded, total, done}
//   const res = await f(url);                      // same Response, its body counted as it is read
// The orchestrator worker installs one such fetch for its whole life (installWorkerFetch): every
// artifact a load fetches (Pyodide, Python sources, model files, WASM builds, shaders) reports its
// bytes without the loaders knowing, and URLs under LOCAL_SCHEME are answered from File objects
// the page handed over (a model folder picked with <input webkitdirectory>: nothing is uploaded).
// Between the two sits the weight cache (web/weight_cache.mjs): a weight file's progress says
// where its bytes came from (p.cache: "hit" | "hit-offline" | "miss" | "not-stored").
import { CACHE_HEADER, weightCacheFetch } from "./weight_cache.mjs";
import { passThrough } from "./byte_stream.mjs";


export const LOCAL_SCHEME = "exactspec-local:";
const REPORT_EVERY_MS = 100;

/** The last path segment of a URL (what the page shows as the artifact's name). */
export function artifactName(url) {
  const path = String(url).split(/[?#]/)[0];
  const parts = path.split("/").filter(Boolean);
  return parts.slice(-2).join("/") || path;
}

/** A Response whose body reports {url, name, loaded, total, done[, cache]} while it is read (at most
 *  every 100 ms, and once at the end). total is Content-Length, or 0 when unknown; cache: what the
 *  weight cache did with it (its header), absent for files it does not cache. */
export function countedResponse(response, url, onProgress, now = () => performance.now()) {
  if (!response.body || !onProgress) return response;
  const total = Number(response.headers.get("content-length") ?? 0) || 0;
  const name = artifactName(url);
  const cache = response.headers.get(CACHE_HEADER);
  let loaded = 0, last = -Infinity;
  const report = (done) => {
    try { onProgress({ url: String(url), name, loaded, total, done, ...(cache ? { cache } : {}) }); } catch { /* a listener never breaks a load */ }
  };
  // a byte stream still (byte_stream.mjs): a streaming loader's small reads reach the network's
  const counted = passThrough(response.body, {
    onPiece(chunk) {
      loaded += chunk.byteLength;
      if (now() - last >= REPORT_EVERY_MS) { last = now(); report(false); }
    },
    onEnd() { report(true); },
  });
  report(false);
  return new Response(counted, { status: response.status, statusText: response.statusText, headers: response.headers });
}

/** fetch(input, init) that counts every response body through onProgress() (read at call time,
 *  so it can be swapped or null). */
export function progressFetch(baseFetch, getListener) {
  return async (input, init) => {
    const response = await baseFetch(input, init);
    const url = typeof input === "string" ? input : input.url ?? String(input);
    const listener = getListener();
    return listener ? countedResponse(response, url, listener) : response;
  };
}

/** Answer URLs under LOCAL_SCHEME from a map "role/relative/path" -> Blob; other URLs go to base. */
export function localFilesFetch(baseFetch, files) {
  return async (input, init) => {
    const url = typeof input === "string" ? input : input.url ?? String(input);
    if (!url.startsWith(LOCAL_SCHEME)) return baseFetch(input, init);
    const key = decodeURIComponent(url.slice(LOCAL_SCHEME.length).replace(/^\/+/, "").split(/[?#]/)[0]);
    const blob = files.get(key);
    if (!blob) return new Response(`no local file ${key}`, { status: 404, statusText: "Not Found" });
    return new Response(blob, { status: 200, headers: { "content-length": String(blob.size),
      "content-type": key.endsWith(".wasm") ? "application/wasm" : "application/octet-stream" } });
  };
}

/** For the orchestrator worker: replace globalThis.fetch once; returns {setListener(fn|null),
 *  setLocalFiles(map), setCache(on)}. Local files stay until the next load replaces them; the
 *  weight cache is off until a load turns it on (its option cache, default true). */
export function installWorkerFetch(scope = globalThis) {
  const native = scope.fetch.bind(scope);
  let listener = null;
  const files = new Map();
  const cache = weightCacheFetch(localFilesFetch(native, files));
  scope.fetch = progressFetch(cache.fetch, () => listener);
  return {
    setCache: cache.setEnabled,
    setListener(fn) { listener = fn; },
    setLocalFiles(entries) {
      files.clear();
      for (const [k, v] of Object.entries(entries ?? {})) files.set(k, v);
    },
  };
}

/** The virtual base URL of a local model folder of `role` ("champion" | "draft"). */
export const localModelUrl = (role) => `${LOCAL_SCHEME}/${role}/`;
