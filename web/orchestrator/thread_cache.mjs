// thread_cache.mjs — the WASM champion's thread choice (champion_backends.mjs calibrateThreads), kept
// per device, browser and model in the calibration's IndexedDB store, so that a second load spends
// a spot check (one timed step) instead of the 1.5 s timing (docs/browser.md, "Threads").
//   const tc = await threadCacheFor(backend, mode);   // null: measure, keep nothing
//   backend.warmUp({ cachedThreads: tc?.entry });     // -> {..., threads_measured} when it measured
//   if (w.threads_measured) await tc?.store(w.threads_measured);
import { calibrationKey, openCalibrationCache } from "./calibrate.mjs";

export const THREADS_ENTRY_VERSION = 1;

/** A stored choice fit for `key`: this version, this key, a timed median for the count it kept. */
export function usableThreads(entry, key) {
  return !!entry && entry.kind === "threads" && entry.version === THREADS_ENTRY_VERSION && entry.key === key &&
    Number.isInteger(entry.threads) && entry.threads >= 1 && entry.ms?.[entry.threads] > 0;
}

/** The cache of this backend's thread choice under calibrate `mode`: "auto" reads and writes, "force"
 *  writes (a fresh timing), "off" neither (null, as for a backend that times nothing: WebGPU, a
 *  requested count, no pool, no IndexedDB). -> {key, entry (or null), store(measured)} */
export async function threadCacheFor(backend, mode, { open = openCalibrationCache } = {}) {
  if (mode === "off" || backend.kind !== "wasm" || !backend.threadsPlan?.calibrate) return null;
  const cache = await open();
  if (!cache) return null;
  const key = await calibrationKey({ kind: "threads", champion: backend.identity, matmul: backend.matmul, simd: backend.simd,
    pool: backend.threadsPlan.count, cores: globalThis.navigator?.hardwareConcurrency ?? 0,
    user_agent: globalThis.navigator?.userAgent ?? "" });
  const entry = mode === "auto" ? await cache.get(key).catch(() => null) : null;
  return {
    key,
    entry: usableThreads(entry, key) ? entry : null,
    store: ({ threads, ms, reps }) => cache.put({ kind: "threads", version: THREADS_ENTRY_VERSION, key, threads, ms, reps,
      measured_at: new Date().toISOString() }).catch(() => {}),
  };
}
