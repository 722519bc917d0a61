// pyodide_snapshot.mjs — a memory snapshot of a booted Pyodide with the standard-library modules
// exactspec uses, the served wheels (jinja2, markupsafe) and exactspec itself already imported, so
// that the orchestrator worker starts in a few hundred ms instead of seconds
// (loadPyodide({_loadSnapshot})). Made in Node by tools/setup.sh:
//   node tools/pyodide_snapshot.mjs [OUT_DIR=build/pyodide_snapshot]
// writes OUT_DIR/snapshot.bin and OUT_DIR/index.json {pyodide_version, sha256, bytes, modules,
// py_sources (sourcesKey of the exactspec files imported)}. The worker (web/orchestrator/boot.mjs)
// uses it only when its version equals the served Pyodide's and its sha256 matches (else it boots
// the slow way and says why); when the served exactspec sources differ from py_sources it drops
// the snapshot's exactspec modules and imports the served ones. The file system is not part of
// a memory snapshot: the worker writes the wheels' and exactspec's files again after a restore.
// Each output is written to a fresh name beside it and renamed over it, never through a link (a link
// at either output is refused before any work: docs/hostile_input.md, "Files the command line writes").
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const out = path.resolve(process.argv[2] ?? path.join(root, "build", "pyodide_snapshot"));
const pyodideDir = path.join(root, "node_modules", "pyodide");
const outputs = { snapshot: path.join(out, "snapshot.bin"), index: path.join(out, "index.json") };
for (const file of [out, ...Object.values(outputs)]) {
  if (fs.lstatSync(file, { throwIfNoEntry: false })?.isSymbolicLink()) {
    console.error(`pyodide snapshot: E_IO: ${file}: is a symbolic link; exactspec never writes through a link`);
    process.exit(1);
  }
}

/** data to `file` through a fresh name ("wx": created new, no link followed), renamed over it. */
function writeFresh(file, data) {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${randomBytes(6).toString("hex")}.tmp`);
  try {
    fs.writeFileSync(tmp, data, { flag: "wx" });
    fs.renameSync(tmp, file);
  } finally {
    fs.rmSync(tmp, { force: true });
  }
}
const version = JSON.parse(fs.readFileSync(path.join(pyodideDir, "package.json"), "utf8")).version;
// the standard library exactspec's browser modules import (web/orchestrator/py_files.json)
// plus what installing the served wheels (pyodide.unpackArchive) and importing jinja2 pull in
export const MODULES = ["json", "re", "hashlib", "math", "dataclasses", "unicodedata", "operator", "uuid", "time",
  "stat", "secrets", "platform", "numbers", "heapq", "bisect", "typing", "fractions", "datetime", "asyncio", "os",
  "sys", "string", "functools", "itertools", "collections", "base64", "struct", "zipfile", "shutil", "tarfile",
  "tempfile", "pathlib", "importlib.metadata", "importlib.machinery", "email.parser", "sysconfig", "ast", "inspect",
  "keyword", "weakref", "textwrap", "pprint", "decimal", "copy", "fnmatch", "io", "enum", "abc", "types",
  "contextlib", "collections.abc", "html", "urllib.parse", "random", "codecs", "encodings.idna"];

const t0 = performance.now();
const { loadPyodide } = await import(pathToFileURL(path.join(pyodideDir, "pyodide.mjs")).href);
const { sourcesKey, IMPORTS, writeSources } = await import(pathToFileURL(path.join(root, "web", "orchestrator", "py_sources.mjs")).href);
const pyodide = await loadPyodide({ indexURL: pyodideDir + path.sep, _makeSnapshot: true });
pyodide.runPython(MODULES.map((m) => `import ${m}`).join("\n"));
const wheelsIndex = path.join(root, "build", "wheels", "index.json");
if (fs.existsSync(wheelsIndex)) {            // jinja2 for chat templates: imported, ready to render
  for (const { file } of JSON.parse(fs.readFileSync(wheelsIndex, "utf8")).wheels) {
    pyodide.unpackArchive(new Uint8Array(fs.readFileSync(path.join(root, "build", "wheels", file))), "wheel");
  }
  pyodide.runPython("import markupsafe, jinja2, jinja2.ext, jinja2.sandbox");
}
const names = JSON.parse(fs.readFileSync(path.join(root, "web", "orchestrator", "py_files.json"), "utf8"));
const sources = names.map((f) => new Uint8Array(fs.readFileSync(path.join(root, "py", "exactspec", f))));
writeSources(pyodide, names, sources);
pyodide.runPython(IMPORTS);
const pySources = await sourcesKey(names, sources);
const snapshot = pyodide.makeMemorySnapshot();
fs.mkdirSync(out, { recursive: true });
writeFresh(outputs.snapshot, snapshot);
const index = { pyodide_version: version, sha256: createHash("sha256").update(snapshot).digest("hex"),
  bytes: snapshot.length, modules: MODULES, py_sources: pySources };
writeFresh(outputs.index, JSON.stringify(index, null, 1) + "\n");
console.log(`pyodide snapshot: ${(snapshot.length / 1e6).toFixed(1)} MB, pyodide ${version}, ` +
  `${((performance.now() - t0) / 1000).toFixed(1)} s -> ${path.relative(root, out)}`);
