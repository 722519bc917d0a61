// streamed_placement.mjs — a loader's writes of tensors into its model (WASM memory, GPU buffers),
// run as a streamed file's tensors arrive (streamed_file.mjs), or at once for a tensor map held in
// memory. A write names the tensors it needs; most need one, and run while that tensor is staged. A
// write that needs two (a q8 linear dequantised with its scales) keeps a copy of the first until
// the second arrives, counted in the load transient.
//
//   writes: [[needs: tensor names, write(tensors)]]    (tensors: a Map name -> {dtype, shape, bytes})
//   await placeAll(writes, tensors, file);              // file: a StreamedFile, or null (in memory)
//   for (const [r0, r1, bytes] of float32Slices(tensors, name, [rows, cols], where)) ...   // a float32 tensor in slices
import { expectTensor } from "./safetensors.mjs";

const SLICE_BYTES = 1 << 20;          // float32 bytes made at a time from a tensor that converts by rows

/** Run every write: with `file`, in file order as each tensor is staged (every entry of `tensors`
 *  names its source {offset, nbytes}); a tensor the file lacks is refused before any data byte is
 *  read (its write runs and throws). -> the largest tensor staged, or 0 in memory. */
export async function placeAll(writes, tensors, file = null) {
  if (!file) {
    for (const [, write] of writes) write(tensors);
    return 0;
  }
  const byName = new Map();
  for (const job of writes) {
    for (const name of job[0]) {
      if (!tensors.has(name)) job[1](tensors);            // throws: the missing tensor, named
      byName.set(name, [...(byName.get(name) ?? []), job]);
    }
  }
  const order = [...byName.keys()].map((name) => [name, tensors.get(name).source]).sort((a, b) => a[1].offset - b[1].offset);
  const largest = Math.max(...order.map(([, source]) => source.nbytes));
  const transient = file.transient;
  transient.largestTensor = Math.max(transient.largestTensor, largest);
  const held = new Map();                                  // name -> a copy kept for a write that needs more
  const waiting = new Map([...byName].map(([name, jobs]) => [name, jobs.length]));
  for (const [name, source] of order) {
    const staged = await file.stage(source.offset, source.nbytes, largest);
    for (const job of byName.get(name)) {
      const others = job[0].filter((n) => n !== name);
      if (!others.every((n) => held.has(n))) {               // its other tensors come later: keep this one
        if (!held.has(name)) { held.set(name, staged.slice()); transient.hold(staged.byteLength); }
        continue;
      }
      const view = new Map(tensors);
      for (const n of others) {
        const t = tensors.get(n);
        view.set(n, { dtype: t.dtype, shape: t.shape, bytes: held.get(n) });
      }
      job[1](view);
      for (const n of job[0]) waiting.set(n, waiting.get(n) - 1);
    }
    for (const [n, copy] of held) {                          // copies no write waits for any more
      if (waiting.get(n) === 0) { held.delete(n); transient.release(copy.byteLength); }
    }
  }
  return largest;
}

/** A (rows, cols) float32 tensor as [r0, r1, bytes of rows r0..r1): in slices of about 1 MiB where
 *  its entry converts by rows (a GGUF tensor dequantised or widened: rows()), else one slice of the
 *  whole (checked by expectTensor). A block entry stands for its float32() entry. */
export function* float32Slices(tensors, name, [rows, cols], where) {
  const t = tensors.get(name);
  const entry = t && t.dtype !== "F32" && typeof t.float32 === "function" ? t.float32() : t;
  const fits = entry?.dtype === "F32" && entry.shape?.length === 2 && entry.shape[0] === rows && entry.shape[1] === cols;
  if (fits && typeof entry.rows === "function") {
    const step = Math.max(1, Math.floor(SLICE_BYTES / (4 * cols)));
    for (let r = 0; r < rows; r += step) yield [r, Math.min(rows, r + step), entry.rows(r, Math.min(rows, r + step))];
    return;
  }
  yield [0, rows, expectTensor(new Map([[name, entry]]), name, "F32", [rows, cols], where).bytes];
}
