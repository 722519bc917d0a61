"""Vocabulary padding (issue 21 item 5; docs/core.md "Vocabulary padding"): a transformers-made
Qwen2 pair of Qwen2.5's shape (an embedding of 151,936 rows, a tokenizer of 151,665 ids) pairs,
and every request suppresses the 271 padding rows on the champion and the draft alike, declared
in the policy and its hash. Its padding rows are scaled so that, unsuppressed, they win nearly
every argmax and draw: the no-padding-id checks have power (shown by an Orchestrator told no
padding). Greedy output equals transformers' generate with those ids suppressed; speculation
equals the champion alone; the browser (WASM and WebGPU champions) equals the reference."""
import pytest

from browser_fixture import chromium_browser  # noqa: F401
from engine_loads import FAST_RUNTIME
from exactspec.core.errors import E_BAD_ARGUMENT, ExactSpecError
from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.core.receipts import sha256_json
from exactspec.formats.manifest import check_pair
from exactspec.host.browser_run import BrowserRuntime
from exactspec.reference.models import load_pair
from exactspec.reference.processors import SamplingPolicy
from synthetic_models import QWEN_IDS, QWEN_ROWS, padded_qwen2

PADDING = tuple(range(QWEN_IDS, QWEN_ROWS))
TEXT = "The exact speculative decoding of a small model"


@pytest.fixture(scope="module")
def pair():
    return str(padded_qwen2("champion")), str(padded_qwen2("draft"))


@pytest.fixture(scope="module")
def loaded(pair):
    return load_pair(*pair)


def _prompt(loaded):
    return loaded.tokenizer.encode(TEXT)


def _greedy(orch, prompt, speculate, n=12):
    return orch.generate(prompt, GenerationConfig(max_new_tokens=n, policy=SamplingPolicy(temperature=0.0),
                                                  speculate=speculate, k=3, seed=0))


def test_the_pair_check_accepts_rows_past_the_tokenizer(pair, loaded):
    shared = check_pair(*pair)["shared"]
    assert (shared["tokenizer_vocab_size"], shared["config_vocab_size"]) == (QWEN_IDS, QWEN_ROWS)
    assert loaded.orchestrator.vocab_size == QWEN_ROWS and loaded.orchestrator.n_token_ids == QWEN_IDS
    assert loaded.orchestrator.padding_ids == PADDING


def test_unsuppressed_the_padding_rows_win(loaded):
    """The power of the checks below: the same runners with no padding declared emit padding ids."""
    bare = Orchestrator(loaded.orchestrator.champion, loaded.orchestrator.draft)
    assert any(t >= QWEN_IDS for t in _greedy(bare, _prompt(loaded), "none").token_ids)
    sampled = bare.generate(_prompt(loaded), GenerationConfig(max_new_tokens=8, policy=SamplingPolicy(temperature=1.0),
                                                              speculate="none", seed=1))
    assert sum(t >= QWEN_IDS for t in sampled.token_ids) >= 4


def test_greedy_equals_transformers_with_the_padding_suppressed_in_every_mode(pair, loaded):
    import torch
    from transformers import Qwen2ForCausalLM
    prompt = _prompt(loaded)
    alone = _greedy(loaded.orchestrator, prompt, "none")
    assert alone.token_ids and all(t < QWEN_IDS for t in alone.token_ids)
    for mode in ("draft", "lookup", "auto"):
        assert _greedy(loaded.orchestrator, prompt, mode).token_ids == alone.token_ids, mode
    model = Qwen2ForCausalLM.from_pretrained(pair[0], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, suppress_tokens=list(PADDING),
                             eos_token_id=151645, pad_token_id=151643)
    assert out[0, len(prompt):].tolist()[:len(alone.token_ids)] == alone.token_ids


def test_sampling_never_draws_a_padding_row_and_the_policy_declares_them(loaded):
    prompt = _prompt(loaded)
    for seed in range(3):
        for mode in ("none", "draft"):
            r = loaded.orchestrator.generate(prompt, GenerationConfig(max_new_tokens=10, policy=SamplingPolicy(temperature=1.0),
                                                                      speculate=mode, k=3, seed=seed))
            assert r.token_ids and all(t < QWEN_IDS for t in r.token_ids), (mode, seed)
    declared = SamplingPolicy(temperature=1.0, suppress_token_ids=PADDING)
    assert r.receipt["sampling_policy_hash"] == sha256_json(declared.canonical())
    assert r.receipt["sampling_policy_hash"] != sha256_json(SamplingPolicy(temperature=1.0).canonical())


def test_a_prompt_holding_a_padding_row_is_refused(loaded):
    with pytest.raises(ExactSpecError) as err:
        _greedy(loaded.orchestrator, _prompt(loaded) + [QWEN_IDS + 3], "none")
    assert err.value.code == E_BAD_ARGUMENT and "vocabulary padding" in err.value.message
    with pytest.raises(ExactSpecError) as err:
        Orchestrator(loaded.orchestrator.champion, None, n_token_ids=QWEN_ROWS + 1)
    assert err.value.code == E_BAD_ARGUMENT


@pytest.mark.parametrize("backend", ["wasm", "webgpu"])
def test_the_browser_suppresses_the_same_rows_and_equals_the_reference(pair, backend, chromium_browser):  # noqa: F811
    from exactspec.host.model_cache import browser_ready
    champion_q8 = browser_ready(pair[0], "champion")          # what the browser runs, as `exactspec convert` writes it
    reference = load_pair(champion_q8, pair[1], champion_weights="q8", champion_matmul="q8act" if backend == "wasm" else "f32")
    prompt = _prompt(reference)
    expected = _greedy(reference.orchestrator, prompt, "none").token_ids
    rt = BrowserRuntime(*pair, browser=chromium_browser, champion_backend=backend, **FAST_RUNTIME)
    try:
        for mode in ("none", "draft"):
            got = rt.generate({"prompt_ids": prompt, "config": {"max_new_tokens": 12, "temperature": 0.0, "speculate": mode,
                                                                "k": 3, "prefix_reuse": False}})["result"]
            assert got["token_ids"] == expected, mode
        sampled = rt.generate({"prompt_ids": prompt, "config": {"max_new_tokens": 10, "temperature": 1.0, "speculate": "draft",
                                                                "k": 3, "seed": 5}})["result"]
        assert sampled["token_ids"] and all(t < QWEN_IDS for t in sampled["token_ids"])
        declared = SamplingPolicy(temperature=1.0, suppress_token_ids=PADDING)
        assert sampled["receipt"]["sampling_policy_hash"] == sha256_json(declared.canonical())
        refused = rt.generate({"prompt_ids": prompt + [QWEN_IDS], "config": {"max_new_tokens": 4}})
    except ExactSpecError as err:
        refused = err
    finally:
        rt.close()
    assert isinstance(refused, ExactSpecError) and refused.code == E_BAD_ARGUMENT
