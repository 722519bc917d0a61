// pyodide_harness.mjs — page script of web/tests/pyodide_harness.html (window.runPy, window.harnessReady).
// runPy(code) -> {ok, value | error, timing_ms}: runs Python in a module worker with exactspec
const worker = new Worker("/web/tests/pyodide_worker.mjs", { type: "module" });
let pending = null;
worker.onmessage = (ev) => { const p = pending; pending = null; p(ev.data); };
worker.onerror = (ev) => { if (pending) { const p = pending; pending = null; p({ ok: false, error: ev.message }); } };
window.runPy = (code) => new Promise((resolve) => { pending = resolve; worker.postMessage({ code }); });
window.harnessReady = true;
