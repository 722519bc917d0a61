// gguf_dequant.mjs — GGUF tensor types to float32, the JS twin of py/exactspec/reference/gguf_dequant.py (and of
// ggml's dequantize_row_*): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K. Every value is computed
// with the same float32 operations in the same order (each product and sum rounded to float32 by
// Math.fround: a double holds a float32 product exactly, and one double-then-float rounding of a
// sum of two float32 equals float32's own), so the results are bitwise those of the NumPy twin.
//
//   dequantize(raw Uint8Array of whole blocks, typeName, out Float32Array, outOffset = 0)
// Block layouts: see gguf_dequant.py's docstring.
const f = Math.fround;

export const BLOCKS = { F32: [1, 4], F16: [1, 2], BF16: [1, 2], Q8_0: [32, 34], Q4_0: [32, 18], Q4_1: [32, 20],
  Q4_K: [256, 144], Q6_K: [256, 210] };

const HALF = (() => {           // float16 bits -> float32 value, all 65536 (exact: float16 widens exactly)
  const table = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    table[h] = exp === 0 ? sign * man * 2 ** -24 : exp === 31 ? (man ? NaN : sign * Infinity) : sign * (1024 + man) * 2 ** (exp - 25);
  }
  return table;
})();

const half = (raw, at) => HALF[raw[at] | (raw[at + 1] << 8)];

/** Q4_K's eight 6-bit (scale, min) pairs from the 12 bytes at raw[at..]. */
function q4kScales(raw, at, sc, mn) {
  for (let j = 0; j < 4; j++) {
    sc[j] = raw[at + j] & 0x3f;
    mn[j] = raw[at + 4 + j] & 0x3f;
    sc[4 + j] = (raw[at + 8 + j] & 0x0f) | ((raw[at + j] >> 2) & 0x30);
    mn[4 + j] = (raw[at + 8 + j] >> 4) | ((raw[at + 4 + j] >> 2) & 0x30);
  }
}

/** See the header comment. raw.byteLength must be a whole number of blocks. */
export function dequantize(raw, typeName, out, outOffset = 0) {
  const [perBlock, blockBytes] = BLOCKS[typeName] ?? [];
  if (!perBlock) throw new Error(`E_MODEL_LOAD: tensor type ${typeName} has no dequantiser`);
  const nBlocks = raw.byteLength / blockBytes;
  let o = outOffset;
  if (typeName === "F32") {
    out.set(new Float32Array(raw.slice().buffer), o);       // a copy: the file's bytes may sit unaligned
    return;
  }
  if (typeName === "F16") {
    for (let i = 0; i < nBlocks; i++) out[o++] = half(raw, 2 * i);
    return;
  }
  if (typeName === "BF16") {       // the top half of a float32: widen the bits, no rounding
    const bits = new Uint32Array(out.buffer, out.byteOffset + 4 * o, nBlocks);
    for (let i = 0; i < nBlocks; i++) bits[i] = (raw[2 * i] | (raw[2 * i + 1] << 8)) << 16;
    return;
  }
  const sc = new Uint8Array(8), mn = new Uint8Array(8);
  for (let b = 0; b < nBlocks; b++) {
    const at = b * blockBytes;
    if (typeName === "Q8_0") {                         // x = d * q
      const d = half(raw, at);
      for (let j = 0; j < 32; j++) out[o++] = f(d * ((raw[at + 2 + j] << 24) >> 24));
    } else if (typeName === "Q4_0") {                  // x = d * (q - 8)
      const d = half(raw, at);
      for (let j = 0; j < 16; j++) out[o + j] = f(d * ((raw[at + 2 + j] & 0x0f) - 8));
      for (let j = 0; j < 16; j++) out[o + 16 + j] = f(d * ((raw[at + 2 + j] >> 4) - 8));
      o += 32;
    } else if (typeName === "Q4_1") {                  // x = d * q + m
      const d = half(raw, at), m = half(raw, at + 2);
      for (let j = 0; j < 16; j++) out[o + j] = f(f(d * (raw[at + 4 + j] & 0x0f)) + m);
      for (let j = 0; j < 16; j++) out[o + 16 + j] = f(f(d * (raw[at + 4 + j] >> 4)) + m);
      o += 32;
    } else if (typeName === "Q4_K") {                  // x = (d * sc) * q - dmin * mn, per 32-value group
      const d = half(raw, at), dmin = half(raw, at + 2);
      q4kScales(raw, at + 4, sc, mn);
      for (let g = 0; g < 8; g++) {
        const scale = f(d * sc[g]), offset = f(dmin * mn[g]);
        const q = at + 16 + 32 * (g >> 1), shift = 4 * (g & 1);
        for (let j = 0; j < 32; j++) out[o++] = f(f(scale * ((raw[q + j] >> shift) & 0x0f)) - offset);
      }
    } else {                                           // Q6_K: x = (d * sc) * (q - 32), per 16-value group
      const d = half(raw, at + 208);
      for (let g = 0; g < 16; g++) {
        const scale = f(d * ((raw[at + 192 + g] << 24) >> 24));
        for (let j = 0; j < 16; j++) {
          const v = 16 * g + j;                          // value v of the block: half h, quarter g4, index l
          const h = v >> 7, g4 = (v >> 5) & 3, l = v & 31;
          const lowByte = raw[at + 64 * h + 32 * (g4 & 1) + l];
          const low = g4 < 2 ? lowByte & 0x0f : lowByte >> 4;
          const high = (raw[at + 128 + 32 * h + l] >> (2 * g4)) & 3;
          out[o + v] = f(scale * ((low | (high << 4)) - 32));
        }
      }
      o += 256;
    }
  }
}
