// cpu_simd.mjs — which build of the CPU module to load: the one name mapping (cpu.wasm -> cpu_mt.wasm for
// threads, -> cpu_relaxed.wasm / cpu_mt_relaxed.wasm for relaxed SIMD, wasm/build.sh) and the probe that
// says whether this engine's relaxed SIMD dot product computes the spec's sums.
//
//   moduleUrl(url, { threads, relaxed })  -> the URL of that build (url: cpu.wasm's)
//   relaxedDotWorks()                     -> true where i32x4.relaxed_dot_i8x16_i7x16_add_s validates
//                                            and gives the exact sums (a V8 whose baseline compiler
//                                            doubles them, as Node 20's Liftoff does, answers false)

/** The URL of the CPU module build for `threads` (> 1: the threaded one) and `relaxed` SIMD, from
 *  cpu.wasm's URL (or cpu_mt.wasm's); any query string is kept. */
export function moduleUrl(url, { threads = 1, relaxed = false } = {}) {
  const m = /(^|\/)cpu(_mt)?(_relaxed)?\.wasm(\?.*)?$/.exec(url);
  if (!m) return url;                   // a module under another name: loaded as it is
  const name = `cpu${threads > 1 || m[2] ? "_mt" : ""}${relaxed ? "_relaxed" : ""}.wasm`;
  return url.slice(0, m.index + m[1].length) + name + (m[4] ?? "");
}

// (module (func (export "probe") (result i32)
//   (i32x4.all_true (i32x4.eq (i32x4.relaxed_dot_i8x16_i7x16_add_s (v128.const A) (v128.const B) (v128.const C))
//                             (v128.const EXPECTED)))))
// A: signed bytes over the whole int8 range, B: 7-bit bytes (0..127, where the result is specified)
const A = [-128, 127, -1, 64, 17, -90, 3, -7, 100, -100, 55, -55, 1, 2, -3, 4];
const B = [127, 1, 90, 33, 0, 127, 64, 5, 126, 125, 7, 8, 99, 98, 97, 96];
const C = [1000, -1000, 7, 0];
const EXPECTED = [0, 1, 2, 3].map((i) => C[i] + [0, 1, 2, 3].reduce((s, j) => s + A[4 * i + j] * B[4 * i + j], 0));

const i8 = (xs) => xs.map((x) => x & 0xff);
const i32 = (xs) => xs.flatMap((x) => [x & 0xff, (x >> 8) & 0xff, (x >> 16) & 0xff, (x >>> 24) & 0xff]);
const V128_CONST = [0xfd, 0x0c];
const BODY = [0x00,                                          // no locals
  ...V128_CONST, ...i8(A), ...V128_CONST, ...i8(B), ...V128_CONST, ...i32(C),
  0xfd, 0x93, 0x02,                                           // i32x4.relaxed_dot_i8x16_i7x16_add_s (0x113)
  ...V128_CONST, ...i32(EXPECTED),
  0xfd, 0x37,                                                 // i32x4.eq
  0xfd, 0xa3, 0x01,                                           // i32x4.all_true
  0x0b];                                                      // end
const PROBE = new Uint8Array([0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7f,                   // type: () -> i32
  0x03, 0x02, 0x01, 0x00,                                     // function 0 of type 0
  0x07, 0x09, 0x01, 0x05, 0x70, 0x72, 0x6f, 0x62, 0x65, 0x00, 0x00,   // export "probe"
  0x0a, BODY.length + 2, 0x01, BODY.length, ...BODY]);

let works = null;

/** See the header comment; computed once. */
export function relaxedDotWorks() {
  if (works !== null) return works;
  try {
    works = WebAssembly.validate(PROBE) && new WebAssembly.Instance(new WebAssembly.Module(PROBE)).exports.probe() === 1;
  } catch {
    works = false;
  }
  return works;
}
