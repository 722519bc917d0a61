/* draft.c — the exactspec draft model in WASM-SIMD: Llama forward pass (f32 weights, f32x4
 * mat-vec), the processors-v1 pipeline (float64) and the addressed Gumbel-max sampler of
 * docs/rng.md, so a proposal drawn here equals the NumPy reference's for the same address.
 *
 * Build: wasm/build.sh (clang 14, --target=wasm32 -msimd128 -ffreestanding -nostdlib
 * -ffp-contract=off), linked with champion.c, cpu.c and common.c into one module
 * (web/build/cpu.wasm). No libc, no libm: exp, sin/cos, frexp and the portable log are written
 * from IEEE basic operations in common.c (shared with champion.c), as are the RNG, the sampler
 * and processors-v1. JS (web/draft/draft.mjs) parses the safetensors header,
 * copies the file into this module's memory and tells the C side where each tensor lies.
 *
 * One draft per instance. Calls from JS, in order:
 *   draft_alloc(bytes) -> ptr            bump allocation (the weights file, argument buffers)
 *   draft_build_config(...)              hyper-parameters; allocates the run state + KV cache
 *   draft_set_tensor(kind, layer, ptr)   one call per tensor (f32, HF (out, in) layout)
 *   draft_set_restriction(...)           optional: a restricted vocabulary (docs/draft_wasm.md)
 *   draft_check()                        0 when every tensor is present
 *   draft_forward / draft_set_policy / draft_set_context / draft_process / draft_propose
 * Errors are the status codes of protocol.json's wasm_status (wasm_status.h); JS maps them through
 * web/wasm_status.mjs, the same table as the champion's.
 */
#include "common.h"
#include "cpu.h"

EXPORT("draft_alloc") void *draft_alloc(uint32_t nbytes) { return arena_alloc(nbytes); }

/* ============================================================================================
 * Model: config, weights (pointers into the copied safetensors file), run state, KV cache.
 * ========================================================================================== */

typedef struct {
    const float *attn_norm;      /* (D,) input_layernorm */
    const float *wq;             /* (H*hd, D) */
    const float *wk;             /* (KV*hd, D) */
    const float *wv;             /* (KV*hd, D) */
    const float *bq, *bk, *bv;   /* (H*hd,), (KV*hd,), (KV*hd,) q/k/v biases (Qwen2), or 0 */
    const float *wo;             /* (D, H*hd) */
    const float *mlp_norm;       /* (D,) post_attention_layernorm */
    const float *w_gate;         /* (F, D) */
    const float *w_up;           /* (F, D) */
    const float *w_down;         /* (D, F) */
} LayerWeights;

typedef struct {
    const float *embed;          /* (V, D) embed_tokens, or (M, D) with embed_rows */
    const float *final_norm;     /* (D,) model.norm */
    const float *lm_head;        /* (V, D); == embed when tied; (N, D) with head_ids */
    LayerWeights *layers;        /* (L,) */
    /* restricted vocabulary (exactspec.head_ids / exactspec.embed_rows), or 0: the full one */
    const int32_t *head_ids;     /* (N,) strictly ascending ids: the LM head's rows */
    int n_head;                  /* N */
    float *head_out;             /* (N,) scratch: the head's N logits before the scatter */
    const int32_t *embed_rows;   /* (V,) token t's embedding is row embed_rows[t] */
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
        return ERR_OUT_OF_MEMORY;
    build_rope_tables(s->rope_cos, s->rope_sin, c->max_context, c->head_dim, c->rope_theta);
    return OK;
}

/* the arena cannot return memory; freeing forgets the pointers (one model per instance) */
static void free_run_state(RunState *s) { zero_bytes(s, sizeof(*s)); }


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


/* one token at position pos: updates the KV cache; logits only if want_logits */
static void forward_token(int token, int pos, int want_logits) {
    const Config *c = &cfg;
    int D = c->hidden_size, hd = c->head_dim, half = hd / 2;
    int kv_dim = c->num_kv_heads * hd, q_dim = c->num_heads * hd;
    int group = c->num_heads / c->num_kv_heads;
    float scale = (float)(1.0 / __builtin_sqrt((double)hd));
    const float *cs = st.rope_cos + pos * half, *sn = st.rope_sin + pos * half;
    int row = weights.embed_rows ? weights.embed_rows[token] : token;
    const float *emb = weights.embed + (uint32_t)row * (uint32_t)D;
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
        if (w->bq) {                                          /* Qwen2: biases before RoPE */
            for (int i = 0; i < q_dim; i++) st.q[i] += w->bq[i];
            for (int i = 0; i < kv_dim; i++) { k_pos[i] += w->bk[i]; v_pos[i] += w->bv[i]; }
        }
        for (int h = 0; h < c->num_heads; h++) rope(st.q + h * hd, cs, sn, half);
        for (int h = 0; h < c->num_kv_heads; h++) rope(k_pos + h * hd, cs, sn, half);

        for (int h = 0; h < c->num_heads; h++)                /* HF repeat_kv: kv head h // group */
            attend_head(st.att_out + h * hd, st.q + h * hd, k_layer, v_layer, kv_dim, hd, (h / group) * hd, pos,
                        scale, st.scores);
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
        if (!weights.head_ids) {
            matvec(st.logits, weights.lm_head, st.xb, c->vocab_size, D);
        } else {   /* the same per-row dot products on N rows, scattered; -inf elsewhere */
            matvec(weights.head_out, weights.lm_head, st.xb, weights.n_head, D);
            for (int i = 0; i < c->vocab_size; i++) st.logits[i] = -__builtin_inff();
            for (int j = 0; j < weights.n_head; j++) st.logits[weights.head_ids[j]] = weights.head_out[j];
        }
    }
}

