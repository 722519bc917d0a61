/* common.h — the maths shared by the WASM draft (draft.c) and the WASM champion (champion.c):
 * bump arena, IEEE-only log/exp/sincos, the RNG contract of docs/rng.md (Threefry-2x32-20,
 * addressed draws, Gumbel-max sampler), processors-v1 in float64 and the Llama building blocks
 * (RMSNorm, RoPE tables and rotation, SiLU). Included once per module (one translation unit);
 * every function is static. Compiled with -ffp-contract=off (wasm/build.sh): no fused
 * multiply-add, so the portable log matches NumPy bit for bit.
 */
#ifndef EXACTSPEC_WASM_COMMON_H
#define EXACTSPEC_WASM_COMMON_H

#include <stdint.h>
#include <wasm_simd128.h>

#define EXPORT(name) __attribute__((export_name(name)))

enum {
    OK = 0,
    ERR_PROCESSOR_INVALID = 1,   /* NaN/+inf logit or no valid token after a step */
    ERR_BAD_ARGUMENT = 2,        /* ids out of range, start_pos beyond the cache, empty feed */
    ERR_CONTEXT_OVERFLOW = 3,    /* positions beyond max_position_embeddings */
    ERR_MODEL = 4,               /* missing tensor, unsupported shape */
    ERR_NO_MEMORY = 5,
};

/* ============================================================================================
 * Memory: a bump arena above __heap_base; grows linear memory as needed.
 * ========================================================================================== */

extern unsigned char __heap_base;
static uintptr_t arena_top;              /* next free byte (16-aligned) */

static void *arena_alloc(uint32_t nbytes) {
    if (arena_top == 0) arena_top = ((uintptr_t)&__heap_base + 15) & ~(uintptr_t)15;
    uintptr_t p = arena_top;
    uintptr_t end = (p + (uintptr_t)nbytes + 15) & ~(uintptr_t)15;
    if (end < p) return 0;
    uintptr_t have = (uintptr_t)__builtin_wasm_memory_size(0) * 65536u;
    if (end > have) {
        uintptr_t pages = (end - have + 65535u) / 65536u;
        if (__builtin_wasm_memory_grow(0, pages) == (uintptr_t)-1) return 0;
    }
    arena_top = end;
    return (void *)p;
}

static void zero_bytes(void *dst, uint32_t n) {
    unsigned char *d = (unsigned char *)dst;
    for (uint32_t i = 0; i < n; i++) d[i] = 0;
}

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
static double frexp_pos(double x, int *e) {
    uint64_t u = f64_bits(x);
    int ex = (int)((u >> 52) & 0x7ff);
    int bias = 0;
    if (ex == 0) {                       /* subnormal: scale into the normal range (exact) */
        x = x * 18014398509481984.0;     /* 2^54 */
        u = f64_bits(x);
        ex = (int)((u >> 52) & 0x7ff);
        bias = -54;
    }
    *e = ex - 1022 + bias;
    return bits_f64((u & 0x800fffffffffffffULL) | 0x3fe0000000000000ULL);
}

/* plog: the portable natural log of docs/rng.md §4, operation for operation */
static const double PLOG_C[12] = {
    1.0 / 3, 1.0 / 5, 1.0 / 7, 1.0 / 9, 1.0 / 11, 1.0 / 13,
    1.0 / 15, 1.0 / 17, 1.0 / 19, 1.0 / 21, 1.0 / 23, 1.0 / 25,
};

static double plog(double x) {
    int e;
    double m = frexp_pos(x, &e);
    if (m < 0.7071067811865476) { m = m * 2.0; e = e - 1; }
    double f = m - 1.0;
    double s = f / (2.0 + f);
    double z = s * s;
    double p = PLOG_C[11];
    for (int i = 10; i >= 0; i--) p = p * z + PLOG_C[i];
    double t = 2.0 * s;
    double log_m = t + t * (z * p);
    double de = (double)e;
    return de * LN2_HI + (log_m + de * LN2_LO);
}

