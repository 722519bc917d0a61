// Attention scores: s[j, h, t] = (q[j, h] . k[t, h / group]) * scale for keys t <= start_pos + j.
struct Meta {
  n: u32, start_pos: u32, heads: u32, kv_heads: u32,
  head_dim: u32, layer_offset: u32, scale: f32, max_context: u32,  // layer_offset = layer * maxContext * KV * hd
}

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;       // (maxBlock, heads * hd / 4), after RoPE
@group(0) @binding(1) var<storage, read> k_cache: array<vec4<f32>>; // (layers, maxContext, KV, hd / 4)
@group(0) @binding(2) var<storage, read_write> scores: array<f32>;  // (maxBlock, heads, maxContext)
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (ceil((start_pos + n) / 64), heads, 1); one invocation per (key t, head h) scores every
// query row j that sees t (t <= start_pos + j). No workgroup memory or barriers (slow on
// SwiftShader); each score is its own fma sequence over hd, whatever n is (batch invariant).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let t = gid.x;
  let h = gid.y;
  if (t >= params.start_pos + params.n || h >= params.heads) { return; }
  let hd4 = params.head_dim / 4u;
  let kvh = h / (params.heads / params.kv_heads);               // HF repeat_kv: head h reads kv head h / group
  let k_base = params.layer_offset / 4u + (t * params.kv_heads + kvh) * hd4;
  // the first row that sees key t: j0 = max(t - start_pos, 0); later keys are never read
  for (var j = select(0u, t - params.start_pos, t > params.start_pos); j < params.n; j++) {
    let row = j * params.heads + h;
    let q_base = row * hd4;
    var acc = vec4<f32>(0.0);
    for (var d = 0u; d < hd4; d++) {
      acc = fma(q[q_base + d], k_cache[k_base + d], acc);
    }
    scores[row * params.max_context + t] = ((acc.x + acc.y) + (acc.z + acc.w)) * params.scale;
  }
}
