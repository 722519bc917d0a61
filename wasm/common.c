/* common.c — the one copy of the code both halves of the CPU module share (declared in common.h):
 * the arena, the portable maths, the RNG and sampler, processors-v1, the Llama building blocks. */
#include "common.h"

uintptr_t arena_top;                     /* next free byte (16-aligned): the one arena of the module */
void *arena_alloc(uint32_t nbytes) {
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

void zero_bytes(void *dst, uint32_t n) {
    unsigned char *d = (unsigned char *)dst;
    for (uint32_t i = 0; i < n; i++) d[i] = 0;
}

/* clang lowers the zero-initialisation of a large struct (a matmul step) to a memset call; no libc
 * here, so this is it (-ffreestanding: the loop is not turned back into a memset call) */
void *memset(void *dst, int c, unsigned long n) {
    unsigned char *d = (unsigned char *)dst;
    for (unsigned long i = 0; i < n; i++) d[i] = (unsigned char)c;
    return dst;
}

double frexp_pos(double x, int *e) {
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

static const double PLOG_C[12] = {
    1.0 / 3, 1.0 / 5, 1.0 / 7, 1.0 / 9, 1.0 / 11, 1.0 / 13,
    1.0 / 15, 1.0 / 17, 1.0 / 19, 1.0 / 21, 1.0 / 23, 1.0 / 25,
};

double plog(double x) {
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

double exp_f64(double x) {
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

void sincos_f64(double x, double *s_out, double *c_out) {
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

void threefry2x32(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1,
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

RoundKey round_key(uint32_t seed_lo, uint32_t seed_hi, uint32_t domain, uint32_t round_id) {
    RoundKey rk;
    threefry2x32(seed_lo, seed_hi, domain, round_id, &rk.k0, &rk.k1);
    return rk;
}

v128_t draw_bits_x4(RoundKey rk, uint32_t position, v128_t tokens) {
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

int sample_gumbel_max(const double *weights, int n, RoundKey rk, uint32_t position,
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

int sample_gumbel_max_plain(const double *weights, int n, RoundKey rk, uint32_t position) {
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

int config_set(Config *cfg, int vocab_size, int hidden_size, int intermediate_size, int num_layers,
                      int num_heads, int num_kv_heads, int head_dim, int max_context, double rms_norm_eps,
                      double rope_theta) {
    if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_layers <= 0 ||
        num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || max_context <= 0 ||
        num_heads % num_kv_heads || head_dim % 4 || hidden_size % 4 || intermediate_size % 4 ||
        !(rope_theta > 0) || !(rms_norm_eps >= 0))
        return ERR_MODEL_LOAD;
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

int build_proc_state(ProcState *p, Policy *po, int vocab_size) {
    uint32_t v = (uint32_t)vocab_size;
    p->in_context = (uint8_t *)arena_alloc(v);
    p->work = (double *)arena_alloc(v * 8u);
    p->heap = (int32_t *)arena_alloc(v * 8u + 16u);     /* the sampler stores 4 lanes at a time */
    p->is_stop = (uint8_t *)arena_alloc(v);
    po->suppressed = (uint8_t *)arena_alloc(v);
    po->allowed = (uint8_t *)arena_alloc(v);
    if (!p->in_context || !p->work || !p->heap || !p->is_stop || !po->suppressed || !po->allowed)
        return ERR_OUT_OF_MEMORY;
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

void free_proc_state(ProcState *p) { zero_bytes(p, sizeof(*p)); }

void rmsnorm(float *out, const float *x, const float *weight, int n, double eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float inv = (float)(1.0 / __builtin_sqrt(ss / (double)n + eps));
    for (int i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inv);
}

void rope(float *v, const float *cs, const float *sn, int half) {
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}

void attend_head(float *out, const float *qh, const float *k_layer, const float *v_layer, int kv_dim,
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

void rope_column(float *rope_cos, float *rope_sin, int max_context, int half, int i, double inv_freq) {
    for (int pos = 0; pos < max_context; pos++) {
        double sn, cs;
        sincos_f64((double)pos * inv_freq, &sn, &cs);
        rope_cos[pos * half + i] = (float)cs;
        rope_sin[pos * half + i] = (float)sn;
    }
}

void build_rope_tables(float *rope_cos, float *rope_sin, int max_context, int head_dim,
                              double rope_theta) {
    int half = head_dim / 2;
    double log_theta = plog(rope_theta);
    for (int i = 0; i < half; i++)
        rope_column(rope_cos, rope_sin, max_context, half, i,
                    exp_f64(-((double)(2 * i) / (double)head_dim) * log_theta));
}

int rope_tables_from_inv_freq(float *rope_cos, float *rope_sin, int max_context, int head_dim,
                                     const double *inv_freq) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++)
        if (!(inv_freq[i] > 0)) return ERR_MODEL_LOAD;
    for (int i = 0; i < half; i++) rope_column(rope_cos, rope_sin, max_context, half, i, inv_freq[i]);
    return OK;
}

void heap_sift_down(int32_t *heap, int n, int i, const double *val) {
    for (;;) {
        int best = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(val, heap[l], heap[best])) best = l;
        if (r < n && ranks_before(val, heap[r], heap[best])) best = r;
        if (best == i) return;
        int32_t t = heap[i]; heap[i] = heap[best]; heap[best] = t;
        i = best;
    }
}

void heap_build(int32_t *heap, int n, const double *val) {
    for (int i = n / 2 - 1; i >= 0; i--) heap_sift_down(heap, n, i, val);
}

int32_t heap_pop(int32_t *heap, int *n, const double *val) {
    int32_t top = heap[0];
    *n -= 1;
    heap[0] = heap[*n];
    heap[*n] = top;
    heap_sift_down(heap, *n, 0, val);
    return top;
}

int row_invalid(const double *x, int n) {
    int any_finite = 0;
    for (int i = 0; i < n; i++) {
        double v = x[i];
        if (is_nan(v) || v == POS_INF) return 1;
        if (v != -POS_INF) any_finite = 1;
    }
    return !any_finite;
}

int process_row(const float *logits, int V, const Policy *pol, ProcState *proc) {
    return process_row_masked(logits, V, pol, 0, proc);
}

int process_row_masked(const float *logits, int V, const Policy *pol, const uint32_t *mask_bits, ProcState *proc) {
    double *x = proc->work;
    for (int i = 0; i < V; i++) x[i] = (double)logits[i];                     /* 1. cast */
    if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    if (pol->n_suppressed) {                                                    /* 2. suppression */
        for (int i = 0; i < V; i++) if (pol->suppressed[i]) x[i] = -POS_INF;
        if (row_invalid(x, V)) return ERR_PROCESSOR_INVALID;
    }
    if (pol->has_allowed || mask_bits) {                                        /* 3. grammar mask */
        if (pol->has_allowed)
            for (int i = 0; i < V; i++) if (!pol->allowed[i]) x[i] = -POS_INF;
        if (mask_bits)                                                          /*    this row's bits */
            for (int i = 0; i < V; i++) if (!((mask_bits[i >> 5] >> (i & 31)) & 1u)) x[i] = -POS_INF;
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

int policy_set(Policy *pol, double temperature, int top_k, double top_p, double repetition_penalty) {
    if (!(temperature >= 0 && temperature < POS_INF) || top_k < 0 || !(top_p > 0 && top_p <= 1) ||
        !(repetition_penalty > 0 && repetition_penalty < POS_INF))
        return ERR_BAD_ARGUMENT;
    pol->temperature = temperature;
    pol->top_k = top_k;
    pol->top_p = top_p;
    pol->repetition_penalty = repetition_penalty;
    return OK;
}

int policy_set_masks(Policy *pol, int V, const int32_t *suppress, int n_suppress, const int32_t *allowed,
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
