// weight_cache.mjs — the verified weight cache (docs/browser.md, "Weight cache"): model weight files
// (.gguf, .safetensors) and Pyodide's memory snapshot kept in Cache Storage under their sha256 and
// found again by URL.
//   const layer = weightCacheFetch(fetch);    // a fetch that reads and fills the cache; layer.setEnabled(true)
//   const identity = await artifactIdentity(bytes);   // the loaders' sha256 of the bytes they run
//   await listCachedModels(); await forgetCachedModel(sha256 | null); await weightCacheIdle();
// A cached copy is served only when the server's validators (Content-Length, ETag, Last-Modified,
// from a HEAD request) still match what was stored, or when the server cannot be reached (offline).
// Verified on read: the loader hashes the bytes it runs anyway (its identity); a copy served from
// the cache whose hash is not its key is removed, and the load fails with E_MODEL_LOAD marked
// cacheEvicted (the orchestrator then loads once more, from the network). A file read from the
// network is stored while it is read (a second stream, no whole copy in JS), under a pending key,
// and filed under its sha256 once the loader's hash of the same bytes is known.
import { codedError } from "./protocol.mjs";
import { forgetDerived } from "./derived_cache.mjs";
import { sha256Hex } from "./sha256.mjs";
import { passThrough } from "./byte_stream.mjs";

export const CACHE_NAME = "exactspec-weights-v1";
/** On every response of a weight URL through the layer: "hit" | "hit-offline" | "miss" (stored as
 *  it is read) | "not-stored" (no length, or not enough storage quota). */
export const CACHE_HEADER = "x-exactspec-cache";
const TICKET_HEADER = "x-exactspec-cache-ticket";
const KEY_ORIGIN = "https://exactspec.invalid/";       // cache keys only: never fetched
const blobKey = (sha256) => `${KEY_ORIGIN}sha256/${sha256}`;
const indexKey = (url) => `${KEY_ORIGIN}url/${encodeURIComponent(url)}`;
const PENDING = `${KEY_ORIGIN}pending/`;
const PENDING_MAX_AGE_MS = 3600e3;       // a pending copy older than this (a load that died) is dropped
const FILING_GRACE_MS = 600e3;           // an unreferenced blob younger than this may be mid-filing: kept
const FILED_AT_HEADER = "x-exactspec-filed-at";   // on a blob: Date.now() when it was filed
const STARTED_HEADER = "x-exactspec-read-started";  // on a blob: Date.now() when the read it came from began
const OUR_HEADERS = [CACHE_HEADER, TICKET_HEADER, FILED_AT_HEADER, STARTED_HEADER];
const forgottenKey = (sha256) => `${KEY_ORIGIN}forgotten/${sha256 ?? "all"}`;   // {at}: a forget's time
const WEIGHT_FILE = /\.(gguf|safetensors)$|\/pyodide_snapshot\/snapshot\.bin$/i;   // and Pyodide's memory snapshot (31 MB)
const SHA256 = /^[0-9a-f]{64}$/;

const tickets = new Map();               // ticket id -> {kind: "hit" | "store", url, ...}
const byBuffer = new WeakMap();          // ArrayBuffer a loader read from a ticketed response -> ticket
const commits = new Set();               // filings in flight (weightCacheIdle waits for them)

/** Cache Storage's cache for weights, or null where there is none (an insecure context). */
export async function openWeightCache() {
  try {
    return (await globalThis.caches?.open(CACHE_NAME)) ?? null;
  } catch {
    return null;
  }
}

/** Whether the layer caches `url`: a weight file or the Pyodide snapshot over http(s) (a picked
 *  local folder is not). */
export function isCacheableUrl(url) {
  try {
    const u = new URL(url, globalThis.location?.href);
    return (u.protocol === "http:" || u.protocol === "https:") && WEIGHT_FILE.test(u.pathname);
  } catch {
    return false;
  }
}

const nameOf = (url) => decodeURIComponent(new URL(url, globalThis.location?.href).pathname.split("/").filter(Boolean).slice(-2).join("/"));

/** A response with `extra` headers and none of ours that it came with (a server cannot speak for the cache). */
function reheader(res, extra, body = res.body) {
  const headers = new Headers(res.headers);
  for (const h of OUR_HEADERS) headers.delete(h);
  for (const [k, v] of Object.entries(extra)) headers.set(k, v);
  return new Response(body, { status: res.status, statusText: res.statusText, headers });
}

const validatorsOf = (res) => ({ bytes: Number(res.headers.get("content-length") ?? NaN),
  etag: res.headers.get("etag"), last_modified: res.headers.get("last-modified") });

/** "same" when a HEAD of url still matches `meta`'s validators, "changed" when it does not (or the
 *  server says the file is gone), "offline" when the server cannot be reached. */
