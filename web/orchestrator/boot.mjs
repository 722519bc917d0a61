// Boot Pyodide offline from the engine's own origin and install the exactspec Python sources
// into it. Every URL comes from `assets` (resolved by the page from the engine module's URL or
// its baseUrl option): nothing here is root-absolute, so the engine runs from any path or origin.

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
  };
}

// -> { pyodide, timing_ms: { pyodide, install } }
export async function bootPython(assets = defaultAssets()) {
  const t0 = performance.now();
  const { loadPyodide } = await import(new URL("pyodide.mjs", assets.pyodide).href);
  const pyodide = await loadPyodide({ indexURL: assets.pyodide });
  const t1 = performance.now();
  const files = await fetchOk(assets.pyFiles, "json");
  pyodide.FS.mkdirTree("/home/pyodide/exactspec");
  const blobs = await Promise.all(files.map((f) => fetchOk(new URL(f, assets.py).href, "bytes")));
  files.forEach((f, i) => pyodide.FS.writeFile(`/home/pyodide/exactspec/${f}`, blobs[i]));
  // import check: a missing or broken file fails here, loudly, not at the first request
  pyodide.runPython(`
import sys
sys.path.insert(0, "/home/pyodide")
import exactspec.browser_backend, exactspec.orchestrator, exactspec.tokenizer, exactspec.manifest, exactspec.config
`);
  return { pyodide, timing_ms: { pyodide: t1 - t0, install: performance.now() - t1 } };
}
