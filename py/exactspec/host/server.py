"""Static server for the browser runtime: 127.0.0.1 only, loopback Host names only, an allowlist
of folders, regular files only, COOP/COEP/CORP + CSP + nosniff on every response, a read timeout,
a total deadline for the request head and a bounded number of connection threads.

Serves the repository's web/, shaders/, py/exactspec/ (the orchestrator's Python source, loaded
into Pyodide), node_modules/pyodide/ (Pyodide itself, offline), node_modules/@mlc-ai/web-xgrammar/lib/
(xgrammar's WASM build: response_format constraints) and build/ (compiled WASM and
test fixtures), plus explicit model mounts (`/models/<name>/`). Everything else is 404: the page
never needs anything from another origin. The rules are in docs/browser.md ("The static server").
Only when asked (`allow_origins`, `exactspec serve --allow-origin URL`), a page on one of those
origins may load the engine from here: CORS for that origin and CORP cross-origin.
"""
from __future__ import annotations

import email.utils
import http.server
import io
import os
import re
import stat
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from ..core.errors import E_BAD_ARGUMENT, E_IO, ExactSpecError

REPO_ROOT = Path(__file__).resolve().parents[3]
ALLOWED_PREFIXES = ("/web/", "/shaders/", "/py/exactspec/", "/node_modules/pyodide/",
                    "/node_modules/@mlc-ai/web-xgrammar/lib/", "/build/")
MOUNT_PREFIX = re.compile(r"/models/[a-z][a-z0-9_-]*/\Z")   # the only shape a mount URL may take
# The real model that tools/fetch_models.py fetches, where the page finds it (models/<name>/ beside
# web/index.html): only regular .gguf files of that build/ folder; 404 while it is absent.
GGUF_ONLY_PREFIXES = {"/web/models/smollm2-135m-instruct/": "build/models/smollm2-135m-instruct"}
LOOPBACK_HOST = re.compile(r"(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?\Z")
MAX_PATH_CHARS = 1024          # longer request paths are refused before any decoding
READ_TIMEOUT_S = 20.0          # a connection that sends nothing (or reads nothing) this long is closed
HEAD_DEADLINE_S = 10.0         # the whole request head must arrive within this (a trickle holds no slot)
MAX_CONNECTIONS = 32           # handler threads at once; beyond that a connection gets 503
MIME_TYPES = {
    ".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
    ".json": "application/json", ".wgsl": "text/plain; charset=utf-8", ".py": "text/plain; charset=utf-8",
    ".zip": "application/zip", ".whl": "application/zip", ".html": "text/html; charset=utf-8",
    ".css": "text/css", ".safetensors": "application/octet-stream", ".gguf": "application/octet-stream", ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml", ".png": "image/png",
}
# Why each directive: docs/browser.md, "The static server".
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'", "script-src 'self' 'wasm-unsafe-eval'", "worker-src 'self'", "connect-src 'self'",
    "img-src 'self' data:", "style-src 'self'", "object-src 'none'", "base-uri 'none'", "form-action 'none'",
    "frame-ancestors 'none'",
])
SECURITY_HEADERS = (
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Embedder-Policy", "require-corp"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-cache"),   # kept, but revalidated on every use (ETag: a changed file is never stale)
)
WEIGHT_SUFFIXES = (".gguf", ".safetensors", "/snapshot.bin")   # what web/weight_cache.mjs keeps
REDIRECTS = {"/": "/web/index.html", "/index.html": "/web/index.html"}
ORIGIN = re.compile(r"https?://([a-z0-9-]+(\.[a-z0-9-]+)*|\[[0-9a-f:]+\])(:[0-9]{1,5})?\Z")


# ---- pure rules (tests/test_server.py drives these with tables of hostile input) ----

def is_loopback_host(host_header: str | None) -> bool:
    """True only for Host 127.0.0.1, localhost or [::1], with an optional port: a page on another
    name that resolves to 127.0.0.1 (DNS rebinding) sends its own name and is refused."""
    return host_header is not None and LOOPBACK_HOST.match(host_header.strip().lower()) is not None


def url_path_of(raw_target: str) -> str:
    """The path part of a request target: query and fragment cut off, nothing decoded."""
    return raw_target.split("?", 1)[0].split("#", 1)[0]


