"""Shared headless-Chromium fixtures for browser tests.

Use from a test module with::

    from browser_fixture import chromium_browser, http_server, browser_page  # noqa: F401

(``tests/`` is on ``sys.path`` under pytest's default import mode.) The browser, the
Playwright driver and the HTTP server are process-wide singletons, so every module that
imports these fixtures shares ONE Chromium and ONE server per test session, even though pytest
registers the fixture once per importing module. They are shut down at the end of the session.

Facts this relies on (see shared STACK_NOTES):
- Debian's ``/usr/bin/chromium`` driven by Python Playwright via ``executable_path``; no
  browser download is possible here.
- WebGPU comes from SwiftShader with the flags in ``CHROMIUM_ARGS`` (exactspec.host.browser_run's, the CLI's); ``navigator.gpu`` exists
  only in a secure context: ``http://127.0.0.1`` is one, ``about:blank`` opened by Playwright
  is NOT. Use ``http_server`` for anything that touches WebGPU, workers or WASM threads.
- The server sends COOP/COEP, so pages are ``crossOriginIsolated`` (SharedArrayBuffer,
  WASM threads), and serves ``.mjs`` as text/javascript and ``.wasm`` as application/wasm.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import threading
from pathlib import Path

import pytest

from exactspec.host.browser_run import CHROMIUM, CHROMIUM_ARGS  # the product's own launch, one copy  # noqa: F401
from exactspec.host.server import StaticServer  # the same server `exactspec serve` runs

REPO_ROOT = Path(__file__).resolve().parent.parent

_lock = threading.Lock()
_state: dict = {}


def get_server() -> StaticServer:
    """The process-wide server for the repository root."""
    with _lock:
        if "server" not in _state:
            _state["server"] = StaticServer(REPO_ROOT)
        return _state["server"]


# ----------------------------------------------------------------------------- browser
def chromium_available() -> bool:
    return Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is not None


def get_browser():
    """The process-wide headless Chromium (Playwright sync API), launched on first use."""
    with _lock:
        if "browser" not in _state:
            if not chromium_available():
                raise RuntimeError(f"{CHROMIUM} not found: run `bash tools/setup.sh`")
            from playwright.sync_api import sync_playwright

            pw = sync_playwright().start()
            try:
                browser = pw.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
                )
            except Exception:
                pw.stop()
                raise
            _state["playwright"] = pw
            _state["browser"] = browser
        return _state["browser"]


def shutdown() -> None:
    """Close browser, driver and server (idempotent)."""
    with _lock:
        browser = _state.pop("browser", None)
        pw = _state.pop("playwright", None)
        server = _state.pop("server", None)
    for fn in (
        browser and browser.close,
        pw and pw.stop,
        server and server.close,
    ):
        if fn:
            try:
                fn()
            except Exception as exc:  # pragma: no cover - best effort at teardown
                print(f"browser_fixture: shutdown: {exc!r}", file=sys.stderr)


atexit.register(shutdown)


def forward_console(page, sink: list | None = None, prefix: str = "browser") -> list:
    """Print the page's console messages (its dedicated workers' included: Playwright reports
    them as page console events) and uncaught page errors into the test output.

    Returns the list that collects ``(kind, text)`` tuples, so tests can assert on it.
    """
    sink = [] if sink is None else sink

    def on_console(msg):
        sink.append((msg.type, msg.text))
        print(f"[{prefix} console.{msg.type}] {msg.text}")

    def on_error(err):
        sink.append(("pageerror", str(err)))
        print(f"[{prefix} pageerror] {err}")

    page.on("console", on_console)
    page.on("pageerror", on_error)
    return sink


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def http_server() -> StaticServer:
    """Static server for the repository root with COOP/COEP; ``http_server.url`` is the base."""
    server = get_server()
    yield server
    # shut down in `chromium_browser`'s teardown / atexit; nothing to do per module


@pytest.fixture(scope="session")
def chromium_browser():
    """One headless Chromium for the whole test session (fails, never skips, if missing)."""
    browser = get_browser()
    yield browser
    shutdown()


@pytest.fixture
def browser_page(chromium_browser):
    """A fresh context + page, with console/page errors forwarded; ``page.console_log`` holds
    the collected ``(kind, text)`` messages."""
    context = chromium_browser.new_context()
    page = context.new_page()
    page.console_log = forward_console(page)
    try:
        yield page
    finally:
        context.close()


# the engine's own load limit is 300 s (Engine.load timeoutMs): waiting a little longer lets its
# E_TIMEOUT reach the page's status line, which tells a load that hung from a page that never began one
PAGE_LOAD_WAIT_MS = 330_000


def wait_load_ended(page, loads: int, timeout_ms: int = PAGE_LOAD_WAIT_MS) -> None:
    """Wait until web/index.html's load after `loads` loads has ended (ready or failed). When it does
    not, fail with what the page showed (stage, status, progress rows, model note) instead of the
    bare timeout: a load that never ends is otherwise a failure with nothing to go on."""
    try:
        page.wait_for_function("(n) => window.appState.loads > n && window.appState.stage !== 'loading'",
                               arg=loads, timeout=timeout_ms)
    except Exception as exc:   # playwright's TimeoutError: said again with the page's own account
        shown = page.evaluate("""() => ({stage: window.appState?.stage, loads: window.appState?.loads,
          status: document.getElementById('status')?.textContent,
          progress: document.getElementById('progress')?.innerText,
          note: document.getElementById('model_note')?.textContent})""")
        raise AssertionError(f"the page's load did not end within {timeout_ms} ms: {shown}") from exc
