// processors_rows.wgsl: logits processors (processors-v1, docs/processors.md) on n_rows rows,
// one workgroup of WG invocations per row. Invocation lid owns tokens lid + i * WG,
// i < PER, held in the private array x (tokens >= V are padding, kept at -inf).
// Needs accept_common.wgsl. Row `row` sees the context bitmap plus proposals[:row].
//
// Float recipes (f32): penalty x / penalty or x * penalty; x / temperature; top-k: binary search
// on the order key for the k-th largest (logit desc, id asc); softmax exp(x - max) / sum
// (fixed-order sum); top-p: binary search on the probability bit pattern for the last kept
// value, ties by id, renormalised by the kept sum. -inf is tested by bit pattern only.

@group(0) @binding(0) var<storage, read> logits: array<f32>;          // (n_rows, V) champion logits
@group(0) @binding(1) var<storage, read_write> probs: array<f32>;     // (maxBlock, V) processed rows out
@group(0) @binding(2) var<storage, read_write> rowinfo: array<u32>;   // (maxBlock, 4): status bits, argmax, n_kept, spare
@group(0) @binding(3) var<storage, read> bitmaps: array<u32>;         // (2, NWORDS): [0] masked ids, [1] context ids
@group(0) @binding(4) var<storage, read> proposals: array<u32>;       // (maxBlock,)
@group(0) @binding(5) var<uniform> P: Params;

const TOP_P_NEAR: f32 = 1e-5;                  // |cumulative - top_p| below this flags the row (ROW_NEAR_TOP_P)

var<private> x: array<f32, PER>;               // (PER,) this invocation's logits, later probabilities

fn bit_set(word0: u32, j: u32) -> bool { return ((bitmaps[word0 + (j >> 5u)] >> (j & 31u)) & 1u) != 0u; }

fn penalize(v: f32) -> f32 {                   // Hugging Face convention
  if (v > 0.0) { return v / P.penalty; }
  return v * P.penalty;
}

fn seen_before(t: u32, y: u32) -> bool {
  for (var s = 0u; s < t; s++) { if (proposals[s] == y) { return true; } }
  return false;
}

// NaN / +inf anywhere (or flagged before), or no finite logit: the row is invalid.
fn row_is_valid(bad_in: u32) -> bool {
  var bad = bad_in;
  var n_finite = 0u;
  for (var i = 0u; i < PER; i++) {
    let b = bitcast<u32>(x[i]);
    if (is_nan_or_pos_inf(b)) { bad = 1u; } else if (b != NEG_INF_BITS) { n_finite += 1u; }
  }
  let any_bad = wg_reduce_u32(OP_MAX, bad);
  let total = wg_reduce_u32(OP_ADD, n_finite);
  return any_bad == 0u && total != 0u;
}

fn count_finite() -> u32 {
  var n = 0u;
  for (var i = 0u; i < PER; i++) { if (key_of(x[i]) != 0u) { n += 1u; } }
  return wg_reduce_u32(OP_ADD, n);
}

// Lowest id among the largest keys of x; NONE if every key is 0.
fn argmax_x() -> u32 {
  var best = 0u;
  var best_id = NONE;
  for (var i = 0u; i < PER; i++) {
    let k = key_of(x[i]);
    if (k > best) { best = k; best_id = lid + i * WG; }
  }
  let top = wg_reduce_u32(OP_MAX, best);
  return wg_reduce_u32(OP_MIN, select(NONE, best_id, best == top && top != 0u));
}

fn write_row(base: u32) {
  for (var i = 0u; i < PER; i++) {
    let j = lid + i * WG;
    if (j < V) { probs[base + j] = x[i]; }
  }
}

fn write_info(row: u32, status: u32, am: u32, n_kept: u32) {
  if (lid == 0u) {
    rowinfo[row * 4u] = status;
    rowinfo[row * 4u + 1u] = am;
    rowinfo[row * 4u + 2u] = n_kept;
    rowinfo[row * 4u + 3u] = 0u;
  }
}

// Top-k: exactly k survivors by (logit desc, id asc). Needs 0 < k < number of finite logits.
fn apply_top_k(neg_inf: f32) {
  let k = P.top_k;
  var kth = 0u;                                 // largest key with count(key >= kth) >= k
  for (var b = 31i; b >= 0i; b--) {
    let cand = kth | (1u << u32(b));
    var c = 0u;
    for (var i = 0u; i < PER; i++) { if (key_of(x[i]) >= cand) { c += 1u; } }
    if (wg_reduce_u32(OP_ADD, c) >= k) { kth = cand; }
  }
  var c_gt = 0u;
  for (var i = 0u; i < PER; i++) { if (key_of(x[i]) > kth) { c_gt += 1u; } }
  let r = k - wg_reduce_u32(OP_ADD, c_gt);      // survivors among the ties at kth, lowest ids first
  var last = 0u;                                // the r-th smallest id with key == kth
  for (var b = i32(IDBITS) - 1i; b >= 0i; b--) {
    let cand = last | (1u << u32(b));
    var c = 0u;
    for (var i = 0u; i < PER; i++) { if (key_of(x[i]) == kth && lid + i * WG < cand) { c += 1u; } }
    if (wg_reduce_u32(OP_ADD, c) < r) { last = cand; }
  }
  for (var i = 0u; i < PER; i++) {
    let key = key_of(x[i]);
    if (!(key > kth || (key == kth && lid + i * WG <= last))) { x[i] = neg_inf; }
  }
}

