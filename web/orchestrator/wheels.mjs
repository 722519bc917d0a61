// Install the pure-Python wheels the project serves itself (build/wheels/, written by
// tools/pyodide_wheels.py: jinja2 and a pure-Python markupsafe) into Pyodide, offline: each
// wheel listed in build/wheels/index.json is fetched, its sha256 checked, and unpacked into
// site-packages (pyodide.unpackArchive; no micropip, whose wheel the npm package lacks).
import { sha256Hex } from "../sha256.mjs";

/** build/wheels/ relative to this module (web/orchestrator/ -> ../../build/wheels/). */
export function defaultWheelsUrl(here = import.meta.url) {
  return new URL("../../build/wheels/", here).href;
}

// -> the installed wheel file names ([] when no index is served: set-up has not built them, and
// Python then renders only the project's own chat template, refusing others by name)
export async function installWheels(pyodide, base = defaultWheelsUrl()) {
  const r = await fetch(new URL("index.json", base));
  if (!r.ok) return [];
  const { wheels } = await r.json();
  const installed = [];
  for (const { file, sha256 } of wheels) {
    const resp = await fetch(new URL(file, base));
    if (!resp.ok) throw new Error(`E_MODEL_LOAD: ${file}: HTTP ${resp.status}`);
    const bytes = new Uint8Array(await resp.arrayBuffer());
    const got = await sha256Hex(bytes);
    if (got !== null && got !== sha256) {
      throw new Error(`E_MODEL_LOAD: build/wheels/${file}: sha256 ${got} differs from build/wheels/index.json`);
    }
    pyodide.unpackArchive(bytes, "wheel");
    installed.push(file);
  }
  return installed;
}
