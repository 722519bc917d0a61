"""One table of a model folder's files (py/exactspec/formats/model_files.json): Python's lists and the page's folder check are read from it."""
import json
import subprocess
from pathlib import Path

from exactspec.formats import manifest
from exactspec.pyodide import model_check

ROOT = Path(__file__).resolve().parent.parent
TABLE = json.loads((ROOT / "py" / "exactspec" / "formats" / "model_files.json").read_text())


def test_python_reads_the_table():
    assert manifest.FILES == model_check.MODEL_FILES == tuple(TABLE["required"])
    assert (manifest.CHAT_TEMPLATE_FILE,) == model_check.OPTIONAL_MODEL_FILES == tuple(TABLE["optional"])
    assert model_check.DEFAULT_RUN_WEIGHTS == TABLE["run_artifact"]
    assert (manifest.Q8_WEIGHTS_FILE, manifest.WEIGHTS_FILE) == (TABLE["run_artifact"]["champion"], TABLE["run_artifact"]["draft"])
    assert json.loads(model_check.model_files()) == TABLE                 # what the worker's model check reads


def test_the_page_checks_a_picked_folder_against_the_table():
    """folderFiles names exactly the files the table requires and a folder lacks; a table with one more
    required file is obeyed with no JS change."""
    script = """
import { folderFiles } from "./web/exactspec.mjs";
const table = JSON.parse(process.argv[1]);
const folder = ["config.json", "tokenizer.json", "model.q8.safetensors"].map((n) => new File(["{}"], n));
const refusal = (t) => { try { folderFiles("champion", folder, t); return null; } catch (err) { return err.message; } };
const grown = { ...table, required: ["config.json", "tokenizer.json"] };
console.log(JSON.stringify([refusal(table), Object.keys(folderFiles("champion", folder, grown)).sort()]));
"""
    r = subprocess.run(["node", "--input-type=module", "-e", script, json.dumps(TABLE)], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    refused, files = json.loads(r.stdout)
    assert refused.startswith("E_MODEL_LOAD: champion folder lacks tokenizer_config.json, generation_config.json"), refused
    assert files == ["champion/config.json", "champion/model.q8.safetensors", "champion/tokenizer.json"]
