// Attention softmax in place: p[j, h, t] = exp(s - max) / sum over keys t <= start_pos + j.
struct Meta { n: u32, start_pos: u32, heads: u32, max_context: u32 }

@group(0) @binding(0) var<storage, read_write> scores: array<f32>;  // (maxBlock, heads, maxContext): scores in, probabilities out
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (ceil(n * heads / 64), 1, 1); one invocation per (query row, head), sequential over
// its keys: max, exp and sum orders depend on the key count only (batch invariant).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let row = gid.x;                           // j * heads + h
  if (row >= params.n * params.heads) { return; }
  let keys = params.start_pos + row / params.heads + 1u;
  let base = row * params.max_context;
  var peak = scores[base];
  for (var t = 1u; t < keys; t++) { peak = max(peak, scores[base + t]); }
  var total = 0.0;
  for (var t = 0u; t < keys; t++) {
    let e = exp(scores[base + t] - peak);
    scores[base + t] = e;
    total += e;
  }
  let inv_total = 1.0 / total;
  for (var t = 0u; t < keys; t++) { scores[base + t] = scores[base + t] * inv_total; }
}
