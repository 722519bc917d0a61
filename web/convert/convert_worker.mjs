// Module worker: converts a picked Hugging Face folder (File objects) to the q8 run artifact,
// streaming the safetensors files (web/convert/q8_artifact.mjs), with progress messages.
//   in:  {files: {name: File}, q8Embedding?: bool}
//   out: {type: "progress", tensors_done, tensors, bytes_done, bytes_total, peak_block_bytes}
//        {type: "done", blob (model.q8.safetensors), bytes, sha256, peak_block_bytes, ms}
//        {type: "error", code, message}
import { writeQ8Artifact } from "./q8_artifact.mjs";
import { sha256Hex } from "../sha256.mjs";

self.onmessage = async (ev) => {
  const t0 = performance.now();
  try {
    const chunks = [];
    const out = await writeQ8Artifact(ev.data.files, {
      q8Embedding: Boolean(ev.data.q8Embedding),
      onChunk: (c) => chunks.push(c),
      onProgress: (p) => self.postMessage({ type: "progress", ...p }),
    });
    const blob = new Blob(chunks, { type: "application/octet-stream" });
    chunks.length = 0;
    const sha256 = await sha256Hex(new Uint8Array(await blob.arrayBuffer()));
    self.postMessage({ type: "done", blob, sha256, ...out, ms: performance.now() - t0 });
  } catch (err) {
    const m = /^(E_[A-Z_]+): (.*)$/s.exec(String(err.message ?? err));
    self.postMessage({ type: "error", code: m ? m[1] : "E_MODEL_LOAD", message: m ? m[2] : String(err) });
  }
};