// Top-p on probabilities x: shortest prefix by (prob desc, id asc) with cumulative >= top_p.
// Returns ROW_NEAR_TOP_P when the f32 decision could differ from the f64 reference.
fn apply_top_p() -> u32 {
  let top_p = P.top_p;
  var tp = 0u;                                  // largest bit pattern with sum(p >= tp) >= top_p
  for (var b = 30i; b >= 0i; b--) {
    let cand = tp | (1u << u32(b));
    var s = 0.0;
    for (var i = 0u; i < PER; i++) { if (bitcast<u32>(x[i]) >= cand) { s = s + x[i]; } }
    if (wg_sum_f32(s) >= top_p) { tp = cand; }
  }
  if (tp == 0u) { return 0u; }                  // rounding: keep every positive probability
  let v = bitcast<f32>(tp);
  var s_gt = 0.0;
  for (var i = 0u; i < PER; i++) { if (bitcast<u32>(x[i]) > tp) { s_gt = s_gt + x[i]; } }
  let mass_gt = wg_sum_f32(s_gt);
  var last = 0u;                                // the last kept id among the ties at v
  for (var b = i32(IDBITS) - 1i; b >= 0i; b--) {
    let cand = last | (1u << u32(b));
    var c = 0u;
    for (var i = 0u; i < PER; i++) { if (bitcast<u32>(x[i]) == tp && lid + i * WG < cand) { c += 1u; } }
    if (mass_gt + f32(wg_reduce_u32(OP_ADD, c)) * v < top_p) { last = cand; }
  }
  var kept = 0.0;
  var next_bits = 0u;                           // largest removed probability
  for (var i = 0u; i < PER; i++) {
    let b = bitcast<u32>(x[i]);
    if (b > tp || (b == tp && lid + i * WG <= last)) {
      kept = kept + x[i];
    } else {
      next_bits = max(next_bits, b);
      x[i] = 0.0;
    }
  }
  let mass = wg_sum_f32(kept);
  let next_v = bitcast<f32>(wg_reduce_u32(OP_MAX, next_bits));
  let near = mass - top_p < TOP_P_NEAR || top_p - (mass - v) < TOP_P_NEAR
             || (next_v != v && next_v > v * (1.0 - TOP_P_NEAR));
  return select(0u, ROW_NEAR_TOP_P, near);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  lid = li;
  let row = wid.x;
  let base = row * V;
  let neg_inf = bitcast<f32>(P.neg_inf_bits);   // from the uniform: a constant -inf is a shader error

  // steps 1-4: input check, suppression + grammar mask, penalty over the context bitmap
  var bad = 0u;
  for (var i = 0u; i < PER; i++) {
    let j = lid + i * WG;
    var v = neg_inf;
    if (j < V) {
      v = logits[base + j];
      if (is_nan_or_pos_inf(bitcast<u32>(v))) { bad = 1u; }
      if (P.has_mask != 0u && bit_set(0u, j)) {
        v = neg_inf;
      } else if (P.has_penalty != 0u && bit_set(NWORDS, j) && is_finite_bits(bitcast<u32>(v))) {
        v = penalize(v);
      }
    }
    x[i] = v;
  }
  if (P.has_penalty != 0u) {                    // ... and over proposals[:row], each distinct id once
    for (var t = 0u; t < row; t++) {
      let y = proposals[t];
      if (y < V && y % WG == lid && !bit_set(NWORDS, y) && !seen_before(t, y)) {
        let v = x[y / WG];
        if (is_finite_bits(bitcast<u32>(v))) { x[y / WG] = penalize(v); }
      }
    }
  }

  // step 5: greedy stops here with a one-hot row
  if (P.temperature == 0.0) {
    if (!row_is_valid(bad)) { write_info(row, ROW_INVALID, NONE, 0u); return; }
    let am = argmax_x();
    for (var i = 0u; i < PER; i++) { x[i] = select(0.0, 1.0, lid + i * WG == am); }
    write_row(base);
    write_info(row, 0u, am, 1u);
    return;
  }
  if (P.temperature != 1.0) {
    for (var i = 0u; i < PER; i++) {
      if (is_finite_bits(bitcast<u32>(x[i]))) { x[i] = x[i] / P.temperature; }
    }
  }
  if (!row_is_valid(bad)) { write_info(row, ROW_INVALID, NONE, 0u); return; }

  // step 6: top-k
  let n_finite = count_finite();
  if (P.top_k > 0u && P.top_k < n_finite) { apply_top_k(neg_inf); }

  // step 7: softmax
  let mx = key_to_f32(wg_reduce_u32(OP_MAX, argmax_key()));
  var s = 0.0;
  for (var i = 0u; i < PER; i++) {
    var e = 0.0;
    if (key_of(x[i]) != 0u) { e = exp(x[i] - mx); }
    x[i] = e;
    s = s + e;
  }
  let total = wg_sum_f32(s);
  for (var i = 0u; i < PER; i++) { x[i] = x[i] / total; }

  // step 8: top-p, renormalised by the kept mass
  var status = 0u;
  if (P.top_p < 1.0) {
    status = apply_top_p();
    var kept = 0.0;
    for (var i = 0u; i < PER; i++) { kept = kept + x[i]; }
    let mass = wg_sum_f32(kept);
    for (var i = 0u; i < PER; i++) { x[i] = x[i] / mass; }
  }
  var n_kept = 0u;
  for (var i = 0u; i < PER; i++) { if (x[i] > 0.0) { n_kept += 1u; } }
  n_kept = wg_reduce_u32(OP_ADD, n_kept);
  var am = NONE;
  if (P.greedy != 0u) { am = argmax_x(); }
  write_row(base);
  write_info(row, status, am, n_kept);
}

fn argmax_key() -> u32 {
  var best = 0u;
  for (var i = 0u; i < PER; i++) { best = max(best, key_of(x[i])); }
  return best;
}
