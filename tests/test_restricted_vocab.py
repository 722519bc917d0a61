"""Restricted-vocabulary drafts (exactspec.head_ids / exactspec.embed_rows, docs/draft_wasm.md).

The fixture is the toy pair's draft (web/models/draft, V = 4096, tied) remade untied and
restricted: an LM head of N = 1363 rows (not a multiple of 4), an embedding of M = 1029 rows,
random row map; plus its "expanded" twin, the same function written the unrestricted way (every
id's own embedding row; head rows scattered into a (V, D) head, zeros elsewhere). Checked here:

- the NumPy reference: -inf off head_ids, the expanded twin's logits on them; the WASM draft:
  forward logits bitwise equal to the expanded twin's WASM logits on head_ids, -inf (exactly)
  elsewhere, within draft_logits of the reference; processed rows and proposals as
  tests/test_wasm_draft.py demands of any draft;
- speculation stays exact: greedy output equals the champion alone (the toy pair's champion
  through models.load_pair), and a chi-square test of sampled output against a toy champion;
- the CLI and the page (Node, the same modules the page runs) convert a bf16 restricted draft to
  the same bytes, I32 tensors unchanged; hostile tensors are refused by both, and by
  LlamaReference and the WASM loader, with the same code and phrase naming the tensor; a
  champion carrying either tensor is refused as an unexpected tensor.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from node_harness import run_harness
from test_statistical import ALPHA, chi_square_pvalue
from test_wasm_draft import (compare_proposals, ensure_wasm, forward_sequences, hard_rows, policy_json,
                             processor_policies, propose_scenarios, run_node, unb64)
from tolerances import within
from toy_helpers import champion_first_two

from exactspec.core.backends import RunnerChampion, RunnerDraft
from exactspec.reference.convert import convert
from exactspec.core.errors import ExactSpecError
from exactspec.reference.models import load_pair
from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.core.policy import SamplingPolicy
from exactspec.reference.processors import process_logits
from exactspec.reference.reference_llama import LlamaReference
from exactspec.reference.restricted_vocab import EMBED_ROWS, HEAD_IDS
from exactspec.formats.safetensors import load_safetensors, to_numpy, write_safetensors
from exactspec.reference.toy import ToyRunner

REPO = Path(__file__).resolve().parent.parent
TOY = REPO / "web" / "models"
HARNESS = REPO / "web" / "tests" / "restricted_harness.mjs"
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json")
N_HEAD, M_EMBED = 1363, 1029
STOP_IDS = (1, 6)


# ----------------------------------------------------------------------------- builders
def toy_draft_tensors() -> dict:
    return {k: np.array(to_numpy(t)) for k, t in load_safetensors(str(TOY / "draft" / "model.safetensors")).items()}


def restricted_tensors(seed: int = 0) -> dict:
    """The toy draft untied and restricted: name -> array (the two index tensors int32)."""
    rs = np.random.default_rng(seed)
    t = toy_draft_tensors()
    embed = t.pop("model.embed_tokens.weight")                                      # (V, D), tied
    V = embed.shape[0]
    head_ids = np.sort(np.concatenate([list(STOP_IDS), V - 1 - rs.choice(V - 8, N_HEAD - 2, replace=False)]))
    head_ids = np.unique(head_ids)[:N_HEAD].astype(np.int32)                         # (N,) ascending
    assert head_ids.size == N_HEAD
    embed_rows = rs.integers(0, M_EMBED, V).astype(np.int32)                         # (V,) in [0, M)
    embed_rows[:M_EMBED] = np.arange(M_EMBED)                                        # every row used
    t["model.embed_tokens.weight"] = embed[:M_EMBED] * np.float32(1.5)               # (M, D)
    t["lm_head.weight"] = embed[head_ids] + np.float32(0.01) * rs.normal(size=(N_HEAD, embed.shape[1])).astype(np.float32)
    t[HEAD_IDS], t[EMBED_ROWS] = head_ids, embed_rows
    return t


def expanded_tensors(t: dict) -> dict:
    """The same function, unrestricted: (V, D) embedding and (V, D) head (zero rows off the head)."""
    out = {k: v for k, v in t.items() if k not in (HEAD_IDS, EMBED_ROWS)}
    V = t[EMBED_ROWS].size
    out["model.embed_tokens.weight"] = t["model.embed_tokens.weight"][t[EMBED_ROWS]]
    head = np.zeros((V, t["lm_head.weight"].shape[1]), np.float32)
    head[t[HEAD_IDS]] = t["lm_head.weight"]
    out["lm_head.weight"] = head
    return out


def write_folder(d: Path, tensors: dict, dtype: str = "F32", **config_changes) -> Path:
    """A draft folder: the toy draft's small files, config untied (plus changes), the tensors
    (float arrays as dtype; integer arrays as I32; a float array standing for an index tensor
    keeps its dtype, for the hostile cases)."""
    from hostile_folders import to_half
    d.mkdir(parents=True, exist_ok=True)
    for name in SMALL_FILES:
        shutil.copy(TOY / "draft" / name, d / name)
    config = json.loads((TOY / "draft" / "config.json").read_text())
    config.update({"tie_word_embeddings": False, **config_changes})
    (d / "config.json").write_text(json.dumps(config, indent=2))
    out = {}
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        if np.issubdtype(a.dtype, np.integer):
            out[name] = ("I32", a.shape, a.astype("<i4").tobytes())
        elif dtype == "F32" or name in (HEAD_IDS, EMBED_ROWS):
            out[name] = ("F32", a.shape, a.astype("<f4").tobytes())
        else:
            out[name] = (dtype, a.shape, to_half(a, dtype))
    write_safetensors(str(d / "model.safetensors"), out, {"format": "pt"})
    return d


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("restricted")
    t = restricted_tensors()
    return {"restricted": write_folder(base / "restricted", t), "expanded": write_folder(base / "expanded", expanded_tensors(t)),
            "tensors": t, "base": base}


@pytest.fixture(scope="module")
def refs(folders):
    return LlamaReference.from_dir(folders["restricted"]), LlamaReference.from_dir(folders["expanded"])


# ----------------------------------------------------------------------------- the forward pass
def test_reference_is_the_expanded_function_with_minus_inf_off_the_head(folders, refs):
    restricted, expanded = refs
    head_ids = folders["tensors"][HEAD_IDS]
    off = np.setdiff1d(np.arange(restricted.vocab_size), head_ids)
    ids = np.random.default_rng(1).integers(0, restricted.vocab_size, 40).tolist()
    got, want = restricted.forward(ids, 0), expanded.forward(ids, 0)          # (n, V) float64
    assert got.shape == want.shape == (40, 4096)
    assert np.all(got[:, off] == -np.inf)
    assert np.all(np.isfinite(got[:, head_ids]))
    np.testing.assert_allclose(got[:, head_ids], want[:, head_ids], rtol=1e-12, atol=1e-12)
    assert restricted.forward([5], 40)[0].argmax() in head_ids


def test_wasm_forward_is_bitwise_the_expanded_drafts_and_matches_the_reference(folders, refs):
    ref = refs[0]
    head_ids = folders["tensors"][HEAD_IDS]
    off = np.setdiff1d(np.arange(ref.vocab_size), head_ids)
    seqs = forward_sequences(ref.vocab_size, 160, np.random.default_rng(3))
    cases = {"forward": [[[ids, s] for ids, s in seq] for seq in seqs]}
    got_r = run_node(folders["restricted"], cases)["forward"]
    got_e = run_node(folders["expanded"], cases)["forward"]
    n_rows = 0
    for seq, rows_r, rows_e in zip(seqs, got_r, got_e):
        ref.reset()
        for (ids, start), row_r, row_e in zip(seq, rows_r, rows_e):
            r, e = unb64(row_r, "<f4"), unb64(row_e, "<f4")
            assert np.array_equal(r[head_ids].view(np.uint32), e[head_ids].view(np.uint32)), (start, len(ids))
            assert np.all(r[off] == -np.inf), (start, len(ids))
            want = ref.forward(ids, start)[-1]
            assert np.array_equal(np.isinf(want), np.isinf(r))
            assert within(r[head_ids], want[head_ids], "draft_logits"), (start, len(ids))
            n_rows += 1
    assert n_rows >= 15


def test_wasm_processed_rows_of_restricted_logits(folders, refs):
    ref = refs[0]
    V = ref.vocab_size
    rs = np.random.default_rng(9)
    ref.reset()
    rows = [r.astype(np.float32) for r in ref.forward(rs.integers(0, V, 6).tolist(), 0)[-3:]] + hard_rows(V, rs)[2:]
    cases, want = [], []
    for policy in processor_policies(V)[:8]:
        for row in rows:
            context = rs.integers(0, V, 12).tolist()
            try:
                expect = process_logits(row.astype(np.float64), context, policy)
            except ExactSpecError as err:
                expect = err.code
            cases.append({"logits": __import__("base64").b64encode(row.tobytes()).decode(), "context": context,
                          "policy": policy_json(policy)})
            want.append(expect)
    out = run_node(folders["restricted"], {"process": cases})["process"]
    for i, (got, expect) in enumerate(zip(out, want)):
        if isinstance(expect, str):
            assert got["error_code"] == expect, i
            continue
        p64 = unb64(got["probs64"], "<f8")
        assert within(p64, expect, "draft_probs_f64"), i
        assert np.array_equal(p64 > 0, expect > 0), f"case {i}: support differs"


@pytest.mark.parametrize("policy,n_seeds", [(SamplingPolicy(temperature=0.0), 8), (SamplingPolicy(temperature=1.0), 12)],
                         ids=["greedy", "T1"])
def test_wasm_proposals_match_runner_draft(folders, refs, policy, n_seeds):
    ref = refs[0]
    head_ids = set(folders["tensors"][HEAD_IDS].tolist())
    seeds = [int(s) for s in np.random.default_rng(17).integers(0, 2 ** 64, n_seeds, dtype=np.uint64)]
    calls, expected, seed_of = [], [], []
    for seed in seeds:
        c, e = propose_scenarios(ref, policy, [seed], n_rounds=4, k=5, stop_ids=STOP_IDS)
        calls, expected, seed_of = calls + c, expected + e, seed_of + [seed] * len(c)
    out = run_node(folders["restricted"], {"propose": calls})["propose"]
    n_rounds, n_mismatch, n_tokens, _ = compare_proposals(calls, expected, out, seed_of, policy.temperature)
    assert n_tokens > 0 and all(t in head_ids for p in expected for t in p.tokens)
    assert n_mismatch == 0 if policy.temperature == 0 else n_mismatch <= max(1, 0.02 * n_rounds)


# ----------------------------------------------------------------------------- exactness
def test_greedy_speculation_equals_the_champion_alone(folders):
    pair = load_pair(str(TOY / "champion"), str(folders["restricted"]))
    prompt = pair.tokenizer.encode("Once upon a time") if hasattr(pair.tokenizer, "encode") else [3, 4, 5]
    prompt = list(getattr(prompt, "ids", prompt))
    greedy = SamplingPolicy(temperature=0.0)
    alone = pair.orchestrator.generate(prompt, GenerationConfig(max_new_tokens=24, policy=greedy, speculate="none"))
    spec = pair.orchestrator.generate(prompt, GenerationConfig(max_new_tokens=24, policy=greedy, speculate="draft", k=4))
    assert list(spec.token_ids) == list(alone.token_ids) and len(alone.token_ids) > 0


def tiny_restricted_reference(V: int = 12, seed: int = 5) -> LlamaReference:
    """An in-memory restricted draft over the statistical tests' toy vocabulary (N = 7, M = 5)."""
    rs = np.random.default_rng(seed)
    D, F = 8, 16
    t = {"model.embed_tokens.weight": rs.normal(0, 1, (5, D)), "model.norm.weight": 1 + 0.1 * rs.normal(size=D),
         "lm_head.weight": rs.normal(0, 1.5, (7, D)), "model.layers.0.input_layernorm.weight": np.ones(D),
         "model.layers.0.post_attention_layernorm.weight": np.ones(D)}
    for name, shape in [("self_attn.q_proj", (D, D)), ("self_attn.k_proj", (D, D)), ("self_attn.v_proj", (D, D)),
                        ("self_attn.o_proj", (D, D)), ("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)),
                        ("mlp.down_proj", (D, F))]:
        t[f"model.layers.0.{name}.weight"] = rs.normal(0, 0.5, shape)
    t = {k: v.astype(np.float32) for k, v in t.items()}
    t[HEAD_IDS] = np.array([0, 1, 2, 3, 5, 8, 11], np.int32)
    t[EMBED_ROWS] = (np.arange(V) % 5).astype(np.int32)
    config = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
              "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64,
              "tie_word_embeddings": False}
    return LlamaReference(config, t, identity="tiny-restricted")


