// The embedding example's whole integration: import the engine module from where the site serves
// it (embed.html's <meta name="exactspec-engine">, relative to the page; never the query string,
// which anyone linking here controls), create an engine, generate through the public API.
const engineUrl = new URL(document.querySelector('meta[name="exactspec-engine"]')?.content || "../exactspec.mjs",
  document.baseURI).href;
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
    const result = await engine.generate($("prompt").value, { speculate: "auto", temperature: 0, max_new_tokens: 24 },
      (ev) => { if (ev.kind === "tokens") $("output").textContent += ev.payload.text; });
    $("status").textContent = result.error ? `${result.error.code}: ${result.error.message}` :
      `${result.finish_reason}: ${result.token_ids.length} tokens, ${result.stats.accepted} of ${result.stats.proposed} proposals accepted`;
    window.embedResult = { text: result.text, finish_reason: result.finish_reason, n: result.token_ids.length,
      receipt_keys: Object.keys(result.receipt), error: result.error ?? null };
    $("go").disabled = false;
  };
  window.embedReady = true;
}
main().catch((err) => {
  $("status").textContent = `${err.code ?? "E_INTERNAL"}: ${err.detail ?? err.message ?? err}`;
  window.embedError = $("status").textContent;
});
