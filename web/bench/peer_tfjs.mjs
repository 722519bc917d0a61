// peer_tfjs.mjs — transformers.js runners of web/bench/peer.html (tools/bench/peer.py --tfjs): each
// runner (a dtype at a thread count) in an iframe of its own (web/bench/tfjs_runner.html: one
// onnxruntime-web, one thread count per realm), driven from this page one request at a time.
// window.peerTfjs = {open, generate, close}.
const frames = new Map();   // name -> iframe

/** Open runner `name`: an iframe loading the model folder modelUrl at dtype on `threads` threads.
 *  -> tfjsRunner.load's answer ({load_ms, threads, ...} or {refused}). */
async function open(name, modelUrl, dtype, threads, timeoutMs = 600000) {
  await close(name);
  const frame = document.createElement("iframe");
  frame.title = name;
  frame.src = "/web/bench/tfjs_runner.html";
  document.body.append(frame);
  frames.set(name, frame);
  const t0 = performance.now();
  while (!frame.contentWindow?.tfjsReady) {
    if (performance.now() - t0 > timeoutMs) return { refused: { code: "E_TIMEOUT", message: `${name}: runner page not ready` } };
    await new Promise((r) => setTimeout(r, 20));
  }
  return frame.contentWindow.tfjsRunner.load(modelUrl, dtype, threads);
}

/** One request of runner `name` (tfjsRunner.generate). */
function generate(name, prompt, options) {
  return frames.get(name).contentWindow.tfjsRunner.generate(prompt, options);
}

async function close(name) {
  const frame = frames.get(name);
  if (!frame) return;
  await frame.contentWindow?.tfjsRunner?.unload();
  frame.remove();
  frames.delete(name);
}

window.peerTfjs = { open, generate, close };
