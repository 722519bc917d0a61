// q8act-v1 activation quantisation (docs/quant_kernels.md §1): int8 per block of 32, power-of-two scale, all exact.
struct Meta { n: u32, cols: u32 }
// cols = K (a multiple of 32); one invocation per (position j, block b)

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;           // (maxBlock, K / 4)
@group(0) @binding(1) var<storage, read_write> qx: array<u32>;          // (maxBlock, K / 4): 4 int8 per word, little-endian
@group(0) @binding(2) var<storage, read_write> xb: array<vec2<f32>>;    // (maxBlock, K / 32): (dx_b, f32(xsum_b))
@group(1) @binding(0) var<uniform> params: Meta;

// Every step is integer or exact float work: amax and the exponent from the bits (for finite
// non-negative floats the integer order of the bits is the float order), x * 2^-e (a power of
// two, exact for every element that can round to a non-zero integer), round() to nearest even.
const NOT_FINITE = 0x7f800000u;     // |x| bits at or above: Inf or NaN
const TINY = 0x0d800000u;           // bits of 2^-100: a block below is a zero block

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let nb = params.cols / 32u;
  let b = gid.x;
  let j = gid.y;
  if (b >= nb || j >= params.n) { return; }
  let base = (j * params.cols + b * 32u) / 4u;
  var amax = 0u;
  for (var k = 0u; k < 8u; k++) {
    let v = bitcast<vec4<u32>>(x[base + k]) & vec4<u32>(0x7fffffffu);
    amax = max(amax, max(max(v.x, v.y), max(v.z, v.w)));
  }
  if (amax >= NOT_FINITE || amax < TINY) {          // non-finite: dx NaN (the row becomes NaN); tiny: a zero block
    for (var k = 0u; k < 8u; k++) { qx[base + k] = 0u; }
    xb[j * nb + b] = vec2<f32>(select(0.0, bitcast<f32>(amax | 0x00400000u), amax >= NOT_FINITE), 0.0);   // a quiet NaN (no NaN constant: WGSL refuses one)
    return;
  }
  // E = floor(log2(amax)); e = E - 6 when the mantissa 1.f <= 127/64 (amax * 2^-(E-6) <= 127), else E - 5
  let E = i32(amax >> 23u) - 127;
  let e = select(E - 5, E - 6, (amax & 0x7fffffu) <= 0x7e0000u);
  let inv = bitcast<f32>(u32(127 - e) << 23u);     // 2^-e, a normal float for every e in [-106, 122]
  var sum = 0i;
  for (var k = 0u; k < 8u; k++) {
    let q = vec4<i32>(round(x[base + k] * inv));    // |q| <= 127
    sum += (q.x + q.y) + (q.z + q.w);
    let u = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
    qx[base + k] = u.x | (u.y << 8u) | (u.z << 16u) | (u.w << 24u);
  }
  xb[j * nb + b] = vec2<f32>(bitcast<f32>(u32(e + 127) << 23u), f32(sum));
}
