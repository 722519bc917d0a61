"""End to end in headless Chromium: Pyodide orchestrator, champion (WebGPU or WASM-SIMD: every
test runs on both backends) + acceptance, WASM draft.

Greedy: speculative-with-draft and prompt-lookup ids equal browser champion-alone ids (the GPU
kernels are batch-invariant, so this is exact, not approximate). Against the CPython reference
(same q8 champion weights, float64): greedy ids agree up to a first difference that only a
reference logit gap within the f32 error allows; sampled answers agree in all but two
of eight; the rates are printed.
"""
import json
import os
import subprocess

import pytest

from browser_fixture import browser_page, chromium_browser, http_server  # noqa: F401
from exactspec.core.backends import RunnerChampion, RunnerDraft
from engine_loads import FAST_LOAD_JS, browser_runtime
from exactspec.reference.models import default_models_dir, stop_ids_from
from exactspec.core.orchestrator import GenerationConfig, Orchestrator
from exactspec.core.policy import SamplingPolicy
from exactspec.reference.reference_llama import LlamaReference
from exactspec.formats.tokenizer import Tokenizer
from tolerances import flip_margin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = default_models_dir()
CHAMPION, DRAFT = os.path.join(MODELS, "champion"), os.path.join(MODELS, "draft")
PROMPTS = ["In the beginning", "To be, or not to be,", "And the LORD said unto Moses,", "O Romeo, Romeo,",
           "The LORD is my shepherd;", "Friends, Romans, countrymen,", "Now the serpent", "All the world's a stage,",
           "Blessed are the meek:", "Enter HAMLET.", "Thus saith the LORD", "Good night, good night!",
           "What light through yonder window", "And God said, Let there be", "Is this a dagger which I see",
           "Honour thy father", "Now is the winter of our discontent", "Vanity of vanities,",
           "Shall I compare thee", "Then said Jesus unto"]


@pytest.fixture(scope="module", params=["webgpu", "wasm"])
def runtime(request, chromium_browser):
    """One engine per champion backend: every exactness test here runs on both."""
    for name in ("cpu.wasm", "cpu_mt.wasm"):
        if not os.path.exists(os.path.join(ROOT, "web", "build", name)):
            subprocess.run(["bash", os.path.join(ROOT, "wasm", "build.sh")], check=True)
    rt = browser_runtime(CHAMPION, DRAFT, browser=chromium_browser, timeout_s=600, champion_backend=request.param)
    assert rt.ready["info"]["champion"]["backend"] == request.param
    print(f"{request.param}: load timings (ms):", json.dumps(rt.ready["timing_ms"]))
    yield rt
    rt.close()


def browser_ids(rt, prompt, **config):
    out = rt.generate({"prompt": prompt, "config": config})
    r = out["result"]
    assert r["error"] is None, r["error"]
    return r


def test_greedy_modes_are_identical_in_the_browser(runtime):
    endings, n_checked = set(), 0
    # WebGPU (SwiftShader, ~4x WASM's time a token here): every other prompt, half of them with a stop string
    prompts = PROMPTS if runtime.ready["info"]["champion"]["backend"] == "wasm" else PROMPTS[::2]
    for i, prompt in enumerate(prompts):
        alone = browser_ids(runtime, prompt, max_new_tokens=16, temperature=0, speculate="none")
        config = dict(max_new_tokens=16, temperature=0)
        if i % 2 and len(alone["text"]) > 10:
            config["stop_strings"] = [alone["text"][5:8]]
            alone = browser_ids(runtime, prompt, speculate="none", **config)
        endings.add(alone["finish_reason"])
        for mode in ("draft", "lookup"):
            spec = browser_ids(runtime, prompt, speculate=mode, k=4, **config)
            assert spec["token_ids"] == alone["token_ids"], (prompt, mode)
            assert spec["finish_reason"] == alone["finish_reason"] and spec["text"] == alone["text"]
            n_checked += 1
    assert n_checked == 2 * len(prompts) and {"length", "stop"} <= endings


