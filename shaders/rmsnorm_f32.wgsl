// RMSNorm per row: y[j, :] = w * (x[j, :] / sqrt(mean(x[j, :]^2) + eps)), HF order of operations.
struct Meta { n: u32, hidden: u32, eps: f32, pad0: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;            // (maxBlock, H)
@group(0) @binding(1) var<storage, read> weight: array<f32>;       // (H,)
@group(0) @binding(2) var<storage, read_write> y: array<f32>;      // (maxBlock, H)
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (n, 1, 1). Every invocation sums the whole row itself, in index order: the result
// is the same float sequence for any n and any invocation (batch invariant, no barriers).
@compute @workgroup_size(16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let j = wid.x;
  if (j >= params.n) { return; }
  let base = j * params.hidden;
  var ss = 0.0;
  for (var i = 0u; i < params.hidden; i++) {
    let v = x[base + i];
    ss = fma(v, v, ss);
  }
  let inv = 1.0 / sqrt(ss / f32(params.hidden) + params.eps);
  for (var i = lid; i < params.hidden; i += 16u) {
    y[base + i] = weight[i] * (x[base + i] * inv);
  }
}
