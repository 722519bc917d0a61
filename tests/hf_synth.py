"""Synthetic Hugging Face folders for the tests/test_hf_*.py files, made once per session.

`synth_models` (a session fixture) is {shape: folder} for the mid-size shapes of every family
and their drafts, written by tools/synth_models.py through transformers (bf16 on disk,
initializer_range 0.2 so that attention, RoPE and biases visibly shape the logits).
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import synth_models  # noqa: E402

INIT_STD = 0.2
CHAMPIONS = ("smollm2-mid", "qwen2.5-mid", "qwen2.5-mid-untied", "llama3.2-mid", "tinyllama-mid")
DRAFTS = {"smollm2-mid": "smollm2-draft", "qwen2.5-mid": "qwen2.5-draft", "qwen2.5-mid-untied": "qwen2.5-draft",
          "llama3.2-mid": "llama3.2-draft", "tinyllama-mid": "tinyllama-draft"}


@pytest.fixture(scope="session")
def synth_models_dirs(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth_models")
    return {shape: synth_models.make_model(shape, str(out), seed=0, init_std=INIT_STD)
            for shape in (*CHAMPIONS, *sorted(set(DRAFTS.values())))}