/* exp(x), about 1 ulp: x = k ln2 + r with |r| <= ln2/2, Taylor series of degree 13 in r */
static double exp_f64(double x) {
    if (is_nan(x)) return x;
    if (x > 709.782712893384) return POS_INF;
    if (x < -745.2) return 0.0;
    double kd = x * INV_LN2;
    kd = kd < 0 ? kd - 0.5 : kd + 0.5;
    int k = (int)kd;                                  /* round to nearest */
    double r = (x - (double)k * LN2_HI) - (double)k * LN2_LO;
    double p = 1.0 / 6227020800.0;                    /* 1/13! */
    static const double INV_FACT[13] = {
        1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
        1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600,
    };
    for (int i = 12; i >= 0; i--) p = p * r + INV_FACT[i];
    if (k < -1021) return (p * pow2i(k + 54)) * (1.0 / 18014398509481984.0);  /* subnormal result */
    if (k > 1023) return (p * 2.0) * pow2i(k - 1);
    return p * pow2i(k);
}

/* sin and cos of a double: reduce by pi/2 (three-part Cody-Waite), Taylor on |r| <= pi/4 */
static void sincos_f64(double x, double *s_out, double *c_out) {
    static const double PIO2_1 = 1.57079632673412561417e+00;   /* first 33 bits of pi/2 */
    static const double PIO2_2 = 6.07710050650619224932e-11;
    static const double PIO2_3 = 2.02226624879595063154e-21;
    static const double TWO_OVER_PI = 6.36619772367581382433e-01;
    double nd = x * TWO_OVER_PI;
    nd = nd < 0 ? nd - 0.5 : nd + 0.5;
    long long n = (long long)nd;
    double r = ((x - (double)n * PIO2_1) - (double)n * PIO2_2) - (double)n * PIO2_3;
    double z = r * r;
    /* sin r = r + r z q,  q = -1/3! + z/5! - z^2/7! + ... + z^7/17! */
    double q = 1.0 / 355687428096000.0;
    q = q * z - 1.0 / 1307674368000.0;
    q = q * z + 1.0 / 6227020800.0;
    q = q * z - 1.0 / 39916800.0;
    q = q * z + 1.0 / 362880.0;
    q = q * z - 1.0 / 5040.0;
    q = q * z + 1.0 / 120.0;
    q = q * z - 1.0 / 6.0;
    double sin_r = r + r * (z * q);
    /* cos r = 1 + z c,  c = -1/2! + z/4! - z^2/6! + ... - z^8/18! */
    double c = -1.0 / 6402373705728000.0;
    c = c * z + 1.0 / 20922789888000.0;
    c = c * z - 1.0 / 87178291200.0;
    c = c * z + 1.0 / 479001600.0;
    c = c * z - 1.0 / 3628800.0;
    c = c * z + 1.0 / 40320.0;
    c = c * z - 1.0 / 720.0;
    c = c * z + 1.0 / 24.0;
    c = c * z - 0.5;
    double cos_r = 1.0 + z * c;
    switch ((int)(n & 3)) {
        case 0: *s_out = sin_r;  *c_out = cos_r;  break;
        case 1: *s_out = cos_r;  *c_out = -sin_r; break;
        case 2: *s_out = -sin_r; *c_out = -cos_r; break;
        default: *s_out = -cos_r; *c_out = sin_r; break;
    }
}

/* ============================================================================================
 * RNG contract (docs/rng.md): Threefry-2x32-20, two-level address, bits -> uniform -> Gumbel.
 * ========================================================================================== */

static inline uint32_t rotl32(uint32_t v, int n) { return (v << n) | (v >> (32 - n)); }

