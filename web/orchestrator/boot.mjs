// Boot Pyodide offline from the engine's own origin and install the exactspec Python sources
// into it. Every URL comes from `assets` (resolved by the page from the engine module's URL or
// its baseUrl option): nothing here is root-absolute, so the engine runs from any path or origin.
import { sha256Hex } from "../sha256.mjs";
import { FORGET, IMPORTS, PY_HOME, sourcesKey } from "./py_sources.mjs";
import { installWheels } from "./wheels.mjs";

export async function fetchOk(url, as = "text") {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`E_MODEL_LOAD: ${url}: HTTP ${r.status}`);
  return as === "bytes" ? new Uint8Array(await r.arrayBuffer()) : as === "json" ? r.json() : r.text();
}

/** Where the worker finds Pyodide, the Python sources and its file list, by default relative to
 *  this module (web/orchestrator/ -> ../../node_modules/pyodide/, ../../py/exactspec/). */
export function defaultAssets(here = import.meta.url) {
  return {
    pyodide: new URL("../../node_modules/pyodide/", here).href,
    py: new URL("../../py/exactspec/", here).href,
    pyFiles: new URL("./py_files.json", here).href,
    snapshot: new URL("../../build/pyodide_snapshot/", here).href,
  };
}

/** The memory snapshot tools/pyodide_snapshot.mjs made (a booted Pyodide with the standard
 *  library exactspec imports), when one is served for this very Pyodide and its bytes hash
 *  right: -> {bytes, status: "used"}; else {bytes: null, status: why not}. */
async function fetchSnapshot(base, version) {
  if (!base) return { bytes: null, status: "not configured" };
  let index;
  try {
    const r = await fetch(new URL("index.json", base));
    if (!r.ok) return { bytes: null, status: `absent (HTTP ${r.status})` };
    index = await r.json();
  } catch (err) {
    return { bytes: null, status: `absent (${err.message ?? err})` };
  }
  if (index.pyodide_version !== version) return { bytes: null, status: `made for pyodide ${index.pyodide_version}, not ${version}` };
  const bytes = await fetchOk(new URL("snapshot.bin", base).href, "bytes");
  const got = await sha256Hex(bytes);
  if (got !== null && got !== index.sha256) return { bytes: null, status: "sha256 differs from its index.json" };
  return { bytes, status: "used", pySources: index.py_sources ?? null };
}

// -> { pyodide, timing_ms: { pyodide, install }, snapshot: "used" | why it was not }
// With a snapshot Pyodide starts in ~0.3 s instead of ~3 s; one that fails to restore is
// reported (snapshot: "failed: ...") and Pyodide boots the slow way: nothing has run yet.
export async function bootPython(assets = defaultAssets()) {
  const t0 = performance.now();
  const { loadPyodide, version } = await import(new URL("pyodide.mjs", assets.pyodide).href);
  let { bytes, status, pySources } = await fetchSnapshot(assets.snapshot, version);
  let pyodide = null;
  if (bytes) {
    try {
      pyodide = await loadPyodide({ indexURL: assets.pyodide, _loadSnapshot: bytes });
    } catch (err) {
      status = `failed: ${err.message ?? err}`;
    }
  }
  pyodide ??= await loadPyodide({ indexURL: assets.pyodide });
  const t1 = performance.now();
  await installWheels(pyodide, assets.wheels);   // jinja2 for chat templates (build/wheels/)
  const files = await fetchOk(assets.pyFiles, "json");
  pyodide.FS.mkdirTree(`${PY_HOME}/exactspec`);
  const blobs = await Promise.all(files.map((f) => fetchOk(new URL(f, assets.py).href, "bytes")));
  files.forEach((f, i) => pyodide.FS.writeFile(`${PY_HOME}/exactspec/${f}`, blobs[i]));
  if (status === "used" && pySources !== await sourcesKey(files, blobs)) {   // made from other sources
    pyodide.runPython(FORGET);
    status = "used (exactspec sources changed since: re-imported)";
  }
  pyodide.runPython(IMPORTS);
  return { pyodide, timing_ms: { pyodide: t1 - t0, install: performance.now() - t1 }, snapshot: status };
}
