"""The pure-Python wheels Pyodide installs offline at boot (web/orchestrator/wheels.mjs).

    python3 tools/pyodide_wheels.py [OUT]          # default build/wheels

Writes OUT/jinja2-3.1.6-py3-none-any.whl (from PyPI, as published), OUT/markupsafe-3.0.3-py3-
none-any.whl (built here from the PyPI sdist without the optional C speedups: MarkupSafe falls
back to its pure-Python `_native` module; PyPI has no pure wheel) and OUT/index.json
{"wheels": [{file, sha256, bytes}]} in install order. The versions are the ones Pyodide's own
lock file names. Idempotent: nothing is downloaded when index.json matches the wheels on disk.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from exactspec.host.safe_files import write_file  # noqa: E402  (never through a link)

JINJA2 = ("jinja2", "3.1.6")
MARKUPSAFE = ("markupsafe", "3.0.3")
WHEELS = (f"{MARKUPSAFE[0]}-{MARKUPSAFE[1]}-py3-none-any.whl", f"{JINJA2[0]}-{JINJA2[1]}-py3-none-any.whl")
_EPOCH = (2020, 1, 1, 0, 0, 0)      # fixed zip timestamps: the same sdist gives the same bytes


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def up_to_date(out: str) -> bool:
    try:
        with open(os.path.join(out, "index.json"), encoding="utf-8") as f:
            entries = json.load(f)["wheels"]
        return [e["file"] for e in entries] == list(WHEELS) and all(
            _sha256(open(os.path.join(out, e["file"]), "rb").read()) == e["sha256"] for e in entries)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _download(spec: str, binary: bool, dest: str) -> str:
    cmd = [sys.executable, "-m", "pip", "download", spec, "--no-deps", "--disable-pip-version-check", "-q", "-d", dest,
           "--only-binary=:all:" if binary else "--no-binary=:all:"]
    subprocess.run(cmd, check=True)
    return dest


def pure_wheel_from_sdist(sdist: bytes, name: str, version: str) -> bytes:
    """A py3-none-any wheel of src/<name>/ (Python files and py.typed only) with the sdist's
    PKG-INFO as METADATA and its LICENSE."""
    root = f"{name}-{version}/"
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(sdist), mode="r:gz") as tar:
        for member in tar.getmembers():
            path = member.name
            if not member.isfile():
                continue
            data = tar.extractfile(member).read()
            if path.startswith(root + f"src/{name}/") and path.endswith((".py", "py.typed")):
                files[path[len(root + "src/"):]] = data
            elif path == root + "PKG-INFO":
                files[f"{name}-{version}.dist-info/METADATA"] = data
            elif path == root + "LICENSE.txt":
                files[f"{name}-{version}.dist-info/licenses/LICENSE.txt"] = data
    if f"{name}/__init__.py" not in files or f"{name}-{version}.dist-info/METADATA" not in files:
        raise SystemExit(f"pyodide_wheels: {name} sdist does not have the expected layout")
    files[f"{name}-{version}.dist-info/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: exactspec tools/pyodide_wheels.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{name}-{version}.dist-info/top_level.txt"] = f"{name}\n".encode()
    record = f"{name}-{version}.dist-info/RECORD"
    lines = []
    for path in sorted(files):
        digest = base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(files[path])}")
    files[record] = ("\n".join(lines + [f"{record},,"]) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(files, key=lambda p: (p == record, p)):     # RECORD last
            z.writestr(zipfile.ZipInfo(path, _EPOCH), files[path])
    return buf.getvalue()


def build(out: str) -> list[dict]:
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _download(f"{JINJA2[0]}=={JINJA2[1]}", True, tmp)
        _download(f"{MARKUPSAFE[0]}=={MARKUPSAFE[1]}", False, tmp)
        with open(os.path.join(tmp, WHEELS[1]), "rb") as f:
            jinja2 = f.read()
        with open(os.path.join(tmp, f"{MARKUPSAFE[0]}-{MARKUPSAFE[1]}.tar.gz"), "rb") as f:
            markupsafe = pure_wheel_from_sdist(f.read(), *MARKUPSAFE)
    entries = []
    for file, data in zip(WHEELS, (markupsafe, jinja2)):
        write_file(os.path.join(out, file), data)
        entries.append({"file": file, "sha256": _sha256(data), "bytes": len(data)})
    write_file(os.path.join(out, "index.json"), json.dumps({"wheels": entries}, indent=2) + "\n")
    return entries


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "wheels")
    if up_to_date(out):
        print(f"pyodide_wheels: {out} up to date")
        return 0
    for e in build(out):
        print(f"pyodide_wheels: {e['file']} {e['bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
