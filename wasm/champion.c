/* champion.c — the exactspec champion in WASM-SIMD: Llama forward pass over a block of 1..B
 * positions on the q8 artifact (int8 values held as exact float32, per-row scale applied after
 * the row sum), batch-invariant, plus the round's decision (processors-v1, acceptance, residual,
 * extra and baseline sampling) in float64 on the CPU: exactspec.core.acceptance.decide_round.
 *
 * Weights: every linear has a format (qmatmul.h, docs/quant_kernels.md). Quantised weights stay
 * in their blocks -- the q8 artifact's int8 rows (ROWQ8) and GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K
 * as read from the file -- and are multiplied by the q8act-v1 kernel (qmatmul.c: activations
 * quantised per block of 32, int32 dot products). The float function of before stays for F32
 * linears (GGUF F32/F16/BF16, or the q8 artifact widened at load: "matmul f32") and I8F (int8
 * held, widened in registers): the same float values, so the same bits, either way.
 *
 * Build: wasm/build.sh (clang 14, --target=wasm32 -msimd128 -ffreestanding -nostdlib
 * -ffp-contract=off), linked with draft.c, cpu.c and common.c into one module (web/build/cpu.wasm).
 * The maths shared with draft.c (RNG, portable log/exp, processors, sampler, arena) is in
 * common.c. JS (web/champion_wasm/champion_wasm.mjs) parses config.json and
 * model.q8.safetensors and writes each tensor where champion_tensor_ptr says.
 *
 * One champion per instance. Calls from JS, in order:
 *   champion_alloc(bytes) -> ptr                  bump allocation (argument buffers)
 *   champion_build_config(...)                    hyper-parameters; allocates state, KV
 *   champion_set_format(kind, layer, fmt)         (optional) a linear's format, before any tensor_ptr
 *   champion_alloc_weights()                      (optional) the weight buffers; OOM refused here
 *   champion_tensor_ptr(kind, layer) -> ptr       where JS writes one tensor (allocates the weights
 *   champion_tensor_bytes(kind, layer) -> bytes     at the first call) and how many bytes it takes
 *   champion_check()                              marks the model built
 *   champion_forward / champion_logits / champion_set_policy / champion_set_masks / champion_decide
 * Errors are the status codes of protocol.json's wasm_status (wasm_status.h); JS maps them through
 * web/wasm_status.mjs, the same table as the draft's.
 *
 * Batch invariance: every output element of every stage is computed by the same sequence of
 * float operations whatever the block size n, the position of the row inside the block, the
 * tile shape or the thread that computes it (q8act matmul: exact int32 block sums, then the
 * declared float sequence in block order; float matmul: one f32x4 accumulator per element over the
 * input in steps of 4, then (l0 + l2) + (l1 + l3), then * scale, then + residual; norms, RoPE,
 * attention and SwiGLU row by row). A position's logits are therefore the same bits decoded
 * alone or inside any block, after any rollback.
 */
#include "common.h"
#include "cpu.h"
#include "qmatmul.h"

EXPORT("champion_alloc") void *champion_alloc(uint32_t nbytes) { return arena_alloc(nbytes); }

/* ============================================================================================
 * Model: weights (fused q|k|v and gate|up, q8 values as int8), run state for B rows, KV cache.
 * ========================================================================================== */

/* the linears of a layer, in the order of the tensor kinds T_WQ .. T_W_DOWN */
enum { LIN_Q = 0, LIN_K, LIN_V, LIN_O, LIN_GATE, LIN_UP, LIN_DOWN, LIN_COUNT };

typedef struct {
    float *attn_norm;            /* (D,) input_layernorm */
    float *mlp_norm;             /* (D,) post_attention_layernorm */
    QLin lin[LIN_COUNT];         /* q (H*hd, D), k, v (KV*hd, D), o (D, H*hd), gate, up (F, D), down (D, F) */
    float *b_qkv;                /* (H*hd + 2 KV*hd,) q|k|v biases (Qwen2), or 0 */
} LayerWeights;

typedef struct {
    QLin embed;                  /* (V, D) embed_tokens (a tied head multiplies by it too) */
    QLin lm_head;                /* (V, D) an untied head (w == 0 when tied) */
    float *final_norm;           /* (D,) model.norm */
    LayerWeights *layers;        /* (L,) */
} Weights;

typedef struct {
    float *x;                    /* (B, D) residual stream */
    float *xb;                   /* (B, D) normed input of a sub-block */
    float *qkv;                  /* (B, H*hd + 2 KV*hd) q | k | v; q and k rotated in place */
    float *att;                  /* (B, H*hd) concatenated head outputs */
    float *gate_up;              /* (B, 2F) */
    float *act;                  /* (B, F) silu(gate) * up */
    float *scores;               /* (MAX_THREADS, T_max) attention scores of one (row, head), per thread */
    float *logits;               /* (B, V) logits of the last forward's rows */
    QAct qact;                   /* (B, max(D, F, H*hd)) the quantised input of the current matmul */
    float *key_cache;            /* (L, kv_cap, KV*hd) keys after RoPE */
    float *value_cache;          /* (L, kv_cap, KV*hd) */
    int kv_cap;                  /* positions the K/V caches hold room for: grows on demand (grow_kv)
                                    up to cfg.max_context, so a short chat does not pay for 8192 */
    float *rope_cos;             /* (T_max, hd/2) */
    float *rope_sin;             /* (T_max, hd/2) */
    double *residual;            /* (V,) residual weights of a rejected proposal */
    int n_cached;                /* positions [0, n_cached) hold valid K/V */
    int n_rows;                  /* logits rows of the last forward */
} RunState;

enum { KV_INITIAL = 512 };        /* K/V positions allocated at build; grow_kv doubles, in steps of this */

#ifdef CHAMPION_THREADS
enum { MAX_THREADS = 16 };       /* the calling thread + up to 15 helpers */
#else
enum { MAX_THREADS = 1 };
#endif

static Config cfg;
static int max_block;            /* B */
static Weights weights;
static RunState st;
static Policy pol;
static ProcState proc;
static int built;

static float *alloc_floats(uint32_t n) { return (float *)arena_alloc(n * 4u); }
static int default_fmt;          /* the q8 linears' format unless set: QF_F32 (widened), QF_I8F, QF_ROWQ8 */
static int has_qkv_bias, tied_head, embed_q8;   /* model features (champion_build_config) */
static int weights_ready;        /* 1: the weight buffers are allocated (the first tensor_ptr) */
static uint32_t weight_bytes;    /* bytes of every weight buffer (values + scales + norms + biases) */

