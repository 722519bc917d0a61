// processors_rows.wgsl: logits processors (processors-v1, docs/processors.md) on n_rows rows,
// one workgroup of WG invocations per row. Invocation lid owns tokens lid + i * WG,
// i < PER, held in the private array x (tokens >= V are padding, kept at -inf).
// Needs accept_common.wgsl. Row `row` sees the context bitmap plus proposals[:row]; it reads logits
// row params.row_offset + row (rows before the offset were fed but are not decided on) and writes
// probs / rowinfo row `row`; its masked ids are bitmaps[0], or bitmaps[2 + row] with per-row masks.
//
// Float recipes (f32): penalty x / penalty or x * penalty; x / temperature; top-k: radix select
// (4-bit digits) of the k-th largest order key, then of the last kept id among its ties; softmax
// exp(x - max) / sum (fixed-order sum); top-p: radix select of the largest probability bit
// pattern whose cumulative mass reaches top_p (f32 digit masses), then the last kept id among its
// ties; renormalised by the kept sum. -inf is tested by bit pattern only.

@group(0) @binding(0) var<storage, read> logits: array<f32>;          // (row_offset + n_rows, V) champion logits
@group(0) @binding(1) var<storage, read_write> probs: array<f32>;     // (maxBlock, V) processed rows out
@group(0) @binding(2) var<storage, read_write> rowinfo: array<u32>;   // (maxBlock, 4): status bits, argmax, n_kept, spare
@group(0) @binding(3) var<storage, read> bitmaps: array<u32>;         // (2 + maxBlock, NWORDS): [0] masked ids, [1] context ids, [2 + r] row r's masked ids
@group(0) @binding(4) var<storage, read> proposals: array<u32>;       // (maxBlock,)
@group(1) @binding(0) var<uniform> params: Meta;

const TOP_P_NEAR: f32 = 1e-5;                  // |cumulative - top_p| below this flags the row (ROW_NEAR_TOP_P)

var<private> x: array<f32, PER>;               // (PER,) this invocation's logits, later probabilities

fn bit_set(word0: u32, j: u32) -> bool { return ((bitmaps[word0 + (j >> 5u)] >> (j & 31u)) & 1u) != 0u; }

fn penalize(v: f32) -> f32 {                   // Hugging Face convention
  if (v > 0.0) { return v / params.penalty; }
  return v * params.penalty;
}

fn seen_before(t: u32, y: u32) -> bool {
  for (var s = 0u; s < t; s++) { if (proposals[s] == y) { return true; } }
  return false;
}

// NaN / +inf anywhere (or flagged before), or no finite logit: the row is invalid.
fn row_is_valid(bad_in: u32) -> bool {
  return row_check(bad_in) != NONE;
}

