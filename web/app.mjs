// The page: loads a pair with real progress, streams answers with every token marked by its
// source, plots live statistics, and offers each answer's privacy-safe receipt as JSON.
// It drives the engine only through the public module (exactspec.mjs), like an embedding site.
import { createEngine } from "./exactspec.mjs";
import { applyProgress, bytesText, displayRows, finishRows } from "./ui/load_progress.mjs";
import { createLiveStats, waterfall } from "./ui/live_stats.mjs";
import { memoryChart, roundsChart, survivalChart, waterfallChart } from "./ui/charts.mjs";

const $ = (id) => document.getElementById(id);
const MEMORY_POLL_MS = 1000;
const page = { engine: null, running: false, lastReceipt: null, loadTiming: null, loads: 0,
  source: { champion: undefined, draft: undefined } };
window.appState = page;   // tests read appState.stage / loads / lastResult (this page's memory only)

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

const coded = (err) => (err?.code ? `${err.code}: ${err.detail ?? err.message}` : `E_INTERNAL: ${err?.message ?? err}`);

// ---------------------------------------------------------------- loading
function renderProgress(rows) {
  $("progress").replaceChildren(...displayRows(rows).map((r) => {
    const li = document.createElement("li");
    li.className = r.done ? "done" : "active";
    const label = document.createElement("span");
    label.textContent = `${r.done ? "✓" : "…"} ${r.label}`;
    li.append(label);
    if (r.bytes) {
      const bar = document.createElement("progress");
      bar.max = r.total || 1;
      bar.value = r.total ? r.loaded : (r.done ? 1 : 0);
      bar.setAttribute("aria-label", r.label);
      const txt = document.createElement("span");
      txt.className = "bytes";
      txt.textContent = bytesText(r);
      li.append(bar, txt);
    }
    return li;
  }));
}

function setModes(info) {
  const draftOk = !!info.draft && !info.draft_error;
  const opt = [...$("speculate").options].find((o) => o.value === "draft");
  opt.disabled = !draftOk;
  opt.textContent = draftOk ? "speculative (draft model)"
    : info.draft_loading ? "speculative (draft model) — the draft is loading…" : "speculative (draft model) — no draft loaded";
  if (!draftOk && $("speculate").value === "draft") $("speculate").value = "lookup";
}

/** Load buttons off while a load runs: a second click would start a second engine (each with its
 *  own Pyodide and WASM memory) that nothing ever terminates. */
function setLoadButtons(enabled) {
  $("load_models").disabled = !enabled;
  $("load_shipped").disabled = !enabled;
}

async function loadModels() {
  if (page.stage === "loading") return;   // a click that got through while a load runs: ignored
  page.stage = "loading";
  setLoadButtons(false);
  window.appDraftReady = false;   // true once this load's draft has arrived (or failed): draftArrived
  $("go").disabled = true;
  $("go").textContent = "Loading models…";
  const rows = new Map();
  // the page is usable once the champion is ready; the draft loads behind it and switches
  // speculation on when it arrives ("draft_ready")
  const onProgress = (p) => {
    if (p.stage === "draft_ready") return draftArrived(p);
    applyProgress(rows, p);
    renderProgress(rows);
  };
  const options = { championBackend: $("champion_backend").value, onProgress, draftInBackground: true };
  const t0 = performance.now();
  setStatus("loading…");
  try {
    if (page.engine && !page.engine.engine.terminated) {
      await page.engine.load(page.source, options);
    } else {                                  // the first load, or after an engine ended (E_TIMEOUT)
      page.engine = await createEngine({ ...page.source, ...options });
    }
  } catch (err) {
    if (page.engine) page.engine.engine.ready = null;   // the worker holds no model after a refused load
    renderProgress(rows);
    setStatus(`could not load: ${coded(err)}`, true);
    $("go").textContent = "Unavailable";
    page.stage = "failed";
    page.loads++;
    setLoadButtons(true);
    return;
  }
  renderProgress(finishRows(rows));
  const { info, timing_ms } = page.engine.ready;
  page.loadTiming = timing_ms;
  const champ = info.champion;
  const draftNote = info.draft_error ? ` — the draft could not load (${info.draft_error.code}: ${info.draft_error.message}); champion alone and prompt lookup work`
    : info.draft ? ` — draft ${info.draft.placement}, speculation on`
    : info.draft_loading ? " — the draft is loading; champion alone and prompt lookup work now" : " — no draft: champion alone and prompt lookup";
  setStatus(`models loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s; champion on ${champ.backend} (${champ.backend_why})${draftNote}`,
    !!info.draft_error);
  setModes(info);
  $("go").textContent = "Generate";
  $("go").disabled = false;
  page.stage = "ready";
  page.loads++;
  setLoadButtons(true);
  window.appReady = true;
}

