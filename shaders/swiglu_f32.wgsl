// SwiGLU: a[j, f] = silu(gate[j, f]) * up[j, f], gate|up fused in one (n, 2F) buffer.
struct Meta { n: u32, inter: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> gate_up: array<f32>;      // (maxBlock, 2F): gate | up
@group(0) @binding(1) var<storage, read_write> act: array<f32>;    // (maxBlock, F)
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (ceil(F / 64), n, 1)
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let f = gid.x;
  let j = gid.y;
  if (f >= params.inter || j >= params.n) { return; }
  let g = gate_up[j * 2u * params.inter + f];
  let u = gate_up[j * 2u * params.inter + params.inter + f];
  act[j * params.inter + f] = (g / (1.0 + exp(-g))) * u;
}
