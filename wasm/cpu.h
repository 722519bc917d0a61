/* cpu.h — what each half of the CPU module (champion.c, draft.c) lends the CPU round (cpu.c). */
#ifndef EXACTSPEC_WASM_CPU_H
#define EXACTSPEC_WASM_CPU_H

#include "common.h"

/* champion half (champion.c) */
int champ_built(void);
int champ_vocab_size(void);
int champ_max_block(void);
Policy *champ_policy(void);
ProcState *champ_proc(void);
int champ_forward(const int32_t *tokens, int n, int start_pos);   /* logits rows 0..n-1 at champ_logits() */
float *champ_logits(void);
/* the round's decision on rows 0..m, written as the record's REC_DECISION_WORDS words; reads the
 * context marks and stop marks in champ_proc() (it adds the proposals to the context marks) */
void champ_decide_words(const int32_t *proposals, int m, const float *p_draft, uint32_t seed_lo, uint32_t seed_hi,
                        uint32_t round_id, int remaining, int greedy, int32_t *words);

/* draft half (draft.c) */
int draft_built(void);
int draft_vocab_size(void);
Policy *draft_policy(void);
ProcState *draft_proc(void);
/* RunnerDraft.propose: feed, then up to k proposals with their f32 processed rows (out_rows k x V);
 * *n_out proposals kept; ERR_PROCESSOR_INVALID for an invalid row */
int draft_propose_rows(const int32_t *feed, int n_feed, int start_pos, int k, uint32_t seed_lo, uint32_t seed_hi,
                       uint32_t round_id, int32_t *out_tokens, float *out_rows, int *n_out);

#endif
