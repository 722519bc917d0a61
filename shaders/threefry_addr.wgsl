// threefry_addr.wgsl: Threefry-2x32-20 (Random123) and the two-level address of docs/rng.md.
//   round_key(seed, domain, round) = threefry(key = (seed_lo, seed_hi), counter = (domain, round))
//   draw_bits(...)                = threefry(key = round_key, counter = (position, token)).x
// u32 arithmetic wraps mod 2^32 in WGSL, exactly as the contract needs.

fn rotl32(v: u32, n: u32) -> u32 { return (v << n) | (v >> (32u - n)); }

fn threefry2x32(k0: u32, k1: u32, c0: u32, c1: u32) -> vec2<u32> {
  let ks2 = 0x1BD11BDAu ^ k0 ^ k1;              // Skein parity constant
  var x0 = c0 + k0;
  var x1 = c1 + k1;
  // rounds 0-3, rotations 13 15 26 6, then key injection s = 1
  x0 += x1; x1 = rotl32(x1, 13u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 15u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 26u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 6u);  x1 ^= x0;
  x0 += k1; x1 += ks2 + 1u;
  // rounds 4-7, rotations 17 29 16 24, s = 2
  x0 += x1; x1 = rotl32(x1, 17u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 29u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 16u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 24u); x1 ^= x0;
  x0 += ks2; x1 += k0 + 2u;
  // rounds 8-11, s = 3
  x0 += x1; x1 = rotl32(x1, 13u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 15u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 26u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 6u);  x1 ^= x0;
  x0 += k0; x1 += k1 + 3u;
  // rounds 12-15, s = 4
  x0 += x1; x1 = rotl32(x1, 17u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 29u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 16u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 24u); x1 ^= x0;
  x0 += k1; x1 += ks2 + 4u;
  // rounds 16-19, s = 5
  x0 += x1; x1 = rotl32(x1, 13u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 15u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 26u); x1 ^= x0;
  x0 += x1; x1 = rotl32(x1, 6u);  x1 ^= x0;
  x0 += ks2; x1 += k0 + 5u;
  return vec2<u32>(x0, x1);
}

const DOMAIN_DRAFT_SAMPLE: u32 = 1u;
const DOMAIN_ACCEPT_UNIFORM: u32 = 2u;
const DOMAIN_CORRECTION_SAMPLE: u32 = 3u;
const DOMAIN_TARGET_EXTRA: u32 = 4u;
const DOMAIN_TARGET_BASELINE: u32 = 5u;

fn round_key(seed_lo: u32, seed_hi: u32, domain: u32, round_id: u32) -> vec2<u32> {
  return threefry2x32(seed_lo, seed_hi, domain, round_id);
}

fn draw_bits(rk: vec2<u32>, position: u32, token: u32) -> u32 {
  return threefry2x32(rk.x, rk.y, position, token).x;
}

// Both have a numerator of at most 24 bits times 2^-24: exact in f32 (docs/rng.md section 3).
const TWO_M24: f32 = 5.9604644775390625e-08;
fn uniform_open_closed(bits: u32) -> f32 { return f32((bits >> 8u) + 1u) * TWO_M24; }
fn uniform_open_open(bits: u32) -> f32 { return f32(((bits >> 9u) << 1u) + 1u) * TWO_M24; }
