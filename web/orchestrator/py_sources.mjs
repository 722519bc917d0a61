// py_sources.mjs — where the exactspec sources live in Pyodide, the import that checks them, and
// the key that says whether a Pyodide snapshot (tools/pyodide_snapshot.mjs) was made from the
// same sources as the ones served now. Shared by the worker's boot and the snapshot tool.
import { sha256Hex } from "../sha256.mjs";

export const PY_HOME = "/home/pyodide";

// the import check: a missing or broken file fails here, loudly, not at the first request
export const IMPORTS = `
import sys
if "${PY_HOME}" not in sys.path:
    sys.path.insert(0, "${PY_HOME}")
import exactspec.browser_backend, exactspec.orchestrator, exactspec.tokenizer, exactspec.manifest, exactspec.config
`;

// drop every exactspec module (a snapshot's, made from other sources) so that IMPORTS reads the
// files just written
export const FORGET = `
import importlib, sys
for name in [m for m in sys.modules if m == "exactspec" or m.startswith("exactspec.")]:
    del sys.modules[name]
importlib.invalidate_caches()
`;

/** sha256 over the (name, sha256 of bytes) list of py_files.json's files, in its order. */
export async function sourcesKey(names, blobs) {
  const hashes = await Promise.all(blobs.map((b) => sha256Hex(b)));
  const listing = new TextEncoder().encode(JSON.stringify(names.map((n, i) => [n, hashes[i]])));
  return sha256Hex(listing);
}