static inline int qkv_rows(void) { return (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim; }

static float *alloc_weight_floats(uint32_t n) { weight_bytes += n * 4u; return alloc_floats(n); }

/* a linear's buffers by its format: the values (rows x row_bytes) and, for F32 / I8F / ROWQ8
 * linears, (rows,) float32 row scales (with_scale) */
static int alloc_lin(QLin *L, int with_scale) {
    uint32_t nbytes = qf_row_bytes(L->fmt, L->cols) * (uint32_t)L->rows;
    L->w = (const uint8_t *)arena_alloc(nbytes);
    weight_bytes += nbytes;
    L->scale = 0;
    if (with_scale && (L->fmt == QF_F32 || L->fmt == QF_I8F || L->fmt == QF_ROWQ8)) L->scale = alloc_weight_floats((uint32_t)L->rows);
    if (!L->w || (with_scale && (L->fmt == QF_F32 || L->fmt == QF_I8F || L->fmt == QF_ROWQ8) && !L->scale)) return ERR_OUT_OF_MEMORY;
    return OK;
}

/* the shapes and default formats of every linear (no memory yet: formats may still change) */
static int plan_weights(void) {
    int D = cfg.hidden_size, F = cfg.intermediate_size, V = cfg.vocab_size;
    int q_dim = cfg.num_heads * cfg.head_dim, kv_dim = cfg.num_kv_heads * cfg.head_dim;
    weights.layers = (LayerWeights *)arena_alloc((uint32_t)cfg.num_layers * sizeof(LayerWeights));
    if (!weights.layers) return ERR_OUT_OF_MEMORY;
    zero_bytes(weights.layers, (uint32_t)cfg.num_layers * sizeof(LayerWeights));
    weights.embed = (QLin){ 0, 0, embed_q8 ? default_fmt : QF_F32, V, D };
    weights.lm_head = (QLin){ 0, 0, tied_head ? QF_F32 : default_fmt, tied_head ? 0 : V, D };
    const int shape[LIN_COUNT][2] = { { q_dim, D }, { kv_dim, D }, { kv_dim, D }, { D, q_dim }, { F, D }, { F, D }, { D, F } };
    for (int l = 0; l < cfg.num_layers; l++)
        for (int i = 0; i < LIN_COUNT; i++)
            weights.layers[l].lin[i] = (QLin){ 0, 0, default_fmt, shape[i][0], shape[i][1] };
    return OK;
}

/* the weight bytes the current formats need (with_arena: plus what the arena already holds); 64-bit,
 * so a model too large for wasm32 is refused at champion_build_config, before any tensor is fetched */
static uint64_t planned_weight_bytes(int with_arena) {
    uint64_t D = (uint64_t)cfg.hidden_size, total = with_arena ? (uint64_t)arena_top : 0;
    total += (uint64_t)qf_row_bytes(weights.embed.fmt, weights.embed.cols) * (uint64_t)weights.embed.rows;
    if (embed_q8) total += 4u * (uint64_t)weights.embed.rows;
    if (!tied_head) total += ((uint64_t)qf_row_bytes(weights.lm_head.fmt, weights.lm_head.cols) + 4u) * (uint64_t)weights.lm_head.rows;
    total += 4u * D * (1u + 2u * (uint64_t)cfg.num_layers);
    for (int l = 0; l < cfg.num_layers; l++)
        for (int i = 0; i < LIN_COUNT; i++) {
            const QLin *L = &weights.layers[l].lin[i];
            total += ((uint64_t)qf_row_bytes(L->fmt, L->cols) + 4u) * (uint64_t)L->rows;
        }
    return total;
}

static int build_weights(void) {
    int D = cfg.hidden_size;
    if (alloc_lin(&weights.embed, embed_q8) != OK) return ERR_OUT_OF_MEMORY;
    if (!tied_head && alloc_lin(&weights.lm_head, 1) != OK) return ERR_OUT_OF_MEMORY;
    weights.final_norm = alloc_weight_floats((uint32_t)D);
    if (!weights.final_norm) return ERR_OUT_OF_MEMORY;
    for (int l = 0; l < cfg.num_layers; l++) {
        LayerWeights *w = &weights.layers[l];
        w->attn_norm = alloc_weight_floats((uint32_t)D);
        w->mlp_norm = alloc_weight_floats((uint32_t)D);
        w->b_qkv = has_qkv_bias ? alloc_weight_floats((uint32_t)qkv_rows()) : 0;
        if (!w->attn_norm || !w->mlp_norm || (has_qkv_bias && !w->b_qkv)) return ERR_OUT_OF_MEMORY;
        for (int i = 0; i < LIN_COUNT; i++)
            if (alloc_lin(&w->lin[i], 1) != OK) return ERR_OUT_OF_MEMORY;
    }
    weights_ready = 1;
    return OK;
}

static int build_run_state(void) {
    uint32_t B = (uint32_t)max_block, D = (uint32_t)cfg.hidden_size, F = (uint32_t)cfg.intermediate_size;
    uint32_t kv_dim = (uint32_t)(cfg.num_kv_heads * cfg.head_dim);
    uint32_t q_dim = (uint32_t)(cfg.num_heads * cfg.head_dim);
    st.kv_cap = cfg.max_context < KV_INITIAL ? cfg.max_context : KV_INITIAL;
    uint32_t cache_n = (uint32_t)cfg.num_layers * (uint32_t)st.kv_cap * kv_dim;
    uint32_t rope_n = (uint32_t)cfg.max_context * (uint32_t)(cfg.head_dim / 2);
    st.x = alloc_floats(B * D);
    st.xb = alloc_floats(B * D);
    st.qkv = alloc_floats(B * (uint32_t)qkv_rows());
    st.att = alloc_floats(B * q_dim);
    st.gate_up = alloc_floats(B * 2 * F);
    st.act = alloc_floats(B * F);
    st.scores = alloc_floats((uint32_t)MAX_THREADS * (uint32_t)cfg.max_context);
    st.logits = alloc_floats(B * (uint32_t)cfg.vocab_size);
    uint32_t k_max = D > F ? D : F;
    if (q_dim > k_max) k_max = q_dim;
    st.qact.q = (int16_t *)arena_alloc(B * k_max * 2u);
    st.qact.q8 = (int8_t *)arena_alloc(B * k_max);
    st.qact.d = alloc_floats(B * (k_max / 32u + 1u));
    st.qact.s = (int32_t *)arena_alloc(B * (k_max / 32u + 1u) * 4u);
    st.key_cache = alloc_floats(cache_n);
    st.value_cache = alloc_floats(cache_n);
    st.rope_cos = alloc_floats(rope_n);
    st.rope_sin = alloc_floats(rope_n);
    st.residual = (double *)arena_alloc((uint32_t)cfg.vocab_size * 8u);
    st.n_cached = 0;
    st.n_rows = 0;
    if (!st.x || !st.xb || !st.qkv || !st.att || !st.gate_up || !st.act || !st.scores || !st.logits ||
        !st.qact.q || !st.qact.q8 || !st.qact.d || !st.qact.s ||
        !st.key_cache || !st.value_cache || !st.rope_cos || !st.rope_sin || !st.residual)
        return ERR_OUT_OF_MEMORY;
    build_rope_tables(st.rope_cos, st.rope_sin, cfg.max_context, cfg.head_dim, cfg.rope_theta);
    return OK;
}

/* ============================================================================================
 * Block matmul: out[t, r] (+)= (sum_i w[r, i] x[t, i]) * scale[r] for t < n, r in [r0, r1).
 * Tiles of 4 (or, for n == 1, 8) rows x up to 3 columns give enough independent accumulators;
 * each weight row is loaded from memory once per block (the columns of a tile reuse it).
 * ========================================================================================== */

typedef struct {
    float *out;                  /* (n, out_stride) */
    const void *w;               /* (rows, cols): int8 values (q8 = 1) or float32 */
    const float *scale;          /* (rows,) or 0 */
    const float *x;              /* (n, x_stride) */
    int out_stride, x_stride, n, rows, cols;
    int accumulate;              /* 1: out += result (the residual stream) */
    int q8;                      /* 1: w holds int8 (I8F) */
} FMat;

/* weights [i, i+4) of a row as float32: int8 widened exactly (Q = 1, a compile-time constant
 * after inlining), or loaded as they are (Q = 0) */
static inline __attribute__((always_inline)) v128_t load_w(const void *row, int i, const int Q) {
    if (Q) return wasm_f32x4_convert_i32x4(wasm_i32x4_extend_low_i16x8(wasm_i16x8_extend_low_i8x16(
               wasm_v128_load32_zero((const int8_t *)row + i))));
    return wasm_v128_load((const float *)row + i);
}

/* int8 weights widened to exact float32: the 16 bytes b hold elements i..i+15 of a row; lane group
 * q (0..3) is elements i+4q..i+4q+3. lo/hi are b's halves widened to int16 (computed once per 16). */
#define W16_LO(b) wasm_i16x8_extend_low_i8x16(b)
#define W16_HI(b) wasm_i16x8_extend_high_i8x16(b)
#define W16_GROUP(lo, hi, q) wasm_f32x4_convert_i32x4( \
    (q) == 0 ? wasm_i32x4_extend_low_i16x8(lo) : (q) == 1 ? wasm_i32x4_extend_high_i16x8(lo) : \
    (q) == 2 ? wasm_i32x4_extend_low_i16x8(hi) : wasm_i32x4_extend_high_i16x8(hi))

static inline const void *row_ptr(const FMat *m, int r) {
    uint32_t off = (uint32_t)r * (uint32_t)m->cols;
    return m->q8 ? (const void *)((const int8_t *)m->w + off) : (const void *)((const float *)m->w + off);
}

