// Embedding gather: x[j, :] = embed[ids[j], :] for the n tokens of the block (exact copy).
struct Meta { n: u32, hidden: u32, rows: u32, row0: u32 }   // this piece holds embedding rows [row0, row0 + rows)

@group(0) @binding(0) var<storage, read> embed: array<f32>;        // (rows, H): one piece of the (V, H) embedding
@group(0) @binding(1) var<storage, read> ids: array<u32>;          // (maxBlock,)
@group(0) @binding(2) var<storage, read_write> x: array<f32>;      // (maxBlock, H)
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (ceil(H / 64), n, 1), once per piece; a token is copied by the piece that holds its row
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  let j = gid.y;
  if (i >= params.hidden || j >= params.n) { return; }
  let id = ids[j];                             // ids are validated in JS (< V)
  if (id < params.row0 || id - params.row0 >= params.rows) { return; }
  x[j * params.hidden + i] = embed[(id - params.row0) * params.hidden + i];
}