def resolve_request_path(raw_target: str, root: str | Path, allowed_prefixes=ALLOWED_PREFIXES,
                         mounts: dict | None = None) -> str | None:
    """The real path of the regular file a request target names, or None (serve 404).

    Decodes once, refuses NUL/control characters, backslashes, '%' left after decoding (double
    encoding), empty, '.' and '..' segments; maps the longest matching mount or allowed prefix to
    its folder, resolves symlinks, and serves only a regular file still inside that folder.
    """
    if len(raw_target) > MAX_PATH_CHARS:
        return None
    try:
        path = urllib.parse.unquote(url_path_of(raw_target), errors="strict")
    except UnicodeDecodeError:
        return None
    if not path.startswith("/") or any(c in path for c in "\\%") or any(ord(c) < 0x20 or c == "\x7f" for c in path):
        return None
    bases = {prefix: os.path.join(str(root), prefix.strip("/")) for prefix in allowed_prefixes}
    gguf_only = {prefix: os.path.join(str(root), folder) for prefix, folder in GGUF_ONLY_PREFIXES.items()}
    bases.update(gguf_only)
    bases.update(mounts or {})
    prefix = max((p for p in bases if path.startswith(p)), key=len, default=None)
    if prefix is None:
        return None
    segments = path[len(prefix):].split("/")
    if any(s in ("", ".", "..") for s in segments):
        return None
    if prefix in gguf_only and not (len(segments) == 1 and segments[0].endswith(".gguf")):
        return None
    if os.path.isfile(bases[prefix]):     # a one-file mount (a .gguf): only its own name
        return bases[prefix] if segments == [os.path.basename(bases[prefix])] else None
    base = os.path.realpath(bases[prefix])
    real = os.path.realpath(os.path.join(base, *segments))
    if os.path.commonpath([base, real]) != base or real == base:
        return None
    try:
        return real if stat.S_ISREG(os.stat(real).st_mode) else None
    except (OSError, ValueError):
        return None


def check_origins(origins) -> tuple:
    """Origins allowed to embed the engine: each scheme://host[:port], lower case, no path."""
    out = []
    for origin in origins or ():
        if not isinstance(origin, str) or not ORIGIN.match(origin):
            raise ExactSpecError(E_BAD_ARGUMENT, f"--allow-origin {origin!r} is not an origin like http://127.0.0.1:9000 "
                                                 "(scheme, host and port only, lower case)")
        out.append(origin)
    return tuple(out)


def response_headers(allow_origins=(), request_origin: str | None = None) -> list:
    """The security headers of every response; with allowed origins, CORP is cross-origin and a
    request from one of them gets Access-Control-Allow-Origin (and Vary: Origin)."""
    if not allow_origins:
        return list(SECURITY_HEADERS)
    headers = [(n, "cross-origin" if n == "Cross-Origin-Resource-Policy" else v) for n, v in SECURITY_HEADERS]
    if request_origin in allow_origins:
        headers.append(("Access-Control-Allow-Origin", request_origin))
    headers.append(("Vary", "Origin"))
    return headers


LAST_MODIFIED_MIN_AGE_S = 2.0   # a file changed more recently has no Last-Modified: a second's resolution could hide a change


def not_modified(if_none_match: str | None, if_modified_since: str | None, etag: str, mtime: float) -> bool:
    """Whether the requester's copy is current (answer 304): its If-None-Match names `etag` (a
    list, weak or strong, or *); without one, its If-Modified-Since is the file's Last-Modified
    exactly (Chromium ignores an HTTP/1.0 response's ETag and revalidates with the date alone; an
    older file put in its place has another date), for a file not changed in the last
    LAST_MODIFIED_MIN_AGE_S (a date has a second's resolution: a file rewritten within the second
    it was served would look unchanged)."""
    if if_none_match:
        tags = [t.strip() for t in if_none_match.split(",")]
        return "*" in tags or any(t.removeprefix("W/") == etag for t in tags)
    if not if_modified_since or time.time() - mtime < LAST_MODIFIED_MIN_AGE_S:
        return False
    try:
        since = email.utils.parsedate_to_datetime(if_modified_since).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return False
    return int(mtime) == int(since)


def validators(st) -> list:
    """ETag (size and modification time to the nanosecond) and, for a file not changed in the last
    LAST_MODIFIED_MIN_AGE_S, Last-Modified: what a browser revalidates with, and what the page's
    weight cache (web/weight_cache.mjs) compares before it serves a cached copy of the URL."""
    tags = [("ETag", f'"{st.st_size:x}-{st.st_mtime_ns:x}"')]
    if time.time() - st.st_mtime >= LAST_MODIFIED_MIN_AGE_S:
        tags.append(("Last-Modified", time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(st.st_mtime))))
    return tags


def content_type_for(path: str) -> str:
    return MIME_TYPES.get(os.path.splitext(path)[1].lower(), "application/octet-stream")


