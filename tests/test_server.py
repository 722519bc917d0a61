"""The static server: allowlist and path rules (a table of hostile paths), loopback Host only,
security headers on every response, HEAD == GET, read timeout, bounded threads, coded errors."""
import http.client
import os
import socket
import threading
import urllib.error
import urllib.request

import pytest

from exactspec.host.browser_run import _url_for
from exactspec.core.errors import E_BAD_ARGUMENT, E_IO, ExactSpecError
from exactspec.host.server import REPO_ROOT, StaticServer, is_loopback_host, resolve_request_path


@pytest.fixture(scope="module")
def server():
    s = StaticServer()
    yield s
    s.close()


def get(server, path):
    return urllib.request.urlopen(server.url + path, timeout=10)


def request(server, method, path, host=None):
    """(status, headers without Date, body) of one request with an explicit Host header."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host or f"127.0.0.1:{server.port}")
    conn.endheaders()
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, {k: v for k, v in r.getheaders() if k != "Date"}, body


def raw_exchange(port, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_headers_and_mime_types(server):
    for path, mime in [("/py/exactspec/core/protocol.json", "application/json"),
                       ("/node_modules/pyodide/pyodide.mjs", "text/javascript"),
                       ("/node_modules/pyodide/pyodide.asm.wasm", "application/wasm"),
                       ("/py/exactspec/core/orchestrator.py", "text/plain; charset=utf-8")]:
        r = get(server, path)
        assert r.status == 200
        assert r.headers["Content-Type"] == mime, path
        assert r.headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert r.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert r.read() == (REPO_ROOT / path.lstrip("/")).read_bytes()


@pytest.mark.parametrize("path", ["/pyproject.toml", "/.git/config", "/tests/test_server.py",
                                  "/web/../pyproject.toml", "/py/", "/.venv/pyvenv.cfg",
                                  "/web/%2e%2e/pyproject.toml", "/web/%2e%2e/.git/config",
                                  "/web/%2E%2E/tools/setup.sh", "/web/..%2ftests/test_server.py",
                                  "/web/%252e%252e/pyproject.toml", "/web/%00", "/web/", "/web"])
def test_only_runtime_files_are_served(server, path):
    with pytest.raises(urllib.error.HTTPError) as e:
        get(server, path)
    assert e.value.code == 404


def test_binds_loopback_only(server):
    assert server.httpd.server_address[0] == "127.0.0.1"


# ---- resolve_request_path: one pure function, a table of hostile paths ----

@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """root/{web/ok.txt, web/sub/dir/f.json, web/fifo, web/link_out -> ../secret.txt,
    web/link_in -> ok.txt, secret.txt}; model/{config.json, link -> /etc/passwd}."""
    base = tmp_path_factory.mktemp("served")
    root, web, model = base / "root", base / "root" / "web", base / "model"
    (web / "sub" / "dir").mkdir(parents=True)
    model.mkdir()
    (web / "ok.txt").write_text("ok")
    (web / "sub" / "dir" / "f.json").write_text("{}")
    (root / "secret.txt").write_text("secret")
    (model / "config.json").write_text("{}")
    os.mkfifo(web / "fifo")
    os.symlink("../secret.txt", web / "link_out")
    os.symlink("ok.txt", web / "link_in")
    os.symlink("/etc/passwd", model / "link")
    os.symlink(str(base), model / "up")
    return {"root": str(root), "web": str(web), "mounts": {"/models/champion/": str(model)}, "model": str(model)}


def resolve(tree, raw):
    return resolve_request_path(raw, tree["root"], ("/web/",), tree["mounts"])


@pytest.mark.parametrize("raw", [
    "/web/../secret.txt", "/web/%2e%2e/secret.txt", "/web/%2E%2E/secret.txt", "/web/.%2e/secret.txt",
    "/web/%2e%2e%2fsecret.txt", "/web/%252e%252e/secret.txt", "/web/%252e%252e%252fsecret.txt",
    "/web/ok.txt%00", "/web/%00", "/web/ok%00.txt", "/web/%0d%0aok.txt",
    "/web/..%5csecret.txt", "/web\\..\\secret.txt", "/web/sub\\dir\\f.json",
    "/web//ok.txt", "//web/ok.txt", "/web/./ok.txt", "/web/%2e/ok.txt", "/web/sub//dir/f.json",
    "/models/champion//etc/passwd", "/models/champion/%2fetc/passwd", "/models/champion/%2Fetc%2Fpasswd",
    "/models/champion/../root/secret.txt", "/models/champion/%2e%2e/root/secret.txt",
    "/models/champion/link", "/models/champion/up/root/secret.txt", "/models/draft/config.json",
    "/web/link_out", "/web/sub", "/web/sub/", "/web/sub/dir", "/web/", "/web", "/web/fifo",
    "/web/ok.txt/", "/web/ok.txt/.", "/secret.txt", "/", "", "web/ok.txt", "/WEB/ok.txt",
    "/web/ok.txt%ff", "/web/%c0%ae%c0%ae/secret.txt", "/web/missing.txt",
    "/web/" + "a" * 2000, "/web/" + "sub/" * 300 + "ok.txt", "/web/ok.txt?" + "q" * 2000,
    "?/web/ok.txt", "#/web/ok.txt",
])
def test_hostile_paths_are_refused(tree, raw):
    assert resolve(tree, raw) is None


@pytest.mark.parametrize("raw, rel", [
    ("/web/ok.txt", "web/ok.txt"), ("/web/ok.txt?x=1&y=/../secret.txt", "web/ok.txt"),
    ("/web/ok.txt#frag/../../secret.txt", "web/ok.txt"), ("/web/o%6b.txt", "web/ok.txt"),
    ("/web/link_in", "web/ok.txt"), ("/web/sub/dir/f.json", "web/sub/dir/f.json"),
    ("/models/champion/config.json", "MODEL/config.json"),
])
def test_allowed_paths_resolve_to_the_real_file(tree, raw, rel):
    want = os.path.join(tree["model"], rel[len("MODEL/"):]) if rel.startswith("MODEL/") \
        else os.path.join(tree["root"], rel)
    assert resolve(tree, raw) == os.path.realpath(want)


@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1", True), ("127.0.0.1:8000", True), ("localhost", True), ("LOCALHOST:1", True),
    ("[::1]", True), ("[::1]:8000", True), (None, False), ("", False), ("evil.example", False),
    ("evil.example:8000", False), ("127.0.0.1.evil.example", False), ("localhost.", False),
    ("127.0.0.2", False), ("127.0.0.1:80:80", False), ("127.0.0.1:", False), ("::1", False),
    ("localhost:8000 evil", False), ("0.0.0.0", False),
])
def test_loopback_host_names_only(host, ok):
    assert is_loopback_host(host) is ok


# ---- over HTTP ----

def test_foreign_host_is_refused_with_a_short_line(server):
    for host in ("evil.example", f"rebind.example:{server.port}"):
        status, headers, body = request(server, "GET", "/web/index.html", host=host)
        assert status == 421 and body.startswith(b"421 ") and body.count(b"\n") == 1
        assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert request(server, "GET", "/web/index.html", host=f"localhost:{server.port}")[0] == 200
    reply = raw_exchange(server.port, b"GET /web/index.html HTTP/1.0\r\n\r\n")   # no Host at all
    assert reply.startswith(b"HTTP/1.0 421 ")


def test_mount_serves_only_regular_files_inside_its_directory(tree):
    s = StaticServer(tree["root"], mounts=tree["mounts"])
    try:
        assert request(s, "GET", "/models/champion/config.json")[0] == 200
        for path in ("/models/champion//etc/passwd", "/models/champion/%2fetc/passwd", "/models/champion/link",
                     "/models/champion/", "/models/champion/up/root/secret.txt"):
            status, _, body = request(s, "GET", path)
            assert (status, body) == (404, b"404 not served\n"), path
    finally:
        s.close()


def test_url_for_mounts_directories_outside_web(tree):
    mounts = {}
    assert _url_for(tree["model"], "draft", mounts) == "/models/draft/"
    assert mounts == {"/models/draft/": os.path.realpath(tree["model"])}
    mounts = {}
    assert _url_for(str(REPO_ROOT / "web" / "models"), "champion", mounts) == "/web/models/"
    assert mounts == {}


@pytest.mark.parametrize("path", ["/", "/index.html", "/web/index.html", "/nope", "/web/%00", "/.git/config"])
def test_head_equals_get_without_body(server, path):
    get_status, get_headers, get_body = request(server, "GET", path)
    head_status, head_headers, head_body = request(server, "HEAD", path)
    assert (head_status, head_headers, head_body) == (get_status, get_headers, b"")
    assert int(get_headers["Content-Length"]) == len(get_body)


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/web/index.html", 200), ("GET", "/", 302), ("GET", "/pyproject.toml", 404),
    ("GET", "/web/%00", 404), ("POST", "/web/index.html", 501), ("HEAD", "/nope", 404),
])
def test_security_headers_on_every_response(server, method, path, status):
    got, headers, _ = request(server, method, path)
    assert got == status
    assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert headers["Cross-Origin-Resource-Policy"] == "same-origin"
    assert headers["X-Content-Type-Options"] == "nosniff"
    csp = dict(d.strip().split(" ", 1) for d in headers["Content-Security-Policy"].split(";"))
    assert csp["default-src"] == "'self'" and csp["object-src"] == "'none'"
    assert csp["base-uri"] == "'none'" and csp["frame-ancestors"] == "'none'"
    assert "'unsafe-inline'" not in headers["Content-Security-Policy"]
    assert headers["Server"] == "exactspec"


def test_bad_requests_are_clean_4xx_without_traceback(server, capfd):
    for raw in (b"GET /web/%00 HTTP/1.0\r\n", b"GET /web/\x00 HTTP/1.0\r\n", b"GARBAGE\r\n",
                b"GET /web/" + b"a" * 70000 + b" HTTP/1.0\r\n"):
        reply = raw_exchange(server.port, raw + f"Host: 127.0.0.1:{server.port}\r\n\r\n".encode())
        assert reply.split(b" ", 2)[1] in (b"400", b"404", b"414"), reply[:80]
    assert raw_exchange(server.port, b"GET /web/index.html\r\n\r\n").startswith(b"HTTP/1.0 421 ")   # HTTP/0.9 form
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err


def test_port_errors_are_coded():
    for port in (-1, 70000, "80", True):
        with pytest.raises(ExactSpecError) as e:
            StaticServer(port=port)
        assert e.value.code == E_BAD_ARGUMENT
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ExactSpecError) as e:
            StaticServer(port=taken.getsockname()[1])
        assert e.value.code == E_IO


def test_silent_client_is_dropped_and_blocks_nobody():
    s = StaticServer(read_timeout_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as silent:
            assert request(s, "GET", "/web/index.html")[0] == 200   # served while `silent` is open
            assert silent.recv(1) == b""   # the server closed it: no read blocks a thread for ever
    finally:
        s.close()


def test_connections_beyond_the_bound_get_503_and_no_thread():
    s = StaticServer(max_connections=2)
    silent = [socket.create_connection(("127.0.0.1", s.port), timeout=30) for _ in range(2)]
    try:
        assert request(s, "GET", "/web/index.html")[0] == 503   # so both silent threads are running
        n_threads = threading.active_count()
        for _ in range(10):
            status, headers, body = request(s, "GET", "/web/index.html")
            assert (status, body) == (503, b"503 too many open connections\n")
            assert headers["X-Content-Type-Options"] == "nosniff"
        assert threading.active_count() <= n_threads
    finally:
        for sock in silent:
            sock.close()
    try:   # the slots come back once the silent clients go
        for _ in range(200):
            if request(s, "GET", "/web/index.html")[0] == 200:
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("slots never came back")
    finally:
        s.close()


@pytest.mark.parametrize("origin", ["127.0.0.1:9000", "http://127.0.0.1:9000/", "http://x/path", "HTTP://X", "*", ""])
def test_allow_origin_must_be_an_origin(origin):
    with pytest.raises(ExactSpecError) as e:
        StaticServer(allow_origins=[origin])
    assert e.value.code == E_BAD_ARGUMENT and "--allow-origin" in e.value.message


def _trickle(port: int, stop: threading.Event, closed: list) -> None:
    """One client sending its request head a byte at a time, 0.2 s apart (each byte well within
    the read timeout), until the server closes it or `stop` is set."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for byte in b"GET /web/index.html HTTP/1.0\r\nX-Slow: " + b"a" * 1000:
            if stop.wait(0.2):
                return
            try:
                s.sendall(bytes([byte]))
            except OSError:
                break
        s.settimeout(10)
        try:
            closed.append(s.recv(1) == b"")
        except OSError:
            closed.append(True)


