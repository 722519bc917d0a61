/* draft.c — the exactspec draft model in WASM-SIMD: Llama forward pass (f32 weights, f32x4
 * mat-vec), the processors-v1 pipeline (float64) and the addressed Gumbel-max sampler of
 * docs/rng.md, so a proposal drawn here equals the NumPy reference's for the same address.
 *
 * Build: wasm/build.sh (clang 14, --target=wasm32 -msimd128 -ffreestanding -nostdlib
 * -ffp-contract=off). No libc, no libm: exp, sin/cos, frexp and the portable log are written
 * below from IEEE basic operations. JS (web/draft/draft.mjs) parses the safetensors header,
 * copies the file into this module's memory and tells the C side where each tensor lies.
 *
 * One model per instance. Calls from JS, in order:
 *   draft_alloc(bytes) -> ptr            bump allocation (the weights file, argument buffers)
 *   draft_build_config(...)              hyper-parameters; allocates the run state + KV cache
 *   draft_set_tensor(kind, layer, ptr)   one call per tensor (f32, HF (out, in) layout)
 *   draft_check()                        0 when every tensor is present
 *   draft_forward / draft_set_policy / draft_set_context / draft_process / draft_propose
 * Errors are returned as small integer codes (ERR_* below); JS maps them to E_* codes.
 */
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

EXPORT("draft_alloc") void *draft_alloc(uint32_t nbytes) { return arena_alloc(nbytes); }

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

static inline double gumbel(uint32_t bits) { return -plog(-plog(uniform_open_open(bits))); }

