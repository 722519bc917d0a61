// Module worker: converts a picked Hugging Face folder (File objects) to a role's run artifact
// (champion: model.q8.safetensors; draft: the all-float32 model.safetensors), streaming the
// safetensors files (web/convert/q8_artifact.mjs), with progress messages.
//   in:  {files: {name: File}, role?: "champion" (default) | "draft", q8Embedding?: bool}
//   out: {type: "progress", tensors_done, tensors, bytes_done, bytes_total, peak_block_bytes}
//        {type: "done", blob (the artifact), bytes, sha256, peak_block_bytes, ms}
//        {type: "error", code, message}: the folder's refusal (E_MODEL_LOAD naming the file), a
//        file the browser could not read (E_IO), or a bug (E_INTERNAL naming the exception)
import { writeRunArtifact } from "./q8_artifact.mjs";
import { sha256Hex } from "../sha256.mjs";

const UNREADABLE = ["NotReadableError", "NotFoundError", "SecurityError"];   // a picked file gone or changed

function errorMessage(err) {
  const m = /^(E_[A-Z_]+): (.*)$/s.exec(String(err?.message ?? err));
  if (err?.code && m) return { type: "error", code: m[1], message: m[2] };
  if (UNREADABLE.includes(err?.name)) return { type: "error", code: "E_IO", message: `a picked file cannot be read (${err.message})` };
  return { type: "error", code: "E_INTERNAL", message: `the converter failed: ${err?.name ?? "Error"}: ${err?.message ?? err}` };
}

self.onmessage = async (ev) => {
  const t0 = performance.now();
  try {
    const chunks = [];
    const out = await writeRunArtifact(new Map(Object.entries(ev.data.files ?? {})), {
      role: ev.data.role ?? "champion", q8Embedding: Boolean(ev.data.q8Embedding),
      onChunk: (c) => chunks.push(c),
      onProgress: (p) => self.postMessage({ type: "progress", ...p }),
    });
    const blob = new Blob(chunks, { type: "application/octet-stream" });
    chunks.length = 0;
    const sha256 = await sha256Hex(new Uint8Array(await blob.arrayBuffer()));
    self.postMessage({ type: "done", blob, sha256, ...out, ms: performance.now() - t0 });
  } catch (err) {
    self.postMessage(errorMessage(err));
  }
};
