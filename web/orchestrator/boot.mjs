// Boot Pyodide offline from this origin and install the exactspec Python sources into it.
import { loadPyodide } from "/node_modules/pyodide/pyodide.mjs";

export async function fetchOk(url, as = "text") {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`E_MODEL_LOAD: ${url}: HTTP ${r.status}`);
  return as === "bytes" ? new Uint8Array(await r.arrayBuffer()) : as === "json" ? r.json() : r.text();
}

// -> { pyodide, timing_ms: { pyodide, install } }
export async function bootPython() {
  const t0 = performance.now();
  const pyodide = await loadPyodide({ indexURL: "/node_modules/pyodide/" });
  const t1 = performance.now();
  const files = await fetchOk("/web/orchestrator/py_files.json", "json");
  pyodide.FS.mkdirTree("/home/pyodide/exactspec");
  const blobs = await Promise.all(files.map((f) => fetchOk(`/py/exactspec/${f}`, "bytes")));
  files.forEach((f, i) => pyodide.FS.writeFile(`/home/pyodide/exactspec/${f}`, blobs[i]));
  // import check: a missing or broken file fails here, loudly, not at the first request
  pyodide.runPython(`
import sys
sys.path.insert(0, "/home/pyodide")
import exactspec.browser_backend, exactspec.orchestrator, exactspec.tokenizer, exactspec.manifest, exactspec.config
`);
  return { pyodide, timing_ms: { pyodide: t1 - t0, install: performance.now() - t1 } };
}
