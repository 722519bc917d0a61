/* qmatmul.c — the q8act-v1 matmul of docs/quant_kernels.md in WASM SIMD128: decode a block of 32
 * weights of 4 rows into int16 lanes once, then for every activation row of the block (the k + 1
 * positions of a round) an exact int32 dot product per row (i32x4.dot_i16x8_s), then the declared
 * float32 sequence acc = acc + (dw * dx) * isum (+ (mw * dx) * xsum), in block order.
 */
#include "qmatmul.h"
#include "qact_table.h"   /* QACT_SCALE, QACT_STEP (tools/gen_qact_table.py) */

int qf_known(int fmt) {
    return fmt == QF_F32 || fmt == QF_I8F || fmt == QF_ROWQ8 || fmt == QF_Q8_0 || fmt == QF_Q4_0 ||
           fmt == QF_Q4_1 || fmt == QF_Q4_K || fmt == QF_Q6_K;
}

int qf_is_q8act(int fmt) { return qf_known(fmt) && fmt != QF_F32 && fmt != QF_I8F; }

static int qf_block(int fmt) {
    if (fmt == QF_Q4_K || fmt == QF_Q6_K) return 256;
    if (fmt == QF_F32 || fmt == QF_I8F) return 4;
    return 32;
}

int qf_cols_ok(int fmt, int cols) { return qf_known(fmt) && cols > 0 && cols % qf_block(fmt) == 0; }

uint32_t qf_row_bytes(int fmt, int cols) {
    uint32_t c = (uint32_t)cols;
    switch (fmt) {
        case QF_F32: return 4u * c;
        case QF_I8F: case QF_ROWQ8: return c;
        case QF_Q8_0: return c / 32u * 34u;
        case QF_Q4_0: return c / 32u * 18u;
        case QF_Q4_1: return c / 32u * 20u;
        case QF_Q4_K: return c / 256u * 144u;
        case QF_Q6_K: return c / 256u * 210u;
        default: return 0;
    }
}

static inline uint16_t load_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline float bits_f32(uint32_t u) { union { uint32_t u; float f; } v = { u }; return v.f; }
static inline uint32_t f32_bits(float f) { union { float f; uint32_t u; } v = { f }; return v.u; }

/* IEEE half -> float, exact for every finite half (subnormals included): the half's exponent and
 * mantissa placed in a float's low bits, times 2^112; inf / NaN scales are refused at load */
static inline float f16_f32(uint16_t h) {
    float mag = bits_f32((uint32_t)(h & 0x7fff) << 13) * 0x1p112f;
    return bits_f32(f32_bits(mag) | ((uint32_t)(h & 0x8000) << 16));
}

/* ============================================================================================
 * Activations: amax = 2^E (1 + f) -> s = 2^-E QACT_SCALE[f's top 6 bits], qx = nearest_even(x s),
 * dx = 2^E QACT_STEP[...]: 125..127 levels at the block's largest element, every operation exact.
 * ========================================================================================== */

