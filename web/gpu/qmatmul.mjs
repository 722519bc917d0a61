// q8act-v1 on WebGPU: activation quantisation, the block matmuls and gathers (shaders/quantize_act.wgsl, qmatmul_*.wgsl, embed_gather_q*.wgsl).
import { createPipelines } from "./device.mjs";

/** Formats with a WGSL kernel: name -> shader file stem, bytes per 32 weights (ROWQ8's row scales apart). */
export const QMATMUL_FORMATS = {
  ROWQ8: { stem: "rowq8", blockBytes: 32 },
  Q8_0: { stem: "q8_0", blockBytes: 34 },
  Q4_0: { stem: "q4_0", blockBytes: 18 },
  Q4_1: { stem: "q4_1", blockBytes: 20 },
};
export const DOT4_FEATURE = "packed_4x8_integer_dot_product";
export const QMATMUL_ROWS = 4;      // output rows per invocation: shaders/gen_qmatmul.py's R (its GENERATED line)
const cdiv = (a, b) => Math.ceil(a / b);
const u = (v) => [v, "u32"];

/** Whether this browser's WGSL has dot4I8Packed (a language feature: the same for every adapter). */
export function hasDot4() {
  return Boolean(globalThis.navigator?.gpu?.wgslLanguageFeatures?.has(DOT4_FEATURE));
}

/** The kernel (pipeline) name of a format's matmul on one integer path. */
export function qmatmulKernel(format, dot4) {
  const f = QMATMUL_FORMATS[format];
  if (!f) throw Object.assign(new Error(`E_MODEL_LOAD: no WebGPU q8act kernel for format ${format}`), { code: "E_MODEL_LOAD" });
  return `qmatmul_${f.stem}${dot4 ? "_dot4" : ""}`;
}

/** Bytes of a (rows, cols) weight in a format (GGUF: rows * cols / 32 blocks); E_MODEL_LOAD when
 *  cols is not a multiple of 32. The GPU buffer holds 4 more (a 2-aligned word read past the end). */
export function qmatmulWeightBytes(format, rows, cols) {
  if (!QMATMUL_FORMATS[format]) qmatmulKernel(format, false);
  if (cols % 32 !== 0) {
    throw Object.assign(new Error(`E_MODEL_LOAD: ${format}: ${cols} columns is not a multiple of 32`), { code: "E_MODEL_LOAD" });
  }
  return rows * (cols / 32) * QMATMUL_FORMATS[format].blockBytes;
}

/** Meta fields and grid: quantize_act {n, cols}; a qmatmul kernel {n, rows, cols, accumulate, stride, row0};
 *  a block gather {n, hidden, vocab: rows of this piece, row0}. */
export const QOPS = {
  embed_gather_blocks: (d) => ({ meta: [u(d.n), u(d.hidden), u(d.vocab), u(d.row0 ?? 0), u(0)], grid: [cdiv(d.hidden, 64), d.n, 1] }),
  quantize_act: (d) => ({ meta: [u(d.n), u(d.cols)], grid: [cdiv(d.cols / 32, 64), d.n, 1] }),
  qmatmul: (d) => ({
    meta: [u(d.n), u(d.rows), u(d.cols), u(d.accumulate ? 1 : 0), u(d.stride ?? d.rows), u(d.row0 ?? 0), u(0)],
    grid: [cdiv(d.rows, 64 * QMATMUL_ROWS), 1, 1],
  }),
};

/** Compile quantize_act, every format's matmul on one path: dot4 (default: where the browser has
 *  it) or unpacking, and the block gathers. Returns {dot4, pipelines: {quantize_act, ROWQ8, Q8_0,
 *  Q4_0, Q4_1, gather: {Q8_0, Q4_0, Q4_1}}}. */
export async function compileQmatmulPipelines(device, { dot4 = hasDot4(), shaderUrl = null } = {}) {
  if (dot4 && !hasDot4()) {
    throw Object.assign(new Error(`E_BAD_ARGUMENT: dot4 asked for, but WGSL here lacks ${DOT4_FEATURE}`), { code: "E_BAD_ARGUMENT" });
  }
  const blockFormats = Object.keys(QMATMUL_FORMATS).filter((f) => f !== "ROWQ8");
  const gatherKernel = (f) => `embed_gather_${QMATMUL_FORMATS[f].stem}`;
  const names = ["quantize_act", ...Object.keys(QMATMUL_FORMATS).map((f) => qmatmulKernel(f, dot4)), ...blockFormats.map(gatherKernel)];
  const compiled = await createPipelines(device, shaderUrl ?? new URL("../../shaders/", import.meta.url), names);
  const pipelines = { quantize_act: compiled.quantize_act, gather: {} };
  for (const f of Object.keys(QMATMUL_FORMATS)) pipelines[f] = compiled[qmatmulKernel(f, dot4)];
  for (const f of blockFormats) pipelines.gather[f] = compiled[gatherKernel(f)];
  return { dot4, pipelines };
}
