// Int8 mat-mul: y[j, o] (+)= scale[o] * sum_i q8[o, i] * x[j, i]; += when Meta.accumulate (residual).
struct Meta { n: u32, rows: u32, cols4: u32, accumulate: u32 }   // rows = out, cols4 = in / 4

@group(0) @binding(0) var<storage, read> weight: array<u32>;      // (out, in / 4): 4 int8 per word, little-endian
@group(0) @binding(1) var<storage, read> scale: array<f32>;       // (out,)
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;     // (maxBlock, in / 4)
@group(0) @binding(3) var<storage, read_write> y: array<f32>;     // (maxBlock, out); the residual stream when accumulating
@group(1) @binding(0) var<uniform> params: Meta;

// 4 int8 of a word, lowest byte first; shifts were faster than unpack4xI8 on SwiftShader
fn w4(word: u32) -> vec4<f32> {
  let s = vec4<i32>(bitcast<i32>(word << 24u), bitcast<i32>(word << 16u), bitcast<i32>(word << 8u), bitcast<i32>(word));
  return vec4<f32>(s >> vec4<u32>(24u));
}

fn finish(a: vec4<f32>, o: u32) -> f32 { return ((a.x + a.y) + (a.z + a.w)) * scale[o]; }

fn store(j: u32, o: u32, a: vec4<f32>) {
  if (j < params.n && o < params.rows) {
    let v = finish(a, o);
    y[j * params.rows + o] = select(v, y[j * params.rows + o] + v, params.accumulate != 0u);
  }
}

// dispatch: (ceil(out / 4 / 64), 1, 1). Each invocation owns 4 output rows and walks the block
// 5 columns at a time; a column's sum is the same fma sequence (index order, vec4 lanes, one
// fixed final fold) whatever n is and whichever chunk it lands in: batch invariant.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let o0 = gid.x * 4u;
  if (o0 >= params.rows) { return; }
  let cols4 = params.cols4;
  let last_row = params.rows - 1u;            // rows past the end re-read the last row; never stored
  let w0_base = min(o0 + 0u, last_row) * cols4;
  let w1_base = min(o0 + 1u, last_row) * cols4;
  let w2_base = min(o0 + 2u, last_row) * cols4;
  let w3_base = min(o0 + 3u, last_row) * cols4;
  let last_col = params.n - 1u;
  for (var jc = 0u; jc < params.n; jc += 5u) {
    let x0_base = min(jc + 0u, last_col) * cols4;
    let x1_base = min(jc + 1u, last_col) * cols4;
    let x2_base = min(jc + 2u, last_col) * cols4;
    let x3_base = min(jc + 3u, last_col) * cols4;
    let x4_base = min(jc + 4u, last_col) * cols4;
    var a00 = vec4<f32>(0.0); var a01 = vec4<f32>(0.0); var a02 = vec4<f32>(0.0); var a03 = vec4<f32>(0.0); var a04 = vec4<f32>(0.0);
    var a10 = vec4<f32>(0.0); var a11 = vec4<f32>(0.0); var a12 = vec4<f32>(0.0); var a13 = vec4<f32>(0.0); var a14 = vec4<f32>(0.0);
    var a20 = vec4<f32>(0.0); var a21 = vec4<f32>(0.0); var a22 = vec4<f32>(0.0); var a23 = vec4<f32>(0.0); var a24 = vec4<f32>(0.0);
    var a30 = vec4<f32>(0.0); var a31 = vec4<f32>(0.0); var a32 = vec4<f32>(0.0); var a33 = vec4<f32>(0.0); var a34 = vec4<f32>(0.0);
    for (var i = 0u; i < cols4; i++) {
      let w0 = w4(weight[w0_base + i]);
      let w1 = w4(weight[w1_base + i]);
      let w2 = w4(weight[w2_base + i]);
      let w3 = w4(weight[w3_base + i]);
      let x0 = x[x0_base + i];
      let x1 = x[x1_base + i];
      let x2 = x[x2_base + i];
      let x3 = x[x3_base + i];
      let x4 = x[x4_base + i];
      a00 = fma(w0, x0, a00); a01 = fma(w0, x1, a01); a02 = fma(w0, x2, a02); a03 = fma(w0, x3, a03); a04 = fma(w0, x4, a04);
      a10 = fma(w1, x0, a10); a11 = fma(w1, x1, a11); a12 = fma(w1, x2, a12); a13 = fma(w1, x3, a13); a14 = fma(w1, x4, a14);
      a20 = fma(w2, x0, a20); a21 = fma(w2, x1, a21); a22 = fma(w2, x2, a22); a23 = fma(w2, x3, a23); a24 = fma(w2, x4, a24);
      a30 = fma(w3, x0, a30); a31 = fma(w3, x1, a31); a32 = fma(w3, x2, a32); a33 = fma(w3, x3, a33); a34 = fma(w3, x4, a34);
    }
    store(jc + 0u, o0 + 0u, a00); store(jc + 1u, o0 + 0u, a01); store(jc + 2u, o0 + 0u, a02); store(jc + 3u, o0 + 0u, a03); store(jc + 4u, o0 + 0u, a04);
    store(jc + 0u, o0 + 1u, a10); store(jc + 1u, o0 + 1u, a11); store(jc + 2u, o0 + 1u, a12); store(jc + 3u, o0 + 1u, a13); store(jc + 4u, o0 + 1u, a14);
    store(jc + 0u, o0 + 2u, a20); store(jc + 1u, o0 + 2u, a21); store(jc + 2u, o0 + 2u, a22); store(jc + 3u, o0 + 2u, a23); store(jc + 4u, o0 + 2u, a24);
    store(jc + 0u, o0 + 3u, a30); store(jc + 1u, o0 + 3u, a31); store(jc + 2u, o0 + 3u, a32); store(jc + 3u, o0 + 3u, a33); store(jc + 4u, o0 + 3u, a34);
  }
}
