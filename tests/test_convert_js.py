"""web/convert/q8_artifact.mjs (the page's streaming converter) writes exactly the bytes of
`exactspec convert [--role draft]` (py/exactspec/reference/convert.py): bf16 shards with an index and f16
single files, embedding as float32 or q8, and the draft's all-F32 model.safetensors. Runs the module in node over file-backed Blobs (fs.openAsBlob),
the same Blob.slice reads the worker makes on picked File objects."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from browser_fixture import browser_page, chromium_browser, http_server  # noqa: F401

from hostile_folders import hf_folder

from exactspec.reference.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_RUN = r"""
import { openAsBlob } from "node:fs";
import { writeFileSync, readdirSync } from "node:fs";
import { writeRunArtifact } from "%(module)s";
const [dir, out, q8Embedding, role] = process.argv.slice(1);
const files = {};
for (const name of readdirSync(dir)) files[name] = await openAsBlob(`${dir}/${name}`);
const chunks = [];
let last = null;
const res = await writeRunArtifact(files, { role, q8Embedding: q8Embedding === "1", onChunk: (c) => chunks.push(Buffer.from(c)),
                                           onProgress: (p) => { last = p; } });
writeFileSync(out, Buffer.concat(chunks));
console.log(JSON.stringify({ ...res, last }));
"""


def _folder(tmp, dtype: str, shards: int) -> str:
    return hf_folder(str(tmp / f"{dtype}_{shards}"), dtype, shards)


ARTIFACT = {"champion": "model.q8.safetensors", "draft": "model.safetensors"}


@pytest.mark.parametrize("role,dtype,shards,q8_embedding", [("champion", "BF16", 2, False), ("champion", "F16", 1, True),
                                                            ("draft", "BF16", 1, False), ("draft", "F16", 2, False)])
def test_js_converter_gives_the_bytes_of_exactspec_convert(tmp_path, role, dtype, shards, q8_embedding):
    src = _folder(tmp_path, dtype, shards)
    convert(src, str(tmp_path / "py_out"), role=role, q8_embedding=q8_embedding)
    with open(tmp_path / "py_out" / ARTIFACT[role], "rb") as f:
        want = f.read()
    out = str(tmp_path / "js.safetensors")
    module = "file://" + os.path.join(ROOT, "web", "convert", "q8_artifact.mjs")
    r = subprocess.run(["node", "--input-type=module", "-e", NODE_RUN % {"module": module}, src, out,
                        "1" if q8_embedding else "0", role], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    with open(out, "rb") as f:
        got = f.read()
    assert len(got) == len(want) == report["bytes"]
    assert got == want
    assert report["last"]["tensors_done"] == report["last"]["tensors"]
    assert report["peak_block_bytes"] <= 3 * 4 * (1 << 20)         # one block of rows, never a tensor


def test_page_worker_converts_picked_files_to_the_same_bytes(tmp_path, browser_page, http_server):
    # Files as the page gets them from a folder picker (File objects), converted in the module
    # worker with progress messages; the blob's sha256 equals exactspec convert's file.
    served = os.path.join(ROOT, "build", "test_models", f"convert_js_{os.getpid()}")
    shutil.rmtree(served, ignore_errors=True)
    os.makedirs(os.path.dirname(served), exist_ok=True)
    shutil.copytree(_folder(tmp_path, "BF16", 2), served)
    try:
        convert(served, str(tmp_path / "py_out"))
        import hashlib
        with open(tmp_path / "py_out" / "model.q8.safetensors", "rb") as f:
            want = f.read()
        names = sorted(os.listdir(served))
        base = f"/build/test_models/{os.path.basename(served)}/"
        page = browser_page
        page.goto(http_server.url + "/web/tests/pyodide_harness.html")
        res = page.evaluate("""async ([base, names]) => {
          const files = {};
          for (const n of names) files[n] = new File([await (await fetch(base + n)).blob()], n);
          const worker = new Worker("/web/convert/convert_worker.mjs", { type: "module" });
          const progress = [];
          return await new Promise((resolve) => {
            worker.onmessage = (ev) => {
              if (ev.data.type === "progress") { progress.push(ev.data.tensors_done); return; }
              worker.terminate();
              resolve({ ...ev.data, blob: undefined, blobSize: ev.data.blob?.size, progress });
            };
            worker.postMessage({ files });
          });
        }""", [base, names])
        assert res["type"] == "done", res
        assert res["sha256"] == hashlib.sha256(want).hexdigest() and res["blobSize"] == len(want)
        assert res["progress"] == list(range(1, len(res["progress"]) + 1)) and len(res["progress"]) > 10
    finally:
        shutil.rmtree(served, ignore_errors=True)