/* one f32x4 accumulator per row -> the 4 row sums, each (l0 + l2) + (l1 + l3) */
static inline v128_t hsum4(v128_t a0, v128_t a1, v128_t a2, v128_t a3) {
    v128_t t0 = wasm_i32x4_shuffle(a0, a1, 0, 4, 1, 5);   /* a0.0 a1.0 a0.1 a1.1 */
    v128_t t1 = wasm_i32x4_shuffle(a0, a1, 2, 6, 3, 7);   /* a0.2 a1.2 a0.3 a1.3 */
    v128_t t2 = wasm_i32x4_shuffle(a2, a3, 0, 4, 1, 5);
    v128_t t3 = wasm_i32x4_shuffle(a2, a3, 2, 6, 3, 7);
    v128_t s01 = wasm_f32x4_add(t0, t1);
    v128_t s23 = wasm_f32x4_add(t2, t3);
    v128_t lo = wasm_i32x4_shuffle(s01, s23, 0, 1, 4, 5);
    v128_t hi = wasm_i32x4_shuffle(s01, s23, 2, 3, 6, 7);
    return wasm_f32x4_add(lo, hi);
}

/* rows r..r+3 of column t: scale, then add into the output if accumulating */
static inline void store4(const FMat *m, int r, int t, v128_t sums) {
    if (m->scale) sums = wasm_f32x4_mul(sums, wasm_v128_load(m->scale + r));
    float *o = m->out + (uint32_t)t * (uint32_t)m->out_stride + (uint32_t)r;
    if (m->accumulate) sums = wasm_f32x4_add(wasm_v128_load(o), sums);
    wasm_v128_store(o, sums);
}

/* rows r..r+3 x columns t0..t0+C-1 (C <= 3, a compile-time constant after inlining) */
static inline __attribute__((always_inline)) void tile4(const FMat *m, int r, int t0, const int C, const int Q) {
    const int K = m->cols;
    const void *w0 = row_ptr(m, r), *w1 = row_ptr(m, r + 1), *w2 = row_ptr(m, r + 2), *w3 = row_ptr(m, r + 3);
    const float *xc[3];
    v128_t acc[3][4];
    for (int c = 0; c < C; c++) {
        xc[c] = m->x + (uint32_t)(t0 + c) * (uint32_t)m->x_stride;
        for (int j = 0; j < 4; j++) acc[c][j] = wasm_f32x4_splat(0.0f);
    }
    int i = 0;
    if (Q) {                         /* 16 at a time (see tile8x1): the same operations per element */
        const void *wr[4] = { w0, w1, w2, w3 };
        for (; i + 16 <= K; i += 16)
            for (int j = 0; j < 4; j++) {
                v128_t b = wasm_v128_load((const int8_t *)wr[j] + i), lo = W16_LO(b), hi = W16_HI(b);
                for (int q = 0; q < 4; q++) {
                    v128_t wv = W16_GROUP(lo, hi, q);
                    for (int c = 0; c < C; c++)
                        acc[c][j] = wasm_f32x4_add(acc[c][j], wasm_f32x4_mul(wv, wasm_v128_load(xc[c] + i + 4 * q)));
                }
            }
    }
    for (; i < K; i += 4) {
        v128_t wv0 = load_w(w0, i, Q), wv1 = load_w(w1, i, Q);
        v128_t wv2 = load_w(w2, i, Q), wv3 = load_w(w3, i, Q);
        for (int c = 0; c < C; c++) {
            v128_t xv = wasm_v128_load(xc[c] + i);
            acc[c][0] = wasm_f32x4_add(acc[c][0], wasm_f32x4_mul(wv0, xv));
            acc[c][1] = wasm_f32x4_add(acc[c][1], wasm_f32x4_mul(wv1, xv));
            acc[c][2] = wasm_f32x4_add(acc[c][2], wasm_f32x4_mul(wv2, xv));
            acc[c][3] = wasm_f32x4_add(acc[c][3], wasm_f32x4_mul(wv3, xv));
        }
    }
    for (int c = 0; c < C; c++) store4(m, r, t0 + c, hsum4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]));
}

/* rows r..r+7 of a single column: eight independent accumulators (block 1 is latency-bound).
 * int8 rows are widened 16 at a time; the accumulators still take elements in steps of 4, in
 * order, so every sum is the same sequence of float operations as with float32 rows. */
static inline __attribute__((always_inline)) void tile8x1(const FMat *m, int r, int t, const int Q) {
    const void *w[8];
    for (int j = 0; j < 8; j++) w[j] = row_ptr(m, r + j);
    const float *xt = m->x + (uint32_t)t * (uint32_t)m->x_stride;
    v128_t a[8];
    for (int j = 0; j < 8; j++) a[j] = wasm_f32x4_splat(0.0f);
    int i = 0;
    if (Q) {
        for (; i + 16 <= m->cols; i += 16)
            for (int j = 0; j < 8; j++) {
                v128_t b = wasm_v128_load((const int8_t *)w[j] + i), lo = W16_LO(b), hi = W16_HI(b);
                for (int q = 0; q < 4; q++)
                    a[j] = wasm_f32x4_add(a[j], wasm_f32x4_mul(W16_GROUP(lo, hi, q), wasm_v128_load(xt + i + 4 * q)));
            }
    }
    for (; i < m->cols; i += 4) {
        v128_t xv = wasm_v128_load(xt + i);
        for (int j = 0; j < 8; j++) a[j] = wasm_f32x4_add(a[j], wasm_f32x4_mul(load_w(w[j], i, Q), xv));
    }
    store4(m, r, t, hsum4(a[0], a[1], a[2], a[3]));
    store4(m, r + 4, t, hsum4(a[4], a[5], a[6], a[7]));
}

/* one row, one column: the same per-element operations as the tiles */
static inline __attribute__((always_inline)) void tile1x1(const FMat *m, int r, int t, const int Q) {
    const void *wr = row_ptr(m, r);
    const float *xt = m->x + (uint32_t)t * (uint32_t)m->x_stride;
    v128_t a = wasm_f32x4_splat(0.0f);
    for (int i = 0; i < m->cols; i += 4)
        a = wasm_f32x4_add(a, wasm_f32x4_mul(load_w(wr, i, Q), wasm_v128_load(xt + i)));
    float s = (wasm_f32x4_extract_lane(a, 0) + wasm_f32x4_extract_lane(a, 2)) +
              (wasm_f32x4_extract_lane(a, 1) + wasm_f32x4_extract_lane(a, 3));
    if (m->scale) s = s * m->scale[r];
    float *o = m->out + (uint32_t)t * (uint32_t)m->out_stride + (uint32_t)r;
    *o = m->accumulate ? *o + s : s;
}

/* rows [r0, r1) for every column; r0 % 8 == 0 (a thread's share starts on a tile boundary) */
static inline __attribute__((always_inline)) void matmul_rows_t(const FMat *m, int r0, int r1, const int Q) {
    int r = r0, full = r0 + ((r1 - r0) & ~3);
    if (m->n == 1)
        for (; r + 8 <= full; r += 8) tile8x1(m, r, 0, Q);
    for (; r + 4 <= full; r += 4) {
        int t = 0;
        for (; t + 3 <= m->n; t += 3) tile4(m, r, t, 3, Q);
        if (m->n - t == 2) tile4(m, r, t, 2, Q);
        else if (m->n - t == 1) tile4(m, r, t, 1, Q);
    }
    for (; r < r1; r++)
        for (int t = 0; t < m->n; t++) tile1x1(m, r, t, Q);
}

static void matmul_rows_q8(const FMat *m, int r0, int r1) { matmul_rows_t(m, r0, r1, 1); }
static void matmul_rows_f32(const FMat *m, int r0, int r1) { matmul_rows_t(m, r0, r1, 0); }

/* ============================================================================================
 * One matmul step: the output rows of up to 3 linears side by side (q | k | v, gate | up), each
 * in its own format; rows [r0, r1) of the concatenation, whichever linears they fall in.
 * ========================================================================================== */