function draftArrived(p) {
  if (!page.engine?.engine?.ready) return;
  const info = page.engine.engine.ready.info;
  setModes(info);
  setStatus(p.draft_error ? `the draft could not load (${p.draft_error.code}: ${p.draft_error.message}); champion alone and prompt lookup work`
    : `draft ready (${info.draft.placement}, ${(p.draft_load_ms / 1000).toFixed(1)} s): speculation on`, !!p.draft_error);
  window.appDraftReady = true;
}

function pickFolders() {
  const champion = $("champion_folder").files, draft = $("draft_folder").files;
  if (!champion.length) {
    setStatus("E_BAD_ARGUMENT: choose a champion folder first (the draft folder is optional)", true);
    return false;
  }
  page.source = { champion, draft: draft.length ? draft : null };
  const name = (fl) => (fl[0].webkitRelativePath || fl[0].name).split("/")[0];
  $("model_source").textContent = `local folders: champion ${name(champion)}${draft.length ? `, draft ${name(draft)}` : ", no draft"}`;
  return true;
}

// ---------------------------------------------------------------- one answer
function readOptions() {
  const num = (id) => Number($(id).value);
  const stops = $("stop_strings").value.split("\n").filter((s) => s.length > 0);
  const opts = { chat: $("chat").checked, raw_text: $("raw_text").checked, speculate: $("speculate").value, k: num("k"), temperature: num("temperature"),
    top_k: num("top_k"), top_p: num("top_p"), repetition_penalty: num("repetition_penalty"), seed: num("seed"),
    max_new_tokens: num("max_new_tokens"), stop_strings: stops };
  if ($("scheduler").value !== "static") opts.scheduler = $("scheduler").value;   // the adaptive k scheduler
  return opts;
}

function appendTokens(payload) {
  const out = $("output");
  const texts = payload.token_texts ?? [payload.text];
  texts.forEach((text, i) => {
    if (!text) return;
    const span = document.createElement("span");
    const source = payload.sources?.[i] ?? "baseline";
    span.className = `tok src-${source}`;
    span.dataset.source = source;
    span.title = source;
    span.textContent = text;
    out.append(span);
  });
}

function renderLive(live, result = null) {
  const s = live.snapshot(performance.now(), result);
  $("tps").textContent = s.tokensPerS === null ? "–" : s.tokensPerS.toFixed(1);
  $("ttft").textContent = s.ttftMs === null || s.ttftMs === undefined ? "–" : `${s.ttftMs.toFixed(0)} ms`;
  $("ntokens").textContent = String(s.tokens);
  $("nrounds").textContent = String(s.rounds);
  $("survival_chart").innerHTML = survivalChart(s.survival);
  $("rounds_chart").innerHTML = roundsChart(s.acceptedPerRound, s.proposedPerRound);
  $("waterfall_chart").innerHTML = waterfallChart(waterfall(page.loadTiming, s.answer));
  page.live = s;
}

async function renderMemory() {
  try {
    const m = await page.engine.memory();
    $("memory_chart").innerHTML = memoryChart({ "GPU buffers": m.gpu_bytes_live, "WASM champion": m.wasm_champion_bytes,
      "WASM draft": m.wasm_draft_bytes, "Pyodide heap": m.pyodide_heap_bytes });
  } catch { /* the engine went away; the last chart stays */ }
}

