// RoPE (HF rotate_half) on q and k of the fused qkv rows; rotated k and raw v go to the KV cache.
struct Meta {
  n: u32, start_pos: u32, heads: u32, kv_heads: u32,
  head_dim: u32, layer_offset: u32, pad0: u32, pad1: u32,   // layer_offset = layer * maxContext * KV * hd
}

@group(0) @binding(0) var<storage, read> qkv: array<f32>;          // (maxBlock, (heads + 2 KV) * hd)
@group(0) @binding(1) var<storage, read> cos_sin: array<vec2<f32>>; // (maxContext, hd / 2): (cos, sin)
@group(0) @binding(2) var<storage, read_write> q: array<f32>;      // (maxBlock, heads * hd)
@group(0) @binding(3) var<storage, read_write> k_cache: array<f32>; // (layers, maxContext, KV, hd)
@group(0) @binding(4) var<storage, read_write> v_cache: array<f32>; // (layers, maxContext, KV, hd)
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (ceil(n * (heads + 2 KV) * hd/2 / 64), 1, 1); one invocation per (j, head slot, i < hd/2)
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let half = params.head_dim / 2u;
  let slots = params.heads + 2u * params.kv_heads;
  let idx = gid.x;
  if (idx >= params.n * slots * half) { return; }
  let i = idx % half;
  let s = (idx / half) % slots;
  let j = idx / (half * slots);
  let pos = params.start_pos + j;
  let src = j * slots * params.head_dim + s * params.head_dim;
  let x1 = qkv[src + i];
  let x2 = qkv[src + i + half];
  let kv_row = params.layer_offset + pos * params.kv_heads * params.head_dim;
  if (s >= params.heads + params.kv_heads) {            // v: copied unrotated
    let dst = kv_row + (s - params.heads - params.kv_heads) * params.head_dim;
    v_cache[dst + i] = x1;
    v_cache[dst + i + half] = x2;
    return;
  }
  let cs = cos_sin[pos * half + i];
  let y1 = x1 * cs.x - x2 * cs.y;                       // x*cos + rotate_half(x)*sin, first half
  let y2 = x2 * cs.x + x1 * cs.y;                       // second half
  if (s < params.heads) {
    let dst = j * params.heads * params.head_dim + s * params.head_dim;
    q[dst + i] = y1;
    q[dst + i + half] = y2;
  } else {
    let dst = kv_row + (s - params.heads) * params.head_dim;
    k_cache[dst + i] = y1;
    k_cache[dst + i + half] = y2;
  }
}
