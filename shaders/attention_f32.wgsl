// Causal GQA attention of the block's queries over the KV cache: out = softmax(q k^T * scale) v.
struct Meta {
  n: u32, start_pos: u32, heads: u32, kv_heads: u32,
  head_dim: u32, layer_offset: u32, scale: f32, pad0: u32,  // layer_offset = layer * maxContext * KV * hd
}

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;       // (maxBlock, heads * hd / 4)
@group(0) @binding(1) var<storage, read> k_cache: array<vec4<f32>>; // (layers, maxContext, KV, hd / 4)
@group(0) @binding(2) var<storage, read> v_cache: array<f32>;       // (layers, maxContext, KV, hd)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;     // (maxBlock, heads * hd)
@group(1) @binding(0) var<uniform> params: Meta;

const WG = 64u;
const MAX_CTX = 4096u;                      // champion.mjs refuses a larger maxContext
var<workgroup> probs: array<f32, MAX_CTX>;  // scores, then exp(score - max)
var<workgroup> part_max: array<f32, WG>;
var<workgroup> part_sum: array<f32, WG>;

// dispatch: (heads, n, 1); one workgroup per (head, query). Query j sees keys [0, start_pos + j].
// Every reduction's grouping depends on the key count and WG only, never on n (batch invariant).
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let j = wid.y;
  let keys = params.start_pos + j + 1u;
  let hd4 = params.head_dim / 4u;
  let kvh = h / (params.heads / params.kv_heads);          // HF repeat_kv: head h uses kv head h / group
  let q_base = (j * params.heads + h) * hd4;
  let row4 = params.kv_heads * hd4;                         // vec4 stride between positions
  let k_base = params.layer_offset / 4u + kvh * hd4;

  var local_max = bitcast<f32>(0xff7fffffu);   // lowest finite f32
  for (var t = lid; t < keys; t += WG) {
    var acc = vec4<f32>(0.0);
    for (var d = 0u; d < hd4; d++) {
      acc = fma(q[q_base + d], k_cache[k_base + t * row4 + d], acc);
    }
    let score = ((acc.x + acc.y) + (acc.z + acc.w)) * params.scale;
    probs[t] = score;
    local_max = max(local_max, score);
  }
  part_max[lid] = local_max;
  workgroupBarrier();
  var peak = part_max[0];
  for (var i = 1u; i < WG; i++) { peak = max(peak, part_max[i]); }
  var local_sum = 0.0;
  for (var t = lid; t < keys; t += WG) {
    let e = exp(probs[t] - peak);
    probs[t] = e;
    local_sum += e;
  }
  part_sum[lid] = local_sum;
  workgroupBarrier();
  var total = 0.0;
  for (var i = 0u; i < WG; i++) { total += part_sum[i]; }
  let inv_total = 1.0 / total;
  let v_base = params.layer_offset + kvh * params.head_dim;
  let row = params.kv_heads * params.head_dim;
  for (var d = lid; d < params.head_dim; d += WG) {
    var o = 0.0;
    for (var t = 0u; t < keys; t++) {
      o = fma(probs[t], v_cache[v_base + t * row + d], o);
    }
    out[(j * params.heads + h) * params.head_dim + d] = o * inv_total;
  }
}