function showStats(r) {
  const st = r.stats, t = r.timing_ms;
  const rows = [
    ["finish", r.finish_reason + (r.error ? ` (${r.error.code}: ${r.error.message})` : "")],
    ["tokens", r.token_ids.length],
    ["rounds", st.rounds + st.baseline_steps],
    ["accepted / proposed", `${st.accepted} / ${st.proposed}`],
    ["tokens per round", st.tokens_per_round ?? "–"],
    ["time to first token", `${(t.first_token ?? 0).toFixed(0)} ms`],
    ["decode", `${t.decode.toFixed(0)} ms (${(1000 * r.token_ids.length / Math.max(t.decode, 1)).toFixed(1)} tokens/s)`],
    ["draft / verify per round", t.per_round ? `${t.per_round.draft.toFixed(1)} / ${t.per_round.verify.toFixed(1)} ms` : "–"],
  ];
  $("stats").replaceChildren(...rows.map(([k, v]) => {
    const tr = document.createElement("tr");
    for (const x of [k, v]) {
      const td = document.createElement("td");
      td.textContent = String(x);
      tr.append(td);
    }
    return tr;
  }));
  page.lastReceipt = r.receipt;
  $("receipt").textContent = JSON.stringify(r.receipt, null, 1);
  $("download_receipt").disabled = !r.receipt;
}

function endVisibly(error) {           // a failure after output began: the answer ends, marked
  const end = document.createElement("span");
  end.className = "answer-end";
  end.textContent = ` [answer ended: ${error.code}: ${error.message}]`;
  $("output").append(end);
}

async function run() {
  let options;
  try { options = readOptions(); } catch (err) { setStatus(coded(err), true); return; }
  $("output").replaceChildren();
  $("go").disabled = true;
  $("stop").disabled = false;
  page.running = true;
  page.stage = "generating";
  setStatus("generating…");
  const live = createLiveStats(performance.now());
  renderLive(live);
  const poll = setInterval(renderMemory, MEMORY_POLL_MS);
  let tokenEvents = 0;
  try {
    const result = await page.engine.generate($("prompt").value, options, (env) => {
      if (env.kind === "tokens") {
        appendTokens(env.payload);
        live.onTokens(env.payload, performance.now());
        page.tokenEvents = ++tokenEvents;
        renderLive(live);
      }
    });
    page.lastResult = { finish_reason: result.finish_reason, error: result.error, n: result.token_ids.length };
    page.lastIds = result.token_ids;
    page.lastPromptIds = result.prompt_ids;
    renderLive(live, result);
    showStats(result);
    if (result.finish_reason === "cancelled") setStatus("cancelled");
    else if (result.error) {
      setStatus(`${result.error.code}: ${result.error.message}`, true);
      if (result.token_ids.length) endVisibly(result.error);
    } else setStatus("done");
  } catch (err) {                      // refused before it started: a code and a sentence
    page.lastResult = { refused: err.code ?? "E_INTERNAL" };
    setStatus(coded(err), true);
  } finally {
    clearInterval(poll);
    await renderMemory();
    page.running = false;
    page.stage = "ready";
    $("go").disabled = false;
    $("stop").disabled = true;
  }
}

function downloadReceipt() {
  if (!page.lastReceipt) return;
  const blob = new Blob([JSON.stringify(page.lastReceipt, null, 1) + "\n"], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `exactspec-receipt-${page.lastReceipt.request_nonce ?? "answer"}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

function main() {
  const backend = new URLSearchParams(location.search).get("champion_backend");   // ?champion_backend=webgpu|wasm
  if (backend) $("champion_backend").value = backend;
  $("go").onclick = run;
  $("stop").onclick = () => page.engine?.cancel();
  $("download_receipt").onclick = downloadReceipt;
  const idle = () => !page.running && page.stage !== "loading";
  $("load_models").onclick = () => { if (idle() && ($("champion_folder").files.length ? pickFolders() : true)) loadModels(); };
  $("load_shipped").onclick = () => {
    if (!idle()) return;
    page.source = { champion: undefined, draft: undefined };
    $("model_source").textContent = "shipped pair";
    loadModels();
  };
  addEventListener("pagehide", () => page.engine?.terminate());
  loadModels();
}
main();