void qact_quantize(QAct *a, const float *x, int x_stride, int n, int K) {
    const int nb = K / 32;
    a->n = n;
    a->K = K;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (uint32_t)t * (uint32_t)x_stride;
        int16_t *qt = a->q + (uint32_t)t * (uint32_t)K;
        for (int b = 0; b < nb; b++) {
            const float *xb = xt + 32 * b;
            v128_t m = wasm_f32x4_abs(wasm_v128_load(xb));
            for (int i = 4; i < 32; i += 4) m = wasm_f32x4_max(m, wasm_f32x4_abs(wasm_v128_load(xb + i)));
            m = wasm_f32x4_max(m, wasm_i32x4_shuffle(m, m, 2, 3, 0, 1));
            m = wasm_f32x4_max(m, wasm_i32x4_shuffle(m, m, 1, 0, 3, 2));
            float amax = wasm_f32x4_extract_lane(m, 0);        /* NaN if any lane is NaN */
            float dx, inv;
            if (!(amax < 0x1p100f)) { dx = __builtin_nanf(""); inv = 0.0f; }          /* NaN, inf or >= 2^100 */
            else if (amax < 0x1p-100f) { dx = 0.0f; inv = 0.0f; }
            else {       /* amax = 2^E (1 + f), j = f's top 6 bits: s = 2^-E SCALE[j], dx = 2^E STEP[j] (exact) */
                uint32_t bits = f32_bits(amax);
                int E = (int)(bits >> 23) - 127, j = (int)((bits >> 17) & 63u);
                inv = bits_f32((uint32_t)(127 - E) << 23) * QACT_SCALE[j];
                dx = bits_f32((uint32_t)(127 + E) << 23) * QACT_STEP[j];
            }
            v128_t vinv = wasm_f32x4_splat(inv), sum = wasm_i32x4_splat(0), q16[4];
            for (int i = 0; i < 4; i++) {
                v128_t q0 = wasm_i32x4_trunc_sat_f32x4(wasm_f32x4_nearest(wasm_f32x4_mul(wasm_v128_load(xb + 8 * i), vinv)));
                v128_t q1 = wasm_i32x4_trunc_sat_f32x4(wasm_f32x4_nearest(wasm_f32x4_mul(wasm_v128_load(xb + 8 * i + 4), vinv)));
                sum = wasm_i32x4_add(sum, wasm_i32x4_add(q0, q1));
                q16[i] = wasm_i16x8_narrow_i32x4(q0, q1);
                wasm_v128_store(qt + 32 * b + 8 * i, q16[i]);
            }
#if QMATMUL_RELAXED
            int8_t *q8 = a->q8 + (uint32_t)t * (uint32_t)K + 32u * (uint32_t)b;
            wasm_v128_store(q8, wasm_i8x16_narrow_i16x8(q16[0], q16[1]));
            wasm_v128_store(q8 + 16, wasm_i8x16_narrow_i16x8(q16[2], q16[3]));
#endif
            sum = wasm_i32x4_add(sum, wasm_i32x4_shuffle(sum, sum, 2, 3, 0, 1));
            sum = wasm_i32x4_add(sum, wasm_i32x4_shuffle(sum, sum, 1, 0, 3, 2));
            a->d[(uint32_t)t * (uint32_t)nb + (uint32_t)b] = dx;
            a->s[(uint32_t)t * (uint32_t)nb + (uint32_t)b] = wasm_i32x4_extract_lane(sum, 0);
        }
    }
}

/* ============================================================================================
 * Weight blocks: one row's 32-element block b as int16 lanes w[0..3] (elements 0-7, 8-15, 16-23,
 * 24-31) with its float scale dw and min mw (0 when the format has none).
 * ========================================================================================== */

typedef struct {
    v128_t w[4];
    v128_t b8[2];                /* relaxed build, Q4 formats: the nibbles of elements 0-15, 16-31 (u8) */
    uint16_t hd, hm;             /* the f16 bits of the block's scale d and min m (Q4_K: d, dmin) */
    int isc, im;                 /* Q4_K: the sub-block's 6-bit scale and min; else 1, 0 */
} Dec;

/* 4 IEEE halves (the low 16 bits of each lane) -> float32, exact as f16_f32 */
static inline v128_t f16x4_f32(v128_t h) {
    v128_t mag = wasm_f32x4_mul(wasm_i32x4_shl(wasm_v128_and(h, wasm_i32x4_splat(0x7fff)), 13), wasm_f32x4_splat(0x1p112f));
    return wasm_v128_or(mag, wasm_i32x4_shl(wasm_v128_and(h, wasm_i32x4_splat(0x8000)), 16));
}

static inline void widen_s8(const v128_t lo16, const v128_t hi16, Dec *o) {   /* 2 x 16 int8 */
    o->w[0] = wasm_i16x8_extend_low_i8x16(lo16);
    o->w[1] = wasm_i16x8_extend_high_i8x16(lo16);
    o->w[2] = wasm_i16x8_extend_low_i8x16(hi16);
    o->w[3] = wasm_i16x8_extend_high_i8x16(hi16);
}