enum { DOMAIN_DRAFT_SAMPLE = 1 };

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
static int sample_gumbel_max_plain(const double *weights, int n, RoundKey rk, uint32_t position) {
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
 * Model: config, weights (pointers into the copied safetensors file), run state, KV cache.
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

typedef struct {
    const float *attn_norm;      /* (D,) input_layernorm */
    const float *wq;             /* (H*hd, D) */
    const float *wk;             /* (KV*hd, D) */
    const float *wv;             /* (KV*hd, D) */
    const float *wo;             /* (D, H*hd) */
    const float *mlp_norm;       /* (D,) post_attention_layernorm */
    const float *w_gate;         /* (F, D) */
    const float *w_up;           /* (F, D) */
    const float *w_down;         /* (D, F) */
} LayerWeights;

typedef struct {
    const float *embed;          /* (V, D) embed_tokens */
    const float *final_norm;     /* (D,) model.norm */
    const float *lm_head;        /* (V, D); == embed when tied */
    LayerWeights *layers;        /* (L,) */
} Weights;

typedef struct {
    float *x;                    /* (D,) residual stream */
    float *xb;                   /* (D,) normed input of a sub-block */
    float *q;                    /* (H*hd,) */
    float *att_out;              /* (H*hd,) concatenated head outputs */
    float *scores;               /* (T_max,) attention scores of one head */
    float *hb_gate;              /* (F,) */
    float *hb_up;                /* (F,) */
    float *logits;               /* (V,) logits of the last fed token */
    float *key_cache;            /* (L, T_max, KV*hd) keys after RoPE */
    float *value_cache;          /* (L, T_max, KV*hd) */
    float *rope_cos;             /* (T_max, hd/2) cos(pos * inv_freq[i]) */
    float *rope_sin;             /* (T_max, hd/2) */
    int n_cached;                /* positions [0, n_cached) hold valid K/V */
} RunState;

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

static Config cfg;
static Weights weights;
static RunState st;
static Policy pol;
static ProcState proc;
static int built;

static float *alloc_floats(uint32_t n) { return (float *)arena_alloc(n * 4u); }

/* allocate everything the forward pass and processors need; zeroed */
static int build_run_state(RunState *s, const Config *c) {
    uint32_t kv_dim = (uint32_t)(c->num_kv_heads * c->head_dim);
    uint32_t q_dim = (uint32_t)(c->num_heads * c->head_dim);
    uint32_t cache_n = (uint32_t)c->num_layers * (uint32_t)c->max_context * kv_dim;
    uint32_t rope_n = (uint32_t)c->max_context * (uint32_t)(c->head_dim / 2);
    s->x = alloc_floats(c->hidden_size);
    s->xb = alloc_floats(c->hidden_size);
    s->q = alloc_floats(q_dim);
    s->att_out = alloc_floats(q_dim);
    s->scores = alloc_floats(c->max_context);
    s->hb_gate = alloc_floats(c->intermediate_size);
    s->hb_up = alloc_floats(c->intermediate_size);
    s->logits = alloc_floats(c->vocab_size);
    s->key_cache = alloc_floats(cache_n);
    s->value_cache = alloc_floats(cache_n);
    s->rope_cos = alloc_floats(rope_n);
    s->rope_sin = alloc_floats(rope_n);
    s->n_cached = 0;
    if (!s->x || !s->xb || !s->q || !s->att_out || !s->scores || !s->hb_gate || !s->hb_up ||
        !s->logits || !s->key_cache || !s->value_cache || !s->rope_cos || !s->rope_sin)
        return ERR_NO_MEMORY;
    /* HF default RoPE: inv_freq[i] = theta^(-2i/hd); angle = pos * inv_freq[i] in float64 */
    int half = c->head_dim / 2;
    double log_theta = plog(c->rope_theta);
    for (int i = 0; i < half; i++) {
        double inv_freq = exp_f64(-((double)(2 * i) / (double)c->head_dim) * log_theta);
        for (int pos = 0; pos < c->max_context; pos++) {
            double sn, cs;
            sincos_f64((double)pos * inv_freq, &sn, &cs);
            s->rope_cos[pos * half + i] = (float)cs;
            s->rope_sin[pos * half + i] = (float)sn;
        }
    }
    return OK;
}

/* the arena cannot return memory; freeing forgets the pointers (one model per instance) */
static void free_run_state(RunState *s) { zero_bytes(s, sizeof(*s)); }

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

static void free_proc_state(ProcState *p) { zero_bytes(p, sizeof(*p)); }

/* ============================================================================================
 * Forward pass: one token at a time; f32x4 mat-vec over 4 output rows at once.
 * ========================================================================================== */

/* out[r] = sum_i w[r, i] * x[i]; w (rows, n) row-major, n % 4 == 0 */
static void matvec(float *out, const float *w, const float *x, int rows, int n) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *w0 = w + (uint32_t)r * (uint32_t)n;
        const float *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
        v128_t a0 = wasm_f32x4_splat(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < n; i += 4) {
            v128_t xv = wasm_v128_load(x + i);
            a0 = wasm_f32x4_add(a0, wasm_f32x4_mul(wasm_v128_load(w0 + i), xv));
            a1 = wasm_f32x4_add(a1, wasm_f32x4_mul(wasm_v128_load(w1 + i), xv));
            a2 = wasm_f32x4_add(a2, wasm_f32x4_mul(wasm_v128_load(w2 + i), xv));
            a3 = wasm_f32x4_add(a3, wasm_f32x4_mul(wasm_v128_load(w3 + i), xv));
        }
        /* transpose-add: lane j of the result = horizontal sum of a_j */
        v128_t t0 = wasm_i32x4_shuffle(a0, a1, 0, 4, 1, 5);   /* a0.0 a1.0 a0.1 a1.1 */
        v128_t t1 = wasm_i32x4_shuffle(a0, a1, 2, 6, 3, 7);   /* a0.2 a1.2 a0.3 a1.3 */
        v128_t t2 = wasm_i32x4_shuffle(a2, a3, 0, 4, 1, 5);
        v128_t t3 = wasm_i32x4_shuffle(a2, a3, 2, 6, 3, 7);
        v128_t s01 = wasm_f32x4_add(t0, t1);                   /* (a0.0+a0.2) (a1.0+a1.2) (a0.1+a0.3) (a1.1+a1.3) */
        v128_t s23 = wasm_f32x4_add(t2, t3);
        v128_t lo = wasm_i32x4_shuffle(s01, s23, 0, 1, 4, 5);
        v128_t hi = wasm_i32x4_shuffle(s01, s23, 2, 3, 6, 7);
        wasm_v128_store(out + r, wasm_f32x4_add(lo, hi));
    }
    for (; r < rows; r++) {                                   /* leftover rows (V % 4 != 0) */
        const float *wr = w + (uint32_t)r * (uint32_t)n;
        v128_t a = wasm_f32x4_splat(0.0f);
        for (int i = 0; i < n; i += 4)
            a = wasm_f32x4_add(a, wasm_f32x4_mul(wasm_v128_load(wr + i), wasm_v128_load(x + i)));
        out[r] = (wasm_f32x4_extract_lane(a, 0) + wasm_f32x4_extract_lane(a, 2)) +
                 (wasm_f32x4_extract_lane(a, 1) + wasm_f32x4_extract_lane(a, 3));
    }
}

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