typedef struct {
    float *out;                  /* (n, out_stride); linear i writes columns [base_i, base_i + rows_i) */
    int out_stride, n, accumulate;
    const float *x;              /* (n, x_stride) float input (F32 / I8F linears) */
    int x_stride;
    const QAct *act;             /* the same input quantised (q8act linears) */
    int n_lin, rows;             /* rows = the sum of the linears' rows */
    QLin lin[3];
} Matmul;

static void matmul_rows(const Matmul *m, int r0, int r1) {
    int base = 0;
    for (int i = 0; i < m->n_lin; base += m->lin[i].rows, i++) {
        const QLin *L = &m->lin[i];
        int lo = r0 > base ? r0 - base : 0, hi = r1 - base < L->rows ? r1 - base : L->rows;
        if (lo >= hi) continue;
        if (qf_is_q8act(L->fmt)) {
            qmatmul_rows(L, m->act, m->out + base, m->out_stride, m->accumulate, lo, hi);
        } else {
            FMat f = { m->out + base, L->w, L->scale, m->x, m->out_stride, m->x_stride, m->n, L->rows, L->cols,
                       m->accumulate, L->fmt == QF_I8F };
            if (f.q8) matmul_rows_q8(&f, lo, hi);
            else matmul_rows_f32(&f, lo, hi);
        }
    }
}

/* ============================================================================================
 * Forward pass over a block: positions [start_pos, start_pos + n), logits of every row.
 * ========================================================================================== */

/* One parallel step of the forward: a matmul (rows split across threads) or the attention of
 * a layer ((row, head) pairs split across threads). A thread's share changes which elements it
 * computes, never how: results are bitwise the same for any thread count. */
typedef struct {
    int kind;                    /* STEP_MATMUL | STEP_ATTEND */
    Matmul mm;
    int layer, n, start_pos;     /* STEP_ATTEND */
} Step;

enum { STEP_MATMUL = 1, STEP_ATTEND = 2 };

static void attend_pairs(const Step *s, int p0, int p1, float *scores) {
    const int hd = cfg.head_dim, kv_dim = cfg.num_kv_heads * hd, q_dim = cfg.num_heads * hd, QKV = qkv_rows();
    const int group = cfg.num_heads / cfg.num_kv_heads;
    const float scale = (float)(1.0 / __builtin_sqrt((double)hd));
    const float *k_layer = st.key_cache + (uint32_t)s->layer * (uint32_t)st.kv_cap * (uint32_t)kv_dim;
    const float *v_layer = st.value_cache + (uint32_t)s->layer * (uint32_t)st.kv_cap * (uint32_t)kv_dim;
    for (int p = p0; p < p1; p++) {                          /* pair p = (row t, query head h) */
        int t = p / cfg.num_heads, h = p % cfg.num_heads;    /* query head h uses kv head h // group */
        attend_head(st.att + t * q_dim + h * hd, st.qkv + t * QKV + h * hd, k_layer, v_layer, kv_dim, hd,
                    (h / group) * hd, s->start_pos + t, scale, scores);
    }
}

/* a step's work in chunks: 8-row chunks of a matmul (tile boundaries), or (row, head) pairs of
 * the attention; chunk c of `chunks` runs on thread `index` (its attention scratch) */
static int step_chunks(const Step *s) {
    return s->kind == STEP_MATMUL ? (s->mm.rows + 7) / 8 : s->n * cfg.num_heads;
}

static void run_chunks(const Step *s, int c0, int c1, int index) {
    if (s->kind == STEP_MATMUL) {
        int r1 = c1 * 8 < s->mm.rows ? c1 * 8 : s->mm.rows;
        matmul_rows(&s->mm, c0 * 8, r1);
    } else {
        attend_pairs(s, c0, c1, st.scores + (uint32_t)index * (uint32_t)cfg.max_context);
    }
}

#ifdef CHAMPION_THREADS
/* ============================================================================================
 * Thread pool: helpers are other instances of this module over the same shared memory, each
 * looping in champion_worker(index). The calling thread publishes a step, bumps `generation`,
 * and then every thread CLAIMS chunks until none is left: `claim` packs the step's generation
 * (high 16 bits) with the next chunk (low 16), so a helper that wakes late claims nothing of a
 * later step. The caller waits only until every chunk is done, never for a helper to show up (a
 * descheduled helper costs nothing but its own claimed chunk). Which thread computes a chunk
 * changes nothing in its arithmetic: the same bits for any thread count.
 * ========================================================================================== */

static struct {
    int32_t generation;          /* bumped once per step (and once to stop) */
    int32_t claim;               /* (generation & 0xffff) << 16 | next chunk of the current step */
    int32_t chunks;              /* chunks of the current step */
    int32_t finished;            /* chunks of the current step done */
    int32_t n_threads;           /* 1 + helpers */
    int32_t ready;               /* helpers that entered their loop */
    int32_t stop;                /* 1: helpers return */
} pool = { 0, 0, 0, 0, 1, 0, 0 };
static Step pool_step;
#define CLAIM_CLOSED 0xffff      /* the low half of a claim word whose step takes no more claims */

/* claim and run chunks of the step of generation `gen` until none is left; 1 chunk at a time */
static void claim_chunks(int32_t gen, int index) {
    const int32_t tag = (gen & 0xffff) << 16;
    for (;;) {
        int32_t w = __atomic_load_n(&pool.claim, __ATOMIC_SEQ_CST);
        if ((w & (int32_t)0xffff0000) != tag) return;              /* another step's word */
        int32_t c = w & 0xffff;
#ifdef CHAMPION_RACE_TEST   /* tests/test_thread_race.py: a helper descheduled after reading the word */
        if (index > 0) for (volatile int i = 0; i < 3000; i++) {}
#endif
        if (c == CLAIM_CLOSED || c >= __atomic_load_n(&pool.chunks, __ATOMIC_SEQ_CST)) return;
        if (!__atomic_compare_exchange_n(&pool.claim, &w, w + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) continue;
        run_chunks(&pool_step, c, c + 1, index);
        __atomic_add_fetch(&pool.finished, 1, __ATOMIC_SEQ_CST);
    }
}

static void run_step(const Step *s) {
    int n = __atomic_load_n(&pool.n_threads, __ATOMIC_SEQ_CST), chunks = step_chunks(s);
    /* one thread: nothing to share; 65535 chunks or more do not fit a claim word's low half */
    if (n <= 1 || chunks <= 1 || chunks >= CLAIM_CLOSED) { run_chunks(s, 0, chunks, 0); return; }
    /* close the last step's claim word before publishing this step: a helper still in claim_chunks
       for it (descheduled after reading the word) must not see this step's larger chunk count
       while the word still holds the last step's tag, claim a chunk of this step with it and count
       it in `finished` (which would end the wait below early, or run a chunk twice) */
    int32_t last = __atomic_load_n(&pool.claim, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pool.claim, (last & (int32_t)0xffff0000) | CLAIM_CLOSED, __ATOMIC_SEQ_CST);
    pool_step = *s;
    int32_t gen = __atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST) + 1;
    __atomic_store_n(&pool.chunks, chunks, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pool.finished, 0, __ATOMIC_SEQ_CST);
#ifdef CHAMPION_RACE_TEST   /* ... and the caller descheduled while it publishes the step */
    for (volatile int i = 0; i < 3000; i++) {}
#endif
    __atomic_store_n(&pool.claim, (gen & 0xffff) << 16, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pool.generation, gen, __ATOMIC_SEQ_CST);
    __builtin_wasm_memory_atomic_notify(&pool.generation, (uint32_t)n);
    claim_chunks(gen, 0);
    while (__atomic_load_n(&pool.finished, __ATOMIC_SEQ_CST) < chunks) {}
}

/* helper thread `index` (1..n_threads-1): claims chunks of each step until champion_threads_stop() */
EXPORT("champion_worker") void champion_worker(int index) {
    int32_t seen = 0;                                        /* generation before any step */
    __atomic_add_fetch(&pool.ready, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        int32_t g;
        for (int spin = 0; (g = __atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST)) == seen; spin++)
            if (spin > 200000) __builtin_wasm_memory_atomic_wait32(&pool.generation, seen, -1);
        seen = g;
        if (__atomic_load_n(&pool.stop, __ATOMIC_SEQ_CST)) return;
        claim_chunks(g, index);
    }
}

