// q8act-v1 activation quantisation (docs/quant_kernels.md §1): int8 per block of 32, a table scale, all exact ops.
struct Meta { n: u32, cols: u32 }
// cols = K (a multiple of 32); one invocation per (position j, block b)

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;           // (maxBlock, K / 4)
@group(0) @binding(1) var<storage, read_write> qx: array<u32>;          // (maxBlock, K / 4): 4 int8 per word, little-endian
@group(0) @binding(2) var<storage, read_write> xb: array<vec2<f32>>;    // (maxBlock, K / 32): (dx_b, f32(xsum_b))
@group(1) @binding(0) var<uniform> params: Meta;

// Every step is integer or exact float work: amax and its exponent from the bits (for finite
// non-negative floats the integer order of the bits is the float order), the scale
// s = 2^-E QACT_SCALE[j] (a power-of-two scaling of a table constant), one correctly rounded product
// x * s, round() to nearest even; dx = 2^E QACT_STEP[j]. The tables: tools/gen_qact_table.py.
const NOT_FINITE = 0x7f800000u;     // |x| bits at or above: Inf or NaN
const HUGE = 0x71800000u;           // bits of 2^100: a block at or above is refused as NaN
const TINY = 0x0d800000u;           // bits of 2^-100: a block below is a zero block
// qact_table:begin (tools/gen_qact_table.py)
const QACT_SCALE = array<f32, 64>(
  bitcast<f32>(0x42fa17a1u), bitcast<f32>(0x42f64d93u), bitcast<f32>(0x42f2a07au), bitcast<f32>(0x42ef0f0fu),
  bitcast<f32>(0x42eb981eu), bitcast<f32>(0x42e83a84u), bitcast<f32>(0x42e4f52fu), bitcast<f32>(0x42e1c71cu),
  bitcast<f32>(0x42deaf58u), bitcast<f32>(0x42dbacf9u), bitcast<f32>(0x42d8bf26u), bitcast<f32>(0x42d5e50du),
  bitcast<f32>(0x42d31decu), bitcast<f32>(0x42d06907u), bitcast<f32>(0x42cdc5acu), bitcast<f32>(0x42cb3333u),
  bitcast<f32>(0x42c8b0fdu), bitcast<f32>(0x42c63e70u), bitcast<f32>(0x42c3dafdu), bitcast<f32>(0x42c18618u),
  bitcast<f32>(0x42bf3f3fu), bitcast<f32>(0x42bd05f4u), bitcast<f32>(0x42bad9bfu), bitcast<f32>(0x42b8ba2fu),
  bitcast<f32>(0x42b6a6d5u), bitcast<f32>(0x42b49f4au), bitcast<f32>(0x42b2a32au), bitcast<f32>(0x42b0b216u),
  bitcast<f32>(0x42aecbb3u), bitcast<f32>(0x42acefa9u), bitcast<f32>(0x42ab1da4u), bitcast<f32>(0x42a95555u),
  bitcast<f32>(0x42a7966fu), bitcast<f32>(0x42a5e0a7u), bitcast<f32>(0x42a433b8u), bitcast<f32>(0x42a28f5cu),
  bitcast<f32>(0x42a0f354u), bitcast<f32>(0x429f5f5fu), bitcast<f32>(0x429dd343u), bitcast<f32>(0x429c4ec5u),
  bitcast<f32>(0x429ad1adu), bitcast<f32>(0x42995bc6u), bitcast<f32>(0x4297ecdcu), bitcast<f32>(0x429684beu),
  bitcast<f32>(0x4295233bu), bitcast<f32>(0x4293c825u), bitcast<f32>(0x42927351u), bitcast<f32>(0x42912492u),
  bitcast<f32>(0x428fdbc1u), bitcast<f32>(0x428e98b4u), bitcast<f32>(0x428d5b45u), bitcast<f32>(0x428c234fu),
  bitcast<f32>(0x428af0afu), bitcast<f32>(0x4289c341u), bitcast<f32>(0x42889ae4u), bitcast<f32>(0x42877777u),
  bitcast<f32>(0x428658dcu), bitcast<f32>(0x42853ef3u), bitcast<f32>(0x428429a0u), bitcast<f32>(0x428318c6u),
  bitcast<f32>(0x42820c4au), bitcast<f32>(0x42810410u), bitcast<f32>(0x42800000u), bitcast<f32>(0x427e0000u)
);
const QACT_STEP = array<f32, 64>(
  bitcast<f32>(0x3c03060cu), bitcast<f32>(0x3c050a14u), bitcast<f32>(0x3c070e1cu), bitcast<f32>(0x3c091224u),
  bitcast<f32>(0x3c0b162cu), bitcast<f32>(0x3c0d1a34u), bitcast<f32>(0x3c0f1e3cu), bitcast<f32>(0x3c112245u),
  bitcast<f32>(0x3c13264cu), bitcast<f32>(0x3c152a55u), bitcast<f32>(0x3c172e5cu), bitcast<f32>(0x3c193265u),
  bitcast<f32>(0x3c1b366du), bitcast<f32>(0x3c1d3a75u), bitcast<f32>(0x3c1f3e7du), bitcast<f32>(0x3c214285u),
  bitcast<f32>(0x3c23468du), bitcast<f32>(0x3c254a95u), bitcast<f32>(0x3c274e9du), bitcast<f32>(0x3c2952a6u),
  bitcast<f32>(0x3c2b56aeu), bitcast<f32>(0x3c2d5ab6u), bitcast<f32>(0x3c2f5ebeu), bitcast<f32>(0x3c3162c5u),
  bitcast<f32>(0x3c3366cdu), bitcast<f32>(0x3c356ad6u), bitcast<f32>(0x3c376edeu), bitcast<f32>(0x3c3972e6u),
  bitcast<f32>(0x3c3b76eeu), bitcast<f32>(0x3c3d7af6u), bitcast<f32>(0x3c3f7efeu), bitcast<f32>(0x3c418306u),
  bitcast<f32>(0x3c43870eu), bitcast<f32>(0x3c458b16u), bitcast<f32>(0x3c478f1eu), bitcast<f32>(0x3c499326u),
  bitcast<f32>(0x3c4b972eu), bitcast<f32>(0x3c4d9b37u), bitcast<f32>(0x3c4f9f3fu), bitcast<f32>(0x3c51a346u),
  bitcast<f32>(0x3c53a74fu), bitcast<f32>(0x3c55ab57u), bitcast<f32>(0x3c57af5fu), bitcast<f32>(0x3c59b366u),
  bitcast<f32>(0x3c5bb76eu), bitcast<f32>(0x3c5dbb77u), bitcast<f32>(0x3c5fbf7fu), bitcast<f32>(0x3c61c387u),
  bitcast<f32>(0x3c63c78eu), bitcast<f32>(0x3c65cb97u), bitcast<f32>(0x3c67cf9fu), bitcast<f32>(0x3c69d3a8u),
  bitcast<f32>(0x3c6bd7afu), bitcast<f32>(0x3c6ddbb8u), bitcast<f32>(0x3c6fdfc0u), bitcast<f32>(0x3c71e3c8u),
  bitcast<f32>(0x3c73e7d0u), bitcast<f32>(0x3c75ebd8u), bitcast<f32>(0x3c77efe0u), bitcast<f32>(0x3c79f3e8u),
  bitcast<f32>(0x3c7bf7efu), bitcast<f32>(0x3c7dfbf8u), bitcast<f32>(0x3c800000u), bitcast<f32>(0x3c810204u)
);
// qact_table:end

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
  if (amax >= HUGE || amax < TINY) {               // non-finite or huge: dx NaN (the row becomes NaN); tiny: a zero block
    for (var k = 0u; k < 8u; k++) { qx[base + k] = 0u; }
    // a quiet NaN made at run time (amax's low bit): WGSL refuses a NaN constant expression
    xb[j * nb + b] = vec2<f32>(bitcast<f32>(select(0u, 0x7fc00000u | (amax & 1u), amax >= HUGE)), 0.0);
    return;
  }
  // amax = 2^E (1 + f), j = the top 6 bits of f: s = 2^-E QACT_SCALE[j], dx = 2^E QACT_STEP[j], both exact
  let E = i32(amax >> 23u) - 127;                   // in [-100, 99]
  let t = (amax >> 17u) & 63u;
  let inv = bitcast<f32>(u32(127 - E) << 23u) * QACT_SCALE[t];
  let dx = bitcast<f32>(u32(127 + E) << 23u) * QACT_STEP[t];
  var sum = 0i;
  for (var k = 0u; k < 8u; k++) {
    let q = vec4<i32>(round(x[base + k] * inv));    // |x s| < 127 (1 + 2^-24): |q| <= 127
    sum += (q.x + q.y) + (q.z + q.w);
    let u = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
    qx[base + k] = u.x | (u.y << 8u) | (u.z << 16u) | (u.w << 24u);
  }
  xb[j * nb + b] = vec2<f32>(dx, f32(sum));
}