def test_trickled_request_heads_hold_no_slot_past_the_deadline():
    """Every slot taken by clients that trickle their head a byte at a time: they are cut off at the
    head's deadline (1 s here), and a normal client is served within seconds, not after them."""
    s = StaticServer(max_connections=4, read_timeout_s=5.0, head_deadline_s=1.0)
    stop, closed = threading.Event(), []
    tricklers = [threading.Thread(target=_trickle, args=(s.port, stop, closed), daemon=True) for _ in range(4)]
    try:
        for t in tricklers:
            t.start()
        threading.Event().wait(0.3)
        assert request(s, "GET", "/web/index.html")[0] == 503   # every slot is a trickler's
        waited, status = 0.0, 503
        while status != 200 and waited < 4.0:
            threading.Event().wait(0.1)
            waited += 0.1
            status = request(s, "GET", "/web/index.html")[0]
        assert status == 200, f"still {status} after {waited:.1f} s of trickling"
        for t in tricklers:
            t.join(timeout=5)
        assert closed == [True] * 4   # the server closed every trickler (they did not give up)
    finally:
        stop.set()
        s.close()


# ---- the xgrammar bundle (web/grammar/xgrammar_masks.mjs imports it in the page and workers) ----

def test_xgrammar_bundle_is_served(server):
    path = "/node_modules/@mlc-ai/web-xgrammar/lib/index.js"
    r = get(server, path)
    assert r.status == 200
    assert r.headers["Content-Type"] == "text/javascript"
    assert r.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert r.read() == (REPO_ROOT / path.lstrip("/")).read_bytes()


@pytest.mark.parametrize("path", ["/node_modules/@mlc-ai/web-xgrammar/package.json",
                                  "/node_modules/@mlc-ai/web-xgrammar/lib/",
                                  "/node_modules/@mlc-ai/web-xgrammar/lib/../package.json",
                                  "/node_modules/@mlc-ai/web-xgrammar/lib/%2e%2e/package.json",
                                  "/node_modules/@mlc-ai/", "/node_modules/@mlc-ai/web-xgrammar/",
                                  "/node_modules/ws/package.json", "/node_modules/@wllama/wllama/package.json",
                                  "/node_modules/.package-lock.json", "/node_modules/"])
def test_other_node_modules_paths_are_refused(server, path):
    with pytest.raises(urllib.error.HTTPError) as e:
        get(server, path)
    assert e.value.code == 404