/* one token at position pos: updates the KV cache; logits only if want_logits */
static void forward_token(int token, int pos, int want_logits) {
    const Config *c = &cfg;
    int D = c->hidden_size, hd = c->head_dim, half = hd / 2;
    int kv_dim = c->num_kv_heads * hd, q_dim = c->num_heads * hd;
    int group = c->num_heads / c->num_kv_heads;
    float scale = (float)(1.0 / __builtin_sqrt((double)hd));
    const float *cs = st.rope_cos + pos * half, *sn = st.rope_sin + pos * half;
    const float *emb = weights.embed + (uint32_t)token * (uint32_t)D;
    for (int i = 0; i < D; i++) st.x[i] = emb[i];

    for (int l = 0; l < c->num_layers; l++) {
        const LayerWeights *w = &weights.layers[l];
        float *k_layer = st.key_cache + (uint32_t)l * (uint32_t)c->max_context * (uint32_t)kv_dim;
        float *v_layer = st.value_cache + (uint32_t)l * (uint32_t)c->max_context * (uint32_t)kv_dim;
        float *k_pos = k_layer + pos * kv_dim, *v_pos = v_layer + pos * kv_dim;

        rmsnorm(st.xb, st.x, w->attn_norm, D, c->rms_norm_eps);
        matvec(st.q, w->wq, st.xb, q_dim, D);
        matvec(k_pos, w->wk, st.xb, kv_dim, D);               /* K/V written in place */
        matvec(v_pos, w->wv, st.xb, kv_dim, D);
        for (int h = 0; h < c->num_heads; h++) rope(st.q + h * hd, cs, sn, half);
        for (int h = 0; h < c->num_kv_heads; h++) rope(k_pos + h * hd, cs, sn, half);

        for (int h = 0; h < c->num_heads; h++) {              /* causal attention over [0, pos] */
            const float *qh = st.q + h * hd;
            int g = h / group;                                /* HF repeat_kv: kv head h // group */
            float peak = -3.0e38f;
            for (int t = 0; t <= pos; t++) {
                const float *kt = k_layer + t * kv_dim + g * hd;
                v128_t a = wasm_f32x4_splat(0.0f);
                for (int i = 0; i < hd; i += 4)
                    a = wasm_f32x4_add(a, wasm_f32x4_mul(wasm_v128_load(qh + i), wasm_v128_load(kt + i)));
                float dot = (wasm_f32x4_extract_lane(a, 0) + wasm_f32x4_extract_lane(a, 2)) +
                            (wasm_f32x4_extract_lane(a, 1) + wasm_f32x4_extract_lane(a, 3));
                st.scores[t] = dot * scale;
                if (st.scores[t] > peak) peak = st.scores[t];
            }
            double total = 0.0;
            for (int t = 0; t <= pos; t++) {
                float e = (float)exp_f64((double)(st.scores[t] - peak));
                st.scores[t] = e;
                total += e;
            }
            float inv_total = (float)(1.0 / total);
            float *out = st.att_out + h * hd;
            for (int i = 0; i < hd; i += 4) wasm_v128_store(out + i, wasm_f32x4_splat(0.0f));
            for (int t = 0; t <= pos; t++) {
                const float *vt = v_layer + t * kv_dim + g * hd;
                v128_t p = wasm_f32x4_splat(st.scores[t] * inv_total);
                for (int i = 0; i < hd; i += 4)
                    wasm_v128_store(out + i, wasm_f32x4_add(wasm_v128_load(out + i),
                                                            wasm_f32x4_mul(p, wasm_v128_load(vt + i))));
            }
        }
        matvec(st.xb, w->wo, st.att_out, D, q_dim);
        for (int i = 0; i < D; i++) st.x[i] += st.xb[i];

        rmsnorm(st.xb, st.x, w->mlp_norm, D, c->rms_norm_eps);
        matvec(st.hb_gate, w->w_gate, st.xb, c->intermediate_size, D);
        matvec(st.hb_up, w->w_up, st.xb, c->intermediate_size, D);
        for (int i = 0; i < c->intermediate_size; i++) st.hb_gate[i] = silu(st.hb_gate[i]) * st.hb_up[i];
        matvec(st.xb, w->w_down, st.hb_gate, D, c->intermediate_size);
        for (int i = 0; i < D; i++) st.x[i] += st.xb[i];
    }
    if (want_logits) {
        rmsnorm(st.xb, st.x, weights.final_norm, D, c->rms_norm_eps);
        matvec(st.logits, weights.lm_head, st.xb, c->vocab_size, D);
    }
}

