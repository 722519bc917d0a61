// accept_common.wgsl: shared by processors_rows.wgsl and accept_decide.wgsl.
// The Meta uniform (group 1), float bit tests, an order-preserving float key and fixed-order workgroup
// reductions over WG invocations. web/gpu/accept.mjs prepends the constants
//   V (vocabulary size), WG (4, 16, 64 or 256), GS = sqrt(WG) (sum group size), PER = ceil(V / WG),
//   NWORDS = ceil(V / 32), IDBITS = ceil(log2 V), ID_SHIFT0 = 4 * (ceil(IDBITS / 4) - 1).
// Every reduction returns through workgroupUniformLoad, so callers may branch on the result.

struct Meta {
  n_rows: u32, m: u32, seed_lo: u32, seed_hi: u32,
  round_id: u32, remaining: u32, greedy: u32, stop_mask: u32,   // stop_mask bit i: proposals[i] is a stop token
  temperature: f32, top_p: f32, penalty: f32, top_k: u32,
  has_penalty: u32, has_mask: u32, neg_inf_bits: u32, row_offset: u32,
}
// has_mask: 0 none, MASK_SHARED one masked-id bitmap for every row (bitmaps[0]), MASK_PER_ROW
// decided row r's own (bitmaps[2 + r], the shared mask already ORed in by the host).
// row_offset: decided row r is logits row row_offset + r (processors_rows.wgsl only).
const MASK_SHARED: u32 = 1u;
const MASK_PER_ROW: u32 = 2u;

const POS_INF_BITS: u32 = 0x7f800000u;
const NEG_INF_BITS: u32 = 0xff800000u;
const NONE: u32 = 0xffffffffu;
const ROW_INVALID: u32 = 1u;        // rowinfo status bits
const ROW_NEAR_TOP_P: u32 = 2u;

// -inf (masked) is tested by its bit pattern, never by float comparison.
fn is_nan_or_pos_inf(b: u32) -> bool { return (b & 0x7fffffffu) > POS_INF_BITS || b == POS_INF_BITS; }
fn is_finite_bits(b: u32) -> bool { return (b & POS_INF_BITS) != POS_INF_BITS; }

// Finite float bits -> u32 with the same order (>= 1; -0 == +0). Masked (-inf) -> 0.
fn key_of(v: f32) -> u32 {
  var b = bitcast<u32>(v);
  if (b == NEG_INF_BITS) { return 0u; }
  if (b == 0x80000000u) { b = 0u; }
  if ((b & 0x80000000u) != 0u) { return ~b; }
  return b | 0x80000000u;
}
fn key_to_f32(k: u32) -> f32 {
  if ((k & 0x80000000u) != 0u) { return bitcast<f32>(k & 0x7fffffffu); }
  return bitcast<f32>(~k);
}

var<private> lid: u32;                         // local_invocation_index, set first thing in main
var<workgroup> wg_atomic: atomic<u32>;
var<workgroup> wg_u: u32;
var<workgroup> wg_part: array<f32, WG>;        // (WG,) per-invocation partial sums
var<workgroup> wg_group: array<f32, GS>;       // (GS,) partials of GS consecutive invocations each
var<workgroup> wg_f: f32;

const OP_ADD: u32 = 0u;
const OP_MAX: u32 = 1u;
const OP_MIN: u32 = 2u;

fn wg_reduce_u32(op: u32, local: u32) -> u32 {
  if (lid == 0u) { atomicStore(&wg_atomic, select(0u, NONE, op == OP_MIN)); }
  workgroupBarrier();
  if (op == OP_ADD) {
    if (local != 0u) { atomicAdd(&wg_atomic, local); }
  } else if (op == OP_MAX) {
    atomicMax(&wg_atomic, local);
  } else {
    atomicMin(&wg_atomic, local);
  }
  workgroupBarrier();
  if (lid == 0u) { wg_u = atomicLoad(&wg_atomic); }
  return workgroupUniformLoad(&wg_u);
}

// f32 sum in a fixed order (the NumPy twin repeats it): invocation t's own sequential sum, then
// GS groups of GS consecutive invocations summed sequentially, then the GS group sums.
fn wg_sum_f32(local: f32) -> f32 {
  wg_part[lid] = local;
  workgroupBarrier();
  if (lid < GS) {
    var s = 0.0;
    for (var t = 0u; t < GS; t++) { s = s + wg_part[lid * GS + t]; }
    wg_group[lid] = s;
  }
  workgroupBarrier();
  if (lid == 0u) {
    var s = 0.0;
    for (var t = 0u; t < GS; t++) { s = s + wg_group[t]; }
    wg_f = s;
  }
  return workgroupUniformLoad(&wg_f);
}
