// Embedding gather: x[j, :] = embed[ids[j], :] for the n tokens of the block (exact copy).
struct Meta { n: u32, hidden: u32, vocab: u32, pad0: u32 }

@group(0) @binding(0) var<storage, read> embed: array<f32>;        // (V, H)
@group(0) @binding(1) var<storage, read> ids: array<u32>;          // (maxBlock,)
@group(0) @binding(2) var<storage, read_write> x: array<f32>;      // (maxBlock, H)
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (ceil(H / 64), n, 1)
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  let j = gid.y;
  if (i >= params.hidden || j >= params.n) { return; }
  let id = min(ids[j], params.vocab - 1u);   // ids are validated in JS; the clamp keeps reads in bounds
  x[j * params.hidden + i] = embed[id * params.hidden + i];
}
