"""tools/bench/peer.py's transformers.js arm (--tfjs) and tools/bench/onnx_export.py, without a browser:
only the bench server serves transformers.js and onnxruntime-web (from build/tfjs/), in frames of its
own origin; runner names, the model folder check, the summary, the comparison and the doc lines; the
GGUF -> Hugging Face folder step of the export gives back the exported model's weights exactly (q/k
rows in HF order), its config and a tokenizer that encodes as the source's. The browser run itself
needs the bench-only install and export (tools/bench/setup_onnx.sh): docs/performance.md."""
import importlib.util
import json
import os
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from safetensors.numpy import load_file

from exactspec.host.server import CONTENT_SECURITY_POLICY, StaticServer
from exactspec.reference.models import default_models_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import peer  # noqa: E402
import onnx_export  # noqa: E402

_spec = importlib.util.spec_from_file_location("export_gguf", os.path.join(ROOT, "tools", "export_gguf.py"))
export_gguf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(export_gguf)


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), b""


@pytest.fixture
def fake_tfjs(tmp_path, monkeypatch):
    """build/tfjs/node_modules stand-ins: the two package folders the bench server mounts."""
    mounts = {}
    for prefix, name in (("/node_modules/@huggingface/transformers/", "transformers"), ("/node_modules/onnxruntime-web/", "ort")):
        folder = tmp_path / name / "dist"
        folder.mkdir(parents=True)
        (folder / "x.wasm").write_bytes(b"\0asm")
        (folder / "x.js").write_text("export {};")
        mounts[prefix] = str(tmp_path / name)
    monkeypatch.setattr(peer, "TFJS_MOUNTS", mounts)
    return mounts


def test_only_the_bench_server_serves_transformers_js(fake_tfjs):
    app, bench = StaticServer(ROOT), peer.PeerServer()
    try:
        for url in ("/node_modules/onnxruntime-web/dist/x.wasm", "/node_modules/@huggingface/transformers/dist/x.js"):
            assert _get(app.url + url)[0] == 404
        status, headers, body = _get(bench.url + "/node_modules/onnxruntime-web/dist/x.wasm")
        assert status == 200 and headers["Content-Type"] == "application/wasm" and body == b"\0asm"
        assert _get(bench.url + "/node_modules/@huggingface/transformers/dist/x.js")[1]["Content-Type"] == "text/javascript"
        # cross-origin isolated (onnxruntime-web's threads), frames of the bench's own origin only (one runner per iframe)
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin" and headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert "frame-ancestors 'self'" in headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
        assert _get(bench.url + "/node_modules/onnxruntime-web/../transformers/dist/x.js")[0] == 404
    finally:
        app.close()
        bench.close()


def test_runner_names_and_refusals():
    assert peer.tfjs_runners("fp32,int8", "1,2") == [("tfjs-fp32-t1", "fp32", 1), ("tfjs-fp32-t2", "fp32", 2),
                                                     ("tfjs-int8-t1", "int8", 1), ("tfjs-int8-t2", "int8", 2)]
    assert peer.tfjs_runners("int8", "2") == [("tfjs-int8-t2", "int8", 2)]
    with pytest.raises(SystemExit, match="--tfjs-dtypes q4"):
        peer.tfjs_runners("q4", "1")
    with pytest.raises(SystemExit, match="--tfjs-threads 0"):
        peer.tfjs_runners("fp32", "0")


def test_model_folder_check(tmp_path, fake_tfjs):
    folder = tmp_path / "onnx_model"
    (folder / "onnx").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "onnx/model.onnx"):
        (folder / name).write_text("{}")
    with pytest.raises(SystemExit, match=r"no onnx/model_int8.onnx \(build/onnx_venv/bin/python tools/bench/onnx_export.py"):
        peer.tfjs_model_url(str(folder), ["fp32", "int8"], {})
    mounts = {}
    assert peer.tfjs_model_url(str(folder), ["fp32"], mounts) == "/models/tfjs/"
    assert mounts == {"/models/tfjs/": os.path.realpath(folder)}
    (folder / "onnx" / "model_int8.onnx").write_text("")
    fake_tfjs["/node_modules/onnxruntime-web/"] = str(tmp_path / "absent")
    with pytest.raises(SystemExit, match="bash tools/bench/setup_onnx.sh"):
        peer.tfjs_model_url(str(folder), ["fp32", "int8"], {})


