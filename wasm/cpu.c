/* cpu.c — the CPU round: one export runs a whole speculative round inside linear memory (the
 * draft's proposal, or given proposals, or none; the champion's forward; the decision) and writes
 * the round record of protocol.json (wasm/round_record.h). Per-request state is set once by
 * cpu_begin; the context marks of the repetition penalty are then kept here, each round adding
 * its committed tokens (accepted proposals + the next token). docs/champion_wasm.md, "CPU round".
 *
 *   cpu_begin(champion policy + masks, draft policy + masks, stops, seed, context, greedy)
 *   cpu_round(k, round_id, remaining, given, champ_feed, n, start, draft_feed, n, start, record)
 *   cpu_chain(h, round_id, remaining, token, start, records): h baseline steps in one call
 *
 * The draft's rows never leave linear memory: they are written to `rows` and the decision reads
 * them there, the same float32 values the separate calls (draft_propose, then champion_decide with
 * the copied rows) see, so a round is bit for bit their composition (tests/test_cpu_module.py).
 * Timing words come from the imported clock env.cpu_now_ms (performance.now() in JS).
 */
#include "common.h"
#include "cpu.h"

__attribute__((import_module("env"), import_name("cpu_now_ms"))) double cpu_now_ms(void);

EXPORT("cpu_alloc") void *cpu_alloc(uint32_t nbytes) { return arena_alloc(nbytes); }

static struct {
    int V;                       /* 0 until the first cpu_begin allocated the buffers below */
    int begun;
    int greedy;
    uint32_t seed_lo, seed_hi;
    Policy champ_pol, draft_pol; /* the request's policies, with their own mask arrays */
    uint8_t *committed;          /* (V,) 1 = id in the committed context (repetition penalty) */
    uint8_t *stops;              /* (V,) 1 = stop id */
    int32_t *tokens;             /* (B,) this round's proposals */
    int32_t *feed;               /* (B,) the champion's block: pending token + proposals */
    float *rows;                 /* (B - 1, V) the proposals' processed rows (f32), draft or one-hot */
    int draft_failure;           /* status of the last draft failure (record status draft_failed) */
    int poison_rows;             /* fault injection: the next forward's first n rows become NaN */
} sess;

static int alloc_session(int V, int B) {
    Policy *pols[2] = { &sess.champ_pol, &sess.draft_pol };
    for (int i = 0; i < 2; i++) {
        pols[i]->suppressed = (uint8_t *)arena_alloc((uint32_t)V);
        pols[i]->allowed = (uint8_t *)arena_alloc((uint32_t)V);
        if (!pols[i]->suppressed || !pols[i]->allowed) return ERR_OUT_OF_MEMORY;
    }
    sess.committed = (uint8_t *)arena_alloc((uint32_t)V);
    sess.stops = (uint8_t *)arena_alloc((uint32_t)V);
    sess.tokens = (int32_t *)arena_alloc((uint32_t)B * 4u);
    sess.feed = (int32_t *)arena_alloc((uint32_t)B * 4u);
    sess.rows = (float *)arena_alloc((uint32_t)(B > 1 ? B - 1 : 1) * (uint32_t)V * 4u);
    if (!sess.committed || !sess.stops || !sess.tokens || !sess.feed || !sess.rows) return ERR_OUT_OF_MEMORY;
    sess.V = V;
    return OK;
}

static int set_policy(Policy *p, int V, double temperature, int top_k, double top_p, double repetition_penalty,
                      const int32_t *suppress, int n_suppress, const int32_t *allowed, int n_allowed) {
    int status = policy_set(p, temperature, top_k, top_p, repetition_penalty);
    return status != OK ? status : policy_set_masks(p, V, suppress, n_suppress, allowed, n_allowed);
}

/* The request's state, once: the champion's policy and masks (n_allowed < 0: no grammar mask), the
 * draft's (ignored when no draft is loaded), stop ids, seed, the committed context, greedy. */
