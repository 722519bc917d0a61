"""The page's converter refuses what `exactspec convert` refuses, with the same code: each hostile
folder of tests/hostile_folders.py goes through the CLI (a subprocess) and through the page's
folder picker (headless Chromium: the folder set on an <input webkitdirectory>, then the module's
resolveModels, which converts a Hugging Face champion in its worker). Refusals that need no
weight byte come before any conversion progress, in milliseconds. The JS config validator
(web/formats/model_checks.mjs) and the Python one agree on every config case of tests/config_cases.py."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from browser_fixture import chromium_browser, forward_console, http_server  # noqa: F401
from config_cases import BAD_CONFIG_BYTES, BAD_CONFIGS, GOOD_CONFIGS
from hostile_folders import HOSTILE, hf_folder

from exactspec.formats.config import load_json_bounded, validate_config
from exactspec.core.errors import ExactSpecError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PICK_AND_CONVERT = """async () => {
  const { loadModelFiles, resolveModels } = await import("/web/exactspec.mjs");
  const t0 = performance.now();
  const progress = [];
  try {
    const table = await loadModelFiles(new URL("/py/exactspec/", location.href).href);
    const models = await resolveModels({ champion: document.getElementById("pick").files, draft: null }, {},
                                       (p) => { if (p.stage === "convert" && p.loaded > 0) progress.push(p.loaded); }, table);
    return { ok: true, bytes: models.files["champion/model.q8.safetensors"].size, progress: progress.length, ms: performance.now() - t0 };
  } catch (err) {
    return { ok: false, code: err.code, message: err.message, progress: progress.length, ms: performance.now() - t0 };
  }
}"""


def cli_convert(src: str, dst: str) -> dict:
    """`exactspec convert SRC DST` -> {ok, code, message} from its exit status and stderr."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "py"))
    r = subprocess.run([sys.executable, "-m", "exactspec", "convert", src, dst], capture_output=True, text=True,
                       timeout=300, env=env)
    if r.returncode == 0:
        return {"ok": True}
    m = re.search(r"(E_[A-Z_]+): (.*)", r.stderr)
    assert m and r.stderr.count("E_") == 1, r.stderr                  # one code, then a sentence
    return {"ok": False, "code": m[1], "message": m[2]}


@pytest.fixture(scope="module")
def picker(chromium_browser, http_server):
    context = chromium_browser.new_context()
    page = context.new_page()
    page.console_log = forward_console(page)
    page.goto(http_server.url + "/web/tests/picker_harness.html")
    yield page
    context.close()


def page_convert(picker, folder: str) -> dict:
    picker.set_input_files("#pick", folder)
    return picker.evaluate(PICK_AND_CONVERT)


def test_a_sound_folder_converts_in_both(picker, tmp_path):
    src = hf_folder(str(tmp_path / "sound"))
    assert cli_convert(src, str(tmp_path / "out")) == {"ok": True}
    page = page_convert(picker, src)
    assert page["ok"], page
    assert page["bytes"] == os.path.getsize(tmp_path / "out" / "model.q8.safetensors") and page["progress"] > 10


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_cli_and_page_refuse_the_same_hostile_folder(picker, tmp_path, case):
    mutate, code, phrase, before_any_weight = HOSTILE[case]
    src = hf_folder(str(tmp_path / "src"))
    mutate(src)
    cli = cli_convert(src, str(tmp_path / "out"))
    page = page_convert(picker, src)
    assert not cli["ok"] and cli["code"] == code and phrase in cli["message"], cli
    assert not page["ok"] and page["code"] == code and phrase in page["message"], page
    assert page["message"].count("E_") == 1, page                 # one code, then a sentence
    assert "TypeError" not in page["message"], page
    if before_any_weight:                                          # refused from config, index and headers alone
        assert page["progress"] == 0 and page["ms"] < 3000, page
    assert not os.path.exists(tmp_path / "out" / "model.q8.safetensors")


