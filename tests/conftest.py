"""Shared pytest set-up: make tests/ helpers importable."""
import os
import sys

# Two cores shared by Chromium, workers and NumPy: one BLAS thread is faster for these small
# matrices and keeps timings of concurrent browser tests sane.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(__file__))