/* Q4_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4) */
static inline void q4k_scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) { *sc = q[j] & 63; *m = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

static inline __attribute__((always_inline)) void decode(int fmt, const uint8_t *row, int b, Dec *o) {
    const v128_t low4 = wasm_i8x16_splat(0x0F);
    o->hd = 0x3c00;              /* 1.0 */
    o->hm = 0;
    o->isc = 1;
    o->im = 0;
    switch (fmt) {
        case QF_ROWQ8: {
            const uint8_t *p = row + 32 * b;
            widen_s8(wasm_v128_load(p), wasm_v128_load(p + 16), o);
            break;
        }
        case QF_Q8_0: {
            const uint8_t *p = row + 34 * b;
            o->hd = load_u16(p);
            widen_s8(wasm_v128_load(p + 2), wasm_v128_load(p + 18), o);
            break;
        }
        case QF_Q4_0: {
            const uint8_t *p = row + 18 * b;
            v128_t v = wasm_v128_load(p + 2), eight = wasm_i8x16_splat(8);
            o->hd = load_u16(p);
            if (QMATMUL_RELAXED) { o->b8[0] = wasm_v128_and(v, low4); o->b8[1] = wasm_u8x16_shr(v, 4); break; }
            widen_s8(wasm_i8x16_sub(wasm_v128_and(v, low4), eight), wasm_i8x16_sub(wasm_u8x16_shr(v, 4), eight), o);
            break;
        }
        case QF_Q4_1: {
            const uint8_t *p = row + 20 * b;
            v128_t v = wasm_v128_load(p + 4);
            o->hd = load_u16(p);
            o->hm = load_u16(p + 2);
            if (QMATMUL_RELAXED) { o->b8[0] = wasm_v128_and(v, low4); o->b8[1] = wasm_u8x16_shr(v, 4); break; }
            widen_s8(wasm_v128_and(v, low4), wasm_u8x16_shr(v, 4), o);   /* 0..15: signed = unsigned */
            break;
        }
        case QF_Q4_K: {
            const uint8_t *p = row + 144 * (b >> 3);
            int j = b & 7, sc, m;
            q4k_scale_min(p + 4, j, &sc, &m);
            o->hd = load_u16(p);
            o->hm = load_u16(p + 2);
            o->isc = sc;
            o->im = m;
            const uint8_t *qs = p + 16 + 32 * (j >> 1);
            v128_t v0 = wasm_v128_load(qs), v1 = wasm_v128_load(qs + 16);
            if (j & 1) { v0 = wasm_u8x16_shr(v0, 4); v1 = wasm_u8x16_shr(v1, 4); }
            else { v0 = wasm_v128_and(v0, low4); v1 = wasm_v128_and(v1, low4); }
            if (QMATMUL_RELAXED) { o->b8[0] = v0; o->b8[1] = v1; break; }
            widen_s8(v0, v1, o);
            break;
        }
        case QF_Q6_K: {
            const uint8_t *p = row + 210 * (b >> 3);
            int g8 = b & 7, h = g8 >> 2, g = g8 & 3;
            const uint8_t *ql = p + 64 * h + 32 * (g & 1), *qh = p + 128 + 32 * h;
            const int8_t *sc = (const int8_t *)(p + 192) + 8 * h + 2 * g;
            o->hd = load_u16(p + 208);
            v128_t l0 = wasm_v128_load(ql), l1 = wasm_v128_load(ql + 16);
            if (g >> 1) { l0 = wasm_u8x16_shr(l0, 4); l1 = wasm_u8x16_shr(l1, 4); }
            else { l0 = wasm_v128_and(l0, low4); l1 = wasm_v128_and(l1, low4); }
            v128_t three = wasm_i8x16_splat(3), k32 = wasm_i8x16_splat(32);
            v128_t h0 = wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(wasm_v128_load(qh), 2 * g), three), 4);
            v128_t h1 = wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(wasm_v128_load(qh + 16), 2 * g), three), 4);
            widen_s8(wasm_i8x16_sub(wasm_v128_or(l0, h0), k32), wasm_i8x16_sub(wasm_v128_or(l1, h1), k32), o);
            v128_t s0 = wasm_i16x8_splat(sc[0]), s1 = wasm_i16x8_splat(sc[1]);   /* |q - 32| * |sc| <= 4096 */
            o->w[0] = wasm_i16x8_mul(o->w[0], s0);
            o->w[1] = wasm_i16x8_mul(o->w[1], s0);
            o->w[2] = wasm_i16x8_mul(o->w[2], s1);
            o->w[3] = wasm_i16x8_mul(o->w[3], s1);
            break;
        }
        default: break;
    }
}

