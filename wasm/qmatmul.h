/* qmatmul.h — the q8act-v1 matmul (docs/quant_kernels.md): weights in their quantised blocks
 * (the q8 artifact's int8 rows, GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K), activations quantised per
 * block of 32 to int8 (table scales, exact ops), products summed in int32, the float work per
 * output element one fixed sequence (batch-invariant). NumPy twin: py/exactspec/twins/qmatmul_twins.py.
 */
#ifndef EXACTSPEC_WASM_QMATMUL_H
#define EXACTSPEC_WASM_QMATMUL_H

#include <stdint.h>
#include <wasm_simd128.h>

/* QMATMUL_RELAXED (cpu_relaxed.wasm, cpu_mt_relaxed.wasm): the Q4 formats' dot products with
 * i32x4.relaxed_dot_i8x16_i7x16_add_s (the nibbles 0..15 are the 7-bit operand, so the result is
 * deterministic and exact: the same int32 sums, the same bits, as the SIMD128 build) */
#ifndef QMATMUL_RELAXED
#define QMATMUL_RELAXED 0
#endif

/* weight formats: GGUF type ids for GGUF blocks; F32 / I8F are the float function
 * (docs/champion_wasm.md "q8 arithmetic"), everything else q8act */
enum { QF_F32 = 0, QF_Q4_0 = 2, QF_Q4_1 = 3, QF_Q8_0 = 8, QF_Q4_K = 12, QF_Q6_K = 14,
       QF_ROWQ8 = 100, QF_I8F = 101 };

int qf_known(int fmt);
int qf_is_q8act(int fmt);             /* ROWQ8 and the GGUF block formats */
int qf_cols_ok(int fmt, int cols);    /* cols a multiple of the format's block (F32/I8F: of 4) */
uint32_t qf_row_bytes(int fmt, int cols);

/* a linear's weights: (rows, cols) in fmt's layout, row-major; scale (rows,) f32 or 0 */
typedef struct {
    const uint8_t *w;
    const float *scale;          /* ROWQ8, I8F: required; F32: optional (1 x ... kept exactly) */
    int fmt, rows, cols;
} QLin;

/* quantised activations of n rows of K (K % 32 == 0) */
typedef struct {
    int16_t *q;                  /* (n, K) the int8 values, held as int16 */
    int8_t *q8;                  /* (n, K) the same as int8 (the relaxed-SIMD build's Q4 dot products) */
    float *d;                    /* (n, K/32) the block scales: 2^E STEP[j], 0 (zero block) or NaN */
    int32_t *s;                  /* (n, K/32) the sums of q per block */
    int n, K;
} QAct;

/* quantise x (n rows at stride x_stride, K each) into a (whose buffers hold at least n*K, n*K/32) */
void qact_quantize(QAct *a, const float *x, int x_stride, int n, int K);

/* out[t * out_stride + r] (=, or += when accumulate) the q8act row r of lin applied to
 * activation row t, for rows r in [r0, r1) and t < a->n */
void qmatmul_rows(const QLin *lin, const QAct *a, float *out, int out_stride, int accumulate, int r0, int r1);

/* row r of lin dequantised to float32 (the embedding gather's element formula), any format */
void qlin_dequant_row(const QLin *lin, int r, float *out);

/* 0 if every f16 scale of a block format is finite, else the first bad row + 1 */
int qlin_bad_scale_row(const QLin *lin);

#endif