async function revalidate(url, meta, baseFetch) {
  let res;
  try {
    res = await baseFetch(url, { method: "HEAD", cache: "no-store" });
  } catch {
    return "offline";
  }
  if (!res.ok) return "changed";
  const now = validatorsOf(res);
  if (now.bytes !== meta.bytes) return "changed";
  for (const v of ["etag", "last_modified"]) if (now[v] && meta[v] && now[v] !== meta[v]) return "changed";
  return "same";
}

async function readIndex(cache, url) {
  const res = await cache.match(indexKey(url));
  if (!res) return null;
  try {
    const meta = await res.json();
    if (!(SHA256.test(meta?.sha256) && Number.isSafeInteger(meta.bytes))) return null;
    meta.started = Number(meta.started ?? Date.parse(meta.stored_at));   // NaN: unknown (a forget covers it)
    return meta;
  } catch {
    return null;
  }
}

function ticket(entry) {
  const id = globalThis.crypto.randomUUID();
  tickets.set(id, entry);
  return id;
}

/** The cached copy of url when its validators still hold, as a response marked "hit"; else null. */
async function serveCached(cache, url, baseFetch) {
  const meta = await readIndex(cache, url);
  if (!meta) return null;
  const forgotten = await forgottenSince(cache, meta.sha256, meta.started);   // a filing a forget cut short
  const body = forgotten ? null : await cache.match(blobKey(meta.sha256));
  const state = body ? await revalidate(url, meta, baseFetch) : "changed";
  if (state === "changed") {
    await cache.delete(indexKey(url));
    await pruneUnreferenced(cache);
    return null;
  }
  const id = ticket({ kind: "hit", url, sha256: meta.sha256, cache });
  return reheader(body, { "content-length": String(meta.bytes), "content-type": "application/octet-stream",
    [CACHE_HEADER]: state === "same" ? "hit" : "hit-offline", [TICKET_HEADER]: id });
}

/** res as it is read, its bytes also written under a pending key (filed by artifactIdentity). */
async function storeWhileRead(cache, url, res) {
  const v = validatorsOf(res);
  const estimate = await globalThis.navigator?.storage?.estimate?.().catch(() => null);
  const roomy = !estimate || estimate.quota - estimate.usage > 2.2 * v.bytes;   // the pending copy and the filed one
  if (!res.body || !Number.isSafeInteger(v.bytes) || v.bytes <= 0 || res.headers.get("content-encoding") || !roomy) {
    return reheader(res, { [CACHE_HEADER]: "not-stored" });
  }
  let storeCtl, storing = true, got = 0;
  const toStore = new ReadableStream({ start(c) { storeCtl = c; } });
  const stopStoring = (why) => { if (storing) { storing = false; storeCtl.error(why); } };
  // a byte stream still (byte_stream.mjs): a streaming loader's small reads reach the network's
  const consumer = passThrough(res.body, {
    onPiece(bytes) {
      got += bytes.byteLength;
      if (storing) storeCtl.enqueue(bytes.slice());     // its own copy: the consumer may keep or transfer its piece
    },
    onEnd() {
      if (storing && got === v.bytes) { storing = false; storeCtl.close(); } else stopStoring(new Error("short body"));
    },
    onCancel(reason) {                   // a reader that stops early (a header probe): nothing is stored
      stopStoring(reason ?? new Error("cancelled"));
    },
  });
  const started = Date.now();           // a forget after this undoes the filing (file)
  const pending = `${PENDING}${started}/${globalThis.crypto.randomUUID()}`;
  const stored = cache.put(pending, new Response(toStore, { headers: { "content-length": String(v.bytes) } }))
    .then(() => true, () => { storing = false; return false; });
  const id = ticket({ kind: "store", url, cache, pending, stored, validators: v, started });
  return reheader(res, { [CACHE_HEADER]: "miss", [TICKET_HEADER]: id }, consumer);
}

/** A fetch that serves weight files from the cache and stores the ones it reads from the network,
 *  while enabled (setEnabled); other URLs and methods pass through. -> {fetch, setEnabled(on)} */
export function weightCacheFetch(baseFetch, { open = openWeightCache } = {}) {
  let enabled = false, swept = false;
  async function cachedFetch(input, init) {
    const url = typeof input === "string" ? input : input?.url ?? String(input);
    const method = String(init?.method ?? input?.method ?? "GET").toUpperCase();
    if (!isCacheableUrl(url) || method !== "GET") return baseFetch(input, init);
    const cache = enabled ? await open() : null;   // opened per fetch: a page may have forgotten it meanwhile
    if (cache && !swept) {
      swept = true;
      await dropStalePending(cache).catch(() => {});
      await pruneUnreferenced(cache).catch(() => {});
    }
    if (!cache) return reheader(await baseFetch(input, init), {});
    const hit = await serveCached(cache, url, baseFetch).catch(() => null);
    return hit ?? storeWhileRead(cache, url, await baseFetch(input, init));
  }
  return { fetch: cachedFetch, setEnabled(on) { enabled = !!on; } };
}

