"""The load-time batch-invariance check (web/orchestrator/batch_check.mjs) on the WASM champion in Node:
invariant on the shipped and a synthetic champion at 1 and 2 threads, variant (with the first differing
position and logit) under the injected fault, bitwise (not numeric) comparison, and no trace left for
the next request. The browser half (WebGPU, the fallback, the receipts) is test_batch_check_browser.py."""
import json

import pytest

import synthetic_models
from browser_fixture import REPO_ROOT
from node_harness import run_harness
from test_wasm_champion import SHIPPED, WASM, ensure_wasm

HARNESS = REPO_ROOT / "web" / "tests" / "batch_check_harness.mjs"
POSITIONS = 5                          # batch_check.mjs CHECK_POSITIONS
FLIP_ROW = POSITIONS - 1               # the fault flips one logit of a block's last row


def run(model_dir, runs, bits=()):
    ensure_wasm()
    return run_harness(HARNESS, {"wasm": str(WASM), "model_dir": str(model_dir), "runs": runs, "bits": list(bits)})


def models():
    out = [synthetic_models.tiny_llama(seed=3)]
    if (SHIPPED / "model.q8.safetensors").exists():
        out.append(SHIPPED)
    return out


@pytest.mark.parametrize("model_dir", models(), ids=lambda p: p.name)
def test_wasm_champion_is_invariant_and_the_fault_is_caught(model_dir):
    out = run(model_dir, [{"check": False}, {}, {"threads": 2}, {"fault": True}])["runs"]
    fresh, plain, threaded, faulty = out
    for r in (plain, threaded):
        assert r["result"] == "invariant" and r["first_mismatch"] is None, r
        assert r["backend"] == "wasm" and r["positions"] == POSITIONS and r["ms"] >= 0, r
    assert faulty["result"] == "variant", faulty
    assert faulty["first_mismatch"]["position"] == FLIP_ROW, faulty
    # the flipped logit: (n * 7919 + 17) % V of the block's last row, n = POSITIONS
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    assert faulty["first_mismatch"]["index"] == (POSITIONS * 7919 + 17) % vocab, faulty
    # the check leaves nothing behind: position 0 forwarded afterwards is a fresh champion's row
    for r in (plain, threaded, faulty):
        assert r["first_row_head"] == fresh["first_row_head"]


def test_short_context_checks_fewer_positions_and_tiny_ones_are_unchecked():
    tiny = synthetic_models.tiny_llama(seed=3)
    short, tiny_ctx = run(tiny, [{"max_context": 6}, {"max_context": 2}])["runs"]
    assert short["result"] == "invariant" and short["positions"] == 3, short   # 3 context ids + 3 positions
    assert tiny_ctx["result"] == "unchecked" and tiny_ctx["positions"] < 2, tiny_ctx


def test_comparison_is_of_bits_not_values():
    tiny = synthetic_models.tiny_llama(seed=3)
    bits = run(tiny, [], bits=[([0, 1, 2], [0, 1, 2]), (["-0", 1], [0, 1]), ([1, "nan"], [1, "nan"]),
                               ([1, 2, 3], [1, 2, 3.0000002])])["bits"]
    assert bits == [-1, 0, -1, 2]