/* the 4 lane sums of p0..p3 -> (sum p0, sum p1, sum p2, sum p3); integer: any order is exact */
static inline v128_t hsum4_i32(v128_t p0, v128_t p1, v128_t p2, v128_t p3) {
    v128_t a = wasm_i32x4_add(wasm_i32x4_shuffle(p0, p1, 0, 4, 1, 5), wasm_i32x4_shuffle(p0, p1, 2, 6, 3, 7));
    v128_t c = wasm_i32x4_add(wasm_i32x4_shuffle(p2, p3, 0, 4, 1, 5), wasm_i32x4_shuffle(p2, p3, 2, 6, 3, 7));
    return wasm_i32x4_add(wasm_i32x4_shuffle(a, c, 0, 1, 4, 5), wasm_i32x4_shuffle(a, c, 2, 3, 6, 7));
}

static inline v128_t dot32(const Dec *d, const v128_t *x) {
    v128_t s = wasm_i32x4_dot_i16x8(d->w[0], wasm_v128_load(x));
    s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(d->w[1], wasm_v128_load(x + 1)));
    s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(d->w[2], wasm_v128_load(x + 2)));
    return wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(d->w[3], wasm_v128_load(x + 3)));
}

/* the relaxed build's Q4 formats: nibbles (0..15, the 7-bit operand) times int8 activations */
#define RELAXED_Q4(fmt) (QMATMUL_RELAXED && ((fmt) == QF_Q4_0 || (fmt) == QF_Q4_1 || (fmt) == QF_Q4_K))

static inline v128_t dot32_relaxed(const Dec *d, const int8_t *x8) {
#if QMATMUL_RELAXED
    /* two separate dots, then an add: Node 20's V8 computes a chained accumulator wrongly (the first
     * dot is lost and the second doubled; tests/test_qmatmul.py caught it) */
    const v128_t zero = wasm_i32x4_splat(0);
    return wasm_i32x4_add(wasm_i32x4_relaxed_dot_i8x16_i7x16_add(wasm_v128_load(x8), d->b8[0], zero),
                          wasm_i32x4_relaxed_dot_i8x16_i7x16_add(wasm_v128_load(x8 + 16), d->b8[1], zero));
#else
    (void)d; (void)x8;
    return wasm_i32x4_splat(0);
#endif
}

enum { QMAX_COLUMNS = 64 };      /* the largest block (champion maxBlock) */