/* feed tokens at [start_pos, start_pos + n); logits of the last one land in st.logits */
static int forward(const int32_t *tokens, int n, int start_pos) {
    if (!built) return ERR_MODEL;
    if (n <= 0 || start_pos < 0 || start_pos > st.n_cached) return ERR_BAD_ARGUMENT;
    if (start_pos + n > cfg.max_context) return ERR_CONTEXT_OVERFLOW;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= cfg.vocab_size) return ERR_BAD_ARGUMENT;
    for (int i = 0; i < n; i++) forward_token(tokens[i], start_pos + i, i == n - 1);
    st.n_cached = start_pos + n;      /* logical rollback: anything beyond is forgotten */
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

/* logits (V,) f32 + policy + context marks -> proc.work (V,) float64 probabilities */
static int process_row(const float *logits) {
    int V = cfg.vocab_size;
    double *x = proc.work;
    for (int i = 0; i < V; i++) x[i] = (double)logits[i];                     /* 1. cast */
    if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    if (pol.n_suppressed) {                                                    /* 2. suppression */
        for (int i = 0; i < V; i++) if (pol.suppressed[i]) x[i] = -POS_INF;
        if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    }
    if (pol.has_allowed) {                                                     /* 3. allowed mask */
        for (int i = 0; i < V; i++) if (!pol.allowed[i]) x[i] = -POS_INF;
        if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    }
    if (pol.repetition_penalty != 1.0) {                                       /* 4. penalty */
        double pen = pol.repetition_penalty;
        for (int i = 0; i < V; i++)
            if (proc.in_context[i]) x[i] = x[i] > 0 ? x[i] / pen : x[i] * pen;
        if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    }
    if (pol.temperature == 0.0) {                                              /* 5. greedy */
        int best = 0;
        for (int i = 1; i < V; i++) if (x[i] > x[best]) best = i;             /* first max */
        for (int i = 0; i < V; i++) x[i] = 0.0;
        x[best] = 1.0;
        return OK;
    }
    if (pol.temperature != 1.0) {                                              /*    temperature */
        for (int i = 0; i < V; i++) x[i] = x[i] / pol.temperature;
        if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    }
    int n_finite = 0;
    for (int i = 0; i < V; i++) if (x[i] != -POS_INF) proc.heap[n_finite++] = i;
    if (pol.top_k > 0 && pol.top_k < n_finite) {                              /* 6. top-k */
        int n = n_finite;
        heap_build(proc.heap, n, x);
        for (int j = 0; j < pol.top_k; j++) heap_pop(proc.heap, &n, x);
        for (int j = 0; j < n; j++) x[proc.heap[j]] = -POS_INF;               /* the rest */
    }
    double peak = -POS_INF;                                                    /* 7. softmax */
    for (int i = 0; i < V; i++) if (x[i] > peak) peak = x[i];
    double total = 0.0;
    for (int i = 0; i < V; i++) {
        x[i] = x[i] == -POS_INF ? 0.0 : exp_f64(x[i] - peak);
        total += x[i];
    }
    for (int i = 0; i < V; i++) x[i] = x[i] / total;
    if (pol.top_p < 1.0) {                                                     /* 8. top-p */
        int n = 0;
        for (int i = 0; i < V; i++) if (x[i] > 0.0) proc.heap[n++] = i;
        heap_build(proc.heap, n, x);
        double cumulative = 0.0;
        while (n > 0) {                       /* prob desc, id asc; shortest prefix >= top_p */
            int32_t id = heap_pop(proc.heap, &n, x);
            cumulative += x[id];
            if (cumulative >= pol.top_p) break;
        }
        for (int j = 0; j < n; j++) x[proc.heap[j]] = 0.0;                    /* not kept */
        double kept = 0.0;
        for (int i = 0; i < V; i++) kept += x[i];
        for (int i = 0; i < V; i++) x[i] = x[i] / kept;
    }
    return OK;
}

