"""The embeddable module: nothing root-absolute in what ships, `npm pack` lists what a site needs,
and web/examples/embed.html on a second origin generates through the public API with the engine
served by `exactspec serve --allow-origin` (CORS and CORP only when asked)."""
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.request

import pytest

from browser_fixture import REPO_ROOT, chromium_browser, forward_console  # noqa: F401
from exactspec.host.server import StaticServer

# quoted URLs that only work when the repository root is the web root
ROOT_ABSOLUTE = re.compile(r"""["'`](/(?:web|py|node_modules|build|shaders)/)""")


def shipped_web_files():
    """The engine's and page's files (web/ minus the test harnesses and benchmark pages)."""
    return sorted(p for p in (REPO_ROOT / "web").rglob("*") if p.suffix in (".mjs", ".html", ".js")
                  and not {"tests", "bench", "build", "models"} & set(p.relative_to(REPO_ROOT / "web").parts[:1]))


def root_absolute_urls(paths, root=REPO_ROOT):
    return [f"{p.relative_to(root)}: {m.group(1)}" for p in paths for m in ROOT_ABSOLUTE.finditer(p.read_text())]


def test_no_root_absolute_url_in_what_ships(tmp_path):
    files = shipped_web_files()
    assert any(p.name == "exactspec.mjs" for p in files) and any(p.name == "worker.mjs" for p in files)
    assert root_absolute_urls(files) == []
    planted = tmp_path / "bad.mjs"                                 # the check can fail
    planted.write_text('import { x } from "/web/engine.mjs";\nfetch(`/py/exactspec/${f}`);\n')
    assert root_absolute_urls([planted], tmp_path) == ["bad.mjs: /web/", "bad.mjs: /py/"]


def test_npm_pack_lists_what_a_site_needs():
    out = subprocess.run(["npm", "pack", "--dry-run", "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = {f["path"] for f in json.loads(out.stdout)[0]["files"]}
    pkg = json.loads((REPO_ROOT / "package.json").read_text())
    assert pkg["exports"]["."]["default"] == "./web/exactspec.mjs" and pkg["exports"]["."]["types"] == "./web/exactspec.d.ts"
    py_files = json.loads((REPO_ROOT / "web/orchestrator/py_files.json").read_text())
    need = {"web/exactspec.mjs", "web/exactspec.d.ts", "web/orchestrator/engine.mjs", "web/fetch_progress.mjs", "web/protocol.mjs",
            "web/orchestrator/worker.mjs", "web/orchestrator/py_files.json", "web/build/cpu.wasm", "web/build/cpu_mt.wasm",
            "web/build/cpu_relaxed.wasm", "web/build/cpu_mt_relaxed.wasm",
            "web/models/manifest.json", "web/models/champion/model.q8.safetensors", "web/models/draft/model.safetensors",
            "web/models/champion/tokenizer.json", "web/examples/embed.html", "py/exactspec/core/protocol.json",
            *(f"py/exactspec/{f}" for f in py_files), *(f"shaders/{p.name}" for p in (REPO_ROOT / "shaders").glob("*.wgsl"))}
    assert need - listed == set()
    relative = re.compile(r"""(?:\bfrom\s*|\bimport\s*\(\s*|^import\s+)["'](\.\.?/[^"']+)["']""", re.M)
    unpacked = sorted({f"{path} -> {target}" for path in listed if path.endswith(".mjs")
                       for target in relative.findall((REPO_ROOT / path).read_text())
                       if os.path.normpath(os.path.join(os.path.dirname(path), target)) not in listed})
    assert unpacked == [], unpacked                                # every module a packed one imports is packed
    assert not [p for p in listed if p.startswith(("web/tests/", "tests/", "node_modules/")) or p == "web/models/champion/model.safetensors"]
    assert sorted(p for p in listed if p.startswith("web/build/")) == ["web/build/cpu.wasm", "web/build/cpu_mt.wasm", "web/build/cpu_mt_relaxed.wasm",
                                                                        "web/build/cpu_relaxed.wasm"]  # the CPU module only


def test_server_sends_cors_and_corp_only_when_asked():
    site = "http://127.0.0.1:9"
    plain, open_ = StaticServer(), StaticServer(allow_origins=[site])
    try:
        def headers(server, origin):
            req = urllib.request.Request(server.url + "/web/exactspec.mjs", headers={"Origin": origin})
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.headers
        h = headers(plain, site)
        assert h["Cross-Origin-Resource-Policy"] == "same-origin" and "Access-Control-Allow-Origin" not in h
        h = headers(open_, site)
        assert h["Access-Control-Allow-Origin"] == site and h["Cross-Origin-Resource-Policy"] == "cross-origin"
        assert "Access-Control-Allow-Origin" not in headers(open_, "http://127.0.0.1:10")   # another origin: no CORS
    finally:
        plain.close()
        open_.close()


@pytest.fixture
def second_origin(tmp_path):
    """The embedding site: a copy of web/examples/ served by a plain server on another port, with
    a module of a visitor's choosing beside it (hijack.mjs) that a link may name."""
    site_dir = tmp_path / "site"
    shutil.copytree(REPO_ROOT / "web" / "examples", site_dir)
    (site_dir / "hijack.mjs").write_text("window.hijacked = true;\nexport const createEngine = null;\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site_dir))
    handler.log_message = lambda *a: None
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    site.dir = site_dir
    site.url = f"http://127.0.0.1:{site.server_address[1]}"
    yield site
    site.shutdown()
    site.server_close()


def test_embed_example_generates_from_a_second_origin(chromium_browser, second_origin):
    """The site names the engine in embed.html's meta, as a deployment does; the page's query
    string names another module (hijack.mjs), which is never imported."""
    engine_host = StaticServer(allow_origins=[second_origin.url])
    page_file = second_origin.dir / "embed.html"
    html = page_file.read_text()
    assert '<meta name="exactspec-engine" content="../exactspec.mjs">' in html
    page_file.write_text(html.replace('content="../exactspec.mjs"', f'content="{engine_host.url}/web/exactspec.mjs"'))
    context = chromium_browser.new_context()
    try:
        page = context.new_page()
        log = forward_console(page)
        page.set_default_timeout(120_000)
        page.goto(f"{second_origin.url}/embed.html?engine={second_origin.url}/hijack.mjs")
        page.wait_for_function("() => window.embedReady === true || !!window.embedError")
        assert page.evaluate("() => window.hijacked ?? null") is None
        assert page.evaluate("() => window.embedError || null") is None
        assert page.evaluate("() => location.origin") != engine_host.url
        page.click("#go")
        page.wait_for_function("() => !!window.embedResult")
        result = page.evaluate("() => window.embedResult")
        assert result["error"] is None and result["finish_reason"] == "length", (result, log)
        assert result["n"] == 24 and result["text"].strip()
        assert "champion_artifact_hash" in result["receipt_keys"]
        assert result["text"] == page.text_content("#output")
        assert not [m for m in log if m[0] in ("error", "pageerror")], log
    finally:
        context.close()
        engine_host.close()
