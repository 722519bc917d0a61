"""Files exactspec writes on disk: made fresh beside their destination and renamed over it, never written through a link.

Every writer of the command line and the tools (convert, bench reports and plots, benchmark
outputs) goes through this module, so that a folder prepared by someone else cannot turn a write
into an overwrite of a file elsewhere (a planted `config.json -> ~/.bashrc`):
- `refuse_link(path)`: a destination that is a symbolic link is refused (E_IO, naming it);
- `create_new(path)`: O_CREAT|O_EXCL|O_NOFOLLOW, so only a name that did not exist is opened;
- `replacing(path)` / `write_file(path, data)`: the data goes to a fresh hidden name in the same
  folder, renamed over `path` when complete (os.replace swaps the directory entry: a link planted
  after the check is replaced, not followed); a failure or an interrupt removes the fresh file;
- `append_text(path, text)`: appends with O_NOFOLLOW (a log a run resumes from);
- `move_into_place(staging, dst, names)`: the renames that publish a finished set of files, with
  SIGINT and SIGTERM held back until the last one, so no interrupt lands between them.
The rules are in docs/hostile_input.md ("Files the command line writes").
"""
from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading

from ..core.errors import E_IO, ExactSpecError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _cannot_write(path, exc: OSError) -> ExactSpecError:
    return ExactSpecError(E_IO, f"{path}: cannot write ({exc.strerror or type(exc).__name__})")


def refuse_link(path) -> None:
    """E_IO when `path` (its last component; a trailing slash ignored) is a symbolic link."""
    path = os.path.normpath(os.fspath(path))
    if os.path.islink(path):
        raise ExactSpecError(E_IO, f"{path}: is a symbolic link; exactspec never writes through a link "
                                   "(remove it or choose another place)")


def _open_new(path, mode: str):
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | (_BINARY if "b" in mode else 0)
    fd = os.open(path, flags, 0o666)   # the umask applies, as with open()
    return os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8", newline="\n")


def create_new(path, mode: str = "wb"):
    """A file object on a name that did not exist (never a link, never an existing file)."""
    try:
        return _open_new(path, mode)
    except OSError as exc:
        refuse_link(path)
        raise _cannot_write(path, exc) from None


def _fresh_name(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.{secrets.token_hex(6)}.tmp")


@contextlib.contextmanager
def replacing(path, mode: str = "wb"):
    """Yield a file that becomes `path` when the block ends without an exception; otherwise
    `path` is left as it was and the fresh file is removed. An OSError raised by the block itself
    passes through unchanged; flushing and renaming failures are E_IO naming `path`."""
    path = os.fspath(path)
    refuse_link(path)
    for _ in range(8):   # a fresh name is taken only if nothing (file or link) holds it
        tmp = _fresh_name(path)
        try:
            f = _open_new(tmp, mode)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise _cannot_write(path, exc) from None
    else:
        raise ExactSpecError(E_IO, f"{path}: cannot find a fresh temporary name beside it")
    try:
        with f:
            yield f
            try:
                f.flush()
            except OSError as exc:
                raise _cannot_write(path, exc) from None
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise _cannot_write(path, exc) from None
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


def write_file(path, data) -> None:
    """Write bytes, or str as UTF-8, to `path` through a fresh file renamed over it."""
    with replacing(path, "w" if isinstance(data, str) else "wb") as f:
        try:
            f.write(data)
        except OSError as exc:
            raise _cannot_write(path, exc) from None


def copy_file(src, dst) -> None:
    """Copy the bytes of `src` to `dst` (as write_file does), in blocks."""
    with open(src, "rb") as f_in, replacing(dst, "wb") as f_out:
        while block := f_in.read(1 << 20):
            try:
                f_out.write(block)
            except OSError as exc:
                raise _cannot_write(dst, exc) from None


def append_text(path, text: str) -> None:
    """Append UTF-8 text to `path` (created if missing); a link at `path` is refused."""
    path = os.fspath(path)
    refuse_link(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
    except OSError as exc:
        refuse_link(path)   # planted after the first check: ELOOP, said plainly
        raise _cannot_write(path, exc) from None
    with os.fdopen(fd, "a", encoding="utf-8", newline="\n") as f:
        f.write(text)


@contextlib.contextmanager
def _interrupts_held():
    """SIGINT and SIGTERM wait until the block ends. Python runs signal handlers in the main thread
    only, so there their handlers are swapped for one that notes the signal, and each noted
    signal is raised again after the block (a signal mask would not do: another thread would
    take a signal sent to the process); elsewhere nothing can interrupt the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in pending:
            signal.raise_signal(sig)


def move_into_place(staging: str, dst: str, names) -> None:
    """Rename staging/<name> to dst/<name> for each name, in order, without an interrupt between
    two renames; each destination entry is replaced (a link there is replaced, never followed)."""
    with _interrupts_held():
        for name in names:
            try:
                os.replace(os.path.join(staging, name), os.path.join(dst, name))
            except OSError as exc:
                raise _cannot_write(os.path.join(dst, name), exc) from None