static void threefry2x32(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1,
                         uint32_t *out0, uint32_t *out1) {
    static const int ROT[8] = { 13, 15, 26, 6, 17, 29, 16, 24 };
    uint32_t ks[3] = { k0, k1, 0x1BD11BDAu ^ k0 ^ k1 };
    uint32_t x0 = c0 + k0, x1 = c1 + k1;
    for (int r = 0; r < 20; r++) {
        x0 += x1;
        x1 = rotl32(x1, ROT[r % 8]);
        x1 ^= x0;
        if (r % 4 == 3) {
            uint32_t s = (uint32_t)(r + 1) / 4;
            x0 += ks[s % 3];
            x1 += ks[(s + 1) % 3] + s;
        }
    }
    *out0 = x0;
    *out1 = x1;
}

typedef struct {
    uint32_t k0, k1;             /* round_key(seed, domain, round) */
} RoundKey;

static RoundKey round_key(uint32_t seed_lo, uint32_t seed_hi, uint32_t domain, uint32_t round_id) {
    RoundKey rk;
    threefry2x32(seed_lo, seed_hi, domain, round_id, &rk.k0, &rk.k1);
    return rk;
}

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

static v128_t draw_bits_x4(RoundKey rk, uint32_t position, v128_t tokens) {
    uint32_t ks[3] = { rk.k0, rk.k1, 0x1BD11BDAu ^ rk.k0 ^ rk.k1 };
    v128_t x0 = wasm_i32x4_splat((int32_t)(position + rk.k0));
    v128_t x1 = wasm_i32x4_add(tokens, wasm_i32x4_splat((int32_t)rk.k1));
    /* unrolled so that every rotation is by a constant (the loop form is not unrolled by clang) */
#define TF_ROUND(rot) x0 = wasm_i32x4_add(x0, x1); x1 = rotl32x4(x1, rot); x1 = wasm_v128_xor(x1, x0);
#define TF_INJECT(s) x0 = wasm_i32x4_add(x0, wasm_i32x4_splat((int32_t)ks[(s) % 3])); \
                     x1 = wasm_i32x4_add(x1, wasm_i32x4_splat((int32_t)(ks[((s) + 1) % 3] + (s))));
    TF_ROUND(13) TF_ROUND(15) TF_ROUND(26) TF_ROUND(6)  TF_INJECT(1)
    TF_ROUND(17) TF_ROUND(29) TF_ROUND(16) TF_ROUND(24) TF_INJECT(2)
    TF_ROUND(13) TF_ROUND(15) TF_ROUND(26) TF_ROUND(6)  TF_INJECT(3)
    TF_ROUND(17) TF_ROUND(29) TF_ROUND(16) TF_ROUND(24) TF_INJECT(4)
    TF_ROUND(13) TF_ROUND(15) TF_ROUND(26) TF_ROUND(6)  TF_INJECT(5)
#undef TF_ROUND
#undef TF_INJECT
    return x0;
}

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
static int sample_gumbel_max(const double *weights, int n, RoundKey rk, uint32_t position,
                             int32_t *scratch /* (2n + 4,) ids, then f32 approximate scores */) {
    const float DELTA = 1e-3f;
    double w_max = 0.0;
    for (int x = 0; x < n; x++) {
        double w = weights[x];
        if (!(w >= 0.0 && w < POS_INF)) return -1;
        if (w > w_max) w_max = w;
    }
    if (w_max == 0.0) return -1;
    const double g_lo = gumbel(0u), g_hi = gumbel(0xffffffffu), margin = 1e-6;
    double floor_score = plog(w_max) + g_lo - margin;
    int32_t *cand = scratch;                                  /* (n_cand,) ids, ascending */
    float *approx = (float *)(scratch + n);                   /* (n_cand + 3,) */
    int n_cand = 0;
    for (int x = 0; x < n; x++) {
        double w = weights[x];
        if (w == 0.0) continue;
        int e;
        frexp_pos(w, &e);                                     /* w < 2^e */
        if ((double)e * LN2_HI + g_hi < floor_score) continue;
        cand[n_cand++] = x;                                   /* here w / w_max >= 2^-30 */
    }
    float best_approx = -3.0e38f;
    for (int j = 0; j < n_cand; j += 4) {
        int32_t ids[4];
        float ratio[4];
        for (int l = 0; l < 4; l++) {
            ids[l] = cand[j + l < n_cand ? j + l : j];
            ratio[l] = (float)(weights[ids[l]] / w_max);       /* in [2^-30, 1]; no 1/w_max overflow */
        }
        v128_t bits = draw_bits_x4(rk, position, wasm_v128_load(ids));
        v128_t u = wasm_f32x4_mul(                            /* uniform_open_open, exact in f32 */
            wasm_f32x4_convert_i32x4(wasm_i32x4_add(wasm_i32x4_shl(wasm_u32x4_shr(bits, 9), 1),
                                                    wasm_i32x4_splat(1))),
            wasm_f32x4_splat(1.0f / 16777216.0f));
        v128_t g = wasm_f32x4_neg(approx_log_x4(wasm_f32x4_neg(approx_log_x4(u))));
        v128_t a = wasm_f32x4_add(approx_log_x4(wasm_v128_load(ratio)), g);
        wasm_v128_store(approx + j, a);
        for (int l = 0; l < 4 && j + l < n_cand; l++)
            if (approx[j + l] > best_approx) best_approx = approx[j + l];
    }
    float threshold = best_approx - 2.0f * DELTA;
    int best = -1;
    double best_score = -POS_INF;
    for (int j = 0; j < n_cand; j++) {
        if (approx[j] < threshold) continue;
        int x = cand[j];
        double score = plog(weights[x]) + gumbel(draw_bits(rk, position, (uint32_t)x));
        if (score > best_score) { best = x; best_score = score; }
    }
    return best;
}

