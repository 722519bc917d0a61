// Attention output: out[j, h, :] = sum over keys t <= start_pos + j of p[j, h, t] * v[t, h / group, :].
struct Meta {
  n: u32, start_pos: u32, heads: u32, kv_heads: u32,
  head_dim: u32, layer_offset: u32, max_context: u32, pad0: u32,   // layer_offset = layer * maxContext * KV * hd
}

@group(0) @binding(0) var<storage, read> probs: array<f32>;         // (maxBlock, heads, maxContext)
@group(0) @binding(1) var<storage, read> v_cache: array<vec4<f32>>; // (layers, maxContext, KV, hd / 4)
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>; // (maxBlock, heads * hd / 4)
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (ceil(n * heads * hd / 4 / 64), 1, 1); one invocation per (query row, head, 4 dims),
// fma over keys in index order (batch invariant).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let hd4 = params.head_dim / 4u;
  let idx = gid.x;
  if (idx >= params.n * params.heads * hd4) { return; }
  let d4 = idx % hd4;
  let row = idx / hd4;                       // j * heads + h
  let keys = params.start_pos + row / params.heads + 1u;
  let kvh = (row % params.heads) / (params.heads / params.kv_heads);
  let v_base = params.layer_offset / 4u + kvh * hd4 + d4;
  let row4 = params.kv_heads * hd4;          // vec4 stride between positions
  let p_base = row * params.max_context;
  var acc = vec4<f32>(0.0);
  for (var t = 0u; t < keys; t++) {
    acc = fma(vec4<f32>(probs[p_base + t]), v_cache[v_base + t * row4], acc);
  }
  out[idx] = acc;
}
