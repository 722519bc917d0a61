"""The one table of numerical tolerances: GPU / WASM kernels against their NumPy twins.

Each entry: (max_abs, max_rel) — a value passes if |got - want| <= max_abs + max_rel * |want|.
Kernels promising bitwise equality are listed with (0, 0). Change a value only with a reason
in the commit message; owners of each block are noted.
"""

TOLERANCES = {
    # --- champion forward on WebGPU (float32) vs NumPy twins (float64) -----------------------
    "embed": (0.0, 0.0),
    "rmsnorm": (1e-5, 1e-5),
    "matmul_q8": (1e-4, 1e-4),
    "rope": (1e-5, 1e-5),
    "attention": (1e-4, 1e-4),
    "swiglu": (1e-5, 1e-5),
    "lm_head": (1e-4, 1e-4),
    "champion_logits_vs_reference": (2e-3, 2e-3),   # whole model, q8 weights, f32 vs f64
    "block_vs_single": (0.0, 0.0),                  # batch invariance: bitwise
    # --- processors / acceptance on WebGPU vs processors.py / acceptance.py ------------------
    "processed_probs": (1e-6, 1e-5),
    # --- draft in WASM vs NumPy reference draft ------------------------------------------------
    "draft_logits": (1e-4, 1e-4),
    "draft_probs": (1e-6, 1e-5),
}


def within(got, want, name):
    """True if every element of got is within TOLERANCES[name] of want (NumPy arrays)."""
    import numpy as np
    max_abs, max_rel = TOLERANCES[name]
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return got.shape == want.shape and bool(np.all(np.abs(got - want) <= max_abs + max_rel * np.abs(want)))
