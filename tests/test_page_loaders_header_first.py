"""The engine's weight loaders read a safetensors file header first (web/formats/safetensors.mjs
openSafetensorsStream, used by the WebGPU champion, the WASM champion and the WASM draft): the
8-byte length and the header are checked against Content-Length before a data byte is read, so a
valid artifact followed by 1.5 GiB of zeros, or a truncated one, is refused after a few kB, and an
undeclared length stops one chunk past the bytes the header covers. Runs the real loaders in Node
over counting streams (nothing is generated that is not pulled)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

from browser_fixture import chromium_browser, http_server  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAILING = 3 << 29                     # 1.5 GiB of zeros after a valid artifact (issue 16)
CHUNK = 1 << 16                        # bytes per pulled chunk
NODE_LOADERS = r"""
import { readFileSync } from "node:fs";
import { createWasmChampion } from "%(root)s/web/champion_wasm/champion_wasm.mjs";
import { createDraft } from "%(root)s/web/draft/draft.mjs";
import { validatedConfigFromJson } from "%(root)s/web/formats/model_config.mjs";
const [trailing, chunk] = process.argv.slice(1).map(Number);
const root = "%(root)s";
// A Response whose body is `bytes` then `extra` zero bytes, generated only as pulled.
function counted(bytes, extra, declare) {
  let at = 0;
  const total = bytes.length + extra;
  const body = new ReadableStream({
    pull(c) {
      if (at >= total) { c.close(); return; }
      const part = new Uint8Array(Math.min(chunk, total - at));
      if (at < bytes.length) part.set(bytes.subarray(at, Math.min(at + part.length, bytes.length)));
      at += part.length;
      c.enqueue(part);
    },
  }, { highWaterMark: 0 });
  return { response: new Response(body, { headers: declare ? { "content-length": String(total) } : {} }), pulled: () => at };
}
const roles = {
  champion: { file: "model.q8.safetensors", load: createWasmChampion },
  draft: { file: "model.safetensors", load: createDraft },
};
const wasmBytes = readFileSync(`${root}/web/build/cpu.wasm`);   // the CPU module: both loaders' module
const out = {};
for (const [role, { file, load }] of Object.entries(roles)) {
  const bytes = new Uint8Array(readFileSync(`${root}/web/models/${role}/${file}`));
  const cases = {
    sound: [bytes, 0, true],
    trailing_declared: [bytes, trailing, true],
    trailing_undeclared: [bytes, trailing, false],
    truncated: [bytes.subarray(0, bytes.length >> 1), 0, true],
  };
  for (const [name, [b, extra, declare]] of Object.entries(cases)) {
    const body = counted(b, extra, declare);
    const t0 = performance.now();
    let result;
    try {
      const model = await load({ wasmBytes,
        configJson: validatedConfigFromJson(readFileSync(`${root}/web/models/${role}/config.json`)), modelUrl: `mem://${role}/`,
        fetchFn: async () => body.response });
      result = { ok: true, bytes: model.artifactBytes };
    } catch (err) {
      result = { ok: false, code: err.code, message: err.message };
    }
    out[`${role} ${name}`] = { ...result, size: b.length, pulled: body.pulled(), ms: performance.now() - t0 };
  }
}
console.log(JSON.stringify(out));
"""


def test_loaders_check_the_header_against_the_size_before_the_data():
    r = subprocess.run(["node", "--input-type=module", "-e", NODE_LOADERS % {"root": ROOT}, str(TRAILING), str(CHUNK)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    for role in ("champion", "draft"):
        sound = res[f"{role} sound"]
        assert sound["ok"] and sound["bytes"] == sound["size"] == sound["pulled"], sound
        for case in ("trailing_declared", "truncated"):          # refused from the header and Content-Length
            got = res[f"{role} {case}"]
            assert not got["ok"] and got["code"] == "E_MODEL_LOAD" and got["message"].count("E_") == 1, (case, got)
            assert got["pulled"] <= CHUNK and got["ms"] < 2000, (case, got)
        assert "trailing bytes" in res[f"{role} trailing_declared"]["message"]
        assert "past the data buffer" in res[f"{role} truncated"]["message"]
        undeclared = res[f"{role} trailing_undeclared"]               # no length: stops one chunk past the end
        assert not undeclared["ok"] and "trailing bytes" in undeclared["message"], undeclared
        assert undeclared["pulled"] <= undeclared["size"] + 2 * CHUNK, undeclared


def test_webgpu_champion_refuses_trailing_bytes_before_downloading_them(chromium_browser, http_server):  # noqa: F811
    # served by the same server as `exactspec serve` (Content-Length, 64 KiB chunks); the zeros
    # are a sparse file, so only what the browser pulls is ever read
    served = os.path.join(ROOT, "build", "test_models", f"trailing_{os.getpid()}")
    shutil.rmtree(served, ignore_errors=True)
    os.makedirs(served)
    try:
        for name in ("config.json", "model.q8.safetensors"):
            shutil.copy(os.path.join(ROOT, "web", "models", "champion", name), served)
        artifact = os.path.join(served, "model.q8.safetensors")
        with open(artifact, "r+b") as f:
            f.truncate(os.path.getsize(artifact) + TRAILING)
        context = chromium_browser.new_context()
        page = context.new_page()
        try:
            page.goto(f"{http_server.url}/web/tests/gpu_harness.html")
            page.wait_for_function("() => window.harnessReady === true", timeout=60_000)
            page.evaluate("window.harness.init()")
            url = "/" + os.path.relpath(served, ROOT).replace(os.sep, "/") + "/"
            t0 = time.perf_counter()
            message = page.evaluate("(u) => window.harness.loadChampion(u, 9, 0).then(() => 'loaded', (e) => e.message)", url)
            seconds = time.perf_counter() - t0
        finally:
            context.close()
        assert message.startswith("E_MODEL_LOAD: ") and "trailing bytes" in message and message.count("E_") == 1, message
        assert seconds < 5, seconds                                # 1.5 GiB over loopback took 10 s and 2.9 GB
    finally:
        shutil.rmtree(served, ignore_errors=True)
