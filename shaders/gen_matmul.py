"""Writes shaders/matmul_q8.wgsl and lm_head_f32.wgsl (one body).

    python3 shaders/gen_matmul.py [COLUMNS_PER_CHUNK=5] [ROWS_PER_INVOCATION=4]

R rows x C block columns of vec4 accumulators per invocation, no workgroup memory. C = 5 was
fastest on SwiftShader for maxBlock 9 (k = 4 -> one chunk, k = 8 -> two). If R changes, change
the matmul grid in web/gpu/champion.mjs (cdiv(rows, 64 * R)).
"""
import os
import sys

C = int(sys.argv[1]) if len(sys.argv) > 1 else 5
R = int(sys.argv[2]) if len(sys.argv) > 2 else 4
os.chdir(os.path.dirname(os.path.abspath(__file__)))
def body(kind):
    q8 = kind != "lm_head"
    L = []
    if q8:
        L.append("// Int8 mat-mul: y[j, o] (+)= scale[o] * sum_i q8[o, i] * x[j, i]; += when Meta.accumulate (residual).")
    else:
        L.append("// Tied LM head: logits[j, v] = sum_i embed[v, i] * x[j, i] (f32 weights, any V).")
    if q8:
        L.append("struct Meta { n: u32, rows: u32, cols4: u32, accumulate: u32 }   // rows = out, cols4 = in / 4")
    else:
        L.append("struct Meta { n: u32, rows: u32, cols4: u32, pad0: u32 }   // rows = out, cols4 = in / 4")
    L.append("")
    if q8:
        L.append("@group(0) @binding(0) var<storage, read> weight: array<u32>;      // (out, in / 4): 4 int8 per word, little-endian")
        L.append("@group(0) @binding(1) var<storage, read> scale: array<f32>;       // (out,)")
        L.append("@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;     // (maxBlock, in / 4)")
        L.append("@group(0) @binding(3) var<storage, read_write> y: array<f32>;     // (maxBlock, out); the residual stream when accumulating")
    else:
        L.append("@group(0) @binding(0) var<storage, read> weight: array<vec4<f32>>; // (V, H / 4): the embedding")
        L.append("@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;      // (maxBlock, H / 4)")
        L.append("@group(0) @binding(2) var<storage, read_write> y: array<f32>;      // (maxBlock, V)")
    L.append("@group(1) @binding(0) var<uniform> params: Meta;")
    L.append("")
    if q8:
        L.append("// 4 int8 of a word, lowest byte first; shifts were faster than unpack4xI8 on SwiftShader")
        L.append("fn w4(word: u32) -> vec4<f32> {")
        L.append("  let s = vec4<i32>(bitcast<i32>(word << 24u), bitcast<i32>(word << 16u), bitcast<i32>(word << 8u), bitcast<i32>(word));")
        L.append("  return vec4<f32>(s >> vec4<u32>(24u));")
        L.append("}")
        L.append("")
        L.append("fn finish(a: vec4<f32>, o: u32) -> f32 { return ((a.x + a.y) + (a.z + a.w)) * scale[o]; }")
    else:
        L.append("fn finish(a: vec4<f32>, o: u32) -> f32 { return (a.x + a.y) + (a.z + a.w); }")
    L.append("")
    L.append("fn store(j: u32, o: u32, a: vec4<f32>) {")
    L.append("  if (j < params.n && o < params.rows) {")
    if q8:
        L.append("    let v = finish(a, o);")
        L.append("    y[j * params.rows + o] = select(v, y[j * params.rows + o] + v, params.accumulate != 0u);")
    else:
        L.append("    y[j * params.rows + o] = finish(a, o);")
    L.append("  }")
    L.append("}")
    L.append("")
    L.append(f"// dispatch: (ceil(out / {R} / 64), 1, 1). Each invocation owns {R} output rows and walks the block")
    L.append(f"// {C} columns at a time; a column's sum is the same fma sequence (index order, vec4 lanes, one")
    L.append("// fixed final fold) whatever n is and whichever chunk it lands in: batch invariant.")
    L.append("@compute @workgroup_size(64)")
    L.append("fn main(@builtin(global_invocation_id) gid: vec3<u32>) {")
    L.append(f"  let o0 = gid.x * {R}u;")
    L.append("  if (o0 >= params.rows) { return; }")
    L.append("  let cols4 = params.cols4;")
    L.append("  let last_row = params.rows - 1u;            // rows past the end re-read the last row; never stored")
    for r in range(R):
        L.append(f"  let w{r}_base = min(o0 + {r}u, last_row) * cols4;")
    L.append("  let last_col = params.n - 1u;")
    L.append(f"  for (var jc = 0u; jc < params.n; jc += {C}u) {{")
    for c in range(C):
        L.append(f"    let x{c}_base = min(jc + {c}u, last_col) * cols4;")
    for r in range(R):
        L.append("    " + " ".join(f"var a{r}{c} = vec4<f32>(0.0);" for c in range(C)))
    L.append("    for (var i = 0u; i < cols4; i++) {")
    for r in range(R):
        ld = f"w4(weight[w{r}_base + i])" if q8 else f"weight[w{r}_base + i]"
        L.append(f"      let w{r} = {ld};")
    for c in range(C):
        L.append(f"      let x{c} = x[x{c}_base + i];")
    for r in range(R):
        L.append("      " + " ".join(f"a{r}{c} = fma(w{r}, x{c}, a{r}{c});" for c in range(C)))
    L.append("    }")
    for r in range(R):
        L.append("    " + " ".join(f"store(jc + {c}u, o0 + {r}u, a{r}{c});" for c in range(C)))
    L.append("  }")
    L.append("}")
    return "\n".join(L) + "\n"
open("matmul_q8.wgsl", "w").write(body("plain"))
open("lm_head_f32.wgsl", "w").write(body("lm_head"))
