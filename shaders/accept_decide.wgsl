// accept_decide.wgsl: the decision of one speculative round (exactspec.core.acceptance.decide_round)
// on rows already processed by processors_rows.wgsl. One workgroup of WG invocations.
// Needs round_record.wgsl (the REC_* word offsets, generated from protocol.json), accept_common.wgsl,
// threefry_addr.wgsl, sample_gumbel.wgsl.
//
// Invocation 0 walks the proposals (scalar work: one Threefry per position) and writes the plan;
// then, if a token must be sampled, all invocations run one Gumbel-max over V:
//   score(x) = plog_f32(w(x)) + gumbel_f32(draw_bits(seed, domain, round, position, x)),
//   w = p_target row (extra / baseline) or [p_target - p_draft]_+ (correction); ties -> lowest id.

@group(0) @binding(0) var<storage, read> probs: array<f32>;          // (maxBlock, V) processed champion rows
@group(0) @binding(1) var<storage, read> rowinfo: array<u32>;        // (maxBlock, 4) from processors_rows
@group(0) @binding(2) var<storage, read> p_draft: array<f32>;        // (maxBlock, V) processed draft rows, m used
@group(0) @binding(3) var<storage, read> proposals: array<u32>;      // (maxBlock,)
@group(0) @binding(4) var<storage, read_write> result: array<u32>;   // (REC_DECISION_WORDS,) the round record's decision
@group(1) @binding(0) var<uniform> params: Meta;

// result: the decision words of protocol.json's round_record, at the REC_* offsets: n_accepted, next_token
// (NONE), rejected_at (NONE), ended_by | REC_NEAR_TOP_P_FLAG, decision_error, and the diagnostics: the
// winning Gumbel score's bits, u and a of the last accept test.

const MODE_DONE: u32 = 0u;
const MODE_SAMPLE: u32 = 1u;                   // Gumbel-max over p_target row
const MODE_RESIDUAL: u32 = 2u;                 // Gumbel-max over [p_target - p_draft]_+

var<workgroup> plan_mode: u32;
var<workgroup> plan_row: u32;
var<workgroup> plan_domain: u32;
var<workgroup> plan_position: u32;
var<private> w: array<f32, PER>;               // (PER,) sampling weights of this invocation
var<private> near_top_p: u32;                  // OR of ROW_NEAR_TOP_P over the rows the round used

fn row_invalid(i: u32) -> bool {
  near_top_p |= rowinfo[i * 4u] & ROW_NEAR_TOP_P;
  return (rowinfo[i * 4u] & ROW_INVALID) != 0u;
}

fn set_plan(mode: u32, row: u32, domain: u32, position: u32) {
  plan_mode = mode; plan_row = row; plan_domain = domain; plan_position = position;
}

fn fail(code: u32) {
  result[REC_N_ACCEPTED] = 0u; result[REC_NEXT_TOKEN] = NONE; result[REC_REJECTED_AT] = NONE; result[REC_ENDED_BY] = 0u; result[REC_DECISION_ERROR] = code;
  plan_mode = MODE_DONE;
}

