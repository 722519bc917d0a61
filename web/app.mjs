// The page: loads the engine once, streams answers, shows acceptance and timings per answer.
import { Engine } from "/web/engine.mjs";

const $ = (id) => document.getElementById(id);
let engine = null;

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
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
    tr.innerHTML = "<td></td><td></td>";
    tr.cells[0].textContent = k;
    tr.cells[1].textContent = String(v);
    return tr;
  }));
  $("receipt").textContent = JSON.stringify(r.receipt, null, 1);
}

async function run() {
  const num = (id) => Number($(id).value);
  const payload = { prompt: $("prompt").value, chat: $("chat").checked, config: {
    speculate: $("speculate").value, k: num("k"), temperature: num("temperature"), seed: num("seed"),
    max_new_tokens: num("max_new_tokens") } };
  $("output").textContent = "";
  $("go").disabled = true;
  $("stop").disabled = false;
  setStatus("generating…");
  try {
    const result = await engine.generate(payload, (env) => {
      if (env.kind === "tokens") $("output").textContent += env.payload.text;
      if (env.kind === "error") setStatus(`${env.payload.code}: ${env.payload.message}`, true);
    });
    showStats(result);
    if (!result.error) setStatus("done");
  } catch (err) {                      // refused before it started: a code and a sentence
    setStatus(err.code ? err.message : `E_INTERNAL: ${err.message ?? err}`, true);
  } finally {
    $("go").disabled = false;
    $("stop").disabled = true;
  }
}

async function main() {
  const t0 = performance.now();
  try {
    // ?champion_backend=webgpu|wasm overrides "auto" (WebGPU only from a hardware adapter)
    const championBackend = new URLSearchParams(location.search).get("champion_backend") ?? "auto";
    engine = await Engine.create({ champion: "/web/models/champion/", draft: "/web/models/draft/" }, { championBackend });
  } catch (err) {
    setStatus(`could not load: ${err.message ?? err}`, true);
    $("go").textContent = "Unavailable";
    return;
  }
  const draftError = engine.ready.info.draft_error;
  const champ = engine.ready.info.champion;
  setStatus(`models loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s; champion on ${champ.backend} (${champ.backend_why})` +
    (draftError ? ` — the draft could not load (${draftError.code}: ${draftError.message}); running the champion alone` : ""),
  !!draftError);
  if (draftError) {                    // "draft" would be refused (E_DRAFT_LOST): offer what works
    const opt = [...$("speculate").options].find((o) => o.value === "draft");
    if (opt) opt.disabled = true;
    if ($("speculate").value === "draft") $("speculate").value = "lookup";
  }
  addEventListener("pagehide", () => engine.terminate());
  $("go").textContent = "Generate";
  $("go").disabled = false;
  $("go").onclick = run;
  $("stop").onclick = () => engine.cancel();
  window.appReady = true;
}
main();