/* the calling thread plus n - 1 helpers share every step from now on (helpers must be running) */
EXPORT("champion_threads_start") int champion_threads_start(int n) {
    if (n < 1 || n > MAX_THREADS) return ERR_BAD_ARGUMENT;
    __atomic_store_n(&pool.n_threads, n, __ATOMIC_SEQ_CST);
    return OK;
}

EXPORT("champion_threads_ready") int champion_threads_ready(void) { return __atomic_load_n(&pool.ready, __ATOMIC_SEQ_CST); }

EXPORT("champion_threads_stop") void champion_threads_stop(void) {
    __atomic_store_n(&pool.n_threads, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pool.stop, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&pool.generation, 1, __ATOMIC_SEQ_CST);
    __builtin_wasm_memory_atomic_notify(&pool.generation, (uint32_t)MAX_THREADS);
}
#else
static void run_step(const Step *s) { run_chunks(s, 0, step_chunks(s), 0); }
#endif

/* out (n, out_stride) (+)= the linears lin[0..n_lin) side by side applied to x (n, x_stride); the
 * input is quantised once, on the calling thread, when a linear is q8act */
static void matmul_lins(float *out, int out_stride, const QLin *lin, int n_lin, const float *x, int x_stride,
                        int n, int accumulate, QAct *act) {
    Step s = { STEP_MATMUL, { out, out_stride, n, accumulate, x, x_stride, act, n_lin, 0, { { 0 } } }, 0, 0, 0 };
    int any_q8act = 0;
    for (int i = 0; i < n_lin; i++) {
        s.mm.lin[i] = lin[i];
        s.mm.rows += lin[i].rows;
        any_q8act |= qf_is_q8act(lin[i].fmt);
    }
    if (any_q8act) qact_quantize(act, x, x_stride, n, lin[0].cols);
    run_step(&s);
}

static void matmul(float *out, int out_stride, const QLin *lin, const float *x, int x_stride, int n, int accumulate) {
    matmul_lins(out, out_stride, lin, 1, x, x_stride, n, accumulate, &st.qact);
}

static void forward_block(const int32_t *tokens, int n, int start_pos) {
    const int D = cfg.hidden_size, F = cfg.intermediate_size, hd = cfg.head_dim, half = hd / 2;
    const int kv_dim = cfg.num_kv_heads * hd, q_dim = cfg.num_heads * hd, QKV = qkv_rows();
    for (int t = 0; t < n; t++) {                            /* embedding rows (dequantised: q8 * scale) */
        qlin_dequant_row(&weights.embed, tokens[t], st.x + t * D);
    }
    for (int l = 0; l < cfg.num_layers; l++) {
        const LayerWeights *w = &weights.layers[l];
        float *k_layer = st.key_cache + (uint32_t)l * (uint32_t)st.kv_cap * (uint32_t)kv_dim;
        float *v_layer = st.value_cache + (uint32_t)l * (uint32_t)st.kv_cap * (uint32_t)kv_dim;
        for (int t = 0; t < n; t++) rmsnorm(st.xb + t * D, st.x + t * D, w->attn_norm, D, cfg.rms_norm_eps);
        matmul_lins(st.qkv, QKV, &w->lin[LIN_Q], 3, st.xb, D, n, 0, &st.qact);
        if (w->b_qkv)                                        /* Qwen2: q|k|v biases, before RoPE */
            for (int t = 0; t < n; t++)
                for (int j = 0; j < QKV; j++) st.qkv[t * QKV + j] += w->b_qkv[j];
        for (int t = 0; t < n; t++) {                        /* RoPE; K/V into the cache */
            int pos = start_pos + t;
            float *q = st.qkv + t * QKV, *k = q + q_dim, *v = k + kv_dim;
            const float *cs = st.rope_cos + pos * half, *sn = st.rope_sin + pos * half;
            for (int h = 0; h < cfg.num_heads; h++) rope(q + h * hd, cs, sn, half);
            for (int h = 0; h < cfg.num_kv_heads; h++) rope(k + h * hd, cs, sn, half);
            for (int i = 0; i < kv_dim; i++) {
                k_layer[pos * kv_dim + i] = k[i];
                v_layer[pos * kv_dim + i] = v[i];
            }
        }
        Step attention = { STEP_ATTEND, { 0 }, l, n, start_pos };
        run_step(&attention);
        matmul(st.x, D, &w->lin[LIN_O], st.att, q_dim, n, 1);
        for (int t = 0; t < n; t++) rmsnorm(st.xb + t * D, st.x + t * D, w->mlp_norm, D, cfg.rms_norm_eps);
        matmul_lins(st.gate_up, 2 * F, &w->lin[LIN_GATE], 2, st.xb, D, n, 0, &st.qact);
        for (int t = 0; t < n; t++) {
            const float *g = st.gate_up + t * 2 * F, *u = g + F;
            for (int i = 0; i < F; i++) st.act[t * F + i] = silu(g[i]) * u[i];
        }
        matmul(st.x, D, &w->lin[LIN_DOWN], st.act, F, n, 1);
    }
    for (int t = 0; t < n; t++) rmsnorm(st.xb + t * D, st.x + t * D, weights.final_norm, D, cfg.rms_norm_eps);
    matmul(st.logits, cfg.vocab_size, tied_head ? &weights.embed : &weights.lm_head, st.xb, D, n, 0);
}

/* Room for `need` positions in the K/V caches: new caches of max(need, twice the room) positions
 * (in steps of KV_INITIAL, at most cfg.max_context), the cached positions copied layer by layer
 * (the layer stride changes), the old ones left to the arena (it never frees: doubling keeps what
 * the caches ever held under twice the final ones, where growing by each chat turn's need would
 * pile up a copy a turn). Runs before a forward, on the calling thread, with no helper working.
 * ERR_OUT_OF_MEMORY when memory cannot grow (nothing changed then). */
static int grow_kv(int need) {
    if (need <= st.kv_cap) return OK;
    int cap = st.kv_cap * 2 > need ? st.kv_cap * 2 : need;
    cap = (cap + KV_INITIAL - 1) / KV_INITIAL * KV_INITIAL;
    if (cap > cfg.max_context) cap = cfg.max_context;
    uint32_t kv_dim = (uint32_t)(cfg.num_kv_heads * cfg.head_dim), L = (uint32_t)cfg.num_layers;
    if ((uint64_t)L * (uint64_t)cap * kv_dim * 8u > 0xFFFF0000ull) return ERR_OUT_OF_MEMORY;
    float *k = alloc_floats(L * (uint32_t)cap * kv_dim);
    float *v = k ? alloc_floats(L * (uint32_t)cap * kv_dim) : 0;
    if (!k || !v) return ERR_OUT_OF_MEMORY;
    uint32_t keep = (uint32_t)st.n_cached * kv_dim;
    for (uint32_t l = 0; l < L; l++) {              /* no libc here: a plain copy */
        const float *ks = st.key_cache + l * (uint32_t)st.kv_cap * kv_dim, *vs = st.value_cache + l * (uint32_t)st.kv_cap * kv_dim;
        float *kd = k + l * (uint32_t)cap * kv_dim, *vd = v + l * (uint32_t)cap * kv_dim;
        for (uint32_t i = 0; i < keep; i++) { kd[i] = ks[i]; vd[i] = vs[i]; }
    }
    st.key_cache = k;
    st.value_cache = v;
    st.kv_cap = cap;
    return OK;
}

static int forward(const int32_t *tokens, int n, int start_pos) {
    if (!built) return ERR_MODEL_LOAD;
    if (n <= 0 || n > max_block || start_pos < 0 || start_pos > st.n_cached) return ERR_BAD_ARGUMENT;
    if (start_pos + n > cfg.max_context) return ERR_CONTEXT_OVERFLOW;
    int grown = grow_kv(start_pos + n);
    if (grown != OK) return grown;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= cfg.vocab_size) return ERR_BAD_ARGUMENT;
    st.n_rows = 0;
    forward_block(tokens, n, start_pos);
    st.n_cached = start_pos + n;      /* logical rollback: anything beyond is forgotten */
    st.n_rows = n;
    return OK;
}

