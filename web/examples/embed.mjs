// The embedding example's whole integration: import the engine module from wherever it is served
// (here: ?engine=<URL of exactspec.mjs>), create an engine, generate through the public API.
const engineUrl = new URLSearchParams(location.search).get("engine") ?? new URL("../exactspec.mjs", import.meta.url).href;
const $ = (id) => document.getElementById(id);

async function main() {
  const { createEngine } = await import(engineUrl);
  const engine = await createEngine({
    onProgress: (p) => { $("status").textContent = p.stage === "fetch" ? `loading ${p.name}…` : `loading (${p.stage})…`; },
  });
  $("status").textContent = `ready: champion on ${engine.ready.info.champion.backend}`;
  $("go").disabled = false;
  $("go").onclick = async () => {
    $("go").disabled = true;
    $("output").textContent = "";
    const result = await engine.generate($("prompt").value, { speculate: "draft", k: 4, temperature: 0, max_new_tokens: 24 },
      (ev) => { if (ev.kind === "tokens") $("output").textContent += ev.payload.text; });
    $("status").textContent = `${result.finish_reason}: ${result.token_ids.length} tokens, ` +
      `${result.stats.accepted} of ${result.stats.proposed} proposals accepted`;
    window.embedResult = { text: result.text, finish_reason: result.finish_reason, n: result.token_ids.length,
      receipt_keys: Object.keys(result.receipt) };
    $("go").disabled = false;
  };
  window.embedReady = true;
}
main().catch((err) => {
  $("status").textContent = `${err.code ?? "E_INTERNAL"}: ${err.detail ?? err.message ?? err}`;
  window.embedError = $("status").textContent;
});