EXPORT("cpu_begin")
int cpu_begin(double temperature, int top_k, double top_p, double repetition_penalty,
              const int32_t *suppress, int n_suppress, const int32_t *allowed, int n_allowed,
              double d_temperature, int d_top_k, double d_top_p, double d_repetition_penalty,
              const int32_t *d_suppress, int d_n_suppress, const int32_t *d_allowed, int d_n_allowed,
              const int32_t *stops, int n_stops, uint32_t seed_lo, uint32_t seed_hi,
              const int32_t *context, int n_context, int greedy) {
    sess.begun = 0;
    if (!champ_built()) return ERR_MODEL_LOAD;
    int V = champ_vocab_size();
    if (draft_built() && draft_vocab_size() != V) return ERR_BAD_ARGUMENT;
    if (!sess.V) {
        int status = alloc_session(V, champ_max_block());
        if (status != OK) return status;
    }
    int status = set_policy(&sess.champ_pol, V, temperature, top_k, top_p, repetition_penalty, suppress, n_suppress,
                            allowed, n_allowed);
    if (status != OK) return status;
    if (draft_built()) {
        status = set_policy(&sess.draft_pol, V, d_temperature, d_top_k, d_top_p, d_repetition_penalty, d_suppress,
                            d_n_suppress, d_allowed, d_n_allowed);
        if (status != OK) return status;
    }
    zero_bytes(sess.committed, (uint32_t)V);
    for (int i = 0; i < n_context; i++) {
        if (context[i] < 0 || context[i] >= V) return ERR_BAD_ARGUMENT;
        sess.committed[context[i]] = 1;
    }
    zero_bytes(sess.stops, (uint32_t)V);
    for (int i = 0; i < n_stops; i++)                       /* ids outside [0, V) cannot occur */
        if (stops[i] >= 0 && stops[i] < V) sess.stops[stops[i]] = 1;
    sess.seed_lo = seed_lo;
    sess.seed_hi = seed_hi;
    sess.greedy = greedy != 0;
    sess.begun = 1;
    return OK;
}

static void copy_bytes(uint8_t *dst, const uint8_t *src, int n) { for (int i = 0; i < n; i++) dst[i] = src[i]; }

static int32_t micros(double ms) { double us = ms * 1000.0; return us <= 0 ? 0 : us >= 2147483647.0 ? 2147483647 : (int32_t)(us + 0.5); }

/* draft mode: the draft's proposals into sess.tokens / sess.rows; -> its status, *m proposals */
static int draft_proposals(int k, uint32_t round_id, const int32_t *feed, int n_feed, int start, int *m) {
    Policy saved = *draft_policy();
    ProcState *proc = draft_proc();
    *draft_policy() = sess.draft_pol;
    copy_bytes(proc->in_context, sess.committed, sess.V);
    copy_bytes(proc->is_stop, sess.stops, sess.V);
    int status = draft_propose_rows(feed, n_feed, start, k, sess.seed_lo, sess.seed_hi, round_id, sess.tokens, sess.rows, m);
    *draft_policy() = saved;                                /* the separate calls keep their own */
    return status;
}

/* One round. given != 0: k given proposals (prompt lookup; their rows one-hot); else k > 0: the
 * draft proposes up to k from draft_feed at draft_start; k == 0: a baseline step. The champion runs
 * over [champ_feed[0], proposals...] at champ_start and decides; record (REC_FIXED_WORDS + k words)
 * gets the whole round record. A draft row that is invalid: status draft_invalid, no proposal, and
 * the baseline step runs. A draft that fails otherwise: status draft_failed, the champion does not
 * run, cpu_draft_failure() says why. Returns OK, or the status of a bad call / champion failure. */