/* ============================================================================================
 * Propose: feed the unmaterialised tokens, then up to k proposals (stop after a stop token),
 * each from its processed row; exactly exactspec.backends.RunnerDraft.propose.
 * ========================================================================================== */

static int n_proposed;

static int propose(const int32_t *feed, int n_feed, int start_pos, int k, uint32_t seed_lo,
                   uint32_t seed_hi, uint32_t round_id, int32_t *out_tokens, float *out_rows) {
    int V = cfg.vocab_size;
    n_proposed = 0;
    if (k < 0) return ERR_BAD_ARGUMENT;
    int status = forward(feed, n_feed, start_pos);
    if (status != OK) return status;
    RoundKey rk = round_key(seed_lo, seed_hi, DOMAIN_DRAFT_SAMPLE, round_id);
    int pos = start_pos + n_feed;
    for (int i = 0; i < k; i++) {
        status = process_row(st.logits);
        if (status != OK) return status;
        int y;
        if (pol.temperature == 0.0) {
            y = 0;
            for (int j = 1; j < V; j++) if (proc.work[j] > proc.work[y]) y = j;
        } else {
            y = sample_gumbel_max(proc.work, V, rk, (uint32_t)i, proc.heap);
            if (y < 0) return ERR_PROCESSOR_INVALID;
        }
        float *row = out_rows + (uint32_t)i * (uint32_t)V;
        for (int j = 0; j < V; j++) row[j] = (float)proc.work[j];
        out_tokens[i] = y;
        n_proposed = i + 1;
        proc.in_context[y] = 1;                  /* row i + 1 sees proposals[:i + 1] */
        if (proc.is_stop[y] || i == k - 1) break;
        int32_t next = y;
        status = forward(&next, 1, pos);
        if (status != OK) return status;
        pos++;
    }
    return OK;
}

/* ============================================================================================
 * Exports (the JS side is web/draft/draft.mjs)
 * ========================================================================================== */

enum {
    T_EMBED = 0, T_FINAL_NORM = 1, T_LM_HEAD = 2,
    T_ATTN_NORM = 10, T_WQ = 11, T_WK = 12, T_WV = 13, T_WO = 14,
    T_MLP_NORM = 15, T_W_GATE = 16, T_W_UP = 17, T_W_DOWN = 18,
};