def _rec(runner, ms, t=0.0, own=None):
    return {"runner": runner, "temperature": t, "ms_per_token": ms, "own_ms_per_token": own,
            "first_token_ms": 1.0, "tokens_per_round": 1.0, "n_tokens": 8}


def test_summary_comparison_and_doc_lines():
    records = [_rec("wllama", 10.0, own=9.0), _rec("tfjs-fp32-t1", 8.0), _rec("tfjs-fp32-t1", 6.0), _rec("tfjs-int8-t2", 9.0),
               _rec("ours-wasm:none", 3.5, own=3.0), _rec("ours-wasm:lookup", 2.0, own=2.0),
               _rec("tfjs-int8-t2", 5.0, t=1.0), _rec("ours-wasm:none", 4.0, t=1.0, own=4.0)]
    load = {"wllama": 1000.0, "ours-wasm": 2000.0, "tfjs-fp32-t1": 3000.0, "tfjs-int8-t2": 4000.0}
    rows = peer.summarise(records, load)
    by = {(r["runner"], r["temperature"]): r for r in rows}
    assert by[("tfjs-fp32-t1", 0.0)]["ms_per_token"] == 7.0 and by[("tfjs-fp32-t1", 0.0)]["own_ms_per_token"] is None
    assert by[("tfjs-fp32-t1", 0.0)]["load_ms"] == 3000 and by[("tfjs-fp32-t1", 0.0)]["vs_wllama"] == round(10 / 7, 3)
    assert "| tfjs-fp32-t1 | 0 | 7.0 | 1.43x | - | 1 | 1.00 | 3.0 |" in peer.markdown_table(rows)
    assert peer.median_or_none([None, None]) is None and peer.median_or_none([1.0, None, 2.0]) == 1.5
    # ours alone against the fastest transformers.js runner of each temperature; lookup rows are not "alone"
    assert peer.tfjs_comparison(rows) == [
        {"temperature": 0.0, "ours": "ours-wasm:none", "tfjs": "tfjs-fp32-t1", "ours_ms": 3.5, "tfjs_ms": 7.0, "speedup": 2.0},
        {"temperature": 1.0, "ours": "ours-wasm:none", "tfjs": "tfjs-int8-t2", "ours_ms": 4.0, "tfjs_ms": 5.0, "speedup": 1.25}]
    assert peer.tfjs_doc_lines({"tfjs": {}}) == []
    out = {"rows": rows, "models": {"tfjs": "/models/tfjs/"},
           "tfjs": {"tfjs-fp32-t1": {"dtype": "fp32", "threads": 1, "version": "4.3.1"},
                    "tfjs-int8-t2": {"dtype": "int8", "threads": 2, "version": "4.3.1"}},
           "agreement": [{"prompt": "Hello there, world", "tfjs": {
               "tfjs-fp32-t1": {"compared": True, "first_divergence": None, "same_prompt_ids": True},
               "tfjs-int8-t2": {"compared": True, "first_divergence": 3, "same_prompt_ids": False}}},
               {"prompt": "no ours runner", "tfjs": {"tfjs-fp32-t1": {"compared": False, "first_divergence": None,
                                                                       "same_prompt_ids": None}}}]}
    lines = peer.tfjs_doc_lines(out)
    assert lines[0].startswith("transformers.js 4.3.1 (onnxruntime-web, WASM backend")
    assert "tfjs-fp32-t1 (fp32, 1 thread), tfjs-int8-t2 (int8, 2 threads)" in lines[0]
    assert lines[1] == ("Greedy tokens, transformers.js against ours: 1 of 2 (prompt, runner) runs identical; "
                        "first divergences: 'Hello there, world' tfjs-int8-t2 at 3.")
    assert lines[2] == "Prompt token ids, transformers.js against ours: different for tfjs-int8-t2."
    assert lines[3] == ("T = 0: ours-wasm:none 3.5 ms/token against transformers.js at its best (tfjs-fp32-t1, 7.0): **2.00x**.")


def test_generation_config():
    assert onnx_export.generation_config({"bos_token_id": 1, "eos_token_id": 2}, (2,)) == \
        {"do_sample": False, "bos_token_id": 1, "eos_token_id": 2}
    assert onnx_export.generation_config({"eos_token_id": 2}, (0, 2)) == {"do_sample": False, "eos_token_id": [0, 2]}


