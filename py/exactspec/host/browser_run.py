"""Run generations in headless Chromium (WebGPU champion, WASM draft, Pyodide orchestrator) from
CPython: `exactspec generate --backend browser` and the browser tests use this."""
from __future__ import annotations

import os
import re
import time
import urllib.parse

from ..core.errors import ALL_CODES, E_DEVICE_LOST, E_MODEL_LOAD, ExactSpecError
from .server import REPO_ROOT, StaticServer

CHROMIUM = os.environ.get("EXACTSPEC_CHROMIUM", "/usr/bin/chromium")
# Every headless launch (the CLI, the evaluation, tools/bench/peer.py, tests/browser_fixture.py):
# WebGPU from SwiftShader, nothing fetched in the background.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--enable-unsafe-webgpu", "--enable-features=Vulkan", "--use-angle=swiftshader",
    "--use-webgpu-adapter=swiftshader",
]


def _url_for(model_dir: str, name: str, mounts: dict) -> str:
    """URL under which the server exposes model_dir: its path under /web/ (percent-encoded) when
    inside web/, else a mount /models/<name>/ that serves only regular files inside model_dir
    (server.resolve_request_path applies the same rules to both)."""
    full = os.path.realpath(model_dir)
    if full.endswith(".gguf") and os.path.isfile(full):   # one file, mounted alone
        prefix = f"/models/{name}/"
        mounts[prefix] = full
        return prefix + urllib.parse.quote(os.path.basename(full))
    web = os.path.realpath(os.path.join(REPO_ROOT, "web"))
    if full.startswith(web + os.sep):
        return "/web/" + urllib.parse.quote(os.path.relpath(full, web).replace(os.sep, "/")) + "/"
    prefix = f"/models/{name}/"
    mounts[prefix] = full
    return prefix


class BrowserRuntime:
    """One server, one Chromium page, one loaded engine; `generate(payload)` per request."""

    def __init__(self, champion_dir: str, draft_dir: str | None, browser=None, timeout_s: float = 600,
                 champion_backend: str = "webgpu", on_progress=None, threads="auto", warm_up: bool = True,
                 matmul: str = "auto", calibrate: str = "auto", faults: bool = False, context=None,
                 cache: bool = True, rate_bytes_per_s: int = 0, port: int = 0, draft_in_background: bool = False):
        """on_progress(payload): the engine's load progress ({stage, ...}, web/fetch_progress.mjs).
        threads: the WASM champion's threads, "auto" (the engine's choice) or a count; warm_up: the
        engine's load-time warm-up (web/orchestrator/warmup.mjs), on by default; matmul: the WASM
        champion's quantised matmul, "auto" | "q8act" | "f32" (docs/champion_wasm.md, Weight formats);
        calibrate: the load's calibration, "auto" (cached per device) | "force" | "off" (docs/browser.md,
        Calibration at load); faults: the engine's fault injection (tests: window.exactspecRunner.fault);
        context: a browser context to open the page in (kept open at close: a persistent profile whose
        weight cache a second runtime reuses), else a new one; cache: the engine's weight cache
        (docs/browser.md, Weight cache); rate_bytes_per_s: the server paces its bodies (benches); port: the
        server's (0: a free one; a fixed one keeps the origin, and with it the cache, across runtimes);
        draft_in_background: ready with the champion alone, the draft loading when the engine is idle
        (speculate "draft" waits for it; "auto" runs without it until then: docs/browser.md)."""
        is_gguf = lambda d: str(d).endswith(".gguf")   # a GGUF file runs as it is: the page reads it
        for d in filter(None, (champion_dir, draft_dir)):
            if not is_gguf(d) and not os.path.isfile(os.path.join(d, "config.json")):
                raise ExactSpecError(E_MODEL_LOAD, f"{d}: no config.json")
        from .model_cache import browser_ready   # a folder as published: converted once, cached under build/
        if not is_gguf(champion_dir):
            champion_dir = browser_ready(champion_dir, "champion")
        if draft_dir and not is_gguf(draft_dir):
            draft_dir = browser_ready(draft_dir, "draft")
        mounts: dict = {}
        models = {"champion": _url_for(champion_dir, "champion", mounts),
                  "draft": _url_for(draft_dir, "draft", mounts) if draft_dir else None}
        self.server = StaticServer(mounts=mounts, rate_bytes_per_s=rate_bytes_per_s, port=port)
        self._pw = None
        self.log: list = []
        if browser is None and context is None:
            try:
                self._pw, browser = launch_chromium()
            except Exception:
                self.server.close()
                raise
        self.browser = browser
        self._own_context = context is None
        self.context = browser.new_context() if context is None else context
        self.page = self.context.new_page()
        self.page.set_default_timeout(timeout_s * 1000)
        self.page.on("console", lambda m: self.log.append(f"console.{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.log.append(f"pageerror: {e}"))
        if on_progress is not None:
            self.page.expose_function("exactspecProgress", on_progress)
        t0 = time.perf_counter()
        self.page.goto(self.server.url + "/web/runner.html")
        self.page.wait_for_function("() => window.runnerReady === true")
        try:
            self.ready = self.page.evaluate("([m, o]) => window.exactspecRunner.load(m, o)",
                                            [models, {"championBackend": champion_backend, "threads": threads,
                                             "warmUp": warm_up, "matmul": matmul, "calibrate": calibrate,
                                             "faults": faults, "cache": cache, "draftInBackground": draft_in_background}])
        except Exception as exc:
            self.close()
            err = _coded_from(exc)
            raise ExactSpecError(err.code, f"browser engine failed to load: {err.message}") from None
        self.ready["timing_ms"]["page_total"] = (time.perf_counter() - t0) * 1000

    def generate(self, payload: dict, cancel_after_tokens: int = 0) -> dict:
        try:
            out = self.page.evaluate("([p, n]) => window.exactspecRunner.generate(p, {cancelAfterTokens: n})",
                                     [payload, cancel_after_tokens])
        except Exception as exc:
            raise _coded_from(exc) from None
        if out.get("refused"):    # refused before it started: the same coded error as the reference backend
            err = out["refused"]
            raise _coded_from(RuntimeError(err["message"] if err["message"].startswith(err["code"])
                                           else f"{err['code']}: {err['message']}"))
        return out

    def close(self):
        for fn in (self.context.close if self._own_context else self.page.close, self._pw and self.browser.close,
                   self._pw and self._pw.stop, self.server.close):
            if fn:
                try:
                    fn()
                except Exception:
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def launch_chromium():
    """(playwright, browser): headless Chromium with the flags above; raises if none can start."""
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    try:
        return pw, pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    except Exception:
        pw.stop()
        raise


def _coded_from(exc) -> ExactSpecError:
    """A coded error from a page exception whose text carries 'E_CODE: message' somewhere."""
    text = _first_line(exc)
    m = re.search(r"\b(E_[A-Z_]+): ?(.*)", text)
    if m and m.group(1) in ALL_CODES:
        return ExactSpecError(m.group(1), m.group(2))
    return ExactSpecError(E_DEVICE_LOST, text)


def _first_line(exc) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.replace("Error: ", "", 1) if text.startswith("Error: E_") else text