def test_sampled_speculation_follows_the_champion():
    """Chi-square on the first two tokens, at the level of tests/test_statistical.py: the draft
    gives probability 0 to 5 of the 12 tokens, the champion to none."""
    V, seed, hidden, scale = 12, 3, 8, 2.5
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    draft = tiny_restricted_reference(V)
    assert np.all(draft.forward([4], 0)[0][[4, 6, 7, 9, 10]] == -np.inf)
    orch = Orchestrator(RunnerChampion(ToyRunner(V, seed, hidden, scale)), RunnerDraft(draft))
    policy = SamplingPolicy(temperature=1.0)
    samples = [tuple(orch.generate(prompt, GenerationConfig(max_new_tokens=2, policy=policy, speculate="draft", k=3,
                                                            seed=s)).token_ids) for s in range(2000)]
    expected = champion_first_two(V, seed, hidden, scale, prompt, policy)
    assert any(s[0] in (4, 6, 7, 9, 10) for s in samples)          # the champion's tokens off the draft's head
    assert chi_square_pvalue(samples, expected) > ALPHA


# ----------------------------------------------------------------------------- conversion + hostile
def node(cases: list) -> list:
    return run_harness(HARNESS, {"cases": cases})["results"]


def python_convert(src: Path, dst: Path, role: str) -> dict:
    try:
        convert(str(src), str(dst), role=role)
        return {"ok": True}
    except ExactSpecError as err:
        return {"ok": False, "code": err.code, "message": err.message}


