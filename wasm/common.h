/* common.h — what the CPU module's two halves share, declared once: the draft (draft.c) and the
 * champion (champion.c) are linked into one module (web/build/cpu.wasm, wasm/build.sh) with
 * common.c, which holds the one copy of: the bump arena (one allocator for both halves), IEEE-only
 * log/exp/sincos, the RNG contract of docs/rng.md (Threefry-2x32-20, addressed draws, Gumbel-max
 * sampler), processors-v1 in float64 (one Policy struct and one policy setter) and the Llama
 * building blocks (one Config struct, RMSNorm, RoPE tables and rotation, attention of one head).
 * The status codes are protocol.json's wasm_status table (wasm_status.h, generated). Compiled with
 * -ffp-contract=off (wasm/build.sh): no fused multiply-add, so the portable log matches NumPy bit
 * for bit.
 */
#ifndef EXACTSPEC_WASM_COMMON_H
#define EXACTSPEC_WASM_COMMON_H

#include <stdint.h>
#include <wasm_simd128.h>
#include "round_record.h"  /* REC_*: the round record's word offsets (protocol.json round_record) */
#include "wasm_status.h"   /* OK, ERR_PROCESSOR_INVALID, ERR_BAD_ARGUMENT, ERR_CONTEXT_OVERFLOW, ERR_MODEL_LOAD, ERR_OUT_OF_MEMORY */

#define EXPORT(name) __attribute__((export_name(name)))

/* ============================================================================================
 * Memory: a bump arena above __heap_base; grows linear memory as needed.
 * ========================================================================================== */

extern unsigned char __heap_base;

void *arena_alloc(uint32_t nbytes);

/* the arena's next free byte (16-aligned); what it holds so far is arena_top - __heap_base */
extern uintptr_t arena_top;

void zero_bytes(void *dst, uint32_t n);

/* ============================================================================================
 * Math from IEEE basic operations (no libm). Compiled with -ffp-contract=off: no fused
 * multiply-add, every operation rounds once, so the portable log matches NumPy bit for bit.
 * ========================================================================================== */

static inline uint64_t f64_bits(double x) { union { double d; uint64_t u; } v = { x }; return v.u; }
static inline double bits_f64(uint64_t u) { union { uint64_t u; double d; } v = { u }; return v.d; }

static const double POS_INF = __builtin_inf();
static const double LN2_HI = 6.93147180369123816490e-01;   /* 0x3FE62E42FEE00000 */
static const double LN2_LO = 1.90821492927058770002e-10;
static const double INV_LN2 = 1.44269504088896338700e+00;

static inline int is_nan(double x) { return x != x; }

/* 2^k as a double for k in [-1022, 1023] */
static inline double pow2i(int k) { return bits_f64((uint64_t)(k + 1023) << 52); }

/* frexp: x = m * 2^e with m in [0.5, 1), for finite x > 0 (subnormals included) */
double frexp_pos(double x, int *e);

/* plog: the portable natural log of docs/rng.md §4, operation for operation */

double plog(double x);

/* exp(x), about 1 ulp: x = k ln2 + r with |r| <= ln2/2, Taylor series of degree 13 in r */
double exp_f64(double x);

/* sin and cos of a double: reduce by pi/2 (three-part Cody-Waite), Taylor on |r| <= pi/4 */
void sincos_f64(double x, double *s_out, double *c_out);

/* ============================================================================================
 * RNG contract (docs/rng.md): Threefry-2x32-20, two-level address, bits -> uniform -> Gumbel.
 * ========================================================================================== */

static inline uint32_t rotl32(uint32_t v, int n) { return (v << n) | (v >> (32 - n)); }

void threefry2x32(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1,
                         uint32_t *out0, uint32_t *out1);

typedef struct {
    uint32_t k0, k1;             /* round_key(seed, domain, round) */
} RoundKey;

RoundKey round_key(uint32_t seed_lo, uint32_t seed_hi, uint32_t domain, uint32_t round_id);

static inline uint32_t draw_bits(RoundKey rk, uint32_t position, uint32_t token) {
    uint32_t x0, x1;
    threefry2x32(rk.k0, rk.k1, position, token, &x0, &x1);
    return x0;                   /* x1 is reserved by the contract */
}

static inline double uniform_open_open(uint32_t bits) {
    return ((double)((bits >> 9) << 1) + 1.0) * (1.0 / 16777216.0);
}

/* (0, 1]: the accept-test uniform (rng.uniform_open_closed); 24-bit numerator, exact */
static inline double uniform_open_closed(uint32_t bits) {
    return ((double)(bits >> 8) + 1.0) * (1.0 / 16777216.0);
}

static inline double gumbel(uint32_t bits) { return -plog(-plog(uniform_open_open(bits))); }

