"""The static server: COOP/COEP, MIME types, allowlist, loopback only."""
import urllib.error
import urllib.request

import pytest

from exactspec.server import StaticServer


@pytest.fixture(scope="module")
def server():
    s = StaticServer()
    yield s
    s.close()


def get(server, path):
    return urllib.request.urlopen(server.url + path, timeout=10)


def test_headers_and_mime_types(server):
    for path, mime in [("/py/exactspec/protocol.json", "application/json"),
                       ("/node_modules/pyodide/pyodide.mjs", "text/javascript"),
                       ("/node_modules/pyodide/pyodide.asm.wasm", "application/wasm"),
                       ("/py/exactspec/orchestrator.py", "text/plain; charset=utf-8")]:
        r = get(server, path)
        assert r.status == 200
        assert r.headers["Content-Type"] == mime, path
        assert r.headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert r.headers["Cross-Origin-Embedder-Policy"] == "require-corp"


@pytest.mark.parametrize("path", ["/pyproject.toml", "/.git/config", "/tests/test_server.py",
                                  "/web/../pyproject.toml", "/py/", "/.venv/pyvenv.cfg"])
def test_only_runtime_files_are_served(server, path):
    with pytest.raises(urllib.error.HTTPError) as e:
        get(server, path)
    assert e.value.code == 404


def test_binds_loopback_only(server):
    assert server.httpd.server_address[0] == "127.0.0.1"