/* feed tokens at [start_pos, start_pos + n); logits of the last one land in st.logits */
static int forward(const int32_t *tokens, int n, int start_pos) {
    if (!built) return ERR_MODEL_LOAD;
    if (n <= 0 || start_pos < 0 || start_pos > st.n_cached) return ERR_BAD_ARGUMENT;
    if (start_pos + n > cfg.max_context) return ERR_CONTEXT_OVERFLOW;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= cfg.vocab_size) return ERR_BAD_ARGUMENT;
    for (int i = 0; i < n; i++) forward_token(tokens[i], start_pos + i, i == n - 1);
    st.n_cached = start_pos + n;      /* logical rollback: anything beyond is forgotten */
    return OK;
}


/* ============================================================================================
 * Propose: feed the unmaterialised tokens, then up to k proposals (stop after a stop token),
 * each from its processed row; exactly exactspec.core.backends.RunnerDraft.propose. Proposal i
 * draws at step counter first_step + i (so k = 1 calls with first_step 0, 1, ... give one k-call's
 * tokens); mask_bits (ceil(V / 32),) uint32 allowed-id bits, or 0, masks every row in processors
 * step 3 (the rows written out are the masked processed rows).
 * ========================================================================================== */

static int n_proposed;

static int propose(const int32_t *feed, int n_feed, int start_pos, int k, uint32_t seed_lo,
                   uint32_t seed_hi, uint32_t round_id, uint32_t first_step, const uint32_t *mask_bits,
                   int32_t *out_tokens, float *out_rows) {
    int V = cfg.vocab_size;
    n_proposed = 0;
    if (k < 0) return ERR_BAD_ARGUMENT;
    int status = forward(feed, n_feed, start_pos);
    if (status != OK) return status;
    RoundKey rk = round_key(seed_lo, seed_hi, DOMAIN_DRAFT_SAMPLE, round_id);
    int pos = start_pos + n_feed;
    for (int i = 0; i < k; i++) {
        status = process_row_masked(st.logits, cfg.vocab_size, &pol, mask_bits, &proc);
        if (status != OK) return status;
        int y;
        if (pol.temperature == 0.0) {
            y = 0;
            for (int j = 1; j < V; j++) if (proc.work[j] > proc.work[y]) y = j;
        } else {
            y = sample_gumbel_max(proc.work, V, rk, first_step + (uint32_t)i, proc.heap);
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
 * The draft half as the CPU round (wasm/cpu.c) sees it (wasm/cpu.h)
 * ========================================================================================== */

int draft_built(void) { return built; }
int draft_vocab_size(void) { return cfg.vocab_size; }
Policy *draft_policy(void) { return &pol; }
ProcState *draft_proc(void) { return &proc; }
int draft_propose_rows(const int32_t *feed, int n_feed, int start_pos, int k, uint32_t seed_lo, uint32_t seed_hi,
                       uint32_t round_id, int32_t *out_tokens, float *out_rows, int *n_out) {
    int status = propose(feed, n_feed, start_pos, k, seed_lo, seed_hi, round_id, 0, 0, out_tokens, out_rows);
    *n_out = n_proposed;
    return status;
}

/* ============================================================================================
 * Exports (the JS side is web/draft/draft.mjs)
 * ========================================================================================== */

enum {
    T_EMBED = 0, T_FINAL_NORM = 1, T_LM_HEAD = 2,
    T_ATTN_NORM = 10, T_WQ = 11, T_WK = 12, T_WV = 13, T_WO = 14,
    T_MLP_NORM = 15, T_W_GATE = 16, T_W_UP = 17, T_W_DOWN = 18,
    T_BQ = 20, T_BK = 21, T_BV = 22,
};

EXPORT("draft_build_config")
int draft_build_config(int vocab_size, int hidden_size, int intermediate_size, int num_layers,
                       int num_heads, int num_kv_heads, int head_dim, int max_context,
                       double rms_norm_eps, double rope_theta) {
    if (built) return ERR_MODEL_LOAD;
    if (config_set(&cfg, vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
                   head_dim, max_context, rms_norm_eps, rope_theta) != OK)
        return ERR_MODEL_LOAD;
    weights.layers = (LayerWeights *)arena_alloc((uint32_t)num_layers * sizeof(LayerWeights));
    if (!weights.layers) return ERR_OUT_OF_MEMORY;
    zero_bytes(weights.layers, (uint32_t)num_layers * sizeof(LayerWeights));
    int status = build_run_state(&st, &cfg);
    if (status == OK) status = build_proc_state(&proc, &pol, vocab_size);
    return status;
}

EXPORT("draft_set_tensor") int draft_set_tensor(int kind, int layer, const float *ptr) {
    if (kind >= T_ATTN_NORM && (layer < 0 || layer >= cfg.num_layers)) return ERR_MODEL_LOAD;
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
        case T_BQ: w->bq = ptr; break;
        case T_BK: w->bk = ptr; break;
        case T_BV: w->bv = ptr; break;
        default: return ERR_MODEL_LOAD;
    }
    return OK;
}

/* A restricted vocabulary (either pointer may be 0): head_ids (n_head,) strictly ascending in
 * [0, V), the LM head set with n_head rows; embed_rows (V,) in [0, n_embed_rows), the embedding
 * set with n_embed_rows rows. JS checks them first (web/model_checks.mjs); checked again here
 * because a bad id would read or write outside the weights. */
EXPORT("draft_set_restriction")
int draft_set_restriction(const int32_t *head_ids, int n_head, const int32_t *embed_rows, int n_embed_rows) {
    int V = cfg.vocab_size;
    if (built || !st.logits) return ERR_MODEL_LOAD;
    if (head_ids) {
        if (n_head < 1 || n_head > V) return ERR_MODEL_LOAD;
        for (int j = 0; j < n_head; j++)
            if (head_ids[j] < 0 || head_ids[j] >= V || (j > 0 && head_ids[j] <= head_ids[j - 1])) return ERR_MODEL_LOAD;
        weights.head_out = alloc_floats((uint32_t)n_head);
        if (!weights.head_out) return ERR_OUT_OF_MEMORY;
        weights.head_ids = head_ids;
        weights.n_head = n_head;
    }
    if (embed_rows) {
        if (n_embed_rows < 1 || n_embed_rows > V) return ERR_MODEL_LOAD;
        for (int t = 0; t < V; t++)
            if (embed_rows[t] < 0 || embed_rows[t] >= n_embed_rows) return ERR_MODEL_LOAD;
        weights.embed_rows = embed_rows;
    }
    return OK;
}

/* RoPE from explicit inverse frequencies (hd/2 float64: scaled RoPE, computed by JS as
 * exactspec.formats.config.rope_inv_freq does); by default the tables come from rope_theta */
EXPORT("draft_set_inv_freq") int draft_set_inv_freq(const double *inv_freq) {
    if (built || !st.rope_cos) return ERR_MODEL_LOAD;
    return rope_tables_from_inv_freq(st.rope_cos, st.rope_sin, cfg.max_context, cfg.head_dim, inv_freq);
}

/* every tensor present? (the LM head defaults to the embedding: tied) */
EXPORT("draft_check") int draft_check(void) {
    if (!weights.embed || !weights.final_norm || !weights.layers) return ERR_MODEL_LOAD;
    if ((weights.head_ids || weights.embed_rows) && !weights.lm_head) return ERR_MODEL_LOAD;   /* untied only */
    if (!weights.lm_head) weights.lm_head = weights.embed;
    for (int l = 0; l < cfg.num_layers; l++) {
        const LayerWeights *w = &weights.layers[l];
        if (!w->attn_norm || !w->wq || !w->wk || !w->wv || !w->wo || !w->mlp_norm ||
            !w->w_gate || !w->w_up || !w->w_down || (!w->bq != !w->bk) || (!w->bq != !w->bv))
            return ERR_MODEL_LOAD;
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
    return policy_set(&pol, temperature, top_k, top_p, repetition_penalty);
}

/* n < 0: no grammar mask; otherwise only ids[0..n) are allowed */
EXPORT("draft_set_masks")
int draft_set_masks(const int32_t *suppress, int n_suppress, const int32_t *allowed, int n_allowed) {
    return policy_set_masks(&pol, cfg.vocab_size, suppress, n_suppress, allowed, n_allowed);
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
    int status = process_row(logits, cfg.vocab_size, &pol, &proc);
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

/* out_tokens (k,) int32, out_rows (k, V) f32; first_step: proposal i draws at step first_step + i
 * (first_step + k <= 2^32, checked by JS); mask_bits (ceil(V / 32),) uint32 allowed-id bits or 0 */
EXPORT("draft_propose")
int draft_propose(const int32_t *feed, int n_feed, int start_pos, int k, uint32_t seed_lo,
                  uint32_t seed_hi, uint32_t round_id, int32_t *out_tokens, float *out_rows,
                  uint32_t first_step, const uint32_t *mask_bits) {
    return propose(feed, n_feed, start_pos, k, seed_lo, seed_hi, round_id, first_step, mask_bits, out_tokens,
                   out_rows);
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