/* the exact sampler without prunings (tests compare the two) */
__attribute__((unused)) static int sample_gumbel_max_plain(const double *weights, int n, RoundKey rk, uint32_t position) {
    int best = -1;
    double best_score = -POS_INF;
    for (int x = 0; x < n; x++) {
        double w = weights[x];
        if (!(w >= 0.0 && w < POS_INF)) return -1;
        if (w == 0.0) continue;
        double score = plog(w) + gumbel(draw_bits(rk, position, (uint32_t)x));
        if (score > best_score) { best = x; best_score = score; }
    }
    return best;
}

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

/* the hyper-parameters, checked (ERR_MODEL: what the SIMD kernels cannot run) */
static int config_set(Config *cfg, int vocab_size, int hidden_size, int intermediate_size, int num_layers,
                      int num_heads, int num_kv_heads, int head_dim, int max_context, double rms_norm_eps,
                      double rope_theta) {
    if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_layers <= 0 ||
        num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || max_context <= 0 ||
        num_heads % num_kv_heads || head_dim % 4 || hidden_size % 4 || intermediate_size % 4 ||
        !(rope_theta > 0) || !(rms_norm_eps >= 0))
        return ERR_MODEL;
    cfg->vocab_size = vocab_size;
    cfg->hidden_size = hidden_size;
    cfg->intermediate_size = intermediate_size;
    cfg->num_layers = num_layers;
    cfg->num_heads = num_heads;
    cfg->num_kv_heads = num_kv_heads;
    cfg->head_dim = head_dim;
    cfg->max_context = max_context;
    cfg->rms_norm_eps = rms_norm_eps;
    cfg->rope_theta = rope_theta;
    return OK;
}

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

