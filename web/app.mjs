// The page: chats with the real model (SmolLM2-135M-Instruct from its GGUF file) by default, or
// the fast test pair; loads with real progress, streams answers with every token marked by its
// source, plots live statistics (with what speculate "auto" chose and why, in words), and offers
// each answer's privacy-safe receipt as JSON.
// It drives the engine only through the public module (exactspec.mjs), like an embedding site.
import { createEngine, forgetCachedModel, listCachedModels, optionNames } from "./exactspec.mjs";
import { renderCachePanel } from "./ui/cache_panel.mjs";
import { applyProgress, bytesText, displayRows, finishRows } from "./ui/load_progress.mjs";
import { createLiveStats, waterfall } from "./ui/live_stats.mjs";
import { memoryChart, roundsChart, survivalChart, waterfallChart } from "./ui/charts.mjs";
import { createConversation } from "./ui/conversation.mjs";
import { responseFormatFrom, reviewAnswer } from "./ui/structured_view.mjs";
import { autoSentence, batchCheckSentence, calibrationSentence, roundsText } from "./ui/auto_panel.mjs";

const $ = (id) => document.getElementById(id);
const MEMORY_POLL_MS = 1000;
/** The real model, as `exactspec serve` serves it once set-up fetched it (404 otherwise); its
 *  sha256 keys the draft made for it in models/manifest.json ("drafts"). */
