"""Codes printed once (issue 16): an error reads "E_X: sentence", never "E_X: E_X: ...", however many
boundaries (a JS Error, Pyodide, the CLI's printer) put the code in front of its message again."""
import pytest

from exactspec.host import cli
from browser_fixture import browser_page, chromium_browser  # noqa: F401 (fixtures)
from exactspec.host.browser_run import _coded_from
from exactspec.host.cli import main as cli_main
from exactspec.core.errors import CODE_TABLE, E_BAD_ARGUMENT, E_DRAFT_LOST, E_MODEL_LOAD, ExactSpecError, coded_error

DOUBLED = [
    ("E_MODEL_LOAD: E_MODEL_LOAD: config.json: bad", "config.json: bad"),
    ("E_MODEL_LOAD:E_MODEL_LOAD: x", "x"),
    ("Error: E_MODEL_LOAD: E_MODEL_LOAD: y", "y"),
    ("JsException: Error: E_MODEL_LOAD: z", "z"),
    ("E_MODEL_LOAD", CODE_TABLE[E_MODEL_LOAD]),   # the code alone: its one-line description
    ("", CODE_TABLE[E_MODEL_LOAD]),
    ("E_MODEL_LOADER: a different word", "E_MODEL_LOADER: a different word"),
    ("tensor E_MODEL_LOAD: in the middle stays", "tensor E_MODEL_LOAD: in the middle stays"),
]


@pytest.mark.parametrize("message, sentence", DOUBLED)
def test_an_error_says_its_code_once(message, sentence):
    err = ExactSpecError(E_MODEL_LOAD, message)
    assert err.message == sentence and str(err) == f"E_MODEL_LOAD: {sentence}"
    assert err.to_dict() == {"code": E_MODEL_LOAD, "message": sentence}


@pytest.mark.parametrize("text, code, sentence", [
    ("E_TARGET_NUMERIC_OR_MASK", "E_TARGET_NUMERIC_OR_MASK", CODE_TABLE["E_TARGET_NUMERIC_OR_MASK"]),
    ("Error: E_BAD_ARGUMENT: E_BAD_ARGUMENT: k is 99", E_BAD_ARGUMENT, "k is 99"),
    ("PythonError: E_MODEL_LOAD: E_MODEL_LOAD: tokenizer.json: bad", E_MODEL_LOAD, "tokenizer.json: bad"),
    ("plain failure", E_DRAFT_LOST, "draft: RuntimeError: plain failure"),
])
def test_coded_error_says_the_code_once(text, code, sentence):
    err = coded_error(RuntimeError(text), E_DRAFT_LOST, "draft")
    assert (err.code, err.message) == (code, sentence)


def test_the_cli_printer_says_the_code_once(capsys):
    """A result's error dict (what the browser backend hands back) printed by the CLI."""
    cli._say_error("E_TARGET_NUMERIC_OR_MASK", "E_TARGET_NUMERIC_OR_MASK")
    cli._say_error(E_BAD_ARGUMENT, "E_BAD_ARGUMENT: E_BAD_ARGUMENT: temperature is 1e-320")
    assert capsys.readouterr().err.splitlines() == [
        f"exactspec: E_TARGET_NUMERIC_OR_MASK: {CODE_TABLE['E_TARGET_NUMERIC_OR_MASK']}",
        "exactspec: E_BAD_ARGUMENT: temperature is 1e-320"]


def test_a_cli_refusal_of_a_bad_model_folder_says_its_code_once(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    for args in (["convert", str(tmp_path), str(tmp_path / "out")],
                 ["generate", "--champion", str(tmp_path), "--prompt", "hi", "--speculate", "none"]):
        assert cli_main(args) == 1
        line = capsys.readouterr().err.strip()
        assert line.startswith("exactspec: E_MODEL_LOAD: ") and line.count("E_MODEL_LOAD") == 1, line


def test_a_js_error_crossing_into_python_says_its_code_once(browser_page):  # noqa: F811
    """A real Error thrown in Chromium, carried back by Playwright ("Page.evaluate: Error: ...") and
    read as `generate --backend browser` reads the page's failures. The suite's one Chromium
    (browser_fixture): a second sync Playwright in the same process is refused."""
    with pytest.raises(Exception) as caught:
        browser_page.evaluate("() => { throw new Error('E_MODEL_LOAD: E_MODEL_LOAD: config.json: bad'); }")
    err = _coded_from(caught.value)
    assert (err.code, err.message) == (E_MODEL_LOAD, "config.json: bad"), str(caught.value)