@pytest.mark.parametrize("mode", ["draft", "lookup"])
def test_a_round_is_one_crossing_whose_bytes_do_not_grow_with_the_answer(runtime, mode):
    """Per-round traffic between Python and JS is O(k): the request's constant state crosses once at
    begin, a round sends 5 scalars (+ lookup's proposals) and gets the record (12 words + proposals),
    whether the answer is 8 tokens or 120 (before the round contract, every round re-sent the policy,
    the stop ids and the whole committed context as JSON). On the WASM champion with the inline
    draft, every round is one call into the CPU module."""
    k = 4
    bound = 4 * (5 + k) + 4 * (12 + k)
    prompt = "And the LORD said unto Moses, And the LORD said unto Moses,"
    seen = {}
    for n in (8, 120):
        r = browser_ids(runtime, prompt, max_new_tokens=n, temperature=0, speculate=mode, k=k)
        st = r["stats"]
        n_rounds = st["rounds"] + st["baseline_steps"]
        assert st["rounds"] > 0 and 0 < st["round_bytes_max"] <= bound, st
        seen[n] = st["round_bytes_max"]
        counts = st["session"]
        assert counts["one_call_rounds"] + counts["separate_call_rounds"] == n_rounds
        if runtime.ready["info"]["champion"]["backend"] == "wasm":
            assert counts == {"one_call_rounds": n_rounds, "separate_call_rounds": 0, "chain_calls": 0}
        else:
            assert counts["one_call_rounds"] == 0
    assert seen[120] <= bound and len(r["token_ids"]) > 60


def test_eos_endings_are_identical(runtime):
    """A chat prompt (template, <|end|> stop id) and extra stop ids taken from the free answer:
    every mode ends on the same EOS token at the same place."""
    n_eos = 0
    for prompt in PROMPTS[:6]:
        free = browser_ids(runtime, prompt, max_new_tokens=16, temperature=0, speculate="none")
        stop_id = free["token_ids"][6]
        results = [browser_ids(runtime, prompt, max_new_tokens=16, temperature=0, speculate=m, k=4,
                               stop_token_ids=[stop_id]) for m in ("none", "draft", "lookup")]
        assert results[0]["finish_reason"] == "eos" and results[0]["token_ids"][-1] == stop_id
        n_eos += 1
        for r in results[1:]:
            assert r["token_ids"] == results[0]["token_ids"] and r["finish_reason"] == "eos"
    chat = [runtime.generate({"prompt": "Who was Moses?", "chat": True,
                              "config": {"max_new_tokens": 24, "temperature": 0, "speculate": m, "k": 4}})["result"]
            for m in ("none", "draft")]
    assert chat[0]["token_ids"] == chat[1]["token_ids"] and chat[0]["prompt_ids"][-2:] == [5, 205]   # "<|assistant|>\n"
    assert n_eos == 6


def _reference_matmul(runtime) -> str:
    """The function the browser champion's linears compute (ready.info.champion.matmul, "q8act-v1"
    on the WASM champion by default, docs/champion_wasm.md), as LlamaReference's matmul option."""
    return "q8act" if runtime.ready["info"]["champion"].get("matmul") == "q8act-v1" else "f32"


def _reference_orchestrator(matmul="f32"):
    tok = Tokenizer.from_file(os.path.join(CHAMPION, "tokenizer.json"))
    orch = Orchestrator(RunnerChampion(LlamaReference.from_dir(CHAMPION, weights="q8", matmul=matmul)),
                        RunnerDraft(LlamaReference.from_dir(DRAFT)), decode=lambda ids: tok.decode(ids, skip_special_tokens=True))
    return orch, tok