const REAL_MODEL = { name: "SmolLM2-135M-Instruct", file: "SmolLM2-135M-Instruct.Q4_1.gguf",
  url: "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
  sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53" };
const TEST_PAIR = { champion: undefined, draft: undefined };   // the engine's default: the shipped pair
const TEST_PAIR_LABEL = "the fast test pair (shipped; trained here on the King James Bible and Shakespeare)";
const page = { engine: null, running: false, answersSinceLoad: 0, lastReceipt: null, loadTiming: null, loads: 0, source: TEST_PAIR,
  conversation: null };
window.appState = page;   // tests read appState.stage / loads / lastResult (this page's memory only)
page.panel = { showDeviceLines, renderAuto };   // the panel's renderers, for tests feeding them objects

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

const coded = (err) => (err?.code ? `${err.code}: ${err.detail ?? err.message}` : `E_INTERNAL: ${err?.message ?? err}`);

// ---------------------------------------------------------------- loading
/** The cached-models list, read again (after each load and each Forget). */
async function refreshCachePanel() {
  const models = await listCachedModels().catch(() => []);
  renderCachePanel($("cached_models"), $("cache_total"), models, {
    onForget: (sha256) => forgetCachedModel(sha256).then(refreshCachePanel, (err) => setStatus(coded(err), true)),
  });
  page.cachedModels = models;   // tests read it
}

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

/** A line of the live panel: its text (textContent: never markup), hidden when there is none. */
function setLine(id, text) {
  $(id).textContent = text ?? "";
  $(id).hidden = !text;
}

/** The load's measurements auto relies on: the calibration and the batch-invariance check. */
function showDeviceLines(info) {
  setLine("calibration_line", calibrationSentence(info?.calibration));
  setLine("batch_check_line", batchCheckSentence(info));
}

/** What auto is doing now and its rounds by method (`statsAuto`: the result's stats.auto). */
function renderAuto(s, statsAuto = null) {
  setLine("auto_now", autoSentence(s.auto));
  setLine("auto_rounds", roundsText(s.autoCounts, statsAuto));
}

/** k and the k policy mean nothing under auto (it picks k in 0..8 itself): shown so. */
function setKControls() {
  const auto = $("speculate").value === "auto";
  for (const id of ["k", "scheduler"]) {
    $(id).disabled = auto;
    $(id).title = auto ? "auto chooses k each round itself" : "";
  }
}

/** Load buttons off while a load runs: a second click would start a second engine (each with its
 *  own Pyodide and WASM memory) that nothing ever terminates. */
function setLoadButtons(enabled) {
  for (const id of ["load_models", "load_real", "load_test_pair"]) $(id).disabled = !enabled;
}

/** Load `source` ({champion, draft}) and say what it is; -> null, or the refusal ("E_CODE: ..."). */
async function loadModels(source, label) {
  if (page.stage === "loading") return "E_BUSY: a load is running";   // a click that got through: ignored
  page.stage = "loading";
  page.source = source;
  $("model_source").textContent = label;
  setLoadButtons(false);
  window.appDraftReady = false;   // true once this load's draft has arrived (or failed): draftArrived
  page.answersSinceLoad = 0;      // answers started since this load (draftArrived's news then leaves the status line alone)
  $("go").disabled = true;
  $("go").textContent = "Loading models…";
  const rows = new Map();
  // the page is usable once the champion is ready; the draft loads behind it and switches
  // speculation on when it arrives ("draft_ready")
  const onProgress = (p) => {
    if (p.stage === "draft_ready") {     // the draft's fetches (its files are checked after ready) are over
      renderProgress(finishRows(rows));
      return draftArrived(p);
    }
    if (p.stage === "calibration") return setLine("calibration_line", calibrationSentence(p.calibration));   // measured again
    applyProgress(rows, p);
    renderProgress(rows);
  };
  const options = { championBackend: $("champion_backend").value, onProgress, draftInBackground: true, cache: $("use_cache").checked };
  const t0 = performance.now();
  setStatus("loading…");
  try {
    if (page.engine && !page.engine.engine.terminated) {
      await page.engine.load(source, options);
    } else {                                  // the first load, or after an engine ended (E_TIMEOUT)
      page.engine = await createEngine({ ...source, ...options });
    }
  } catch (err) {
    if (page.engine) page.engine.engine.ready = null;   // the worker holds no model after a refused load
    renderProgress(rows);
    setStatus(`could not load: ${coded(err)}`, true);
    $("go").textContent = "Unavailable";
    page.stage = "failed";
    page.loads++;
    setLoadButtons(true);
    return coded(err);
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
  showDeviceLines(info);
  setChat(!!info.chat_template);
  $("go").disabled = false;
  page.stage = "ready";
  page.loads++;
  setLoadButtons(true);
  refreshCachePanel();   // files read from the network are filed while the page is ready: opening the list reads it again
  window.appReady = true;
  return null;
}

/** Chat on for a model with a chat template (off, and not offered, for one without). */
function setChat(hasTemplate) {
  $("chat").checked = hasTemplate;
  $("chat").disabled = !hasTemplate;
  $("chat").title = hasTemplate ? "" : "this model has no chat template";
  newConversation();
}

function newConversation() {
  page.conversation.clear();
  const chat = $("chat").checked;
  $("go").textContent = chat ? "Send" : "Generate";
  $("raw_text").disabled = chat;       // message text is never read as special tokens anyway
}

/** The line under the model's name: why the real model is not the one loaded (hidden when it is). */
function setModelNote(text) {
  $("model_note").textContent = text;
  $("model_note").hidden = !text;
}

/** One more sentence in the note under the models (after what it says, if shown), styled as an
 *  error when it is one (a draft that failed after an answer had started: the status line keeps
 *  the answer's outcome). */
function appendModelNote(sentence, isError = false) {
  const note = $("model_note");
  if (note.hidden) note.textContent = "";
  const span = document.createElement("span");
  span.textContent = (note.textContent ? " " : "") + sentence;
  if (isError) span.className = "error";
  note.append(span);
  note.hidden = false;
}

/** {url, draft} of the real model when the page's server has it, else {why}: one sentence. */
async function findRealModel() {
  let res;
  try {
    res = await fetch(REAL_MODEL.url, { method: "HEAD", cache: "no-store" });
  } catch (err) {
    return { why: `${REAL_MODEL.url} could not be reached (${err.message})` };
  }
  if (!res.ok) return { why: `${REAL_MODEL.url} answered HTTP ${res.status}` };
  return { url: REAL_MODEL.url, draft: await draftMadeFor(REAL_MODEL.sha256) };
}

/** The draft folder that models/manifest.json binds to this champion ("drafts"), or null: none. */
async function draftMadeFor(sha256) {
  try {
    const res = await fetch("models/manifest.json", { cache: "no-store" });
    const dir = res.ok ? (await res.json()).drafts?.[sha256]?.dir : null;
    return typeof dir === "string" && /^[a-z0-9][a-z0-9_-]*$/.test(dir) ? `models/${dir}/` : null;
  } catch {
    return null;
  }
}

/** The page's default: the real model when its server has it, else the fast test pair with one
 *  line saying why (a real model that is there but refused to load falls back the same way). */
async function loadDefault() {
  if (page.stage === "loading" || page.stage === "probing") return;
  page.stage = "probing";              // no other load starts while the page looks for the model
  setLoadButtons(false);
  const real = await findRealModel();
  const label = `${REAL_MODEL.name} (${REAL_MODEL.file}), the real model`;
  const refused = real.url ? await loadModels({ champion: real.url, draft: real.draft }, label) : null;
  if (real.url && !refused) {
    setModelNote(real.draft ? "" : "No draft is made for it here: prompt lookup and champion alone.");
    return;
  }
  const why = real.why ? `${real.why}; the fast test pair runs instead (set-up fetches the model: python tools/fetch_models.py)`
    : `it could not load (${refused}); the fast test pair runs instead`;
  await loadModels(TEST_PAIR, TEST_PAIR_LABEL);
  setModelNote(`The real model (${REAL_MODEL.name}) is not available: ${why}.`);
}

function draftArrived(p) {
  if (!page.engine?.engine?.ready) return;
  const info = page.engine.engine.ready.info;
  setModes(info);
  showDeviceLines(info);               // a calibration taken with the draft replaces the one without
  const said = p.draft_error ? `the draft could not load (${p.draft_error.code}: ${p.draft_error.message}); champion alone and prompt lookup work`
    : `draft ready (${info.draft.placement}, ${(p.draft_load_ms / 1000).toFixed(1)} s): speculation on`;
  // the status line says how an answer went once one has started since this load ("generating…",
  // "cancelled", a code): the draft's news must not replace it, so it goes to the note under the models
  if (page.answersSinceLoad === 0) setStatus(said, !!p.draft_error);
  else appendModelNote(`${said[0].toUpperCase()}${said.slice(1)}.`, !!p.draft_error);
  window.appDraftReady = true;
}

/** {source, label} of what the picker holds (a champion .gguf file or folder, an optional draft
 *  .gguf file or folder), or null after saying what is wrong. */
function pickedModels() {
  const folder = $("champion_folder").files, gguf = $("champion_gguf").files[0];
  const draftFolder = $("draft_folder").files, draftGguf = $("draft_gguf").files[0];
  if (folder.length && gguf) {
    setStatus("E_BAD_ARGUMENT: choose a champion folder or a .gguf file, not both", true);
    return null;
  }
  if (draftFolder.length && draftGguf) {
    setStatus("E_BAD_ARGUMENT: choose a draft folder or a .gguf file, not both", true);
    return null;
  }
  if (!folder.length && !gguf) {
    setStatus("E_BAD_ARGUMENT: choose a champion folder or a .gguf file first (the draft is optional)", true);
    return null;
  }
  const notGguf = [gguf, draftGguf].find((f) => f && !f.name.toLowerCase().endsWith(".gguf"));
  if (notGguf) {
    setStatus(`E_BAD_ARGUMENT: ${notGguf.name}: not a .gguf file`, true);
    return null;
  }
  const name = (fl) => (fl[0].webkitRelativePath || fl[0].name).split("/")[0];
  const draft = draftGguf ?? (draftFolder.length ? draftFolder : null);
  const draftLabel = draftGguf ? `, draft ${draftGguf.name}` : draft ? `, draft ${name(draftFolder)}` : ", no draft";
  return { source: { champion: gguf ?? folder, draft },
    label: gguf ? `local file: champion ${gguf.name}${draftLabel}` : `local folders: champion ${name(folder)}${draftLabel}` };
}

// ---------------------------------------------------------------- one answer
/** generate()'s options from the form: each option of protocol.json's tables (the engine's schema)
 *  that has a control with its name as id, read by the table's type. */
function readOptions() {
  const schema = page.engine.engine.schema.schema;   // protocol.json (loadSchema's .schema)
  const { config, fields } = optionNames(schema);
  const rules = { ...schema.generate_request, ...schema.generate_config };
  const opts = {};
  for (const key of [...fields, ...config]) {
    const el = $(key);
    if (!el) continue;
    const type = rules[key].type;
    opts[key] = type === "boolean" ? el.checked : type === "integer" || type === "number" ? Number(el.value)
      : type === "strings" ? el.value.split("\n").filter((s) => s.length > 0)
        : type === "object" ? responseFormatFrom(el.value, $(`${key}_text`)?.value ?? "") : el.value;
  }
  return opts;
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
  renderAuto(s, result?.stats?.auto ?? null);
  page.live = s;
}

/** The structured-output box shows for the kinds that take a text (schema, pattern, grammar), with
 *  an example of that kind when the box holds another kind's. */
const FORMAT_EXAMPLES = {
  json_schema: '{"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}, "population_millions": {"type": "number"}}, "required": ["city", "country", "population_millions"], "additionalProperties": false}',
  regex: "(yes|no), because [a-z ]{3,60}\\.",
  grammar: 'root ::= "The answer is " ("yes" | "no") "."',
};
function setFormatControls() {
  const kind = $("response_format").value;
  $("response_format_label").hidden = !FORMAT_EXAMPLES[kind];
  const box = $("response_format_text");
  if (FORMAT_EXAMPLES[kind] && Object.values(FORMAT_EXAMPLES).includes(box.value)) box.value = FORMAT_EXAMPLES[kind];
}

/** A finished answer under a JSON format: parsed, pretty-printed and checked (structured_view.mjs). */
function showStructured(responseFormat, result) {
  const review = result.error || result.finish_reason === "cancelled" ? null
    : reviewAnswer(responseFormat, result.text, result.finish_reason);
  $("structured_review").hidden = !review;
  if (!review) return;
  const check = $("structured_check");
  check.textContent = review.lines.join(" · ");
  check.className = review.ok ? "" : "bad";
  $("structured_pretty").textContent = review.pretty ?? result.text;
}

async function renderMemory() {
  try {
    const m = await page.engine.memory();
    $("memory_chart").innerHTML = memoryChart({ "GPU buffers": m.gpu_bytes_live, "WASM champion": m.wasm_champion_bytes,
      "WASM draft": m.wasm_draft_bytes, "Pyodide heap": m.pyodide_heap_bytes, "Load transient (peak)": m.load_transient_bytes });
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
    // prefix reuse: the conversation's earlier turns are not recomputed (docs/core.md "Prefix reuse")
    ["prompt reused", `${st.prompt_reused?.champion ?? 0} of ${r.prompt_ids.length} tokens (prefill ${t.prefill.toFixed(0)} ms)`],
    ["decode", `${t.decode.toFixed(0)} ms (${(1000 * r.token_ids.length / Math.max(t.decode, 1)).toFixed(1)} tokens/s)`],
    ["draft / verify per round", t.per_round ? `${t.per_round.draft.toFixed(1)} / ${t.per_round.verify.toFixed(1)} ms` : "–"],
  ];
  if (st.auto) rows.push(["auto", roundsText(null, st.auto) ?? "–"]);
  if (st.structured) {
    const sd = st.structured;
    rows.push(["structured output", `${sd.type}: ${sd.forced} of ${r.token_ids.length} tokens forced (one champion block with the ` +
      `proposals); compiled in ${sd.compile_ms.toFixed(0)} ms${sd.cached ? " (cached)" : ""}`]);
  }
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

/** Send the box's text: with the chat template, as the next turn of the conversation (the request
 *  carries every turn so far); without it, as a plain text prompt (a conversation of one turn). */
async function run() {
  let options;
  try { options = readOptions(); } catch (err) { setStatus(coded(err), true); return; }
  const text = $("prompt").value, chat = options.chat;
  delete options.chat;                 // a conversation (messages) is always in the chat template
  if (chat) delete options.raw_text;   // and its text is never read as special tokens
  else page.conversation.clear();      // a plain prompt: a conversation of one turn
  const prompt = chat ? [...page.conversation.messages, { role: "user", content: text }] : text;
  const turn = page.conversation.start(text);
  if (chat) $("prompt").value = "";
  $("go").disabled = true;
  $("stop").disabled = false;
  $("structured_review").hidden = true;
  page.running = true;
  page.answersSinceLoad += 1;
  page.stage = "generating";
  setStatus("generating…");
  const live = createLiveStats(performance.now());
  renderLive(live);
  const poll = setInterval(renderMemory, MEMORY_POLL_MS);
  let tokenEvents = 0;
  page.tokenEvents = 0;                // this answer's events (the last answer's count would read as this one's)
  try {
    const result = await page.engine.generate(prompt, options, (env) => {
      if (env.kind === "tokens") {
        turn.append(env.payload);
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
    showStructured(options.response_format, result);
    turn.keep(result.text);            // what was emitted stays, also when stopped or failed
    if (result.finish_reason === "cancelled") setStatus("cancelled");
    else if (result.error) {
      setStatus(`${result.error.code}: ${result.error.message}`, true);
      if (result.token_ids.length) turn.markEnd(result.error);
    } else setStatus("done");
  } catch (err) {                      // refused before it started: a code and a sentence
    page.lastResult = { refused: err.code ?? "E_INTERNAL" };
    turn.drop();
    $("prompt").value = text;
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
  const query = new URLSearchParams(location.search);
  const backend = query.get("champion_backend");   // ?champion_backend=webgpu|wasm
  if (backend) $("champion_backend").value = backend;
  page.conversation = createConversation($("conversation"));
  $("go").onclick = run;
  $("stop").onclick = () => page.engine?.cancel();
  $("new_conversation").onclick = () => { if (!page.running) newConversation(); };
  $("chat").onchange = newConversation;            // turns in and out of the template do not mix
  $("speculate").onchange = setKControls;
  setKControls();
  $("response_format").onchange = setFormatControls;
  setFormatControls();
  $("download_receipt").onclick = downloadReceipt;
  $("forget_all").onclick = () => forgetCachedModel(null).then(refreshCachePanel, (err) => setStatus(coded(err), true));
  $("cache_panel").ontoggle = () => { if ($("cache_panel").open) refreshCachePanel(); };
  refreshCachePanel();
  const idle = () => !page.running && page.stage !== "loading" && page.stage !== "probing";
  $("load_models").onclick = () => {
    const picked = idle() ? pickedModels() : null;
    if (picked) loadModels(picked.source, picked.label).then((refused) => refused || setModelNote(""));
  };
  $("load_real").onclick = () => { if (idle()) loadDefault(); };
  $("load_test_pair").onclick = () => {
    if (idle()) loadModels(TEST_PAIR, TEST_PAIR_LABEL).then((refused) => refused || setModelNote(""));
  };
  addEventListener("pagehide", () => page.engine?.terminate());
  if (query.get("model") === "test-pair") loadModels(TEST_PAIR, TEST_PAIR_LABEL);   // a link to the fast pair
  else loadDefault();
}
main();