/* rows r..r+3 (rows beyond r_end - 1 repeat the last row; only lanes < r_end - r are stored) */
static inline __attribute__((always_inline)) void group4(const QLin *L, const QAct *a, float *out, int out_stride,
                                                         int accumulate, int r, int r_end, const int fmt) {
    const uint32_t rb = qf_row_bytes(fmt, L->cols);
    const uint8_t *row[4];
    for (int j = 0; j < 4; j++) row[j] = L->w + (uint32_t)(r + j < r_end ? r + j : r_end - 1) * rb;
    const int nb = L->cols / 32, n = a->n;
    const int has_min = fmt == QF_Q4_1 || fmt == QF_Q4_K;
    v128_t acc[QMAX_COLUMNS];
    for (int t = 0; t < n; t++) acc[t] = wasm_f32x4_splat(0.0f);
    for (int b = 0; b < nb; b++) {
        Dec d0, d1, d2, d3;
        decode(fmt, row[0], b, &d0);
        decode(fmt, row[1], b, &d1);
        decode(fmt, row[2], b, &d2);
        decode(fmt, row[3], b, &d3);
        v128_t dw, mw = wasm_f32x4_splat(0.0f);
        if (fmt == QF_ROWQ8) dw = wasm_f32x4_splat(1.0f);
        else dw = f16x4_f32(wasm_i32x4_make(d0.hd, d1.hd, d2.hd, d3.hd));
        if (fmt == QF_Q4_1) mw = f16x4_f32(wasm_i32x4_make(d0.hm, d1.hm, d2.hm, d3.hm));
        if (fmt == QF_Q4_K) {    /* dw = d * sc, mw = -(dmin * m): exact products */
            dw = wasm_f32x4_mul(dw, wasm_f32x4_convert_i32x4(wasm_i32x4_make(d0.isc, d1.isc, d2.isc, d3.isc)));
            mw = wasm_f32x4_neg(wasm_f32x4_mul(f16x4_f32(wasm_i32x4_make(d0.hm, d1.hm, d2.hm, d3.hm)),
                                               wasm_f32x4_convert_i32x4(wasm_i32x4_make(d0.im, d1.im, d2.im, d3.im))));
        }
        for (int t = 0; t < n; t++) {
            const v128_t *x = (const v128_t *)(a->q + (uint32_t)t * (uint32_t)a->K + 32u * (uint32_t)b);
            uint32_t ib = (uint32_t)t * (uint32_t)nb + (uint32_t)b;
            v128_t isum;
            if (RELAXED_Q4(fmt)) {
                const int8_t *x8 = a->q8 + (uint32_t)t * (uint32_t)a->K + 32u * (uint32_t)b;
                isum = hsum4_i32(dot32_relaxed(&d0, x8), dot32_relaxed(&d1, x8), dot32_relaxed(&d2, x8), dot32_relaxed(&d3, x8));
                if (fmt == QF_Q4_0) isum = wasm_i32x4_sub(isum, wasm_i32x4_splat(8 * a->s[ib]));   /* q - 8 */
            } else {
                isum = hsum4_i32(dot32(&d0, x), dot32(&d1, x), dot32(&d2, x), dot32(&d3, x));
            }
            v128_t dx = wasm_f32x4_splat(a->d[ib]);
            v128_t c = wasm_f32x4_mul(wasm_f32x4_mul(dw, dx), wasm_f32x4_convert_i32x4(isum));
            if (has_min)
                c = wasm_f32x4_add(c, wasm_f32x4_mul(wasm_f32x4_mul(mw, dx), wasm_f32x4_splat((float)a->s[ib])));
            acc[t] = wasm_f32x4_add(acc[t], c);
        }
    }
    int lanes = r_end - r < 4 ? r_end - r : 4;
    v128_t scale = wasm_f32x4_splat(1.0f);
    if (fmt == QF_ROWQ8) {       /* the row scales (lanes past the last row repeat it) */
        int last = r_end - 1;
        scale = wasm_f32x4_make(L->scale[r], L->scale[r + 1 <= last ? r + 1 : last],
                                L->scale[r + 2 <= last ? r + 2 : last], L->scale[r + 3 <= last ? r + 3 : last]);
    }
    for (int t = 0; t < n; t++) {
        v128_t y = fmt == QF_ROWQ8 ? wasm_f32x4_mul(acc[t], scale) : acc[t];
        float *o = out + (uint32_t)t * (uint32_t)out_stride + (uint32_t)r;
        if (lanes == 4) {
            if (accumulate) y = wasm_f32x4_add(wasm_v128_load(o), y);
            wasm_v128_store(o, y);
        } else {
            float v[4];
            wasm_v128_store(v, y);
            for (int j = 0; j < lanes; j++) o[j] = accumulate ? o[j] + v[j] : v[j];
        }
    }
}

static void rows_fmt(const QLin *L, const QAct *a, float *out, int out_stride, int accumulate, int r0, int r1,
                     const int fmt) {
    for (int r = r0; r < r1; r += 4) group4(L, a, out, out_stride, accumulate, r, r1, fmt);
}