static int build_proc_state(ProcState *p, Policy *po, int vocab_size) {
    uint32_t v = (uint32_t)vocab_size;
    p->in_context = (uint8_t *)arena_alloc(v);
    p->work = (double *)arena_alloc(v * 8u);
    p->heap = (int32_t *)arena_alloc(v * 8u + 16u);     /* the sampler stores 4 lanes at a time */
    p->is_stop = (uint8_t *)arena_alloc(v);
    po->suppressed = (uint8_t *)arena_alloc(v);
    po->allowed = (uint8_t *)arena_alloc(v);
    if (!p->in_context || !p->work || !p->heap || !p->is_stop || !po->suppressed || !po->allowed)
        return ERR_NO_MEMORY;
    zero_bytes(p->in_context, v);
    zero_bytes(p->is_stop, v);
    zero_bytes(po->suppressed, v);
    zero_bytes(po->allowed, v);
    po->temperature = 1.0;
    po->top_k = 0;
    po->top_p = 1.0;
    po->repetition_penalty = 1.0;
    po->n_suppressed = 0;
    po->has_allowed = 0;
    return OK;
}

__attribute__((unused)) static void free_proc_state(ProcState *p) { zero_bytes(p, sizeof(*p)); }

/* ============================================================================================
 * Llama building blocks (float32, one row at a time: the same operations whatever the block).
 * ========================================================================================== */

/* out = x * rsqrt(mean(x^2) + eps) * weight (mean in float64) */
static void rmsnorm(float *out, const float *x, const float *weight, int n, double eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float inv = (float)(1.0 / __builtin_sqrt(ss / (double)n + eps));
    for (int i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inv);
}

/* HF rotate_half RoPE on one head vector: first half x1 c - x2 s, second half x2 c + x1 s */
static void rope(float *v, const float *cs, const float *sn, int half) {
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}

static inline float silu(float x) { return x / (1.0f + (float)exp_f64(-(double)x)); }

/* causal attention of one query head at position pos over keys [0, pos] of one layer's cache
 * (T_max, kv_dim), kv head at kv_offset: out (hd,); scores (pos + 1,) scratch */
static void attend_head(float *out, const float *qh, const float *k_layer, const float *v_layer, int kv_dim,
                        int hd, int kv_offset, int pos, float scale, float *scores) {
    float peak = -3.0e38f;
    for (int t = 0; t <= pos; t++) {
        const float *kt = k_layer + t * kv_dim + kv_offset;
        v128_t a = wasm_f32x4_splat(0.0f);
        for (int i = 0; i < hd; i += 4)
            a = wasm_f32x4_add(a, wasm_f32x4_mul(wasm_v128_load(qh + i), wasm_v128_load(kt + i)));
        float dot = (wasm_f32x4_extract_lane(a, 0) + wasm_f32x4_extract_lane(a, 2)) +
                    (wasm_f32x4_extract_lane(a, 1) + wasm_f32x4_extract_lane(a, 3));
        scores[t] = dot * scale;
        if (scores[t] > peak) peak = scores[t];
    }
    double total = 0.0;
    for (int t = 0; t <= pos; t++) {
        float e = (float)exp_f64((double)(scores[t] - peak));
        scores[t] = e;
        total += e;
    }
    float inv_total = (float)(1.0 / total);
    for (int i = 0; i < hd; i += 4) wasm_v128_store(out + i, wasm_f32x4_splat(0.0f));
    for (int t = 0; t <= pos; t++) {
        const float *vt = v_layer + t * kv_dim + kv_offset;
        v128_t p = wasm_f32x4_splat(scores[t] * inv_total);
        for (int i = 0; i < hd; i += 4)
            wasm_v128_store(out + i, wasm_f32x4_add(wasm_v128_load(out + i), wasm_f32x4_mul(p, wasm_v128_load(vt + i))));
    }
}

/* HF default RoPE tables (T_max, hd/2): inv_freq[i] = theta^(-2i/hd); angle = pos * inv_freq[i]
 * in float64, stored as float32 */