EXPORT("draft_build_config")
int draft_build_config(int vocab_size, int hidden_size, int intermediate_size, int num_layers,
                       int num_heads, int num_kv_heads, int head_dim, int max_context,
                       double rms_norm_eps, double rope_theta) {
    if (built) return ERR_MODEL;
    if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_layers <= 0 ||
        num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || max_context <= 0 ||
        num_heads % num_kv_heads || head_dim % 4 || hidden_size % 4 || intermediate_size % 4 ||
        !(rope_theta > 0) || !(rms_norm_eps >= 0))
        return ERR_MODEL;
    cfg.vocab_size = vocab_size;
    cfg.hidden_size = hidden_size;
    cfg.intermediate_size = intermediate_size;
    cfg.num_layers = num_layers;
    cfg.num_heads = num_heads;
    cfg.num_kv_heads = num_kv_heads;
    cfg.head_dim = head_dim;
    cfg.max_context = max_context;
    cfg.rms_norm_eps = rms_norm_eps;
    cfg.rope_theta = rope_theta;
    weights.layers = (LayerWeights *)arena_alloc((uint32_t)num_layers * sizeof(LayerWeights));
    if (!weights.layers) return ERR_NO_MEMORY;
    zero_bytes(weights.layers, (uint32_t)num_layers * sizeof(LayerWeights));
    int status = build_run_state(&st, &cfg);
    if (status == OK) status = build_proc_state(&proc, &pol, vocab_size);
    return status;
}

EXPORT("draft_set_tensor") int draft_set_tensor(int kind, int layer, const float *ptr) {
    if (kind >= T_ATTN_NORM && (layer < 0 || layer >= cfg.num_layers)) return ERR_MODEL;
    LayerWeights *w = kind >= T_ATTN_NORM ? &weights.layers[layer] : 0;
    switch (kind) {
        case T_EMBED: weights.embed = ptr; break;
        case T_FINAL_NORM: weights.final_norm = ptr; break;
        case T_LM_HEAD: weights.lm_head = ptr; break;
        case T_ATTN_NORM: w->attn_norm = ptr; break;
        case T_WQ: w->wq = ptr; break;
        case T_WK: w->wk = ptr; break;
        case T_WV: w->wv = ptr; break;
        case T_WO: w->wo = ptr; break;
        case T_MLP_NORM: w->mlp_norm = ptr; break;
        case T_W_GATE: w->w_gate = ptr; break;
        case T_W_UP: w->w_up = ptr; break;
        case T_W_DOWN: w->w_down = ptr; break;
        default: return ERR_MODEL;
    }
    return OK;
}

/* every tensor present? (the LM head defaults to the embedding: tied) */
EXPORT("draft_check") int draft_check(void) {
    if (!weights.embed || !weights.final_norm || !weights.layers) return ERR_MODEL;
    if (!weights.lm_head) weights.lm_head = weights.embed;
    for (int l = 0; l < cfg.num_layers; l++) {
        const LayerWeights *w = &weights.layers[l];
        if (!w->attn_norm || !w->wq || !w->wk || !w->wv || !w->wo || !w->mlp_norm ||
            !w->w_gate || !w->w_up || !w->w_down)
            return ERR_MODEL;
    }
    built = 1;
    return OK;
}

EXPORT("draft_free") void draft_free(void) {
    free_run_state(&st);
    free_proc_state(&proc);
    built = 0;
}

EXPORT("draft_forward") int draft_forward(const int32_t *tokens, int n, int start_pos) {
    return forward(tokens, n, start_pos);
}

EXPORT("draft_logits") float *draft_logits(void) { return st.logits; }
EXPORT("draft_n_cached") int draft_n_cached(void) { return st.n_cached; }

EXPORT("draft_set_policy")
int draft_set_policy(double temperature, int top_k, double top_p, double repetition_penalty) {
    if (!(temperature >= 0 && temperature < POS_INF) || top_k < 0 || !(top_p > 0 && top_p <= 1) ||
        !(repetition_penalty > 0 && repetition_penalty < POS_INF))
        return ERR_BAD_ARGUMENT;
    pol.temperature = temperature;
    pol.top_k = top_k;
    pol.top_p = top_p;
    pol.repetition_penalty = repetition_penalty;
    return OK;
}

