"""Folders as transformers writes them today, in the browser engine and the page (issue 17): the
chat template in chat_template.jinja (it wins over tokenizer_config.json's, as in transformers),
and a bf16 draft: converted in the page when picked, refused with one code naming the file and
the field when served as it is."""
import json
import os
import re
import shutil

import pytest

from browser_fixture import chromium_browser, forward_console, http_server, wait_load_ended  # noqa: F401
from hostile_folders import to_half
from engine_loads import FAST_LOAD, browser_runtime
from exactspec.reference.models import default_models_dir
from exactspec.formats.safetensors import load_safetensors, to_numpy, write_safetensors

MODELS = default_models_dir()
MOUNTED = {"champion": "/models/champion/", "draft": "/models/draft/", "manifest": None}
WASM = {"championBackend": "wasm", **FAST_LOAD}
CONVERSATION = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who made the light?"},
                {"role": "assistant", "content": "God said, Let there be light."}, {"role": "user", "content": "And then?"}]
# differs from the shipped tokenizer_config.json template in its markers, so the ids show which one ran
JINJA = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n[{{ m['content'] | trim }}]<|end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def write_half_weights(folder, dtype: str = "BF16", shards: int = 1) -> None:
    """folder/model.safetensors rewritten with every tensor in dtype (as transformers saves a bf16
    model), in `shards` files with model.safetensors.index.json when more than one."""
    path = os.path.join(folder, "model.safetensors")
    tensors = {k: to_numpy(t) for k, t in load_safetensors(path).items()}
    if shards == 1:
        write_safetensors(path, {n: (dtype, v.shape, to_half(v, dtype)) for n, v in tensors.items()}, {"format": "pt"})
        return
    os.remove(path)
    names, weight_map = sorted(tensors), {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        write_safetensors(os.path.join(folder, file), {n: (dtype, tensors[n].shape, to_half(tensors[n], dtype)) for n in part},
                          {"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def move_template_to_jinja(folder) -> None:
    """The chat template only in folder/chat_template.jinja (JINJA), as transformers saves it today."""
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(JINJA, encoding="utf-8")


@pytest.fixture(scope="module")
def runtime(tmp_path_factory, chromium_browser):
    """A copy of the shipped pair served from mounts (files changed in place between loads)."""
    root = tmp_path_factory.mktemp("hf_folders")
    for role in ("champion", "draft"):
        shutil.copytree(os.path.join(MODELS, role), root / role)
    rt = browser_runtime(str(root / "champion"), str(root / "draft"), browser=chromium_browser, timeout_s=600,
                         champion_backend="wasm")
    yield rt, root
    rt.close()


def load(rt, models):
    return rt.page.evaluate("([m, o]) => window.exactspecRunner.tryLoad(m, o)", [models, WASM])


def generate(rt, payload):
    return rt.page.evaluate("(p) => window.exactspecRunner.generate(p)", payload)


def chat_prompt_ids(rt):
    out = generate(rt, {"messages": CONVERSATION, "config": {"max_new_tokens": 1, "temperature": 0, "speculate": "none"}})
    assert "result" in out and out["result"]["error"] is None, out
    return out["result"]["prompt_ids"]


def hf_chat_ids(folder, messages=CONVERSATION):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(folder))
    return hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def test_chat_template_jinja_is_read_and_wins_as_in_transformers(runtime):
    rt, root = runtime
    champion, draft = root / "champion", root / "draft"
    saved = {p: p.read_bytes() for p in (champion / "tokenizer_config.json", draft / "tokenizer_config.json")}
    try:
        shipped = hf_chat_ids(champion)
        # both files: the .jinja wins (the draft carries the same, so the pair's chat_template field agrees)
        for folder in (champion, draft):
            (folder / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
        ready = load(rt, MOUNTED)
        assert "ready" in ready and ready["ready"]["info"]["draft"] is not None, ready
        want = hf_chat_ids(champion)
        assert want != shipped and chat_prompt_ids(rt) == want
        # the .jinja is part of each model's identity: a draft without it is refused naming the field
        (draft / "chat_template.jinja").unlink()
        out = load(rt, MOUNTED)
        error = out.get("error") or out["ready"]["info"]["draft_error"]
        assert error["code"] == "E_MANIFEST_MISMATCH" and "chat_template_sha256" in error["message"], out
        (draft / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
        # only the .jinja: tokenizer_config.json holds no chat_template
        for folder in (champion, draft):
            move_template_to_jinja(folder)
        ready = load(rt, MOUNTED)
        assert "ready" in ready and ready["ready"]["info"]["chat_template"] is True, ready
        assert chat_prompt_ids(rt) == hf_chat_ids(champion) == want
        # a .jinja that is not UTF-8: refused before any weights, naming the file, one code
        (champion / "chat_template.jinja").write_bytes(b"\xff{{ bos_token }}")
        err = load(rt, MOUNTED)["error"]
        assert err["code"] == "E_MODEL_LOAD" and err["message"].endswith("champion/chat_template.jinja: not UTF-8 text (byte 0)")
        assert re.findall(r"\bE_[A-Z_]+\b", err["message"]) in ([], ["E_MODEL_LOAD"]), err   # the runner's Error.message
    finally:
        for folder in (champion, draft):
            (folder / "chat_template.jinja").unlink(missing_ok=True)
        for path, raw in saved.items():
            path.write_bytes(raw)
    ready = load(rt, MOUNTED)                     # absent again: no error, tokenizer_config's template
    assert "ready" in ready, ready
    assert chat_prompt_ids(rt) == shipped


def test_a_served_bf16_draft_is_refused_with_one_code_naming_file_and_field(runtime):
    rt, root = runtime
    weights = root / "draft" / "model.safetensors"
    saved = weights.read_bytes()
    try:
        write_half_weights(root / "draft", "BF16")
        ready = load(rt, MOUNTED)["ready"]
        assert ready["info"]["draft"] is None, ready
        refused = generate(rt, {"prompt": "And the LORD said", "config": {"max_new_tokens": 4, "speculate": "draft"}})
        refused = refused["refused"]
        assert refused["code"] == "E_DRAFT_LOST", refused
        text = refused["message"]                # the runner's Error.message: "CODE: sentence"
        assert re.findall(r"\bE_[A-Z_]+\b", text) == ["E_DRAFT_LOST"], text          # one code
        assert text.count("model.safetensors") == 1 and "has dtype BF16" in text, text
        assert "exactspec convert --role draft" in text, text
    finally:
        weights.write_bytes(saved)


# ------------------------------------------------------------------ the page's picker
PAGE_MESSAGE = {"role": "user", "content": "In the beginning"}

@pytest.fixture(scope="module")
def app(chromium_browser, http_server):
    context = chromium_browser.new_context()
    page = context.new_page()
    page.console_log = forward_console(page)
    page.set_default_timeout(300_000)
    page.goto(http_server.url + "/web/index.html?model=test-pair")   # the fast test pair, no real model
    yield page
    context.close()


def page_answer(page, mode, max_tokens):
    if mode == "draft":
        page.wait_for_function("() => window.appDraftReady === true")
    page.select_option("#speculate", mode)
    page.click("#new_conversation")
    page.fill("#max_new_tokens", str(max_tokens))
    page.fill("#prompt", PAGE_MESSAGE["content"])
    page.click("#go")
    page.wait_for_function("() => window.appState.stage === 'ready' && !document.getElementById('go').disabled")
    spans = page.evaluate("() => [...[...document.querySelectorAll('#conversation .turn.assistant')].at(-1)"
                          ".querySelectorAll('span.tok')].map(e => [e.dataset.source, e.textContent])")
    return page.text_content("#status"), page.evaluate("() => window.appState.lastResult"), spans


@pytest.mark.parametrize("dtype,shards", [("BF16", 1), ("F16", 2)])
def test_a_picked_half_precision_draft_is_converted_in_the_page_and_speculates_exactly(app, tmp_path, dtype, shards):
    """Both picked folders as transformers writes them: the template in chat_template.jinja only,
    the draft in bf16 (one file) or f16 (sharded). The page converts the draft, chats in the .jinja
    template (transformers' ids), and greedy speculation gives the champion-alone tokens."""
    champion, draft = tmp_path / "champion", tmp_path / f"draft_{dtype.lower()}"
    shutil.copytree(os.path.join(MODELS, "champion"), champion)
    shutil.copytree(os.path.join(MODELS, "draft"), draft, ignore=shutil.ignore_patterns("model.q8.safetensors"))
    write_half_weights(draft, dtype, shards)
    for folder in (champion, draft):
        move_template_to_jinja(folder)
    # the previous load's draft first: its late draft_ready would mark this load's draft ready (web/app.mjs)
    app.wait_for_function("() => window.appDraftReady === true")
    app.set_input_files("#champion_folder", str(champion))
    app.set_input_files("#draft_folder", str(draft))
    loads = app.evaluate("() => window.appState.loads")
    app.click("#load_models")
    wait_load_ended(app, loads)
    assert app.evaluate("() => window.appState.stage") == "ready", app.text_content("#status")
    app.wait_for_function("() => window.appDraftReady === true")
    rows = app.inner_text("#progress")
    assert re.search(r"draft/model\.safetensors \(converting here\)\n(\d+\.\d) of \1 MB", rows), rows   # all its bytes
    assert not app.eval_on_selector("#speculate option[value=draft]", "o => o.disabled"), app.text_content("#status")
    app.fill("#temperature", "0")                                   # greedy
    assert app.is_checked("#chat")                                  # the .jinja is the model's chat template
    status, spec, spec_spans = page_answer(app, "draft", 24)
    assert status == "done" and spec["n"] == 24, (status, spec)
    assert app.evaluate("() => window.appState.lastPromptIds") == hf_chat_ids(champion, [PAGE_MESSAGE])
    status, alone, alone_spans = page_answer(app, "none", 24)
    assert status == "done" and alone["n"] == 24, (status, alone)
    assert [t for _, t in spec_spans] == [t for _, t in alone_spans]   # the champion's own tokens
    assert "accepted" in {s for s, _ in spec_spans}, spec_spans       # the converted draft proposed them
    assert not [m for m in app.console_log if m[0] in ("error", "pageerror")], app.console_log