// Invocation 0 only. Mirrors baseline_step / greedy_round / stochastic_round in order.
fn plan_round() {
  result[REC_N_ACCEPTED] = 0u; result[REC_NEXT_TOKEN] = NONE; result[REC_REJECTED_AT] = NONE; result[REC_ENDED_BY] = 0u; result[REC_DECISION_ERROR] = 0u;
  result[REC_DIAG_SCORE] = 0u; result[REC_DIAG_U] = 0u; result[REC_DIAG_A] = 0u;
  set_plan(MODE_DONE, 0u, 0u, 0u);
  let m = params.m;
  let greedy = params.greedy != 0u;
  if (m == 0u) {
    if (row_invalid(0u)) { fail(REC_ERR_E_TARGET_NUMERIC_OR_MASK); return; }
    if (greedy) { result[REC_NEXT_TOKEN] = rowinfo[1]; return; }
    set_plan(MODE_SAMPLE, 0u, DOMAIN_TARGET_BASELINE, 0u);
    return;
  }
  let rk = round_key(params.seed_lo, params.seed_hi, DOMAIN_ACCEPT_UNIFORM, params.round_id);
  var n = 0u;
  for (var i = 0u; i < m; i++) {
    if (row_invalid(i)) { fail(REC_ERR_E_TARGET_NUMERIC_OR_MASK); return; }
    let y = proposals[i];
    if (greedy) {
      let t = rowinfo[i * 4u + 1u];
      if (y != t) { result[REC_N_ACCEPTED] = n; result[REC_NEXT_TOKEN] = t; result[REC_REJECTED_AT] = i; return; }
    } else {
      // accept y with probability min(1, p_target(y) / p_draft(y)); u in (0, 1] exact in f32
      let q = probs[i * V + y];
      let p = p_draft[i * V + y];
      var a = 1.0;
      if (p > 0.0) { a = min(1.0, q / p); }
      let u = uniform_open_closed(draw_bits(rk, i, 0u));
      result[REC_DIAG_U] = bitcast<u32>(u);
      result[REC_DIAG_A] = bitcast<u32>(a);
      if (!(u <= a)) {
        result[REC_N_ACCEPTED] = n; result[REC_REJECTED_AT] = i;
        set_plan(MODE_RESIDUAL, i, DOMAIN_CORRECTION_SAMPLE, i);
        return;
      }
    }
    n += 1u;
    if (((params.stop_mask >> i) & 1u) != 0u) { result[REC_N_ACCEPTED] = n; result[REC_ENDED_BY] = REC_ENDED_STOP; return; }
    if (n == params.remaining) { result[REC_N_ACCEPTED] = n; result[REC_ENDED_BY] = REC_ENDED_LENGTH; return; }
  }
  if (row_invalid(m)) { fail(REC_ERR_E_TARGET_NUMERIC_OR_MASK); return; }
  result[REC_N_ACCEPTED] = m;
  if (greedy) { result[REC_NEXT_TOKEN] = rowinfo[m * 4u + 1u]; return; }
  set_plan(MODE_SAMPLE, m, DOMAIN_TARGET_EXTRA, 0u);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) li: u32) {
  lid = li;
  if (lid == 0u) {
    plan_round();
    if (near_top_p != 0u && result[REC_DECISION_ERROR] == 0u) { result[REC_ENDED_BY] |= REC_NEAR_TOP_P_FLAG; }
  }
  let mode = workgroupUniformLoad(&plan_mode);
  if (mode == MODE_DONE) { return; }
  let row = workgroupUniformLoad(&plan_row);
  let domain = workgroupUniformLoad(&plan_domain);
  let position = workgroupUniformLoad(&plan_position);
  let base = row * V;
  let residual = mode == MODE_RESIDUAL;

  var mass = 0.0;
  var bad = 0u;
  for (var i = 0u; i < PER; i++) {
    let j = lid + i * WG;
    var wi = 0.0;
    if (j < V) {
      wi = probs[base + j];
      if (residual) {
        let pd = p_draft[base + j];
        if (!is_finite_bits(bitcast<u32>(pd))) { bad = 1u; }
        wi = max(wi - pd, 0.0);
      }
    }
    w[i] = wi;
    mass = mass + wi;
  }
  if (residual) {                               // residual mass <= 0 or non-finite: invariant broken
    let total = wg_sum_f32(mass);
    let any_bad = wg_reduce_u32(OP_MAX, bad);
    if (any_bad != 0u || !(total > 0.0) || !is_finite_bits(bitcast<u32>(total))) {
      if (lid == 0u) { fail(REC_ERR_E_RESIDUAL_INVARIANT); }
      return;
    }
  }

  let rk = round_key(params.seed_lo, params.seed_hi, domain, params.round_id);
  var best = 0u;
  var best_id = NONE;
  for (var i = 0u; i < PER; i++) {
    let wi = w[i];
    if (wi >= FLT_MIN_NORMAL) {
      let j = lid + i * WG;
      let score = plog_f32(wi) + gumbel_f32(draw_bits(rk, position, j));
      let k = key_of(score);
      if (k > best) { best = k; best_id = j; }    // strict: lowest id wins ties within an invocation
    }
  }
  let top = wg_reduce_u32(OP_MAX, best);
  let id = wg_reduce_u32(OP_MIN, select(NONE, best_id, best == top && top != 0u));
  if (lid == 0u) {
    if (top == 0u) {
      fail(select(REC_ERR_E_TARGET_NUMERIC_OR_MASK, REC_ERR_E_RESIDUAL_INVARIANT, residual));
    } else {
      result[REC_NEXT_TOKEN] = id;
      result[REC_DIAG_SCORE] = bitcast<u32>(key_to_f32(top));
    }
  }
}