/* n < 0: no grammar mask; otherwise only ids[0..n) are allowed */
EXPORT("draft_set_masks")
int draft_set_masks(const int32_t *suppress, int n_suppress, const int32_t *allowed, int n_allowed) {
    int V = cfg.vocab_size;
    zero_bytes(pol.suppressed, (uint32_t)V);
    zero_bytes(pol.allowed, (uint32_t)V);
    pol.n_suppressed = 0;
    pol.has_allowed = n_allowed >= 0;
    for (int i = 0; i < n_suppress; i++) {
        if (suppress[i] < 0 || suppress[i] >= V) return ERR_BAD_ARGUMENT;
        pol.suppressed[suppress[i]] = 1;
        pol.n_suppressed++;
    }
    for (int i = 0; i < n_allowed; i++) {
        if (allowed[i] < 0 || allowed[i] >= V) return ERR_BAD_ARGUMENT;
        pol.allowed[allowed[i]] = 1;
    }
    return OK;
}

EXPORT("draft_set_context") int draft_set_context(const int32_t *ids, int n) {
    zero_bytes(proc.in_context, (uint32_t)cfg.vocab_size);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= cfg.vocab_size) return ERR_BAD_ARGUMENT;
        proc.in_context[ids[i]] = 1;
    }
    return OK;
}

EXPORT("draft_set_stops") int draft_set_stops(const int32_t *ids, int n) {
    zero_bytes(proc.is_stop, (uint32_t)cfg.vocab_size);
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < cfg.vocab_size) proc.is_stop[ids[i]] = 1;
    return OK;
}

/* processed row of arbitrary logits (tests): f32 copy in out (V,), float64 row stays in work */
EXPORT("draft_process") int draft_process(const float *logits, float *out) {
    int status = process_row(logits);
    if (status == OK)
        for (int i = 0; i < cfg.vocab_size; i++) out[i] = (float)proc.work[i];
    return status;
}

EXPORT("draft_work") double *draft_work(void) { return proc.work; }

/* Gumbel-max draw over n float64 weights at (seed, domain, round, position); -1 if invalid */
EXPORT("draft_sample")
int draft_sample(const double *w, int n, uint32_t seed_lo, uint32_t seed_hi, uint32_t domain,
                 uint32_t round_id, uint32_t position, int32_t *scratch /* (2n + 4,) or 0: plain */) {
    RoundKey rk = round_key(seed_lo, seed_hi, domain, round_id);
    return scratch ? sample_gumbel_max(w, n, rk, position, scratch) : sample_gumbel_max_plain(w, n, rk, position);
}

EXPORT("draft_propose")
int draft_propose(const int32_t *feed, int n_feed, int start_pos, int k, uint32_t seed_lo,
                  uint32_t seed_hi, uint32_t round_id, int32_t *out_tokens, float *out_rows) {
    return propose(feed, n_feed, start_pos, k, seed_lo, seed_hi, round_id, out_tokens, out_rows);
}

EXPORT("draft_n_proposed") int draft_n_proposed(void) { return n_proposed; }

/* test hooks: the RNG contract and the math kernels, one value at a time */
EXPORT("draft_plog") double draft_plog(double x) { return plog(x); }
EXPORT("draft_exp") double draft_exp(double x) { return exp_f64(x); }
EXPORT("draft_sin") double draft_sin(double x) { double s, c; sincos_f64(x, &s, &c); return s; }
EXPORT("draft_cos") double draft_cos(double x) { double s, c; sincos_f64(x, &s, &c); return c; }
EXPORT("draft_draw_bits")
uint32_t draft_draw_bits(uint32_t seed_lo, uint32_t seed_hi, uint32_t domain, uint32_t round_id,
                         uint32_t position, uint32_t token) {
    return draw_bits(round_key(seed_lo, seed_hi, domain, round_id), position, token);
}
