"""Static server for the browser runtime: 127.0.0.1 only, COOP/COEP, exact MIME types, allowlist.

Serves the repository's web/, shaders/, py/exactspec/ (the orchestrator's Python source, loaded
into Pyodide), node_modules/pyodide/ (Pyodide itself, offline) and build/ (compiled WASM and
test fixtures). Everything else is 404: the page never needs anything from another origin.
"""
from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ALLOWED_PREFIXES = ("/web/", "/shaders/", "/py/exactspec/", "/node_modules/pyodide/", "/build/")
MIME_TYPES = {
    ".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
    ".json": "application/json", ".wgsl": "text/plain; charset=utf-8", ".py": "text/plain; charset=utf-8",
    ".zip": "application/zip", ".whl": "application/zip", ".html": "text/html; charset=utf-8",
    ".css": "text/css", ".safetensors": "application/octet-stream", ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml", ".png": "image/png",
}


class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **MIME_TYPES}

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    mounts: dict = {}   # URL prefix ("/models/x/") -> directory, for models outside the repository

    def _allowed(self) -> bool:
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        return ".." not in path and path.startswith(ALLOWED_PREFIXES + tuple(self.mounts))

    def translate_path(self, path):
        clean = path.split("?", 1)[0].split("#", 1)[0]
        for prefix, directory in self.mounts.items():
            if clean.startswith(prefix):
                return os.path.join(directory, clean[len(prefix):])
        return super().translate_path(path)

    def do_GET(self):
        if self.path in ("/", "/index.html"):
            self.send_response(302)
            self.send_header("Location", "/web/index.html")
            self.end_headers()
            return
        if not self._allowed():
            self.send_error(404, "not served")
            return
        super().do_GET()

    def do_HEAD(self):
        if not self._allowed():
            self.send_error(404, "not served")
            return
        super().do_HEAD()

    def list_directory(self, path):
        self.send_error(404, "no directory listings")

    def log_message(self, format, *args):
        if os.environ.get("EXACTSPEC_SERVER_LOG"):
            super().log_message(format, *args)


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A page that closes mid-download (tests, a closed tab) is not a server error."""
        import sys
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class StaticServer:
    """Serve `root` on host:port (port 0: ephemeral) from a daemon thread."""

    def __init__(self, root: Path | str = REPO_ROOT, host: str = "127.0.0.1", port: int = 0, mounts=None):
        self.root = Path(root)
        handler_class = type("MountedHandler", (Handler,), {"mounts": dict(mounts or {})})
        handler = functools.partial(handler_class, directory=str(self.root))
        self.httpd = _QuietServer((host, port), handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_forever(host: str = "127.0.0.1", port: int = 8000) -> None:
    server = StaticServer(REPO_ROOT, host, port)
    print(f"exactspec: serving {REPO_ROOT} (web/ and runtime files only) at {server.url}/web/index.html", flush=True)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        server.close()