/* column i of the (max_context, half) RoPE tables: cos and sin of pos * inv_freq, in float64 */
static void rope_column(float *rope_cos, float *rope_sin, int max_context, int half, int i, double inv_freq) {
    for (int pos = 0; pos < max_context; pos++) {
        double sn, cs;
        sincos_f64((double)pos * inv_freq, &sn, &cs);
        rope_cos[pos * half + i] = (float)cs;
        rope_sin[pos * half + i] = (float)sn;
    }
}

static void build_rope_tables(float *rope_cos, float *rope_sin, int max_context, int head_dim,
                              double rope_theta) {
    int half = head_dim / 2;
    double log_theta = plog(rope_theta);
    for (int i = 0; i < half; i++)
        rope_column(rope_cos, rope_sin, max_context, half, i,
                    exp_f64(-((double)(2 * i) / (double)head_dim) * log_theta));
}

/* the tables from explicit inverse frequencies (scaled RoPE: linear, llama3), computed by JS as
 * exactspec.formats.config.rope_inv_freq does; ERR_MODEL if one is not positive */
static int rope_tables_from_inv_freq(float *rope_cos, float *rope_sin, int max_context, int head_dim,
                                     const double *inv_freq) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++)
        if (!(inv_freq[i] > 0)) return ERR_MODEL;
    for (int i = 0; i < half; i++) rope_column(rope_cos, rope_sin, max_context, half, i, inv_freq[i]);
    return OK;
}

/* ============================================================================================
 * Processors-v1 (docs/processors.md) in float64: suppress, allowed mask, repetition penalty,
 * greedy one-hot | temperature, top-k (exactly k by logit desc, id asc), softmax, top-p.
 * ========================================================================================== */

/* a ranks before b: larger value, then lower id (the order of top-k, top-p and argmax) */
static inline int ranks_before(const double *val, int32_t a, int32_t b) {
    return val[a] > val[b] || (val[a] == val[b] && a < b);
}

static void heap_sift_down(int32_t *heap, int n, int i, const double *val) {
    for (;;) {
        int best = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(val, heap[l], heap[best])) best = l;
        if (r < n && ranks_before(val, heap[r], heap[best])) best = r;
        if (best == i) return;
        int32_t t = heap[i]; heap[i] = heap[best]; heap[best] = t;
        i = best;
    }
}

static void heap_build(int32_t *heap, int n, const double *val) {
    for (int i = n / 2 - 1; i >= 0; i--) heap_sift_down(heap, n, i, val);
}

/* remove and return the top of the heap; *n shrinks by one */
static int32_t heap_pop(int32_t *heap, int *n, const double *val) {
    int32_t top = heap[0];
    *n -= 1;
    heap[0] = heap[*n];
    heap[*n] = top;
    heap_sift_down(heap, *n, 0, val);
    return top;
}

/* NaN or +inf anywhere, or no finite entry left: the row is invalid */
static int row_invalid(const double *x, int n) {
    int any_finite = 0;
    for (int i = 0; i < n; i++) {
        double v = x[i];
        if (is_nan(v) || v == POS_INF) return 1;
        if (v != -POS_INF) any_finite = 1;
    }
    return !any_finite;
}