def test_browser_matches_the_cpython_reference_greedy(runtime):
    """Browser greedy ids vs the float64 reference on the same q8 weights computing the same matmul
    function (q8act-v1 on the WASM champion), 10 prompts x 16 tokens:
    where an answer first differs, the reference's logit gap between its token and the browser's
    at that position must be <= flip_margin("champion_logits_vs_reference") (f32 logits within
    that tolerance can swap only such a pair). Later positions are not compared: their contexts
    differ."""
    orch, tok = _reference_orchestrator(_reference_matmul(runtime))
    ref_champion = LlamaReference.from_dir(CHAMPION, weights="q8", matmul=_reference_matmul(runtime))
    stops = stop_ids_from(CHAMPION)
    n_equal, gaps = 0, []
    for prompt in PROMPTS[:10]:
        ids = tok.encode(prompt)
        want = orch.generate(ids, GenerationConfig(max_new_tokens=16, policy=SamplingPolicy(temperature=0),
                                                   speculate="none", stop_token_ids=stops)).token_ids
        got = browser_ids(runtime, prompt, max_new_tokens=16, temperature=0, speculate="none")["token_ids"]
        if got == want:
            n_equal += 1
            continue
        j = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
        assert j < len(got) and j < len(want), (prompt, "one answer stops early without differing", got, want)
        ref_champion.reset()
        logits = ref_champion.forward(ids + want[:j], 0)[-1]
        gaps.append(float(logits[want[j]] - logits[got[j]]))
        assert gaps[-1] <= flip_margin("champion_logits_vs_reference"), (prompt, j, got[j], want[j], gaps[-1])
    print(f"browser vs reference greedy: {n_equal}/10 identical; logit gaps at first differences {gaps}")


def test_same_seed_sampling_browser_vs_reference(runtime):
    """Same seed, mode and prompt: the browser and CPython sample identical answers for at least
    6 of 8 prompts (f32 vs f64 can flip a Gumbel near-tie or a u near the acceptance probability;
    tests/test_gpu_accept.py checks each such flip's margin at the decision level)."""
    orch, tok = _reference_orchestrator(_reference_matmul(runtime))
    stops = stop_ids_from(CHAMPION)
    agree, n = 0, 0
    for seed in range(8):
        prompt = PROMPTS[seed] + (" the king, the king, the king," if seed % 2 else "")
        mode = ("draft", "lookup")[seed % 2]
        want = orch.generate(tok.encode(prompt), GenerationConfig(
            max_new_tokens=12, policy=SamplingPolicy(temperature=1.0), speculate=mode, k=4, seed=seed,
            stop_token_ids=stops)).token_ids
        got = browser_ids(runtime, prompt, max_new_tokens=12, temperature=1.0, speculate=mode, k=4, seed=seed)["token_ids"]
        n += 1
        agree += got == want
    print(f"same-seed sampled answers identical browser vs CPython: {agree}/{n}")
    assert agree >= n - 2


