"""The shipped champion/draft pair on the CPython reference: greedy equality, sampled exactness,
the CLI's JSON, manifest refusal on the real files."""
import json
import os
import shutil

import numpy as np
import pytest

from exactspec.core.errors import E_MANIFEST_MISMATCH, ExactSpecError
from exactspec.reference.models import default_models_dir, load_pair
from exactspec.core.orchestrator import GenerationConfig
from exactspec.reference.processors import SamplingPolicy, process_logits
from exactspec.reference.reference_llama import LlamaReference
from test_cli import cli
from test_statistical import chi_square_pvalue

MODELS = default_models_dir()
CHAMPION, DRAFT = os.path.join(MODELS, "champion"), os.path.join(MODELS, "draft")

PROMPTS = ["In the beginning God created", "To be, or not to be, that is", "And it came to pass",
           "O Romeo, Romeo,", "The LORD is my shepherd;", "Friends, Romans, countrymen,",
           "Now the serpent was more subtil", "All the world's a stage,", "Blessed are the",
           "Enter HAMLET", "Thus saith the LORD of hosts,", "Good night, good night!"]


@pytest.fixture(scope="module")
def pair():
    assert os.path.isfile(os.path.join(CHAMPION, "model.safetensors")), "shipped models missing"
    return load_pair(CHAMPION, DRAFT)


def test_greedy_speculation_equals_champion_alone_on_the_real_pair(pair):
    orch, n_cases, endings_seen = pair.orchestrator, 0, set()
    for text in PROMPTS:
        ids = pair.tokenizer.encode(text)
        free = orch.generate(ids, GenerationConfig(max_new_tokens=32, policy=SamplingPolicy(temperature=0),
                                                   speculate="none", stop_token_ids=pair.stop_token_ids))
        endings = [dict()]
        if len(free.text) > 12:
            endings.append(dict(stop_strings=(free.text[6:10],)))
        for ending in endings:
            kw = dict(max_new_tokens=32, policy=SamplingPolicy(temperature=0), stop_token_ids=pair.stop_token_ids, **ending)
            alone = orch.generate(ids, GenerationConfig(speculate="none", **kw))
            endings_seen.add(alone.finish_reason)
            for mode, k in [("draft", 2), ("draft", 5), ("lookup", 4)]:
                spec = orch.generate(ids, GenerationConfig(speculate=mode, k=k, **kw))
                assert spec.token_ids == alone.token_ids, (text, mode, k, ending)
                assert spec.text == alone.text and spec.finish_reason == alone.finish_reason
                n_cases += 1
    assert n_cases >= 40 and {"length", "stop"} <= endings_seen


def test_sampled_first_token_follows_the_champion(pair):
    """Chi-square on the first sampled token (k=4, T=1), 800 fixed seeds, alpha 1e-3."""
    ids = pair.tokenizer.encode("And the")
    ref = LlamaReference.from_dir(CHAMPION)
    policy = SamplingPolicy(temperature=1.0)
    q1 = process_logits(ref.forward(ids, 0)[-1], ids, policy)
    expected = {(int(x),): float(q1[x]) for x in np.flatnonzero(q1)}
    orch = pair.orchestrator
    samples = [tuple(orch.generate(ids, GenerationConfig(max_new_tokens=2, policy=policy, speculate="draft",
                                                         k=4, seed=s)).token_ids[:1]) for s in range(800)]
    assert chi_square_pvalue(samples, expected) > 1e-3


def test_cli_generate_json_on_the_real_pair():
    r = cli("generate", "--prompt", "In the beginning", "--temperature", "0", "--max-new-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"text", "token_ids", "finish_reason", "stats", "prompt_ids"} <= set(out)
    assert out["prompt_ids"][0] == 0  # <|bos|>
    assert {"rounds", "proposed", "accepted", "tokens_per_round"} <= set(out["stats"])
    alone = json.loads(cli("generate", "--prompt", "In the beginning", "--temperature", "0", "--max-new-tokens", "12",
                           "--speculate", "none", "--json").stdout)
    assert alone["token_ids"] == out["token_ids"]
    s = cli("sample", "--prompt", "In the beginning", "--n", "3", "--max-new-tokens", "6", "--seed", "5", "--json")
    assert s.returncode == 0, s.stderr
    samples = json.loads(s.stdout)["samples"]
    assert len(samples) == 3 and all(len(x["token_ids"]) >= 1 for x in samples)


def test_mismatched_pair_is_refused(tmp_path):
    bad = tmp_path / "draft"
    shutil.copytree(DRAFT, bad)
    cfg = json.loads((bad / "tokenizer_config.json").read_text())
    cfg["chat_template"] = cfg.get("chat_template", "") + " "
    (bad / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExactSpecError) as e:
        load_pair(CHAMPION, str(bad))
    assert e.value.code == E_MANIFEST_MISMATCH and "chat_template" in e.value.message


def test_chat_template_renders_like_transformers():
    from transformers import AutoTokenizer
    from exactspec.formats.chat import check_template, encode_chat_prompt, render_chat
    from exactspec.formats.tokenizer import Tokenizer
    hf = AutoTokenizer.from_pretrained(CHAMPION)
    config = json.loads(open(os.path.join(CHAMPION, "tokenizer_config.json")).read())
    check_template(config["chat_template"])
    tok = Tokenizer.from_file(os.path.join(CHAMPION, "tokenizer.json"))
    for messages in ([{"role": "user", "content": "Who was Moses?"}], [{"role": "user", "content": "  \n\tx  "}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hail!"}, {"role": "user", "content": "And then?"}]):
        for gen in (True, False):
            want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            got = render_chat(messages, config["bos_token"], add_generation_prompt=gen)
            assert got == want
            want_ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen, return_dict=False)
            assert tok.encode(got, add_special_tokens=False) == want_ids
            assert encode_chat_prompt(tok, config, messages, add_generation_prompt=gen) == want_ids
