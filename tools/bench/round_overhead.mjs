// round_overhead.mjs — tools/bench/round_overhead.py in Pyodide under Node, where the browser's
// orchestrator runs: the orchestrator's cost per round by phase and mode, each event posted to a
// JS function as the worker posts it.
//   node tools/bench/round_overhead.mjs [TOKENS=128] [REQUESTS=15]
//   node tools/bench/round_overhead.mjs --baseline OTHER/py [--passes 8] [TOKENS] [REQUESTS]
// With --baseline, a second Pyodide runs the exactspec sources of OTHER/py (a checkout of another
// commit, e.g. `git worktree add /tmp/base <rev>`), passes alternate between the two (this machine's
// noise hits both alike), and the last lines give each tree's median cost outside the call by mode.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const pyodideDir = path.join(root, "node_modules", "pyodide");
const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at < 0 ? fallback : args.splice(at, 2)[1];
};
const baseline = option("--baseline", null);
const passes = Number(option("--passes", "8"));
const [tokens = "128", requests = "15"] = args;
const { loadPyodide } = await import(pathToFileURL(path.join(pyodideDir, "pyodide.mjs")).href);
const { IMPORTS, writeSources } = await import(pathToFileURL(path.join(root, "web", "orchestrator", "py_sources.mjs")).href);
const names = JSON.parse(fs.readFileSync(path.join(root, "web", "orchestrator", "py_files.json"), "utf8"));
let posted = 0;

/** A Pyodide with the exactspec sources of `pyDir` (a py/ folder) and the bench imported. */
async function boot(pyDir) {
  console.error(`round overhead: booting Pyodide with ${path.relative(process.cwd(), pyDir) || "."} ...`);
  const pyodide = await loadPyodide({ indexURL: pyodideDir + path.sep });
  writeSources(pyodide, names, names.map((f) => new Uint8Array(fs.readFileSync(path.join(pyDir, "exactspec", f)))));
  pyodide.runPython(IMPORTS);
  pyodide.FS.writeFile("/home/pyodide/round_overhead.py", fs.readFileSync(path.join(root, "tools", "bench", "round_overhead.py")));
  pyodide.globals.set("post", (text) => { posted += text.length; });
  pyodide.runPython("import round_overhead");
  return pyodide;
}

const ours = await boot(path.join(root, "py"));
if (!baseline) {
  ours.globals.set("argv", ours.toPy([tokens, requests]));
  ours.runPython("round_overhead.main(list(argv), post)");
} else {
  const trees = [["this tree", ours], [baseline, await boot(path.resolve(baseline))]];
  const outside = trees.map(() => ({}));
  for (let pass = 0; pass < passes; pass++) {
    trees.forEach(([name, pyodide], i) => {
      for (const mode of ["none", "auto"]) {
        const row = JSON.parse(pyodide.runPython(
          `import json; json.dumps(round_overhead.measure("${mode}", 0.0, ${Number(tokens)}, ${Number(requests)}, **round_overhead.SCENARIO, post=post))`));
        (outside[i][mode] ??= []).push(row.us_outside_call);
        console.error(`pass ${pass + 1}/${passes} ${name} ${mode}: ${row.us_outside_call} us outside the call ${JSON.stringify(row.us_per_round)}`);
      }
    });
  }
  const median = (v) => v.slice().sort((a, b) => a - b)[v.length >> 1];
  const summary = trees.map(([name], i) => ({ tree: name, none_us: median(outside[i].none), auto_us: median(outside[i].auto),
    passes: outside[i] }));
  for (const s of summary) console.error(`${s.tree}: outside the call, median of ${passes} passes: none ${s.none_us} us, auto ${s.auto_us} us a round`);
  console.log(JSON.stringify({ round_overhead_ab: summary }));
}
console.error(`round overhead: ${(posted / 1e6).toFixed(1)} MB of events posted`);