EXPORT("cpu_round")
int cpu_round(int k, uint32_t round_id, int remaining, const int32_t *given, const int32_t *champ_feed,
              int n_champ_feed, int champ_start, const int32_t *draft_feed, int n_draft_feed, int draft_start,
              int32_t *record) {
    const int V = sess.V;
    if (!sess.begun || !champ_built()) return ERR_BAD_ARGUMENT;
    if (k < 0 || n_champ_feed != 1 || k + 1 > champ_max_block() || (k > 0 && remaining < k)) return ERR_BAD_ARGUMENT;
    if (!given && k > 0 && (!draft_built() || n_draft_feed < 1)) return ERR_BAD_ARGUMENT;
    for (int i = 0; given && i < k; i++) if (given[i] < 0 || given[i] >= V) return ERR_BAD_ARGUMENT;
    record[REC_N_ACCEPTED] = 0;
    record[REC_NEXT_TOKEN] = -1;
    record[REC_REJECTED_AT] = -1;
    record[REC_ENDED_BY] = REC_ENDED_NONE;
    record[REC_DECISION_ERROR] = REC_ERR_OK;
    record[REC_DIAG_SCORE] = record[REC_DIAG_U] = record[REC_DIAG_A] = 0x7fc00000;   /* f32 NaN: none */
    record[REC_STATUS] = REC_STATUS_VERIFIED;
    record[REC_DRAFT_US] = record[REC_VERIFY_US] = record[REC_N_PROPOSED] = 0;
    record[REC_N_FORCED] = 0;                               /* the one-call round never forces */
    double t0 = cpu_now_ms();
    int m = 0;
    if (given) {                                            /* prompt lookup: one-hot rows */
        m = k;
        for (int i = 0; i < m; i++) {
            sess.tokens[i] = given[i];
            float *row = sess.rows + (uint32_t)i * (uint32_t)V;
            zero_bytes(row, (uint32_t)V * 4u);
            row[given[i]] = 1.0f;
        }
    } else if (k > 0) {
        int status = draft_proposals(k, round_id, draft_feed, n_draft_feed, draft_start, &m);
        if (status == ERR_PROCESSOR_INVALID) {
            record[REC_STATUS] = REC_STATUS_DRAFT_INVALID;
            m = 0;                                          /* the baseline step runs below */
        } else if (status != OK) {
            record[REC_STATUS] = REC_STATUS_DRAFT_FAILED;
            record[REC_DRAFT_US] = micros(cpu_now_ms() - t0);
            sess.draft_failure = status;
            return OK;
        }
    }
    double t1 = cpu_now_ms();
    sess.feed[0] = champ_feed[0];
    for (int i = 0; i < m; i++) sess.feed[1 + i] = sess.tokens[i];
    int status = champ_forward(sess.feed, m + 1, champ_start);
    if (status != OK) return status;
    if (sess.poison_rows) {                                 /* fault injection (tests) */
        int n = sess.poison_rows < m + 1 ? sess.poison_rows : m + 1;
        float *logits = champ_logits();
        for (uint32_t j = 0; j < (uint32_t)n * (uint32_t)V; j++) logits[j] = __builtin_nanf("");
        sess.poison_rows = 0;
    }
    ProcState *proc = champ_proc();
    copy_bytes(proc->in_context, sess.committed, V);
    copy_bytes(proc->is_stop, sess.stops, V);
    Policy saved = *champ_policy();
    *champ_policy() = sess.champ_pol;
    champ_decide_words(sess.tokens, m, sess.greedy ? 0 : sess.rows, sess.seed_lo, sess.seed_hi, round_id,
                       remaining, sess.greedy, record);
    *champ_policy() = saved;
    double t2 = cpu_now_ms();
    if (record[REC_DECISION_ERROR] == REC_ERR_OK) {         /* the committed tokens join the context */
        for (int i = 0; i < record[REC_N_ACCEPTED]; i++) sess.committed[sess.tokens[i]] = 1;
        if (record[REC_NEXT_TOKEN] >= 0) sess.committed[record[REC_NEXT_TOKEN]] = 1;
    }
    record[REC_DRAFT_US] = given || k == 0 ? 0 : micros(t1 - t0);
    record[REC_VERIFY_US] = micros(t2 - t1);
    record[REC_N_PROPOSED] = m;
    for (int i = 0; i < m; i++) record[REC_FIXED_WORDS + i] = sess.tokens[i];
    return OK;
}

/* A chain of up to h baseline steps in one call (k = 0 rounds, as cpu_round runs them): step i is
 * round round_id + i with remaining - i tokens left, fed the previous step's next token (the first:
 * `token`) at champ_start + i; records (h, REC_FIXED_WORDS) get each step's record. The chain stops
 * after a step that ended the answer (a stop id, the length) or whose decision failed, so no step
 * follows what the caller must act on. -> the steps run (1..h); a bad call or a champion failure
 * in the first step: -status; one in a later step: the steps before it (the next call meets it). */
EXPORT("cpu_chain")
int cpu_chain(int h, uint32_t round_id, int remaining, int32_t token, int champ_start, int32_t *records) {
    if (h < 1 || remaining < 1) return -ERR_BAD_ARGUMENT;
    if (h > remaining) h = remaining;
    int32_t feed = token;
    for (int i = 0; i < h; i++) {
        int32_t *record = records + (uint32_t)i * REC_FIXED_WORDS;
        int status = cpu_round(0, round_id + (uint32_t)i, remaining - i, 0, &feed, 1, champ_start + i, 0, 0, 0, record);
        if (status != OK) return i ? i : -status;
        /* a baseline step's next token ends the answer when it is a stop id (the record's ended_by
         * speaks of accepted proposals only); the length ends it at h = remaining */
        if (record[REC_DECISION_ERROR] != REC_ERR_OK || (record[REC_ENDED_BY] & REC_ENDED_BY_MASK) != REC_ENDED_NONE
            || record[REC_NEXT_TOKEN] < 0 || sess.stops[record[REC_NEXT_TOKEN]])
            return i + 1;
        feed = record[REC_NEXT_TOKEN];
    }
    return h;
}

/* the status of the last draft failure (a record with status draft_failed) */
EXPORT("cpu_draft_failure") int cpu_draft_failure(void) { return sess.draft_failure; }

/* fault injection (tests): the next cpu_round's champion rows 0..n-1 become NaN after its forward */
EXPORT("cpu_inject_nan") void cpu_inject_nan(int n_rows) { sess.poison_rows = n_rows > 0 ? n_rows : 0; }