def check_port(port) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ExactSpecError(E_BAD_ARGUMENT, f"port {port!r} is not a TCP port (0..65535; 0 picks a free one)")
    return port


def check_mounts(mounts: dict) -> dict:
    """URL prefix ("/models/x/") -> real path of an existing directory, or of one regular .gguf
    file (served under its own name only)."""
    checked = {}
    for prefix, directory in mounts.items():
        if not MOUNT_PREFIX.match(prefix):
            raise ExactSpecError(E_BAD_ARGUMENT, f"mount {prefix!r} is not of the form /models/<name>/")
        one_file = os.path.isfile(directory) and str(directory).endswith(".gguf")
        if not (one_file or os.path.isdir(directory)):
            raise ExactSpecError(E_BAD_ARGUMENT, f"mount {prefix}: {directory} is not a directory or a .gguf file")
        checked[prefix] = os.path.realpath(directory)
    return checked


# ---- HTTP ----

class _HeadDeadlineReader(io.RawIOBase):
    """The connection's reads. While `deadline` (time.monotonic()) is set, each read waits at most
    until it, so a client that trickles its request head byte by byte (each byte within the read
    timeout) is cut off at the deadline; the socket's own timeout is restored after every read,
    so writes keep the plain read/write timeout."""

    def __init__(self, sock, timeout_s):
        self.sock, self.timeout_s, self.deadline = sock, timeout_s, None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        timeout = self.timeout_s
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request head not complete before its deadline")
            timeout = left if timeout is None else min(timeout, left)
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv_into(buffer)
        finally:
            self.sock.settimeout(self.timeout_s)


class _Link:
    """One simulated network link shared by every connection: a chunk is due once the bytes sent
    before it (by any connection) have had their time at the rate. reserve(n, rate) -> seconds
    the caller sleeps."""

    def __init__(self):
        self.lock, self.free_at = threading.Lock(), 0.0

    def reserve(self, n_bytes: int, rate_bytes_per_s: int) -> float:
        with self.lock:
            now = time.monotonic()
            self.free_at = max(now, self.free_at) + n_bytes / rate_bytes_per_s
            return self.free_at - now


class Handler(http.server.BaseHTTPRequestHandler):
    """GET and HEAD of allowlisted regular files; everything else is a short plain-text refusal."""

    root: str = str(REPO_ROOT)
    mounts: dict = {}   # URL prefix ("/models/x/") -> real directory, for models outside web/
    allow_origins: tuple = ()   # origins that may load the engine from here (CORS + CORP cross-origin)
    rate_bytes_per_s: int = 0   # benches: bodies paced to this rate (0: as fast as the socket takes them)
    link = None                 # with a rate: the _Link every connection of this server shares
    timeout = READ_TIMEOUT_S   # socket timeout of every read and write of this connection
    head_deadline_s = HEAD_DEADLINE_S   # total time for the request line and headers
    server_version = "exactspec"
    sys_version = ""
    default_request_version = "HTTP/1.0"   # never answer HTTP/0.9-style (no status line, no headers)

    def version_string(self):
        return self.server_version   # no Python version in the Server header

    def setup(self):
        super().setup()
        self._reader = _HeadDeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self):
        """The base class's, with the head's deadline armed from here until it is parsed (a
        TimeoutError there closes the connection without a reply, as a silent client's does)."""
        self._reader.deadline = time.monotonic() + self.head_deadline_s
        super().handle_one_request()

    def parse_request(self):
        try:
            return super().parse_request()
        finally:
            self._reader.deadline = None   # the head is in (the server reads no request bodies)

    def end_headers(self):
        origin = self.headers.get("Origin") if getattr(self, "headers", None) is not None else None
        weights = getattr(self, "path", "").split("?", 1)[0].endswith(WEIGHT_SUFFIXES)
        for name, value in response_headers(self.allow_origins, origin):
            # weight files: the page's own verified cache keeps them (web/weight_cache.mjs), not the HTTP cache too
            self.send_header(name, "no-store" if weights and name == "Cache-Control" else value)
        super().end_headers()

    def send_error(self, code, message=None, explain=None):
        """Every refusal, including the base class's (400, 414, 501): one short plain-text line."""
        self.log_error("code %d, message %s", code, message)
        self.close_connection = True
        body = f"{code} {message or self.responses.get(code, ('',))[0]}\n".encode("utf-8", "replace")
        self.send_response(code, message)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and code >= 200 and code not in (204, 304):
            self.wfile.write(body)

    def do_GET(self):
        self._serve(send_body=True)

    def do_HEAD(self):
        self._serve(send_body=False)

    def _serve(self, send_body: bool):
        if not is_loopback_host(self.headers.get("Host")):
            self.send_error(421, "Host must be 127.0.0.1, localhost or [::1]")
            return
        if url_path_of(self.path) in REDIRECTS:
            self.send_response(302)
            self.send_header("Location", REDIRECTS[url_path_of(self.path)])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        real = resolve_request_path(self.path, self.root, ALLOWED_PREFIXES, self.mounts)
        if real is None:
            self.send_error(404, "not served")
            return
        try:   # O_NONBLOCK: a file swapped for a FIFO after the check cannot hang the thread
            f = os.fdopen(os.open(real, os.O_RDONLY | os.O_NONBLOCK), "rb")
        except OSError:
            self.send_error(404, "not served")
            return
        with f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                self.send_error(404, "not served")
                return
            tags = validators(st)
            if not_modified(self.headers.get("If-None-Match"), self.headers.get("If-Modified-Since"), tags[0][1], st.st_mtime):
                self.send_response(304)
                for name, value in tags:
                    self.send_header(name, value)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", content_type_for(real))
            self.send_header("Content-Length", str(st.st_size))
            for name, value in tags:
                self.send_header(name, value)
            self.end_headers()
            if send_body:
                while chunk := f.read(1 << 16):
                    self.wfile.write(chunk)
                    if self.rate_bytes_per_s:
                        time.sleep(self.link.reserve(len(chunk), self.rate_bytes_per_s))

    def log_message(self, format, *args):
        if os.environ.get("EXACTSPEC_SERVER_LOG"):
            super().log_message(format, *args)