/* ============================================================================================
 * The round's decision: exactspec.core.acceptance.decide_round on the processed logits rows.
 * ========================================================================================== */

enum { ENDED_NONE = REC_ENDED_NONE, ENDED_STOP = REC_ENDED_STOP, ENDED_LENGTH = REC_ENDED_LENGTH };
enum { DECIDE_OK = REC_ERR_OK, DECIDE_TARGET_NUMERIC_OR_MASK = REC_ERR_E_TARGET_NUMERIC_OR_MASK,
       DECIDE_RESIDUAL_INVARIANT = REC_ERR_E_RESIDUAL_INVARIANT };

typedef struct {
    int32_t n_accepted;
    int32_t next_token;          /* -1: none */
    int32_t rejected_at;         /* -1: none */
    int32_t ended_by;            /* ENDED_* */
    int32_t error;               /* DECIDE_* */
} Decision;

typedef struct {
    double a;                    /* accept probability of the last accept test (NaN: none) */
    double u;                    /* its uniform */
    double score;                /* Gumbel score plog(w) + g of the sampled token (NaN: none) */
} DecisionDiag;

static int argmax_first(const double *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

/* categorical draw (Gumbel-max, float64) at (seed, domain, round, position); -1 if invalid */
static int sample_at(const double *w, uint32_t seed_lo, uint32_t seed_hi, uint32_t domain,
                     uint32_t round_id, uint32_t position, DecisionDiag *diag) {
    RoundKey rk = round_key(seed_lo, seed_hi, domain, round_id);
    int z = sample_gumbel_max(w, cfg.vocab_size, rk, position, proc.heap);
    if (z >= 0) diag->score = plog(w[z]) + gumbel(draw_bits(rk, position, (uint32_t)z));
    return z;
}

/* The rows a decision reads: decided row i is logits row row_offset + i of the last forward (rows
 * before row_offset were fed, e.g. forced grammar tokens, but are not decided on), masked in
 * processors step 3 by row_masks + i * ceil(V / 32) when row_masks is given (0: no per-row mask). */
typedef struct {
    int row_offset;
    const uint32_t *row_masks;   /* (n_rows, ceil(V / 32)) uint32 allowed-id bits, or 0 */
} DecideRows;

/* decided row i, processed with the context marks set so far; proc.work holds it */
static int process_block_row(const DecideRows *rows, int i) {
    const int V = cfg.vocab_size;
    const uint32_t *mask = rows->row_masks ? rows->row_masks + (uint32_t)i * (uint32_t)mask_words(V) : 0;
    return process_row_masked(st.logits + (uint32_t)(rows->row_offset + i) * (uint32_t)V, V, &pol, mask, &proc);
}

static void fail(Decision *d, int error) {
    d->n_accepted = 0;
    d->next_token = -1;
    d->rejected_at = -1;
    d->ended_by = ENDED_NONE;
    d->error = error;
}

static void decide(const DecideRows *rows, const int32_t *proposals, int m, const float *p_draft, uint32_t seed_lo,
                   uint32_t seed_hi, uint32_t round_id, int remaining, int greedy, Decision *d,
                   DecisionDiag *diag) {
    const int V = cfg.vocab_size;
    d->n_accepted = 0;
    d->next_token = -1;
    d->rejected_at = -1;
    d->ended_by = ENDED_NONE;
    d->error = DECIDE_OK;
    diag->a = diag->u = diag->score = __builtin_nan("");
    if (m == 0) {                                            /* baseline_step */
        if (process_block_row(rows, 0) != OK) { fail(d, DECIDE_TARGET_NUMERIC_OR_MASK); return; }
        d->next_token = greedy ? argmax_first(proc.work, V)
                               : sample_at(proc.work, seed_lo, seed_hi, DOMAIN_TARGET_BASELINE, round_id, 0, diag);
        if (d->next_token < 0) fail(d, DECIDE_TARGET_NUMERIC_OR_MASK);
        return;
    }
    RoundKey accept_key = round_key(seed_lo, seed_hi, DOMAIN_ACCEPT_UNIFORM, round_id);
    for (int i = 0; i < m; i++) {
        if (i > 0) proc.in_context[proposals[i - 1]] = 1;   /* row i sees proposals[:i] */
        if (process_block_row(rows, i) != OK) { fail(d, DECIDE_TARGET_NUMERIC_OR_MASK); return; }
        int y = proposals[i];
        int accepted;
        if (greedy) {
            int target = argmax_first(proc.work, V);
            accepted = y == target;
            if (!accepted) {
                d->next_token = target;
                d->rejected_at = i;
                return;
            }
        } else {
            /* min(1, p_target(y) / p_draft(y)) as Python's min: 1 unless the ratio is below 1 */
            const float *pd = p_draft + (uint32_t)i * (uint32_t)V;
            double ratio = proc.work[y] / (double)pd[y];
            diag->a = ratio < 1.0 ? ratio : 1.0;
            diag->u = uniform_open_closed(draw_bits(accept_key, (uint32_t)i, 0));
            accepted = diag->u <= diag->a;
            if (!accepted) {                                 /* residual [p_target - p_draft]_+ */
                double mass = 0.0;
                for (int j = 0; j < V; j++) {
                    double r = proc.work[j] - (double)pd[j];
                    st.residual[j] = r < 0.0 ? 0.0 : r;      /* NaN stays NaN, as np.maximum */
                    mass += st.residual[j];
                }
                if (!(mass > 0.0 && mass < POS_INF)) { fail(d, DECIDE_RESIDUAL_INVARIANT); return; }
                d->next_token = sample_at(st.residual, seed_lo, seed_hi, DOMAIN_CORRECTION_SAMPLE, round_id,
                                          (uint32_t)i, diag);
                d->rejected_at = i;
                return;
            }
        }
        d->n_accepted++;
        if (proc.is_stop[y]) { d->ended_by = ENDED_STOP; return; }
        if (d->n_accepted == remaining) { d->ended_by = ENDED_LENGTH; return; }
    }
    proc.in_context[proposals[m - 1]] = 1;                   /* the extra row sees all proposals */
    if (process_block_row(rows, m) != OK) { fail(d, DECIDE_TARGET_NUMERIC_OR_MASK); return; }
    d->next_token = greedy ? argmax_first(proc.work, V)
                           : sample_at(proc.work, seed_lo, seed_hi, DOMAIN_TARGET_EXTRA, round_id, 0, diag);
    if (d->next_token < 0) fail(d, DECIDE_TARGET_NUMERIC_OR_MASK);
}

/* float32 bits of a float64 (the record's diag words) */
static int32_t f32_word(double x) { union { float f; int32_t i; } v = { (float)x }; return v.i; }

/* decide() written as the round record's decision words (REC_N_ACCEPTED..REC_DIAG_A, protocol.json
 * round_record): int32 words, the three diagnostics as float32 bits */
static void decide_words(const DecideRows *rows, const int32_t *proposals, int m, const float *p_draft,
                         uint32_t seed_lo, uint32_t seed_hi, uint32_t round_id, int remaining, int greedy,
                         int32_t *words) {
    Decision d;
    DecisionDiag diag;
    decide(rows, proposals, m, p_draft, seed_lo, seed_hi, round_id, remaining, greedy, &d, &diag);
    words[REC_N_ACCEPTED] = d.n_accepted;
    words[REC_NEXT_TOKEN] = d.next_token;
    words[REC_REJECTED_AT] = d.rejected_at;
    words[REC_ENDED_BY] = d.ended_by;
    words[REC_DECISION_ERROR] = d.error;
    words[REC_DIAG_SCORE] = f32_word(diag.score);
    words[REC_DIAG_U] = f32_word(diag.u);
    words[REC_DIAG_A] = f32_word(diag.a);
}

/* ============================================================================================
 * The champion half as the CPU round (wasm/cpu.c) sees it (wasm/cpu.h)
 * ========================================================================================== */

int champ_built(void) { return built; }
int champ_vocab_size(void) { return cfg.vocab_size; }
int champ_max_block(void) { return max_block; }
Policy *champ_policy(void) { return &pol; }
ProcState *champ_proc(void) { return &proc; }
int champ_forward(const int32_t *tokens, int n, int start_pos) { return forward(tokens, n, start_pos); }
float *champ_logits(void) { return st.logits; }
void champ_decide_words(const int32_t *proposals, int m, const float *p_draft, uint32_t seed_lo, uint32_t seed_hi,
                        uint32_t round_id, int remaining, int greedy, int32_t *words) {
    const DecideRows rows = { 0, 0 };                        /* the CPU round: rows 0..m, no masks */
    decide_words(&rows, proposals, m, p_draft, seed_lo, seed_hi, round_id, remaining, greedy, words);
}

/* ============================================================================================
 * Exports (the JS side is web/champion_wasm/champion_wasm.mjs)
 * ========================================================================================== */

/* tensor kinds of champion_tensor_ptr: HF tensors, placed inside the fused layer buffers */
enum {
    T_EMBED = 0, T_FINAL_NORM = 1,
    T_ATTN_NORM = 10, T_MLP_NORM = 11,
    T_WQ = 12, T_WK = 13, T_WV = 14, T_WO = 15, T_W_GATE = 16, T_W_UP = 17, T_W_DOWN = 18,
    T_SQ = 22, T_SK = 23, T_SV = 24, T_SO = 25, T_S_GATE = 26, T_S_UP = 27, T_S_DOWN = 28,
    T_LM_HEAD = 2, T_S_LM_HEAD = 3, T_S_EMBED = 4, T_BQ = 32, T_BK = 33, T_BV = 34,
};

EXPORT("champion_build_config")
int champion_build_config(int vocab_size, int hidden_size, int intermediate_size, int num_layers,
                          int num_heads, int num_kv_heads, int head_dim, int max_context,
                          int block, double rms_norm_eps, double rope_theta, int q8_storage,
                          int qkv_bias, int tied, int q8_embedding) {
    if (built || weights.layers) return ERR_MODEL_LOAD;
    if (q8_storage < 0 || q8_storage > 2) return ERR_MODEL_LOAD;
    default_fmt = q8_storage == 0 ? QF_F32 : q8_storage == 1 ? QF_I8F : QF_ROWQ8;
    has_qkv_bias = qkv_bias != 0;
    tied_head = tied != 0;
    embed_q8 = q8_embedding != 0;
    if (block <= 0 || block > 64 || config_set(&cfg, vocab_size, hidden_size, intermediate_size, num_layers, num_heads,
                                               num_kv_heads, head_dim, max_context, rms_norm_eps, rope_theta) != OK)
        return ERR_MODEL_LOAD;
    max_block = block;
    int status = plan_weights();
    if (status == OK) status = build_run_state();
    if (status == OK) status = build_proc_state(&proc, &pol, vocab_size);
    return status;
}

/* the linear of a tensor kind (T_EMBED, T_LM_HEAD, T_WQ .. T_W_DOWN), or 0 */
static QLin *lin_of(int kind, int layer) {
    if (!weights.layers) return 0;
    if (kind == T_EMBED) return &weights.embed;
    if (kind == T_LM_HEAD) return tied_head ? 0 : &weights.lm_head;
    if (kind < T_WQ || kind > T_W_DOWN || layer < 0 || layer >= cfg.num_layers) return 0;
    return &weights.layers[layer].lin[kind - T_WQ];
}

/* set a linear's format (layer -1: that linear in every layer), before the weights are allocated:
 * ERR_MODEL_LOAD for an unknown format, input width not a multiple of its block, an int8 / q8act
 * format for a float-only embedding, or a call after the first champion_tensor_ptr */
EXPORT("champion_set_format") int champion_set_format(int kind, int layer, int fmt) {
    if (!weights.layers || weights_ready || !qf_known(fmt)) return ERR_MODEL_LOAD;
    int l0 = layer < 0 ? 0 : layer, l1 = layer < 0 ? cfg.num_layers : layer + 1;
    if (kind == T_EMBED || kind == T_LM_HEAD) l0 = 0, l1 = 1;
    for (int l = l0; l < l1; l++) {
        QLin *L = lin_of(kind, l);
        if (!L || !qf_cols_ok(fmt, L->cols)) return ERR_MODEL_LOAD;
        if (kind == T_EMBED && !embed_q8 && (fmt == QF_I8F || fmt == QF_ROWQ8)) return ERR_MODEL_LOAD;
        L->fmt = fmt;
    }
    return OK;
}

/* allocate every weight buffer in the formats set so far (champion_tensor_ptr does it at its first
 * call): ERR_OUT_OF_MEMORY, before anything is written, when they cannot fit wasm32's 4 GiB or
 * memory cannot grow; OK if already allocated */
EXPORT("champion_alloc_weights") int champion_alloc_weights(void) {
    if (!weights.layers) return ERR_MODEL_LOAD;
    if (weights_ready) return OK;
    if (planned_weight_bytes(1) > 0xFFFF0000ull) return ERR_OUT_OF_MEMORY;
    return build_weights();
}

/* destination of one tensor (HF (out, in) layout) in its linear's format (values as the format
 * lays them out: float32, int8, or the GGUF blocks as in the file), the scales and the rest
 * float32; 0 if the kind is unknown or has no buffer (the scales of a block format). The first
 * call allocates every weight buffer. */
EXPORT("champion_tensor_ptr") void *champion_tensor_ptr(int kind, int layer) {
    if (!weights.layers) return 0;
    if (champion_alloc_weights() != OK) return 0;
    QLin *L = lin_of(kind, layer);
    if (L) return (void *)L->w;
    if (kind == T_S_EMBED) return (void *)weights.embed.scale;
    if (kind == T_S_LM_HEAD) return tied_head ? 0 : (void *)weights.lm_head.scale;
    if (kind == T_FINAL_NORM) return weights.final_norm;
    if (layer < 0 || layer >= cfg.num_layers) return 0;
    LayerWeights *w = &weights.layers[layer];
    uint32_t q_dim = (uint32_t)(cfg.num_heads * cfg.head_dim), kv_dim = (uint32_t)(cfg.num_kv_heads * cfg.head_dim);
    switch (kind) {
        case T_ATTN_NORM: return w->attn_norm;
        case T_MLP_NORM: return w->mlp_norm;
        case T_SQ: case T_SK: case T_SV: case T_SO: case T_S_GATE: case T_S_UP: case T_S_DOWN:
            return (void *)w->lin[kind - T_SQ].scale;
        case T_BQ: return w->b_qkv;
        case T_BK: return w->b_qkv ? w->b_qkv + q_dim : 0;
        case T_BV: return w->b_qkv ? w->b_qkv + q_dim + kv_dim : 0;
        default: return 0;
    }
}

/* bytes of the buffer champion_tensor_ptr(kind, layer) returns (0: none) */
EXPORT("champion_tensor_bytes") uint32_t champion_tensor_bytes(int kind, int layer) {
    if (!champion_tensor_ptr(kind, layer)) return 0;
    QLin *L = lin_of(kind, layer);
    if (L) return qf_row_bytes(L->fmt, L->cols) * (uint32_t)L->rows;
    uint32_t D = (uint32_t)cfg.hidden_size, q_dim = (uint32_t)(cfg.num_heads * cfg.head_dim);
    uint32_t kv_dim = (uint32_t)(cfg.num_kv_heads * cfg.head_dim);
    switch (kind) {
        case T_S_EMBED: return (uint32_t)weights.embed.rows * 4u;
        case T_S_LM_HEAD: return (uint32_t)weights.lm_head.rows * 4u;
        case T_FINAL_NORM: case T_ATTN_NORM: case T_MLP_NORM: return D * 4u;
        case T_SQ: case T_SK: case T_SV: case T_SO: case T_S_GATE: case T_S_UP: case T_S_DOWN:
            return (uint32_t)weights.layers[layer].lin[kind - T_SQ].rows * 4u;
        case T_BQ: return q_dim * 4u;
        case T_BK: case T_BV: return kv_dim * 4u;
        default: return 0;
    }
}

/* the format of a tensor kind's linear (-1: not a linear) */
EXPORT("champion_tensor_format") int champion_tensor_format(int kind, int layer) {
    QLin *L = lin_of(kind, layer);
    return L ? L->fmt : -1;
}

/* bytes of every weight buffer (0 before the first champion_tensor_ptr) */
EXPORT("champion_weight_bytes") uint32_t champion_weight_bytes(void) { return weight_bytes; }

/* RoPE from explicit inverse frequencies (hd/2 float64: scaled RoPE, computed by JS as
 * exactspec.formats.config.rope_inv_freq does); the default tables come from rope_theta at build time */
EXPORT("champion_set_inv_freq") int champion_set_inv_freq(const double *inv_freq) {
    if (!st.rope_cos || built) return ERR_MODEL_LOAD;
    return rope_tables_from_inv_freq(st.rope_cos, st.rope_sin, cfg.max_context, cfg.head_dim, inv_freq);
}

EXPORT("champion_check") int champion_check(void) {
    if (!weights_ready || !st.logits || !proc.work) return ERR_MODEL_LOAD;
    if (qlin_bad_scale_row(&weights.embed) || (!tied_head && qlin_bad_scale_row(&weights.lm_head))) return ERR_MODEL_LOAD;
    for (int l = 0; l < cfg.num_layers; l++)        /* a non-finite f16 block scale */
        for (int i = 0; i < LIN_COUNT; i++)
            if (qlin_bad_scale_row(&weights.layers[l].lin[i])) return ERR_MODEL_LOAD;
    built = 1;
    return OK;
}

EXPORT("champion_forward") int champion_forward(const int32_t *tokens, int n, int start_pos) {
    return forward(tokens, n, start_pos);
}

EXPORT("champion_logits") float *champion_logits(void) { return st.logits; }
EXPORT("champion_n_cached") int champion_n_cached(void) { return st.n_cached; }
/* positions the K/V caches have room for now (they grow on demand up to max_context) */
EXPORT("champion_kv_capacity") int champion_kv_capacity(void) { return st.kv_cap; }
/* room for n positions now (grow_kv): a request reserves its prompt and its length before its
 * prefill, so a long prompt grows the caches once, not by a doubling every 512 positions */
EXPORT("champion_reserve_kv") int champion_reserve_kv(int n) {
    if (!built) return ERR_MODEL_LOAD;
    if (n < 1 || n > cfg.max_context) return ERR_CONTEXT_OVERFLOW;
    return grow_kv(n);
}
EXPORT("champion_n_rows") int champion_n_rows(void) { return st.n_rows; }

/* test hook: the next decide() reads these n rows (already written at champion_logits()) */
EXPORT("champion_set_n_rows") int champion_set_n_rows(int n) {
    if (n < 0 || n > max_block) return ERR_BAD_ARGUMENT;
    st.n_rows = n;
    return OK;
}

EXPORT("champion_set_policy")
int champion_set_policy(double temperature, int top_k, double top_p, double repetition_penalty) {
    return policy_set(&pol, temperature, top_k, top_p, repetition_penalty);
}

/* n_allowed < 0: no grammar mask; otherwise only allowed[0..n_allowed) are allowed */
EXPORT("champion_set_masks")
int champion_set_masks(const int32_t *suppress, int n_suppress, const int32_t *allowed, int n_allowed) {
    return policy_set_masks(&pol, cfg.vocab_size, suppress, n_suppress, allowed, n_allowed);
}

/* One round on the last forward's logits rows row_offset .. row_offset + n_rows - 1 (n_rows == m + 1;
 * row_offset + n_rows <= the rows the last forward kept; the rows before row_offset are not decided
 * on), decided row i masked in processors step 3 by row_masks (n_rows, ceil(V / 32)) uint32
 * allowed-id bits (ANDed with the policy's allowed ids; 0: none). out: (REC_DECISION_WORDS,) int32,
 * the round record's decision words (protocol.json round_record, wasm/round_record.h): n_accepted,
 * next_token (-1 none), rejected_at (-1 none), ended_by (0 | 1 stop | 2 length), decision_error
 * (0 | 1 E_TARGET_NUMERIC_OR_MASK | 2 E_RESIDUAL_INVARIANT), then diag_score, diag_u, diag_a as
 * float32 bits (NaN: none). */
EXPORT("champion_decide")
int champion_decide(int n_rows, const int32_t *proposals, int m, const float *p_draft,
                    const int32_t *context, int n_context, uint32_t seed_lo, uint32_t seed_hi,
                    uint32_t round_id, const int32_t *stops, int n_stops, int remaining, int greedy,
                    int row_offset, const uint32_t *row_masks, int32_t *out) {
    int V = cfg.vocab_size;
    if (!built || m < 0 || n_rows != m + 1 || row_offset < 0 || row_offset > st.n_rows - n_rows) return ERR_BAD_ARGUMENT;
    if (m > 0 && (remaining < m || (!greedy && !p_draft))) return ERR_BAD_ARGUMENT;
    for (int i = 0; i < m; i++) if (proposals[i] < 0 || proposals[i] >= V) return ERR_BAD_ARGUMENT;
    for (int i = 0; i < n_context; i++) if (context[i] < 0 || context[i] >= V) return ERR_BAD_ARGUMENT;
    zero_bytes(proc.in_context, (uint32_t)V);
    for (int i = 0; i < n_context; i++) proc.in_context[context[i]] = 1;
    zero_bytes(proc.is_stop, (uint32_t)V);
    for (int i = 0; i < n_stops; i++)                       /* ids outside [0, V) cannot occur */
        if (stops[i] >= 0 && stops[i] < V) proc.is_stop[stops[i]] = 1;
    const DecideRows rows = { row_offset, row_masks };
    decide_words(&rows, proposals, m, p_draft, seed_lo, seed_hi, round_id, remaining, greedy, out);
    return OK;
}

/* ============================================================================================
 * Test hook: one matmul on the caller's buffers (any format; through the thread pool when one
 * runs). out (n, rows) = x (n, cols) times the weights w (rows, cols) in fmt, with row scales
 * `scale` (ROWQ8 / I8F; optional for F32). Works before any model is loaded.
 * ========================================================================================== */

static QAct test_act;
static uint32_t test_act_capacity;   /* elements of test_act.q */

EXPORT("champion_qmatmul")
int champion_qmatmul(int fmt, const uint8_t *w, const float *scale, const float *x, int n, int rows, int cols,
                     float *out) {
    if (!qf_cols_ok(fmt, cols) || n <= 0 || n > 64 || rows <= 0 || !w || !x || !out) return ERR_BAD_ARGUMENT;
    if ((fmt == QF_ROWQ8 || fmt == QF_I8F) && !scale) return ERR_BAD_ARGUMENT;
    uint32_t need = (uint32_t)n * (uint32_t)cols;
    if (need > test_act_capacity) {
        test_act.q = (int16_t *)arena_alloc(need * 2u);
        test_act.q8 = (int8_t *)arena_alloc(need);
        test_act.d = (float *)arena_alloc((need / 32u + 1u) * 4u);
        test_act.s = (int32_t *)arena_alloc((need / 32u + 1u) * 4u);
        if (!test_act.q || !test_act.q8 || !test_act.d || !test_act.s) { test_act_capacity = 0; return ERR_OUT_OF_MEMORY; }
        test_act_capacity = need;
    }
    QLin L = { w, scale, fmt, rows, cols };
    matmul_lins(out, rows, &L, 1, x, cols, n, 0, &test_act);
    return OK;
}

/* the load-time check of champion_check on the caller's weights: ERR_MODEL_LOAD if a block's f16
 * scale is not finite (kept out of champion_qmatmul, whose time the benchmarks read) */
EXPORT("champion_qmatmul_check") int champion_qmatmul_check(int fmt, const uint8_t *w, int rows, int cols) {
    if (!qf_cols_ok(fmt, cols) || rows <= 0 || !w) return ERR_BAD_ARGUMENT;
    QLin L = { w, 0, fmt, rows, cols };
    return qlin_bad_scale_row(&L) ? ERR_MODEL_LOAD : OK;
}