void qmatmul_rows(const QLin *L, const QAct *a, float *out, int out_stride, int accumulate, int r0, int r1) {
    switch (L->fmt) {   /* one instantiation per format: the decode is inlined and branch-free */
        case QF_ROWQ8: rows_fmt(L, a, out, out_stride, accumulate, r0, r1, QF_ROWQ8); break;
        case QF_Q8_0: rows_fmt(L, a, out, out_stride, accumulate, r0, r1, QF_Q8_0); break;
        case QF_Q4_0: rows_fmt(L, a, out, out_stride, accumulate, r0, r1, QF_Q4_0); break;
        case QF_Q4_1: rows_fmt(L, a, out, out_stride, accumulate, r0, r1, QF_Q4_1); break;
        case QF_Q4_K: rows_fmt(L, a, out, out_stride, accumulate, r0, r1, QF_Q4_K); break;
        case QF_Q6_K: rows_fmt(L, a, out, out_stride, accumulate, r0, r1, QF_Q6_K); break;
        default: break;
    }
}

/* ============================================================================================
 * Dequantised rows (the embedding gather) and the load-time scale check.
 * ========================================================================================== */

void qlin_dequant_row(const QLin *L, int r, float *out) {
    const uint32_t rb = qf_row_bytes(L->fmt, L->cols);
    const uint8_t *row = L->w + (uint32_t)r * rb;
    if (L->fmt == QF_F32) {
        const float *src = (const float *)row;
        float s = L->scale ? L->scale[r] : 1.0f;
        for (int i = 0; i < L->cols; i++) out[i] = L->scale ? src[i] * s : src[i];
        return;
    }
    if (L->fmt == QF_I8F || L->fmt == QF_ROWQ8) {
        float s = L->scale[r];
        for (int i = 0; i < L->cols; i++) out[i] = (float)((const int8_t *)row)[i] * s;
        return;
    }
    const int has_min = L->fmt == QF_Q4_1 || L->fmt == QF_Q4_K;
    for (int b = 0; b < L->cols / 32; b++) {
        Dec d;
        decode(L->fmt, row, b, &d);
        if (RELAXED_Q4(L->fmt)) {    /* nibbles -> int16 lanes as the SIMD128 decode has them */
            v128_t lo = d.b8[0], hi = d.b8[1];
            if (L->fmt == QF_Q4_0) { lo = wasm_i8x16_sub(lo, wasm_i8x16_splat(8)); hi = wasm_i8x16_sub(hi, wasm_i8x16_splat(8)); }
            widen_s8(lo, hi, &d);
        }
        int16_t w[32];
        for (int k = 0; k < 4; k++) wasm_v128_store(w + 8 * k, d.w[k]);
        float dw = f16_f32(d.hd) * (float)d.isc, mw = L->fmt == QF_Q4_K ? -(f16_f32(d.hm) * (float)d.im) : f16_f32(d.hm);
        for (int i = 0; i < 32; i++) {
            float v = dw * (float)w[i];
            out[32 * b + i] = has_min ? v + mw : v;
        }
    }
}

static int half_finite(const uint8_t *p) { return (load_u16(p) & 0x7c00) != 0x7c00; }

int qlin_bad_scale_row(const QLin *L) {
    if (!qf_is_q8act(L->fmt) || L->fmt == QF_ROWQ8) return 0;
    const uint32_t rb = qf_row_bytes(L->fmt, L->cols);
    for (int r = 0; r < L->rows; r++) {
        const uint8_t *row = L->w + (uint32_t)r * rb;
        int ok = 1;
        switch (L->fmt) {
            case QF_Q8_0: for (int b = 0; b < L->cols / 32; b++) ok &= half_finite(row + 34 * b); break;
            case QF_Q4_0: for (int b = 0; b < L->cols / 32; b++) ok &= half_finite(row + 18 * b); break;
            case QF_Q4_1: for (int b = 0; b < L->cols / 32; b++) ok &= half_finite(row + 20 * b) & half_finite(row + 20 * b + 2); break;
            case QF_Q4_K: for (int b = 0; b < L->cols / 256; b++) ok &= half_finite(row + 144 * b) & half_finite(row + 144 * b + 2); break;
            case QF_Q6_K: for (int b = 0; b < L->cols / 256; b++) ok &= half_finite(row + 210 * b + 208); break;
            default: break;
        }
        if (!ok) return r + 1;
    }
    return 0;
}