/** A loader that read `buffer` (an ArrayBuffer) from `response` says so: artifactIdentity(buffer)
 *  then settles the response's cache ticket. */
export function noteArtifact(response, buffer) {
  const t = tickets.get(response?.headers?.get(TICKET_HEADER));
  if (t) byBuffer.set(buffer instanceof ArrayBuffer ? buffer : buffer.buffer, t);
  return buffer;
}

/** sha256 hex of the bytes a loader runs (its identity); for bytes served from the cache, checked
 *  against the key they were served under (a mismatch removes the copy and throws E_MODEL_LOAD with
 *  cacheEvicted); for bytes read from the network, their copy is filed under it (in the background). */
export async function artifactIdentity(bytes) {
  const identity = await sha256Hex(bytes);
  const buffer = bytes instanceof ArrayBuffer ? bytes : bytes.buffer;
  const t = byBuffer.get(buffer);
  if (!t) return identity;
  byBuffer.delete(buffer);
  return settle(t, identity);
}

/** The same for a loader that hashed `response`'s body as it streamed (StreamedFile): identity,
 *  its sha256 hex, checked against the cache's key or filing the copy, as artifactIdentity does. */
export async function streamedIdentity(response, identity) {
  const t = tickets.get(response?.headers?.get(TICKET_HEADER));
  return t ? settle(t, identity) : identity;
}

async function settle(t, identity) {
  for (const [id, entry] of tickets) if (entry === t) tickets.delete(id);
  if (t.kind === "hit" && identity !== t.sha256) {
    await forgetIn(t.cache, t.sha256).catch(() => {});
    throw Object.assign(codedError("E_MODEL_LOAD", `${nameOf(t.url)}: the cached copy does not match its sha256 ` +
      `(cached as ${t.sha256.slice(0, 12)}…, read as ${identity?.slice(0, 12)}…); it was removed from the cache`), { cacheEvicted: true });
  }
  if (t.kind === "store" && identity) {
    const filing = file(t, identity).catch(() => t.cache.delete(t.pending).catch(() => {}));
    commits.add(filing);
    filing.finally(() => commits.delete(filing));
  }
  return identity;
}

/** The pending copy of a store ticket under its sha256, and url's index entry pointing there. The
 *  blob is written first (a prune spares it while young: FILING_GRACE_MS). A forget of this sha256,
 *  or of everything, after the copy began (another page's Forget, in any worker) undoes the filing:
 *  what the user forgot does not come back from a load that was reading when they asked. Both carry
 *  the read's start, so a filing cut short before its undo (its page closed) is still forgotten:
 *  read, listed and pruned as absent (forgottenSince). */
async function file(t, sha256) {
  if (!(await t.stored)) return;
  const copy = await t.cache.match(t.pending);
  if (!copy) return;
  const filedAt = String(Date.now()), storedAt = new Date().toISOString();
  await t.cache.put(blobKey(sha256), new Response(copy.body, { headers: { "content-length": String(t.validators.bytes),
    [FILED_AT_HEADER]: filedAt, [STARTED_HEADER]: String(t.started) } }));
  await t.cache.put(indexKey(t.url), new Response(JSON.stringify({ sha256, bytes: t.validators.bytes, etag: t.validators.etag,
    last_modified: t.validators.last_modified, url: t.url, name: nameOf(t.url), stored_at: storedAt, started: t.started }),
  { headers: { "content-type": "application/json" } }));
  await t.cache.delete(t.pending);
  if (await forgottenSince(t.cache, sha256, t.started)) {
    if ((await readIndex(t.cache, t.url))?.stored_at === storedAt) await t.cache.delete(indexKey(t.url));
    const blob = await t.cache.match(blobKey(sha256));
    if (blob?.headers.get(FILED_AT_HEADER) === filedAt && !(await inventory(t.cache)).refs.has(sha256)) {
      await t.cache.delete(blobKey(sha256));
    }
  }
}

/** Whether sha256, or everything, was forgotten at or after `since` (ms; NaN, unknown: whenever a
 *  forget was). */
const forgottenSince = (cache, sha256, since) => forgetMarkers(cache)(sha256, since);

/** forgottenSince over one cache with each forget marker read once (an inventory asks per entry). */
function forgetMarkers(cache) {
  const read = new Map();                // marker key -> promise of its time (NaN: none)
  const at = (key) => {
    if (!read.has(key)) read.set(key, cache.match(key).then((res) => (res ? res.json() : null)).then((m) => Number(m?.at), () => NaN));
    return read.get(key);
  };
  return async (sha256, since) => {
    for (const key of [forgottenKey(sha256), forgottenKey(null)]) {
      const t = await at(key);
      if (t >= since || (Number.isFinite(t) && Number.isNaN(since))) return true;
    }
    return false;
  };
}