enum {                        /* RNG domains (py/exactspec/core/rng.py), stable ids */
    DOMAIN_DRAFT_SAMPLE = 1, DOMAIN_ACCEPT_UNIFORM = 2, DOMAIN_CORRECTION_SAMPLE = 3,
    DOMAIN_TARGET_EXTRA = 4, DOMAIN_TARGET_BASELINE = 5,
};

/* Threefry x0 for 4 tokens at once (i32x4 lanes): the same words as draw_bits, lane by lane */
static inline v128_t rotl32x4(v128_t v, int n) {
    return wasm_v128_or(wasm_i32x4_shl(v, n), wasm_u32x4_shr(v, 32 - n));
}

v128_t draw_bits_x4(RoundKey rk, uint32_t position, v128_t tokens);

/* Approximate natural log of 4 positive normal floats (f32 lanes), |error| < 1e-5 for the
 * arguments used below. Only used to pick candidates; every final score is the exact plog. */
static inline v128_t approx_log_x4(v128_t x) {
    v128_t e = wasm_i32x4_sub(wasm_u32x4_shr(x, 23), wasm_i32x4_splat(126));          /* sign is 0 */
    v128_t m = wasm_v128_or(wasm_v128_and(x, wasm_i32x4_splat(0x007fffff)), wasm_i32x4_splat(0x3f000000));
    v128_t small = wasm_f32x4_lt(m, wasm_f32x4_splat(0.70710678f));
    m = wasm_v128_bitselect(wasm_f32x4_add(m, m), m, small);
    e = wasm_i32x4_add(e, small);                                                       /* e - 1 */
    v128_t f = wasm_f32x4_sub(m, wasm_f32x4_splat(1.0f));
    v128_t sv = wasm_f32x4_div(f, wasm_f32x4_add(wasm_f32x4_splat(2.0f), f));
    v128_t z = wasm_f32x4_mul(sv, sv);
    v128_t p = wasm_f32x4_splat(1.0f / 11);
    p = wasm_f32x4_add(wasm_f32x4_mul(p, z), wasm_f32x4_splat(1.0f / 9));
    p = wasm_f32x4_add(wasm_f32x4_mul(p, z), wasm_f32x4_splat(1.0f / 7));
    p = wasm_f32x4_add(wasm_f32x4_mul(p, z), wasm_f32x4_splat(1.0f / 5));
    p = wasm_f32x4_add(wasm_f32x4_mul(p, z), wasm_f32x4_splat(1.0f / 3));
    v128_t t = wasm_f32x4_add(sv, sv);
    v128_t log_m = wasm_f32x4_add(t, wasm_f32x4_mul(t, wasm_f32x4_mul(z, p)));
    return wasm_f32x4_add(wasm_f32x4_mul(wasm_f32x4_convert_i32x4(e), wasm_f32x4_splat(0.693147181f)), log_m);
}

/* Gumbel-max over nonnegative weights: argmax of plog(w) + G over w > 0, ties -> lowest id,
 * exactly docs/rng.md §5. Returns -1 if a weight is NaN/negative/infinite or none is positive.
 *
 * Two prunings make it cheap without changing any result (draws are addressed, so skipping a
 * token shifts nothing):
 *  1. G lies in [G_LO, G_HI] (Gumbels of the smallest and largest uniform). The winner scores
 *     at least plog(w_max) + G_LO; a token with w < 2^e scores below e ln2 + G_HI. A token whose
 *     bound is strictly below (margin 1e-6) can neither win nor tie: skipped, no bits drawn.
 *  2. The rest get an approximate score A = log(w / w_max) + G in float32 SIMD, within
 *     DELTA of the exact S - plog(w_max) (the float32 error is below 1e-5; DELTA = 1e-3). The
 *     exact winner has A >= max A - 2 DELTA, so only those tokens are scored exactly, in id
 *     order with a strict ">" (a token tying the winner is among them too). */
int sample_gumbel_max(const double *weights, int n, RoundKey rk, uint32_t position,
                             int32_t *scratch /* (2n + 4,) ids, then f32 approximate scores */);

/* the exact sampler without prunings (tests compare the two) */
int sample_gumbel_max_plain(const double *weights, int n, RoundKey rk, uint32_t position);

/* ============================================================================================
 * Model hyper-parameters and the sampling policy (shared shapes).
 * ========================================================================================== */

typedef struct {
    int vocab_size;              /* V */
    int hidden_size;             /* D */
    int intermediate_size;       /* F */
    int num_layers;              /* L */
    int num_heads;               /* H */
    int num_kv_heads;            /* KV (H % KV == 0) */
    int head_dim;                /* hd (even, multiple of 4) */
    int max_context;             /* T_max: max_position_embeddings */
    double rms_norm_eps;
    double rope_theta;
} Config;

/* the hyper-parameters, checked (ERR_MODEL_LOAD: what the SIMD kernels cannot run) */
int config_set(Config *cfg, int vocab_size, int hidden_size, int intermediate_size, int num_layers,
                      int num_heads, int num_kv_heads, int head_dim, int max_context, double rms_norm_eps,
                      double rope_theta);