def test_cli_and_page_convert_a_bf16_restricted_draft_to_the_same_bytes(folders):
    t = folders["tensors"]
    src = write_folder(folders["base"] / "bf16", t, dtype="BF16")
    assert python_convert(src, folders["base"] / "bf16_out", "draft") == {"ok": True}
    page_out = folders["base"] / "bf16_page.safetensors"
    assert node([{"op": "convert", "dir": str(src), "role": "draft", "out": str(page_out)}]) == [{"ok": True}]
    cli_bytes = (folders["base"] / "bf16_out" / "model.safetensors").read_bytes()
    assert page_out.read_bytes() == cli_bytes
    out = {k: to_numpy(v) for k, v in load_safetensors(str(folders["base"] / "bf16_out" / "model.safetensors")).items()}
    assert out[HEAD_IDS].dtype == np.int32 and np.array_equal(out[HEAD_IDS], t[HEAD_IDS])
    assert np.array_equal(out[EMBED_ROWS], t[EMBED_ROWS]) and out["lm_head.weight"].dtype == np.float32
    LlamaReference.from_dir(folders["base"] / "bf16_out").forward([1, 2, 3], 0)
    # the page converts a picked bf16 draft, and runs an F32 one with its I32 tensors as it is
    assert node([{"op": "needs_conversion", "dir": str(src)}, {"op": "needs_conversion", "dir": str(folders["restricted"])}]) \
        == [{"ok": True, "value": True}, {"ok": True, "value": False}]