def test_gguf_to_hf_folder_gives_the_model_back(tmp_path):
    """The shipped draft exported to an F32 GGUF (llama.cpp's q/k row order) comes back as the same
    float32 tensors under HF names, the same config and a tokenizer that encodes alike."""
    from tokenizers import Tokenizer
    source = os.path.join(default_models_dir(), "draft")
    gguf_path = str(tmp_path / "draft.f32.gguf")
    export_gguf.export_gguf(source, gguf_path, "f32", "f32")
    hf = tmp_path / "hf"
    onnx_export.hf_folder_from_gguf(gguf_path, str(hf))
    want, got = load_file(os.path.join(source, "model.safetensors")), load_file(str(hf / "model.safetensors"))
    assert set(got) == set(want)
    for name, w in want.items():
        assert np.array_equal(got[name], w.astype(np.float32)), name
    with open(os.path.join(source, "config.json")) as f:
        src_config = json.load(f)
    with open(hf / "config.json") as f:
        config = json.load(f)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "rms_norm_eps", "rope_theta", "tie_word_embeddings"):
        assert config[key] == src_config.get(key, config[key]), key
    text = "In the beginning God created the heaven and the earth. 1234"
    assert Tokenizer.from_file(str(hf / "tokenizer.json")).encode(text).ids == \
        Tokenizer.from_file(os.path.join(source, "tokenizer.json")).encode(text).ids
    with open(hf / "generation_config.json") as f:
        assert json.load(f)["do_sample"] is False


class _Tensor:
    """Enough of onnx.TensorProto for unshare_weights: name, dims, data, CopyFrom."""
    def __init__(self, name="", dims=(), data=None):
        self.name, self.dims, self.data = name, list(dims), data

    def CopyFrom(self, other):
        self.name, self.dims, self.data = other.name, list(other.dims), other.data


class _Node:
    def __init__(self, op_type, inputs, outputs):
        self.op_type, self.input, self.output = op_type, list(inputs), list(outputs)


def test_unshare_weights_gives_every_use_its_own_weight(tmp_path, monkeypatch):
    """torch's exporter merges equal parameters into one initializer read through Identity nodes
    (the widened model's zero layers): after unshare_weights every MatMul reads an initializer of
    its own, directly (what onnxruntime's quantiser needs), unused originals are gone, small
    tensors stay shared. onnx itself lives only in the export venv: a stand-in module here."""
    import types
    big, small = (256, 256), (256,)
    graph = types.SimpleNamespace(
        initializer=[_Tensor("W", big, "zeros"), _Tensor("V", big, "v"), _Tensor("norm", small, "ones")],
        node=[_Node("MatMul", ["x", "W"], ["a"]),                     # a direct use of W
              _Node("Identity", ["W"], ["W_id1"]), _Node("MatMul", ["a", "W_id1"], ["b"]),
              _Node("Identity", ["W"], ["W_id2"]), _Node("MatMul", ["b", "W_id2"], ["c"]),
              _Node("MatMul", ["c", "V"], ["d"]), _Node("MatMul", ["d", "V"], ["e"]),      # V used twice
              _Node("Mul", ["e", "norm"], ["f"]), _Node("Mul", ["f", "norm"], ["g"])]) # small: left shared
    model = types.SimpleNamespace(graph=graph)
    saved = []
    fake = types.SimpleNamespace(load=lambda path: model, save=lambda m, path: saved.append(path), TensorProto=_Tensor)
    monkeypatch.setitem(sys.modules, "onnx", fake)
    assert onnx_export.unshare_weights(str(tmp_path / "model.onnx")) == 3       # two Identities, one second use of V
    assert saved == [str(tmp_path / "model.onnx")]
    assert [n.op_type for n in graph.node].count("Identity") == 0
    inits = {t.name: t for t in graph.initializer}
    matmul_weights = [n.input[1] for n in graph.node if n.op_type == "MatMul"]
    assert len(set(matmul_weights)) == 5 and all(w in inits for w in matmul_weights)
    assert [inits[w].data for w in matmul_weights] == ["zeros", "zeros", "zeros", "v", "v"]
    assert [n.input[1] for n in graph.node if n.op_type == "Mul"] == ["norm", "norm"]
    assert len(graph.initializer) == 6                      # W (its direct use), 2 Identity copies, V, V's copy, norm
    saved.clear()
    assert onnx_export.unshare_weights(str(tmp_path / "model.onnx")) == 0 and saved == []   # nothing left to do
