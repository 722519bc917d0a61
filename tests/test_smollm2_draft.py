"""The draft made for SmolLM2-135M-Instruct: web/models/smollm2-draft/ (tools/train/distill_smollm2.py).

The folder is at most 16 MB and loads with the project's loaders (LlamaReference, and the WASM
draft in Node with the reference's logits); it shares the GGUF champion's tokenizer (the same
tokenizer.json bytes the GGUF rebuilds, the same ids on hostile text, chat template and stop ids);
and greedy speculation with it on the CPython reference gives the champion's own tokens, with
more proposals accepted than an untrained draft of the same shape gets. Tests that need the GGUF skip only when build/models/status.json says it is
unavailable, with its reason.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from gguf_builders import REPO, gguf_reference_pair, smollm2_path
from test_tokenizer_families import HOSTILE
from test_wasm_draft import run_node, unb64
from tolerances import max_error, within

from exactspec.core.backends import RunnerDraft
from exactspec.formats.chat import encode_chat_prompt
from exactspec.formats.gguf import GGUFFile
from exactspec.formats.gguf_tokenizer import load_tokenizer, stop_token_ids, tokenizer_config, tokenizer_spec
from exactspec.formats.manifest import canonical_json, check_pair, load_model_identity
from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.core.policy import SamplingPolicy
from exactspec.reference.reference_llama import LlamaReference
from exactspec.formats.tokenizer import Tokenizer

DRAFT = os.path.join(REPO, "web", "models", "smollm2-draft")
MAX_BYTES = 16_000_000
TEXTS = HOSTILE + ["In 2024, 3.14159 ½ ² ١٢٣ ๓ ９９ Ⅻ", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                   "The LORD is my shepherd; I shall not want.", "def f(x):\n    return x**2  # ok"]


@pytest.fixture(scope="module")
def gguf_path():
    return smollm2_path()


@pytest.fixture(scope="module")
def draft_reference():
    return LlamaReference.from_dir(DRAFT)


def test_folder_is_small_and_loads(draft_reference):
    names = sorted(os.listdir(DRAFT))
    size = sum(os.path.getsize(os.path.join(DRAFT, n)) for n in names)
    print(f"smollm2-draft: {size} bytes in {names}")
    assert size <= MAX_BYTES
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= set(names)
    assert draft_reference.vocab_size == 49152


def test_tokenizer_is_the_champions(gguf_path):
    """The folder's tokenizer is the GGUF's, rebuilt by exactspec.formats.gguf_tokenizer: byte for byte,
    id for id (exactspec and HF `tokenizers`), chat template and stop ids; manifest.check_pair
    (what the CLI runs before pairing) accepts the GGUF champion with this folder."""
    import tokenizers
    with GGUFFile(gguf_path) as f:
        spec, config, stops, theirs = tokenizer_spec(f), tokenizer_config(f), stop_token_ids(f), load_tokenizer(f)
    with open(os.path.join(DRAFT, "tokenizer.json"), "rb") as f:
        raw = f.read()
    assert raw == canonical_json(spec)
    ours = Tokenizer.from_file(os.path.join(DRAFT, "tokenizer.json"))
    hf = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
    for text in TEXTS:
        want = theirs.encode(text)
        assert ours.encode(text) == want, repr(text)
        assert hf.encode(text, add_special_tokens=False).ids == want, repr(text)
    with open(os.path.join(DRAFT, "tokenizer_config.json"), encoding="utf-8") as f:
        assert json.load(f) == config
    with open(os.path.join(DRAFT, "generation_config.json"), encoding="utf-8") as f:
        assert json.load(f)["eos_token_id"] == list(stops)
    identity = load_model_identity(DRAFT)
    assert identity["tokenizer_sha256"] == hashlib.sha256(canonical_json(spec)).hexdigest()
    pair = check_pair(gguf_path, DRAFT)    # the CLI's pair check: every field that must match does
    assert pair["draft"]["hidden_size"] == identity["hidden_size"]


def test_wasm_draft_runs_it(draft_reference):
    """The product's WASM draft (Node) on the shipped weights: logits as LlamaReference's."""
    ids = [1, 9690, 198, 2683, 253, 5356, 2, 198, 1, 4093, 198]
    out = run_node(DRAFT, {"forward": [[[ids[:8], 0], [ids[8:], 8]]]})
    draft_reference.reset()
    worst = 0.0
    for (chunk, start), row in zip([(ids[:8], 0), (ids[8:], 8)], out["forward"][0]):
        got, want = unb64(row, "<f4"), draft_reference.forward(chunk, start)[-1]
        worst = max(worst, max_error(got, want, "draft_logits"))
        assert within(got, want, "draft_logits")
    print(f"smollm2-draft WASM vs reference: [err] draft_logits {worst:.3g}")


def untrained_copy(folder) -> str:
    """The draft's config with seeded N(0, 0.02) matrices: the same shape, nothing learnt (the
    restricted-vocabulary id tensors, integers, are kept as they are)."""
    from safetensors.numpy import load_file, save_file
    rs = np.random.default_rng(0)
    weights = {k: (v if v.dtype.kind == "i" else rs.normal(0, 0.02, v.shape).astype(np.float32) if v.ndim == 2
                   else v.astype(np.float32))
               for k, v in load_file(os.path.join(DRAFT, "model.safetensors")).items()}
    save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(DRAFT, "config.json"), encoding="utf-8") as src, \
            open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as dst:
        dst.write(src.read())
    return folder


def test_greedy_speculation_equals_champion_alone(gguf_path, draft_reference, tmp_path):
    """The CPython reference on a chat turn: the GGUF champion alone, and with this draft at
    k = 4: the same tokens; and the draft has learnt the champion: more of its proposals are accepted than of
    the same shape with untrained weights."""
    pair = gguf_reference_pair(gguf_path)
    base = pair.orchestrator
    ids = encode_chat_prompt(pair.tokenizer, pair.tokenizer_config,
                             [{"role": "user", "content": "What is the capital of France?"}])
    greedy = SamplingPolicy(temperature=0)
    stops = pair.stop_token_ids
    alone = base.generate(ids, GenerationConfig(max_new_tokens=24, speculate="none", policy=greedy,
                                                stop_token_ids=stops))
    accepted = {}
    for name, draft in (("shipped", draft_reference), ("untrained", LlamaReference.from_dir(untrained_copy(tmp_path)))):
        with_draft = Orchestrator(base.champion, RunnerDraft(draft), decode=base.decode,
                                  identities={k: v for k, v in base.identities.items() if k != "champion"})
        spec = with_draft.generate(ids, GenerationConfig(max_new_tokens=24, speculate="draft", k=4, policy=greedy,
                                                         stop_token_ids=stops))
        print(f"smollm2-draft greedy ({name}): {spec.text!r}, {spec.stats['tokens_per_round']} tokens per round")
        assert spec.token_ids == alone.token_ids and spec.stats["mode"] == "draft"
        accepted[name] = spec.stats["accepted"]
    assert accepted["shipped"] > accepted["untrained"]
