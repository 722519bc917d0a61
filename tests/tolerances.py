"""The one table of numerical tolerances (GPU / WASM / float64 code against its reference twin).

Each entry is Tol(max_abs, max_rel, measured): a value passes if |got - want| <= max_abs +
max_rel * |want|. `measured` is the largest error seen when the entry was last set (absolute,
or relative for entries with max_abs == 0), on SwiftShader WebGPU / Node WASM; `pytest -s`
prints it. Every tolerance is at most ~20x its measurement (checked by tests/test_tolerances.py);
bitwise promises are Tol(0, 0, 0) or a direct bit comparison. Re-measure before changing an
entry and say why in the commit.

Decisions (a token choice) are not compared with a tolerance: they must be equal, except where
the reference's decision quantity lies within the error of what it is compared against:
- accept test `u <= a` (u is exact in f32): |u - a_ref| <= TOLERANCES["accept_probability"].max_abs;
- argmax of scores or logits: the reference gap between the two tokens <= flip_margin(name),
  twice the absolute tolerance of the scores (each side may move by it).
"""
from typing import NamedTuple


class Tol(NamedTuple):
    max_abs: float
    max_rel: float
    measured: float          # largest error measured (relative if max_abs == 0 < max_rel)


TOLERANCES = {
    # --- champion forward on WebGPU (float32) vs NumPy twins (tests/test_gpu_champion.py) ---------
    "embed": Tol(0.0, 0.0, measured=0.0),
    "rmsnorm": Tol(4e-5, 0.0, measured=3.6e-6),               # values to ~30
    "matmul_q8": Tol(1e-5, 0.0, measured=6.8e-7),
    "rope": Tol(3e-6, 0.0, measured=2.3e-7),
    "attention": Tol(2e-5, 0.0, measured=1.5e-6),
    "swiglu": Tol(2e-4, 0.0, measured=1.7e-5),                # values to ~400
    "matmul_f32": Tol(1.5e-5, 0.0, measured=1.2e-6),          # f32 linears and the LM head
    # whole model, q8 weights, f32 vs f64: tiny random 2.7e-6, trained champion 1.07e-5 (logits to
    # ~15), trained draft 8.1e-6; its flip_margin bounds greedy differences in test_browser_e2e.py
    "champion_logits_vs_reference": Tol(1.5e-4, 0.0, measured=1.07e-5),
    # WebGPU champion, matmul "q8act" (tests/test_gpu_blocks.py) vs the reference computing q8act and
    # vs the WASM champion's q8act: the matmuls the same function bit for bit (SwiftShader fuses
    # nothing), the rest of the forward float32 vs float64 (or another float32 order). Tiny q8
    # artifact (float tied head): 6.92e-7 vs the reference, 1.19e-6 vs WASM; GGUF blocks with a block
    # head: 0 (every quantised activation equal, so the head's logits are the same bits; 26 of 26 rows
    # bit-identical GPU vs WASM). An activation whose two values straddle a rounding boundary would
    # move its linear by one quantisation step: none does on these inputs
    "champion_logits_q8act": Tol(1.38e-5, 0.0, measured=1.19e-6),
    # --- tools/widen.py: widened pair vs the trained pair, both float64 reference (test_widen.py) --
    "widened_logprobs": Tol(2e-5, 0.0, measured=1.35e-6),      # log-softmax, champion 384-wide
    # --- Hugging Face folders: float64 reference vs transformers float32 (test_hf_models.py) ------
    # mid-size synthetic shapes, bf16 on disk, initializer_range 0.2 (logits to ~9), 96 positions
    "hf_reference_vs_transformers_f32": Tol(5e-4, 0.0, measured=3.9e-5),
    # SmolLM2-135M-Instruct Q4_1 GGUF, dequantised: our float64 reference vs transformers float32
    # (test_gguf_smollm2.py), "The capital of France is" (logits to ~27)
    "gguf_reference_vs_transformers_f32": Tol(5e-4, 0.0, measured=4.3e-5),
    # --- processors / acceptance on WebGPU vs processors.py / acceptance.py (test_gpu_accept.py) --
    "processed_probs": Tol(1.5e-5, 0.0, measured=1.09e-6),
    # decision quantities (harness diagnostics): the test sees 4.7e-7 / 5.2e-6 at V <= 1000; the
    # measured values are the V = 4096 run of docs/gpu_accept.md (score: residual cancellation)
    "accept_probability": Tol(2e-5, 0.0, measured=2.5e-6),   # |a_gpu - a_ref|
    "gumbel_score": Tol(2.5e-4, 0.0, measured=7.8e-5),        # |score_gpu - score_ref| of the winner
    "gumbel_f32": Tol(4e-6, 0.0, measured=4e-7),              # gumbel_f32(bits) vs rng.gumbel_np
    "plog_f32": Tol(0.0, 3e-7, measured=6.9e-8),              # plog_f32(w) vs portable_log, relative
    # --- draft in WASM vs NumPy reference draft (test_wasm_draft.py) -----------------------------
    "draft_logits": Tol(1e-4, 0.0, measured=1.5e-5),          # untied test model; shipped 2.9e-6
    "draft_probs_f64": Tol(2e-14, 0.0, measured=1.8e-15),     # float64 processed rows
    "draft_probs_f32": Tol(4e-7, 0.0, measured=3e-8),         # the same rows rounded to float32
    "wasm_sincos": Tol(2e-15, 0.0, measured=1.1e-16),         # angles to 600 rad
    # --- champion in WASM vs the NumPy references (test_wasm_champion.py) ---------------------------
    # whole model, q8 weights, f32 vs f64: tiny random 1.9e-6, odd-sized random (large
    # activations) 6.4e-5, trained champion 7.7e-6 (logits to ~17)
    "wasm_champion_logits": Tol(6e-4, 0.0, measured=6.44e-5),
    # matmul q8act-v1 (docs/quant_kernels.md) vs the reference computing q8act (matmul="q8act"): the
    # matmuls are the same function bit for bit, the rest of the forward float32 vs float64; an
    # activation that rounds to the other integer moves a linear's output by a quantisation step
    # Measured on the shipped champion (6 layers, float head: no row can be the same bits); where the
    # head is in blocks too, rows are the reference's bits until the first flip (llama3.2-mid and
    # smollm2-mid with a q8 embedding 50/50 rows, tiny GGUF files 24/24, the shipped champion 0/227)
    "wasm_champion_logits_q8act": Tol(1.0, 0.0, measured=0.162),
    # SmolLM2-135M-Instruct Q4_1 (30 layers, activation outliers): one activation rounded to the other
    # integer in an outlier's block moves every later row by ~1 (a single 1-ulp perturbation of the
    # reference's activations: 0.6-1.4), as much as q8act vs the float function (3.0) -- so this
    # entry is loose; the test also asks the first row to be the same bits (2/52 rows are) and each
    # greedy token to be the reference's argmax outside flip_margin (test_gguf_browser_wasm.py)
    # (the test's 52 rows 1.79; 64 rows of a chat turn + a sentence 2.09; the first 2 layers alone: 59/64
    # rows the same bits, 0.22 -- docs/reference_model.md)
    "wasm_champion_logits_q8act_smollm2": Tol(6.0, 0.0, measured=2.09),
    # decision quantities, float64 on both sides (exp and sum order differ): |a_wasm - a_ref| and
    # the sampled token's Gumbel score; flip_margin bounds where a decision may differ
    "wasm_accept_probability": Tol(3e-14, 0.0, measured=2.8e-15),
    "wasm_gumbel_score": Tol(1.5e-12, 0.0, measured=1.53e-13),
    # --- float64 processors (test_processors.py) -------------------------------------------------
    "processors_f64": Tol(0.0, 2e-15, measured=1.9e-16),      # vs hand-computed values, relative
    "processors_vs_hf": Tol(0.0, 1e-14, measured=6.4e-16),    # vs transformers' warpers (torch f64)
}


def within(got, want, name):
    """True if every element of got is within TOLERANCES[name] of want (NumPy arrays)."""
    import numpy as np
    tol = TOLERANCES[name]
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False
    same = got == want                      # equal infinities (a restricted head's -inf) are exact
    bound = tol.max_abs + tol.max_rel * np.abs(np.where(same, 0.0, want))
    return bool(np.all(same | (np.abs(got - want) <= bound)))


def max_error(got, want, name):
    """The error `within` judges, in the unit of `measured`: max |got - want| (relative if the entry is)."""
    import numpy as np
    tol = TOLERANCES[name]
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    diff = np.where(got == want, 0.0, np.abs(got - want))   # equal infinities: no error
    if tol.max_abs == 0 and tol.max_rel > 0:
        diff = diff / np.maximum(np.abs(np.where(got == want, 1.0, want)), np.finfo(np.float64).tiny)
    return float(diff.max()) if diff.size else 0.0


def flip_margin(name):
    """Largest reference gap between two scores that an error within TOLERANCES[name] can reverse."""
    tol = TOLERANCES[name]
    assert tol.max_rel == 0, f"{name}: a flip margin needs an absolute-only tolerance"
    return 2 * tol.max_abs
