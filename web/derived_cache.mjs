// derived_cache.mjs — results this engine's own code computed from an artifact's bytes (the GGUF
// check's rebuilt config and tokenizer files, ~2 MB of JSON from 1-2 s of Pyodide), kept in Cache
// Storage under the sha256 of what they were computed from (the input bytes' sha256, the Python
// sources' identity, the arguments) and checked on read against their own sha256.
//   const key = await derivedKey({kind: "gguf-check", input: sha, code, size, label});
//   const text = await readDerived(key) ?? compute();   await writeDerived(key, text);
import { sha256Hex } from "./sha256.mjs";

export const DERIVED_CACHE = "exactspec-derived-v1";
const KEY_ORIGIN = "https://exactspec.invalid/derived/";    // cache keys only: never fetched
const SHA_HEADER = "x-exactspec-sha256";

const textSha = (text) => sha256Hex(new TextEncoder().encode(text));

/** sha256 hex of `parts` (a plain object; its keys sorted). */
export function derivedKey(parts) {
  return textSha(JSON.stringify(Object.keys(parts).sort().map((k) => [k, parts[k]])));
}

/** The text stored under key, or null (none, no Cache Storage, or one that fails its sha256: removed). */
export async function readDerived(key) {
  try {
    const cache = await globalThis.caches.open(DERIVED_CACHE);
    const res = await cache.match(KEY_ORIGIN + key);
    if (!res) return null;
    const text = await res.text();
    if (await textSha(text) === res.headers.get(SHA_HEADER)) return text;
    await cache.delete(KEY_ORIGIN + key);
    return null;
  } catch {
    return null;
  }
}

/** Store text under key (best effort: a full quota or no Cache Storage stores nothing). */
export async function writeDerived(key, text) {
  try {
    const cache = await globalThis.caches.open(DERIVED_CACHE);
    await cache.put(KEY_ORIGIN + key, new Response(text, { headers: { "content-type": "application/json", [SHA_HEADER]: await textSha(text) } }));
  } catch { /* nothing stored */ }
}

/** Drop every derived result (forgetCachedModel(null) does, with the weights). */
export async function forgetDerived() {
  try {
    await globalThis.caches?.delete(DERIVED_CACHE);
  } catch { /* none */ }
}