// NONE if the row is invalid, else the number of finite logits.
fn row_check(bad_in: u32) -> u32 {
  var bad = bad_in;
  var n_finite = 0u;
  for (var i = 0u; i < PER; i++) {
    let b = bitcast<u32>(x[i]);
    if (is_nan_or_pos_inf(b)) { bad = 1u; } else if (b != NEG_INF_BITS) { n_finite += 1u; }
  }
  // one reduction: the count in the low 31 bits, bad in the top bit (V < 2^31)
  let both = wg_reduce_u32(OP_ADD, n_finite) | (wg_reduce_u32(OP_MAX, bad) << 31u);
  if (both == 0u || (both >> 31u) != 0u) { return NONE; }
  return both;
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

// ---- radix selection: 4-bit digits from the most significant, one histogram pass per digit.
// A pass histograms a 32-bit word of the elements whose word matches `prefix` on the digits
// above `shift`: counts (atomics) and, for probabilities, f32 masses summed in a fixed order.
const SRC_KEY: u32 = 0u;                       // word = key_of(logit), masked tokens excluded
const SRC_PROB: u32 = 1u;                      // word = probability bits (order-preserving), zeros excluded
const SRC_KEY_TIE: u32 = 2u;                   // word = token id, only where key_of(logit) == tie
const SRC_PROB_TIE: u32 = 3u;                  // word = token id, only where probability bits == tie

var<workgroup> wg_cnt: array<atomic<u32>, 16>; // (16,) counts per digit
const FP_SLOTS: u32 = min(WG, 64u);            // invocation t adds into slot t % FP_SLOTS, in order of t / FP_SLOTS
var<workgroup> wg_fpart: array<f32, FP_SLOTS * 16u>; // (FP_SLOTS, 16) masses per digit (fits 16 KiB at WG 256)
var<workgroup> wg_fbin: array<f32, 16>;        // (16,) masses per digit
var<workgroup> sel_prefix: u32;                // selection state, written by invocation 0 only
var<workgroup> sel_need: u32;
var<workgroup> sel_mass: f32;
var<workgroup> sel_ok: u32;

fn hist_pass(src: u32, shift: u32, prefix: u32, tie: u32) {
  let mask = ~((16u << shift) - 1u);           // the digits already chosen (shift 28: none)
  if (lid == 0u) { for (var d = 0u; d < 16u; d++) { atomicStore(&wg_cnt[d], 0u); } }
  workgroupBarrier();
  var c: array<u32, 16>;
  var f: array<f32, 16>;
  for (var i = 0u; i < PER; i++) {
    let j = lid + i * WG;
    let v = x[i];
    var word = 0u;
    var ok = false;
    if (src == SRC_KEY) { word = key_of(v); ok = word != 0u; }
    else if (src == SRC_PROB) { word = bitcast<u32>(v); ok = word != 0u; }
    else if (src == SRC_KEY_TIE) { word = j; ok = key_of(v) == tie; }
    else { word = j; ok = bitcast<u32>(v) == tie; }
    if (ok && (word & mask) == prefix) {
      let d = (word >> shift) & 15u;
      c[d] += 1u;
      f[d] = f[d] + v;
    }
  }
  for (var d = 0u; d < 16u; d++) { if (c[d] != 0u) { atomicAdd(&wg_cnt[d], c[d]); } }
  if (src == SRC_PROB) {
    for (var r = 0u; r < WG / FP_SLOTS; r++) {
      if (lid / FP_SLOTS == r) {
        for (var d = 0u; d < 16u; d++) {
          let k = (lid % FP_SLOTS) * 16u + d;
          wg_fpart[k] = select(wg_fpart[k] + f[d], f[d], r == 0u);
        }
      }
      workgroupBarrier();
    }
    for (var d = lid; d < 16u; d += WG) {
      var s = 0.0;
      for (var t = 0u; t < FP_SLOTS; t++) { s = s + wg_fpart[t * 16u + d]; }
      wg_fbin[d] = s;
    }
  }
  workgroupBarrier();
}

// The need-th smallest token id (need >= 1) among the ties at `tie` (src SRC_KEY_TIE / SRC_PROB_TIE).
fn select_tie_id(src: u32, tie: u32, need: u32) -> u32 {
  if (lid == 0u) { sel_prefix = 0u; sel_need = need; }
  var prefix = workgroupUniformLoad(&sel_prefix);
  for (var shift = i32(ID_SHIFT0); shift >= 0i; shift -= 4i) {
    hist_pass(src, u32(shift), prefix, tie);
    if (lid == 0u) {
      var rest = sel_need;
      var d = 0u;
      loop {
        let c = atomicLoad(&wg_cnt[d]);
        if (c >= rest || d == 15u) { break; }
        rest -= c;
        d += 1u;
      }
      sel_need = rest;
      sel_prefix = prefix | (d << u32(shift));
    }
    prefix = workgroupUniformLoad(&sel_prefix);
  }
  return prefix;
}

// Top-k: exactly k survivors by (logit desc, id asc). Needs 0 < k < number of finite logits.
fn apply_top_k(neg_inf: f32) {
  if (lid == 0u) { sel_prefix = 0u; sel_need = params.top_k; }
  var prefix = workgroupUniformLoad(&sel_prefix);
  for (var shift = 28i; shift >= 0i; shift -= 4i) {  // the k-th largest key, digit by digit
    hist_pass(SRC_KEY, u32(shift), prefix, 0u);
    if (lid == 0u) {
      var rest = sel_need;                      // rank still needed from the top inside this prefix
      var d = 15u;
      loop {
        let c = atomicLoad(&wg_cnt[d]);
        if (c >= rest || d == 0u) { break; }
        rest -= c;
        d -= 1u;
      }
      sel_need = rest;
      sel_prefix = prefix | (d << u32(shift));
    }
    prefix = workgroupUniformLoad(&sel_prefix);
  }
  let kth = prefix;
  let last = select_tie_id(SRC_KEY_TIE, kth, workgroupUniformLoad(&sel_need));
  for (var i = 0u; i < PER; i++) {
    let key = key_of(x[i]);
    if (!(key > kth || (key == kth && lid + i * WG <= last))) { x[i] = neg_inf; }
  }
}

// Top-p on probabilities x: shortest prefix by (prob desc, id asc) with cumulative >= top_p.
// Returns ROW_NEAR_TOP_P when the f32 decision could differ from the f64 reference.
fn apply_top_p() -> u32 {
  let top_p = params.top_p;
  if (lid == 0u) { sel_prefix = 0u; sel_mass = 0.0; sel_ok = 1u; sel_need = 0u; }
  var prefix = workgroupUniformLoad(&sel_prefix);
  for (var shift = 28i; shift >= 0i; shift -= 4i) {  // the largest bits tp with mass(bits >= tp) >= top_p
    hist_pass(SRC_PROB, u32(shift), prefix, 0u);
    if (lid == 0u && sel_ok != 0u) {
      var above = sel_mass;                     // mass of larger probabilities than this prefix
      var chosen = NONE;
      var lowest = NONE;
      for (var d = 15i; d >= 0i; d--) {
        let b = wg_fbin[d];
        if (atomicLoad(&wg_cnt[d]) != 0u) { lowest = u32(d); }
        if (above + b >= top_p) { chosen = u32(d); break; }
        above = above + b;
      }
      if (chosen == NONE) {
        if (shift == 28i) {
          sel_ok = 0u;                          // rounding: the whole mass is below top_p, keep all
        } else {                                // rounding between levels: take the smallest digit present
          chosen = lowest;
          above = sel_mass;
          for (var d = 15u; d > lowest; d--) { above = above + wg_fbin[d]; }
        }
      }
      if (chosen != NONE) {
        sel_mass = above;
        sel_need = atomicLoad(&wg_cnt[chosen]); // at the last digit: the number of ties at tp
        sel_prefix = prefix | (chosen << u32(shift));
      }
    }
    prefix = workgroupUniformLoad(&sel_prefix);
  }
  if (workgroupUniformLoad(&sel_ok) == 0u) { return 0u; }
  let tp = prefix;
  let v = bitcast<f32>(tp);
  if (lid == 0u) {                              // how many ties at v: smallest r with mass_gt + r * v >= top_p
    let mass_gt = sel_mass;
    let n_ties = sel_need;
    var r = u32(clamp(ceil((top_p - mass_gt) / v), 1.0, f32(n_ties)));
    loop { if (r > 1u && mass_gt + f32(r - 1u) * v >= top_p) { r -= 1u; } else { break; } }
    loop { if (r < n_ties && mass_gt + f32(r) * v < top_p) { r += 1u; } else { break; } }
    sel_need = r;
  }
  let last = select_tie_id(SRC_PROB_TIE, tp, workgroupUniformLoad(&sel_need));
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
  let base = row * V;                                // probs row (the decided row)
  let in_base = (params.row_offset + row) * V;       // logits row
  let mask0 = select(0u, (2u + row) * NWORDS, params.has_mask == MASK_PER_ROW);   // this row's masked ids
  let neg_inf = bitcast<f32>(params.neg_inf_bits);   // from the uniform: a constant -inf is a shader error

  // steps 1-4: input check, suppression + grammar mask, penalty over the context bitmap
  var bad = 0u;
  for (var i = 0u; i < PER; i++) {
    let j = lid + i * WG;
    var v = neg_inf;
    if (j < V) {
      v = logits[in_base + j];
      if (is_nan_or_pos_inf(bitcast<u32>(v))) { bad = 1u; }
      if (params.has_mask != 0u && bit_set(mask0, j)) {
        v = neg_inf;
      } else if (params.has_penalty != 0u && bit_set(NWORDS, j) && is_finite_bits(bitcast<u32>(v))) {
        v = penalize(v);
      }
    }
    x[i] = v;
  }
  if (params.has_penalty != 0u) {                    // ... and over proposals[:row], each distinct id once
    for (var t = 0u; t < row; t++) {
      let y = proposals[t];
      if (y < V && y % WG == lid && !bit_set(NWORDS, y) && !seen_before(t, y)) {
        let v = x[y / WG];
        if (is_finite_bits(bitcast<u32>(v))) { x[y / WG] = penalize(v); }
      }
    }
  }

  // step 5: greedy stops here with a one-hot row
  if (params.temperature == 0.0) {
    if (!row_is_valid(bad)) { write_info(row, ROW_INVALID, NONE, 0u); return; }
    let am = argmax_x();
    for (var i = 0u; i < PER; i++) { x[i] = select(0.0, 1.0, lid + i * WG == am); }
    write_row(base);
    write_info(row, 0u, am, 1u);
    return;
  }
  if (params.temperature != 1.0) {
    for (var i = 0u; i < PER; i++) {
      if (is_finite_bits(bitcast<u32>(x[i]))) { x[i] = x[i] / params.temperature; }
    }
  }
  let n_finite = row_check(bad);
  if (n_finite == NONE) { write_info(row, ROW_INVALID, NONE, 0u); return; }

  // step 6: top-k
  if (params.top_k > 0u && params.top_k < n_finite) { apply_top_k(neg_inf); }

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
  if (params.top_p < 1.0) {
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
  if (params.greedy != 0u) { am = argmax_x(); }
  write_row(base);
  write_info(row, status, am, n_kept);
}

fn argmax_key() -> u32 {
  var best = 0u;
  for (var i = 0u; i < PER; i++) { best = max(best, key_of(x[i])); }
  return best;
}