def test_cli_browser_backend_json():
    r = subprocess.run([os.path.join(ROOT, ".venv", "bin", "exactspec") if os.path.exists(os.path.join(ROOT, ".venv", "bin", "exactspec")) else "exactspec",
                        "generate", "--backend", "browser", "--prompt", "In the beginning", "--temperature", "0",
                        "--max-new-tokens", "8", "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert {"text", "token_ids", "finish_reason", "stats", "prompt_ids", "timing_ms"} <= set(out)
    assert {"prefill", "draft", "verify", "total"} <= set(out["timing_ms"]) and "load" in out["timing_ms"]
    ref = subprocess.run([".venv/bin/exactspec" if os.path.exists(".venv/bin/exactspec") else "exactspec",
                          "generate", "--prompt", "In the beginning", "--temperature", "0", "--max-new-tokens", "8",
                          "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert json.loads(ref.stdout)["prompt_ids"] == out["prompt_ids"]


def test_cancel_in_the_browser_ends_the_answer_without_duplicates(runtime):
    out = runtime.generate({"prompt": "In the beginning", "config": {"max_new_tokens": 64, "temperature": 1.0,
                                                                     "speculate": "draft", "k": 4, "seed": 3}},
                           cancel_after_tokens=1)
    r = out["result"]
    assert r["finish_reason"] == "cancelled" and len(r["token_ids"]) < 64
    streamed = [t for e in out["events"] if e["kind"] == "tokens" for t in e["payload"]["token_ids"]]
    assert streamed == r["token_ids"]
    assert "".join(e["payload"]["text"] for e in out["events"] if e["kind"] == "tokens") == r["text"]
    # the engine keeps working after a cancel
    again = browser_ids(runtime, "In the beginning", max_new_tokens=4, temperature=0, speculate="draft", k=4)
    assert again["finish_reason"] == "length"


def test_bad_request_in_the_browser_is_a_coded_error(runtime):
    with pytest.raises(Exception) as e:
        runtime.generate({"prompt": "x", "config": {"max_new_tokens": 0}})
    assert "E_BAD_ARGUMENT" in str(e.value)
    with pytest.raises(Exception) as e:
        runtime.generate({"prompt": "x", "config": {"max_new_tokens": 600}})
    assert "E_CONTEXT_OVERFLOW" in str(e.value)


def test_browser_receipt_binds_the_same_identities_as_cpython(runtime):
    from exactspec.reference.models import load_pair
    r = browser_ids(runtime, "In the beginning", max_new_tokens=4, temperature=0, speculate="draft", k=2)
    pair = load_pair(CHAMPION, DRAFT, champion_weights="q8")   # the CLI's default: the page's artifact
    ref = pair.orchestrator.generate(pair.tokenizer.encode("In the beginning"), GenerationConfig(
        max_new_tokens=4, policy=SamplingPolicy(temperature=0), speculate="draft", k=2))
    for field in ("tokenizer_hash", "chat_template_hash", "sampling_policy_hash", "scheduler_policy_hash",
                  "champion_artifact_hash", "draft_artifact_hash"):
        assert r["receipt"][field] == ref.receipt[field], field
    assert r["receipt"]["champion_backend"] == runtime.ready["info"]["champion"]["backend"]
    assert r["receipt"]["runtime_version"].startswith("pyodide-")


PLACEMENT_JS = """async ([placement]) => {
  const { createEngine } = await import("/web/exactspec.mjs");
  const engine = await createEngine({ champion: "/web/models/champion/", draft: "/web/models/draft/",
    championBackend: "wasm", draftPlacement: placement, ...%s });
  const out = [];
  for (const [prompt, seed] of [["And the LORD said unto Moses,", 3], ["To be, or not to be,", 8]]) {
    const r = await engine.generate(prompt, { temperature: 1, repetition_penalty: 1.3, seed, k: 4,
      speculate: "draft", max_new_tokens: 48 });
    out.push({ ids: r.token_ids, stats: r.stats });
  }
  await engine.terminate();
  return out;
}""" % FAST_LOAD_JS


def test_the_draft_in_its_worker_and_in_the_champions_instance_give_the_same_rounds(browser_page, http_server):
    """The same sampled request, repetition penalty on (so the draft's rows depend on the committed
    context), with the draft in its own worker (the context sent once, then only its growth) and
    loaded into the WASM champion's instance (one call a round; cpu.c keeps the context marks):
    the same tokens, and the same proposals accepted and rejected round for round."""
    browser_page.goto(http_server.url + "/web/runner.html")
    inline = browser_page.evaluate(PLACEMENT_JS, ["inline"])
    worker = browser_page.evaluate(PLACEMENT_JS, ["worker"])
    for a, b in zip(inline, worker):
        assert a["ids"] == b["ids"]
        for key in ("rounds", "proposed", "accepted", "accepted_count_histogram", "rejection_position_histogram"):
            assert a["stats"][key] == b["stats"][key], key
        assert a["stats"]["session"]["separate_call_rounds"] == 0 and b["stats"]["session"]["one_call_rounds"] == 0
        assert a["stats"]["rounds"] > 5
