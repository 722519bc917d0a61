// threefry_bits.wgsl: (tests only) one address per invocation -> the RNG contract's words, so
// tests can compare the WGSL Threefry, uniforms, portable log and Gumbel with exactspec.core.rng.
// Needs threefry_addr.wgsl and sample_gumbel.wgsl.

@group(0) @binding(0) var<storage, read> addrs: array<u32>;        // (n, 8): seed_lo, seed_hi, domain, round, position, token, weight bits, 0
@group(0) @binding(1) var<storage, read_write> words: array<u32>;  // (n, 8): k0, k1, bits, x1, u_oc, u_oo, gumbel, plog(weight) (f32 bits)

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let a = gid.x;
  if (a >= arrayLength(&addrs) / 8u) { return; }
  let s = a * 8u;
  let rk = round_key(addrs[s], addrs[s + 1u], addrs[s + 2u], addrs[s + 3u]);
  let out2 = threefry2x32(rk.x, rk.y, addrs[s + 4u], addrs[s + 5u]);
  let bits = out2.x;
  words[s] = rk.x;
  words[s + 1u] = rk.y;
  words[s + 2u] = bits;
  words[s + 3u] = out2.y;
  words[s + 4u] = bitcast<u32>(uniform_open_closed(bits));
  words[s + 5u] = bitcast<u32>(uniform_open_open(bits));
  words[s + 6u] = bitcast<u32>(gumbel_f32(bits));
  words[s + 7u] = bitcast<u32>(plog_f32(bitcast<f32>(addrs[s + 6u])));
}
