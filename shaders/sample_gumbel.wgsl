// sample_gumbel.wgsl: the portable log of docs/rng.md section 4 evaluated in f32, and the
// Gumbel transform. Built from frexp, +, -, *, / only (no device log), so every WebGPU device
// (and the NumPy float32 twin) gets the same bits, and -log(u) stays accurate for u near 1
// (a device log's absolute error of 2^-21 would swamp -log(1 - 2^-24) = 6e-8).

const PLOG_SQRT_HALF: f32 = 0.70710677;         // f32 nearest sqrt(1/2)
const PLOG_LN2_HI: f32 = 0.693145751953125;      // 0x3f317200: e * LN2_HI exact for |e| < 2^8
const PLOG_LN2_LO: f32 = 1.4286068e-06;          // 0x35bfbe8e: f32 nearest ln2 - LN2_HI
const FLT_MIN_NORMAL: f32 = 1.17549435e-38;      // smaller weights are treated as 0 (devices may flush them)

fn plog_f32(x: f32) -> f32 {
  let fe = frexp(x);                            // x = fract * 2^exp, fract in [0.5, 1)
  var m = fe.fract;
  var e = fe.exp;
  if (m < PLOG_SQRT_HALF) { m = m * 2.0; e = e - 1; }
  let f = m - 1.0;
  let s = f / (2.0 + f);
  let z = s * s;
  var p: f32 = 0.04;                            // 1/25, then 1/23 ... 1/3 (Horner, as in the f64 recipe)
  p = p * z + 0.04347826;
  p = p * z + 0.04761905;
  p = p * z + 0.05263158;
  p = p * z + 0.05882353;
  p = p * z + 0.06666667;
  p = p * z + 0.07692308;
  p = p * z + 0.09090909;
  p = p * z + 0.11111111;
  p = p * z + 0.14285715;
  p = p * z + 0.2;
  p = p * z + 0.33333334;
  let t = 2.0 * s;
  let log_m = t + t * (z * p);
  let ef = f32(e);
  return ef * PLOG_LN2_HI + (log_m + ef * PLOG_LN2_LO);
}

fn gumbel_f32(bits: u32) -> f32 { return -plog_f32(-plog_f32(uniform_open_open(bits))); }
