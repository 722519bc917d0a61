// Bias add: y[j, o] += bias[o] (the q|k|v biases of Qwen2 after the fused projection).
struct Meta { n: u32, rows: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> bias: array<f32>;         // (rows,)
@group(0) @binding(1) var<storage, read_write> y: array<f32>;      // (maxBlock, rows)
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (ceil(rows / 64), n, 1); one add per element (batch invariant)
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let o = gid.x;
  let j = gid.y;
  if (o >= params.rows || j >= params.n) { return; }
  y[j * params.rows + o] = y[j * params.rows + o] + bias[o];
}