def _mutated(name: str):
    def mutate(t):
        t = dict(t)
        V, d = t[EMBED_ROWS].size, t["lm_head.weight"].shape[1]
        if name == "head_ids_f32":
            t[HEAD_IDS] = t[HEAD_IDS].astype(np.float32)
        elif name == "head_ids_2d":
            t[HEAD_IDS] = t[HEAD_IDS][None, :]
        elif name == "head_ids_too_long":
            t[HEAD_IDS] = np.arange(V + 1, dtype=np.int32)
        elif name == "head_ids_not_ascending":
            h = t[HEAD_IDS].copy()
            h[[10, 11]] = h[[11, 10]]
            t[HEAD_IDS] = h
        elif name == "head_ids_repeated":
            h = t[HEAD_IDS].copy()
            h[20] = h[19]
            t[HEAD_IDS] = h
        elif name == "head_ids_out_of_range":
            h = t[HEAD_IDS].copy()
            h[-1] = V
            t[HEAD_IDS] = h
        elif name == "head_ids_negative":
            h = t[HEAD_IDS].copy()
            h[0] = -1
            t[HEAD_IDS] = h
        elif name == "lm_head_rows_not_n":
            t["lm_head.weight"] = np.concatenate([t["lm_head.weight"], np.zeros((1, d), np.float32)])
        elif name == "embed_rows_short":
            t[EMBED_ROWS] = t[EMBED_ROWS][:-1]
        elif name == "embed_rows_out_of_range":
            r = t[EMBED_ROWS].copy()
            r[4000] = M_EMBED
            t[EMBED_ROWS] = r
        elif name == "embed_rows_f32":
            t[EMBED_ROWS] = t[EMBED_ROWS].astype(np.float32)
        elif name == "embed_more_rows_than_v":
            t["model.embed_tokens.weight"] = np.zeros((V + 1, d), np.float32)
        return t
    return mutate