/** Resolves once every copy read so far is filed (tests and benches, before a second load). */
export async function weightCacheIdle() {
  while (commits.size) await Promise.allSettled([...commits]);
}

async function dropStalePending(cache) {
  for (const req of await cache.keys()) {
    if (!req.url.startsWith(PENDING)) continue;
    const at = Number(req.url.slice(PENDING.length).split("/")[0]);
    if (!(Date.now() - at < PENDING_MAX_AGE_MS)) await cache.delete(req);
  }
}

/** Blobs no live index entry points at any more (a file that changed on its server, a filing undone
 *  or cut short): a forgotten one at once, any other once older than FILING_GRACE_MS (a younger one
 *  may be a filing between its blob and its index entry, in this worker or another, which a load of
 *  another file must not remove). */
async function pruneUnreferenced(cache, now = Date.now()) {
  const { blobs, refs, filedAt, forgotten } = await inventory(cache);
  for (const sha256 of blobs.keys()) {
    const young = now - filedAt.get(sha256) < FILING_GRACE_MS;
    if (!refs.has(sha256) && (forgotten.has(sha256) || !young)) await cache.delete(blobKey(sha256));
  }
}

/** What the cache holds, with whatever a later forget covers left out of refs (index entries) and
 *  marked in `forgotten` (blobs). */
async function inventory(cache) {
  const blobs = new Map(), refs = new Map(), filedAt = new Map(), forgotten = new Set();   // sha256 -> bytes; -> [index meta]; -> ms (NaN: unknown)
  const forgottenAfter = forgetMarkers(cache);
  for (const req of await cache.keys()) {
    if (req.url.startsWith(`${KEY_ORIGIN}sha256/`)) {
      const res = await cache.match(req), sha256 = req.url.slice(`${KEY_ORIGIN}sha256/`.length);
      blobs.set(sha256, Number(res?.headers.get("content-length") ?? 0));
      filedAt.set(sha256, Number(res?.headers.get(FILED_AT_HEADER) ?? NaN));
      const started = Number(res?.headers.get(STARTED_HEADER) ?? res?.headers.get(FILED_AT_HEADER) ?? NaN);
      if (await forgottenAfter(sha256, started)) forgotten.add(sha256);
    } else if (req.url.startsWith(`${KEY_ORIGIN}url/`)) {
      const meta = await readIndex(cache, decodeURIComponent(req.url.slice(`${KEY_ORIGIN}url/`.length)));
      if (meta && !(await forgottenAfter(meta.sha256, meta.started))) refs.set(meta.sha256, [...(refs.get(meta.sha256) ?? []), meta]);
    }
  }
  return { blobs, refs, filedAt, forgotten };
}

async function forgetIn(cache, sha256) {
  for (const meta of (await inventory(cache)).refs.get(sha256) ?? []) await cache.delete(indexKey(meta.url));
  await cache.delete(blobKey(sha256));
}

/** The cached weight files: [{sha256, bytes, name, urls, stored_at}] (name and stored_at from the
 *  newest URL that points at it), largest first; [] where there is no cache. */
export async function listCachedModels() {
  const cache = await openWeightCache();
  if (!cache) return [];
  const { blobs, refs, forgotten } = await inventory(cache);
  return [...blobs].filter(([sha256]) => refs.has(sha256) || !forgotten.has(sha256)).map(([sha256, bytes]) => {
    const metas = (refs.get(sha256) ?? []).sort((a, b) => String(b.stored_at).localeCompare(String(a.stored_at)));
    return { sha256, bytes, name: metas[0]?.name ?? null, urls: metas.map((m) => m.url), stored_at: metas[0]?.stored_at ?? null };
  }).sort((a, b) => b.bytes - a.bytes);
}

/** Forget one cached file (its sha256) with every URL that points at it, or everything (null: the
 *  results derived from them too, web/derived_cache.mjs). */
export async function forgetCachedModel(sha256 = null) {
  if (sha256 !== null && !SHA256.test(String(sha256))) {
    throw codedError("E_BAD_ARGUMENT", `forget: ${JSON.stringify(sha256)} is not a sha256 (64 lowercase hex digits)`);
  }
  const cache = await openWeightCache();
  if (!cache) return;
  if (sha256 !== null) {
    await forgetIn(cache, sha256);
  } else {
    await forgetDerived();
    for (const req of await cache.keys()) await cache.delete(req);   // the entries, not the cache a worker may hold open
  }
  // a filing in flight (a load reading now, in any worker) sees this and undoes itself (file)
  await cache.put(forgottenKey(sha256), new Response(JSON.stringify({ at: Date.now() }), { headers: { "content-type": "application/json" } }));
}