NODE_CONFIGS = r"""
import { readFileSync } from "node:fs";
import { parseJsonBounded, validateConfig } from "%(module)s";
const out = [];
for (const raw of JSON.parse(readFileSync(process.argv[1], "utf8"))) {
  try {
    out.push({ ok: validateConfig(parseJsonBounded(Buffer.from(raw, "latin1"))) });
  } catch (err) {
    out.push({ code: err.code ?? `uncoded ${err.name}: ${err.message}`, message: err.message });
  }
}
console.log(JSON.stringify(out));
"""


def _python_verdict(raw: bytes) -> dict:
    try:
        return {"ok": vars(validate_config(load_json_bounded(raw)))}
    except ExactSpecError as e:
        return {"code": e.code}


def test_js_and_python_config_validators_agree(tmp_path):
    from test_hf_refusals import ACCEPTED, REFUSED, _changed
    phrases = {json.dumps(_changed(base, fields)).encode(): text for _, base, fields, text in REFUSED}
    cases = ([json.dumps(cfg).encode() for _, cfg, _ in BAD_CONFIGS] + [raw for _, raw, _ in BAD_CONFIG_BYTES]
             + [json.dumps(cfg).encode() for _, cfg in GOOD_CONFIGS] + list(phrases)
             + [json.dumps(_changed(base, fields)).encode() for _, base, fields, _ in ACCEPTED]
             + [b'{"__proto__": {"hidden_size": 1}, ' + json.dumps(GOOD_CONFIGS[0][1]).encode()[1:],
                b'\xef\xbb\xbf' + json.dumps(GOOD_CONFIGS[0][1]).encode(), b'[]', b'{"hidden_size": 1e400}'])
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([raw.decode("latin1") for raw in cases]))
    module = "file://" + os.path.join(ROOT, "web", "formats", "model_checks.mjs")
    r = subprocess.run(["node", "--input-type=module", "-e", NODE_CONFIGS % {"module": module}, str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout)
    assert len(js) == len(cases)
    accepted = 0
    for raw, got in zip(cases, js):
        want = _python_verdict(raw)
        if "ok" in want:
            accepted += 1
            assert "ok" in got, (raw[:200], got)
            assert got["ok"] == json.loads(json.dumps(want["ok"])), raw[:200]   # every field, the same value
        else:
            assert got["code"] == want["code"], (raw[:200], got, want)
            assert phrases.get(raw, "") in got["message"] and got["message"].count("E_") == 1, (raw[:200], got)
    assert accepted == len(GOOD_CONFIGS) + len(ACCEPTED) + 1        # the __proto__ key is only an unknown field


NODE_HEADERS = r"""
import { readFileSync } from "node:fs";
import { parseSafetensors } from "%(module)s";
const out = [];
for (const path of process.argv.slice(1)) {
  const b = readFileSync(path);
  try {
    out.push({ ok: parseSafetensors(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength), path).tensors.size });
  } catch (err) {
    out.push({ code: err.code ?? `uncoded ${err.name}`, message: err.message });
  }
}
console.log(JSON.stringify(out));
"""


def test_js_and_python_safetensors_readers_refuse_the_same_corruptions(tmp_path):
    from test_safetensors import CORRUPTIONS, GOOD_DATA, GOOD_HEADER, _file
    cases = {**CORRUPTIONS, "good": (_file(GOOD_HEADER, GOOD_DATA), None)}
    paths = []
    for i, (blob, _) in enumerate(cases.values()):
        paths.append(str(tmp_path / f"{i}.safetensors"))
        with open(paths[-1], "wb") as f:
            f.write(blob)
    module = "file://" + os.path.join(ROOT, "web", "formats", "safetensors.mjs")
    r = subprocess.run(["node", "--input-type=module", "-e", NODE_HEADERS % {"module": module}, *paths],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for (case, (_, problem)), got in zip(cases.items(), json.loads(r.stdout)):
        if problem is None:
            assert got == {"ok": 2}, got
        else:                                   # the phrase test_safetensors.py requires of the Python reader
            assert got["code"] == "E_MODEL_LOAD" and problem in got["message"] and got["message"].count("E_") == 1, (case, got)