# case -> (tensor the message names, phrase after "model.safetensors: ", config changes)
HOSTILE = {
    "head_ids_f32": (HEAD_IDS, "tensor 'exactspec.head_ids' has dtype F32, expected I32", {}),
    "head_ids_2d": (HEAD_IDS, f"tensor 'exactspec.head_ids' has shape (1, {N_HEAD}), expected (N,) with 1 <= N <= 4096", {}),
    "head_ids_too_long": (HEAD_IDS, "tensor 'exactspec.head_ids' has shape (4097,), expected (N,) with 1 <= N <= 4096", {}),
    "head_ids_not_ascending": (HEAD_IDS, "tensor 'exactspec.head_ids' is not strictly ascending at index 11", {}),
    "head_ids_repeated": (HEAD_IDS, "tensor 'exactspec.head_ids' is not strictly ascending at index 20", {}),
    "head_ids_out_of_range": (HEAD_IDS, f"tensor 'exactspec.head_ids' holds 4096 at index {N_HEAD - 1}, outside [0, 4096)", {}),
    "head_ids_negative": (HEAD_IDS, "tensor 'exactspec.head_ids' holds -1 at index 0, outside [0, 4096)", {}),
    "lm_head_rows_not_n": ("lm_head.weight", f"tensor 'lm_head.weight' has shape ({N_HEAD + 1}, 128), expected ({N_HEAD}, 128)", {}),
    "embed_rows_short": (EMBED_ROWS, "tensor 'exactspec.embed_rows' has shape (4095,), expected (4096,)", {}),
    "embed_rows_out_of_range": (EMBED_ROWS, f"tensor 'exactspec.embed_rows' holds {M_EMBED} at index 4000, outside [0, {M_EMBED})", {}),
    "embed_rows_f32": (EMBED_ROWS, "tensor 'exactspec.embed_rows' has dtype F32, expected I32", {}),
    "embed_more_rows_than_v": ("model.embed_tokens.weight",
                               "tensor 'model.embed_tokens.weight' needs 1 to 4096 rows with 'exactspec.embed_rows' present", {}),
    "tied": (HEAD_IDS, "tensor 'exactspec.head_ids' needs an untied LM head (config tie_word_embeddings is true)",
             {"tie_word_embeddings": True}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_restriction_tensors_are_refused_alike(folders, case):
    """LlamaReference, `exactspec convert --role draft`, the page's conversion and the WASM
    draft's loader: E_MODEL_LOAD, the same sentence, naming the file and the tensor."""
    tensor, phrase, config = HOSTILE[case]
    d = write_folder(folders["base"] / f"hostile_{case}", _mutated(case)(folders["tensors"]), **config)
    with pytest.raises(ExactSpecError) as err:
        LlamaReference.from_dir(d)
    assert err.value.code == "E_MODEL_LOAD" and err.value.detail.get("tensor") == tensor, err.value
    where = f"{d / 'model.safetensors'}: "
    assert err.value.message.startswith(where + phrase), err.value.message
    sentence = err.value.message[len(where):]                        # e.g. "... at index 11 (40 then 37)"
    cli = python_convert(d, folders["base"] / f"out_{case}", "draft")
    assert cli == {"ok": False, "code": "E_MODEL_LOAD", "message": where + sentence}
    page, loader = node([{"op": "convert", "dir": str(d), "role": "draft", "out": str(d / "page.out")},
                         {"op": "load", "wasm": str(ensure_wasm()), "dir": str(d)}])
    assert page == {"ok": False, "code": "E_MODEL_LOAD", "message": f"model.safetensors: {sentence}"}
    assert loader["code"] == "E_MODEL_LOAD" and tensor in loader["message"], loader
    if case != "lm_head_rows_not_n":            # the loader's own shape sentence names it as well
        assert loader["message"] == f"model.safetensors: {sentence}", loader


def test_a_champion_carrying_either_tensor_is_refused(folders):
    d = folders["restricted"]
    with pytest.raises(ExactSpecError) as err:
        LlamaReference.from_dir(d, role="champion")
    assert err.value.code == "E_MODEL_LOAD" and "unexpected tensor 'exactspec.embed_rows'" in err.value.message
    with pytest.raises(ExactSpecError) as err:
        load_pair(str(d), str(d))                                    # as the pair's champion
    assert err.value.code == "E_MODEL_LOAD" and "unexpected tensor 'exactspec." in err.value.message
    cli = python_convert(d, folders["base"] / "as_champion", "champion")
    page = node([{"op": "convert", "dir": str(d), "role": "champion", "out": str(folders["base"] / "champion.out")}])[0]
    assert cli["code"] == page["code"] == "E_MODEL_LOAD"
    assert cli["message"].endswith(page["message"]) and "unexpected tensor 'exactspec." in page["message"]