BUSY_RESPONSE = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                 b"Content-Length: 30\r\nRetry-After: 1\r\nConnection: close\r\n"
                 + "".join(f"{n}: {v}\r\n" for n, v in SECURITY_HEADERS).encode() + b"\r\n"
                 + b"503 too many open connections\n")


class _BoundedServer(http.server.ThreadingHTTPServer):
    """One thread per connection, at most `max_connections` at once (beyond: 503, no thread)."""

    daemon_threads = True

    def __init__(self, address, handler_class, max_connections: int):
        self.slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler_class)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(BUSY_RESPONSE)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):
        """A page that closes mid-download (tests, a closed tab) is not a server error; anything
        else is one line on stderr, never a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        print(f"exactspec: server: {type(exc).__name__}: {exc} (request from {client_address[0]})",
              file=sys.stderr, flush=True)


class StaticServer:
    """Serve `root` on 127.0.0.1:port (port 0: ephemeral) from a daemon thread.

    Raises ExactSpecError E_BAD_ARGUMENT for a port outside 0..65535, a host other than
    127.0.0.1 or a malformed mount; E_IO when the port cannot be bound (in use, no permission).
    """

    def __init__(self, root: Path | str = REPO_ROOT, host: str = "127.0.0.1", port: int = 0, mounts=None,
                 read_timeout_s: float = READ_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS, allow_origins=(),
                 head_deadline_s: float = HEAD_DEADLINE_S, rate_bytes_per_s: int = 0):
        """rate_bytes_per_s: pace every body to that rate (benches that model a network link)."""
        if host != "127.0.0.1":
            raise ExactSpecError(E_BAD_ARGUMENT, f"host {host!r}: the server listens on 127.0.0.1 only")
        check_port(port)
        self.root = Path(root)
        handler_class = type("MountedHandler", (Handler,), {
            "root": str(self.root), "mounts": check_mounts(dict(mounts or {})), "timeout": read_timeout_s,
            "head_deadline_s": head_deadline_s, "allow_origins": check_origins(allow_origins),
            "rate_bytes_per_s": int(rate_bytes_per_s), "link": _Link()})
        try:
            self.httpd = _BoundedServer((host, port), handler_class, max_connections)
        except OSError as exc:
            raise ExactSpecError(E_IO, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.port = self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_forever(host: str = "127.0.0.1", port: int = 8000, allow_origins=()) -> None:
    server = StaticServer(REPO_ROOT, host, port, allow_origins=allow_origins)
    print(f"exactspec: open {server.url}/ in a browser (the page; web/ and runtime files only, Ctrl-C stops)", flush=True)
    if server.httpd.RequestHandlerClass.allow_origins:
        print(f"exactspec: pages on {', '.join(allow_origins)} may load the engine from {server.url}/web/exactspec.mjs",
              flush=True)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        server.close()
