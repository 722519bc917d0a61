// Embedding gather from int8 rows: x[j, i] = f32(q8[ids[j], i]) * scale[ids[j]] (the dequantised value, one rounding).
struct Meta { n: u32, hidden: u32, rows: u32, row0: u32 }   // this piece holds embedding rows [row0, row0 + rows)

@group(0) @binding(0) var<storage, read> embed: array<u32>;        // (rows, H / 4): 4 int8 per word, little-endian
@group(0) @binding(1) var<storage, read> scale: array<f32>;        // (rows,)
@group(0) @binding(2) var<storage, read> ids: array<u32>;          // (maxBlock,)
@group(0) @binding(3) var<storage, read_write> x: array<f32>;      // (maxBlock, H)
@group(1) @binding(0) var<uniform> params: Meta;

// dispatch: (ceil(H / 64), n, 1), once per piece; a token is copied by the piece that holds its row
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  let j = gid.y;
  if (i >= params.hidden || j >= params.n) { return; }
  let id = ids[j];                             // ids are validated in JS (< V)
  if (id < params.row0 || id - params.row0 >= params.rows) { return; }
  let r = id - params.row0;
  let word = embed[r * (params.hidden / 4u) + i / 4u];
  let q = bitcast<i32>(word << (24u - 8u * (i % 4u))) >> 24u;
  x[j * params.hidden + i] = f32(q) * scale[r];
}