/* logits (V,) f32 + policy + context marks -> proc->work (V,) float64 probabilities */
static int process_row(const float *logits, int V, const Policy *pol, ProcState *proc) {
    double *x = proc->work;
    for (int i = 0; i < V; i++) x[i] = (double)logits[i];                     /* 1. cast */
    if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    if (pol->n_suppressed) {                                                    /* 2. suppression */
        for (int i = 0; i < V; i++) if (pol->suppressed[i]) x[i] = -POS_INF;
        if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    }
    if (pol->has_allowed) {                                                     /* 3. allowed mask */
        for (int i = 0; i < V; i++) if (!pol->allowed[i]) x[i] = -POS_INF;
        if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    }
    if (pol->repetition_penalty != 1.0) {                                       /* 4. penalty */
        double pen = pol->repetition_penalty;
        for (int i = 0; i < V; i++)
            if (proc->in_context[i]) x[i] = x[i] > 0 ? x[i] / pen : x[i] * pen;
        if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    }
    if (pol->temperature == 0.0) {                                              /* 5. greedy */
        int best = 0;
        for (int i = 1; i < V; i++) if (x[i] > x[best]) best = i;             /* first max */
        for (int i = 0; i < V; i++) x[i] = 0.0;
        x[best] = 1.0;
        return OK;
    }
    if (pol->temperature != 1.0) {                                              /*    temperature */
        for (int i = 0; i < V; i++) x[i] = x[i] / pol->temperature;
        if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    }
    int n_finite = 0;
    for (int i = 0; i < V; i++) if (x[i] != -POS_INF) proc->heap[n_finite++] = i;
    if (pol->top_k > 0 && pol->top_k < n_finite) {                              /* 6. top-k */
        int n = n_finite;
        heap_build(proc->heap, n, x);
        for (int j = 0; j < pol->top_k; j++) heap_pop(proc->heap, &n, x);
        for (int j = 0; j < n; j++) x[proc->heap[j]] = -POS_INF;               /* the rest */
    }
    double peak = -POS_INF;                                                    /* 7. softmax */
    for (int i = 0; i < V; i++) if (x[i] > peak) peak = x[i];
    double total = 0.0;
    for (int i = 0; i < V; i++) {
        x[i] = x[i] == -POS_INF ? 0.0 : exp_f64(x[i] - peak);
        total += x[i];
    }
    for (int i = 0; i < V; i++) x[i] = x[i] / total;
    if (pol->top_p < 1.0) {                                                     /* 8. top-p */
        int n = 0;
        for (int i = 0; i < V; i++) if (x[i] > 0.0) proc->heap[n++] = i;
        heap_build(proc->heap, n, x);
        double cumulative = 0.0;
        while (n > 0) {                       /* prob desc, id asc; shortest prefix >= top_p */
            int32_t id = heap_pop(proc->heap, &n, x);
            cumulative += x[id];
            if (cumulative >= pol->top_p) break;
        }
        for (int j = 0; j < n; j++) x[proc->heap[j]] = 0.0;                    /* not kept */
        double kept = 0.0;
        for (int i = 0; i < V; i++) kept += x[i];
        for (int i = 0; i < V; i++) x[i] = x[i] / kept;
    }
    return OK;
}

/* the policy's numbers; ERR_BAD_ARGUMENT if one is out of range */
static int policy_set(Policy *pol, double temperature, int top_k, double top_p, double repetition_penalty) {
    if (!(temperature >= 0 && temperature < POS_INF) || top_k < 0 || !(top_p > 0 && top_p <= 1) ||
        !(repetition_penalty > 0 && repetition_penalty < POS_INF))
        return ERR_BAD_ARGUMENT;
    pol->temperature = temperature;
    pol->top_k = top_k;
    pol->top_p = top_p;
    pol->repetition_penalty = repetition_penalty;
    return OK;
}

/* suppressed ids and the grammar mask (n_allowed < 0: none; else only allowed[0..n_allowed)) */
static int policy_set_masks(Policy *pol, int V, const int32_t *suppress, int n_suppress, const int32_t *allowed,
                            int n_allowed) {
    zero_bytes(pol->suppressed, (uint32_t)V);
    zero_bytes(pol->allowed, (uint32_t)V);
    pol->n_suppressed = 0;
    pol->has_allowed = n_allowed >= 0;
    for (int i = 0; i < n_suppress; i++) {
        if (suppress[i] < 0 || suppress[i] >= V) return ERR_BAD_ARGUMENT;
        pol->suppressed[suppress[i]] = 1;
        pol->n_suppressed++;
    }
    for (int i = 0; i < n_allowed; i++) {
        if (allowed[i] < 0 || allowed[i] >= V) return ERR_BAD_ARGUMENT;
        pol->allowed[allowed[i]] = 1;
    }
    return OK;
}

#endif
