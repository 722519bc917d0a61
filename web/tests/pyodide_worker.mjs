// Test worker: boots Pyodide + exactspec, then runs Python snippets sent by the test page.
import { bootPython } from "/web/orchestrator/boot.mjs";

const booted = bootPython();
self.onmessage = async (ev) => {
  try {
    const { pyodide, timing_ms } = await booted;
    const value = await pyodide.runPythonAsync(ev.data.code);
    self.postMessage({ ok: true, value: typeof value === "string" ? value : String(value), timing_ms });
  } catch (err) {
    self.postMessage({ ok: false, error: String(err) });
  }
};