typedef struct {
    double temperature;          /* 0 = greedy */
    int top_k;                   /* 0 = off */
    double top_p;                /* 1 = off */
    double repetition_penalty;   /* 1 = off */
    uint8_t *suppressed;         /* (V,) 1 = forced to -inf */
    int n_suppressed;
    uint8_t *allowed;            /* (V,) 1 = allowed by the grammar mask */
    int has_allowed;             /* 0 = no grammar mask */
} Policy;

typedef struct {
    uint8_t *in_context;         /* (V,) 1 = id occurs in the context (repetition penalty) */
    double *work;                /* (V,) processed row in float64 */
    int32_t *heap;               /* (2V + 4,) index heap for top-k / top-p; sampler scratch */
    uint8_t *is_stop;            /* (V,) 1 = stop token */
} ProcState;

int build_proc_state(ProcState *p, Policy *po, int vocab_size);

void free_proc_state(ProcState *p);

/* ============================================================================================
 * Llama building blocks (float32, one row at a time: the same operations whatever the block).
 * ========================================================================================== */

/* out = x * rsqrt(mean(x^2) + eps) * weight (mean in float64) */
void rmsnorm(float *out, const float *x, const float *weight, int n, double eps);

/* HF rotate_half RoPE on one head vector: first half x1 c - x2 s, second half x2 c + x1 s */
void rope(float *v, const float *cs, const float *sn, int half);

static inline float silu(float x) { return x / (1.0f + (float)exp_f64(-(double)x)); }

/* causal attention of one query head at position pos over keys [0, pos] of one layer's cache
 * (T_max, kv_dim), kv head at kv_offset: out (hd,); scores (pos + 1,) scratch */
void attend_head(float *out, const float *qh, const float *k_layer, const float *v_layer, int kv_dim,
                        int hd, int kv_offset, int pos, float scale, float *scores);

/* HF default RoPE tables (T_max, hd/2): inv_freq[i] = theta^(-2i/hd); angle = pos * inv_freq[i]
 * in float64, stored as float32 */
/* column i of the (max_context, half) RoPE tables: cos and sin of pos * inv_freq, in float64 */
void rope_column(float *rope_cos, float *rope_sin, int max_context, int half, int i, double inv_freq);

void build_rope_tables(float *rope_cos, float *rope_sin, int max_context, int head_dim,
                              double rope_theta);

/* the tables from explicit inverse frequencies (scaled RoPE: linear, llama3), computed by JS as
 * exactspec.formats.config.rope_inv_freq does; ERR_MODEL_LOAD if one is not positive */
int rope_tables_from_inv_freq(float *rope_cos, float *rope_sin, int max_context, int head_dim,
                                     const double *inv_freq);

/* ============================================================================================
 * Processors-v1 (docs/processors.md) in float64: suppress, allowed mask (the policy's, and a per-row
 * bitmask: process_row_masked), repetition penalty,
 * greedy one-hot | temperature, top-k (exactly k by logit desc, id asc), softmax, top-p.
 * ========================================================================================== */

/* a ranks before b: larger value, then lower id (the order of top-k, top-p and argmax) */
static inline int ranks_before(const double *val, int32_t a, int32_t b) {
    return val[a] > val[b] || (val[a] == val[b] && a < b);
}

void heap_sift_down(int32_t *heap, int n, int i, const double *val);

void heap_build(int32_t *heap, int n, const double *val);

/* remove and return the top of the heap; *n shrinks by one */
int32_t heap_pop(int32_t *heap, int *n, const double *val);

/* NaN or +inf anywhere, or no finite entry left: the row is invalid */
int row_invalid(const double *x, int n);

/* logits (V,) f32 + policy + context marks -> proc->work (V,) float64 probabilities */
int process_row(const float *logits, int V, const Policy *pol, ProcState *proc);

/* process_row with a per-row grammar mask in step 3: mask_bits (ceil(V / 32),) uint32, bit (id & 31)
 * of word (id >> 5) set = id allowed (xgrammar's bitmask layout), ANDed with pol->allowed when the
 * policy has one; mask_bits 0 = none (exactly process_row) */
int process_row_masked(const float *logits, int V, const Policy *pol, const uint32_t *mask_bits, ProcState *proc);

/* words of one row of a token bitmask: ceil(V / 32) */
static inline int mask_words(int V) { return (V + 31) / 32; }

/* the policy's numbers; ERR_BAD_ARGUMENT if one is out of range */
int policy_set(Policy *pol, double temperature, int top_k, double top_p, double repetition_penalty);

/* suppressed ids and the grammar mask (n_allowed < 0: none; else only allowed[0..n_allowed)) */
int policy_set_masks(Policy *pol, int V, const int32_t *suppress, int n_suppress, const int32_t *allowed,
                            int n_allowed);

#endif
