"""Coded errors: every failure the engine reports carries a stable code and a message.

The one table of codes is the "errors" object of protocol.json; Python (here) and JS
(web/protocol.mjs) both read it, and tests/test_protocol.py checks that the names below, the
JSON table and every code raised anywhere in py/ and web/ agree.
"""
from __future__ import annotations

import json
import os
import re

with open(os.path.join(os.path.dirname(__file__), "protocol.json"), encoding="utf-8") as _f:
    CODE_TABLE: dict = json.load(_f)["errors"]   # code -> one-line description

# Stable codes. Never renumber or rename: receipts, the worker protocol and the CLI use them.
E_BAD_ARGUMENT = "E_BAD_ARGUMENT"                    # invalid option or value, or beyond a backend limit
E_BUSY = "E_BUSY"                                    # a request is running and queueing was refused
E_PROCESSOR_INVALID = "E_PROCESSOR_INVALID"          # processed distribution has NaN or no valid token
E_TARGET_NUMERIC_OR_MASK = "E_TARGET_NUMERIC_OR_MASK"  # champion row invalid inside a round (fatal)
E_RESIDUAL_INVARIANT = "E_RESIDUAL_INVARIANT"        # residual mass not finite or <= floor
E_DRAFT_LOST = "E_DRAFT_LOST"                        # draft worker / backend failed
E_DEVICE_LOST = "E_DEVICE_LOST"                      # GPU device / champion backend lost
E_NO_WEBGPU = "E_NO_WEBGPU"                          # no WebGPU adapter or device
E_BATCH_VARIANT = "E_BATCH_VARIANT"                  # the champion's block logits differ from one-by-one (load-time check)
E_SHADER = "E_SHADER"                                # shader compile / pipeline failure
E_OUT_OF_MEMORY = "E_OUT_OF_MEMORY"                  # an allocation was refused
E_TIMEOUT = "E_TIMEOUT"                              # an operation exceeded its time limit
E_STALE_EPOCH = "E_STALE_EPOCH"                      # message from an old epoch
E_CANCELLED = "E_CANCELLED"                          # request cancelled by the caller
E_MODEL_LOAD = "E_MODEL_LOAD"                        # model or tokenizer file missing / malformed
E_MANIFEST_MISMATCH = "E_MANIFEST_MISMATCH"          # champion/draft pair incompatible
E_CONTEXT_OVERFLOW = "E_CONTEXT_OVERFLOW"            # prompt + generation exceeds context limit
E_GRAMMAR_DEAD_END = "E_GRAMMAR_DEAD_END"            # the response_format allows no token here
E_CACHE_STATE = "E_CACHE_STATE"                      # cache transaction misuse (a bug, never user input)
E_PROTOCOL = "E_PROTOCOL"                            # malformed worker message
E_IO = "E_IO"                                        # file / pipe / socket failure
E_TERMINATED = "E_TERMINATED"                        # engine terminated under a request
E_INTERNAL = "E_INTERNAL"                            # unexpected failure (a bug), named in the message

ALL_CODES = frozenset(v for k, v in dict(globals()).items() if k.startswith("E_"))
if ALL_CODES != frozenset(CODE_TABLE):   # the names above and the one table must be the same set
    raise ImportError(f"errors.py and protocol.json disagree: {sorted(ALL_CODES ^ frozenset(CODE_TABLE))}")


_WRAPPER = re.compile(r"(?:(?:Uncaught )?(?:Error|JsException|PythonError|RuntimeError): )+")


def message_without_code(code: str, message) -> str:
    """The sentence of a coded message: leading copies of `code` (each perhaps behind an "Error: "
    a JS or Pyodide boundary put in front) removed, so that code and sentence print once; the
    code's one-line description when nothing else is left."""
    text = str(message).lstrip()
    head = re.compile(rf"(?:{_WRAPPER.pattern})?{code}(?::\s*|\Z)")
    while m := head.match(text):
        text = text[m.end():]
    return text or CODE_TABLE[code]


class ExactSpecError(Exception):
    """An error with a stable `code` (one of ALL_CODES) and a one-line human message (a leading
    copy of the code in `message` is dropped: see message_without_code)."""

    def __init__(self, code: str, message: str, **detail):
        if code not in ALL_CODES:
            raise ValueError(f"unknown error code {code!r}")
        message = message_without_code(code, message)
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message}


def coded_error(exc: BaseException, default_code: str, context: str = "") -> ExactSpecError:
    """The ExactSpecError an exception stands for.

    An ExactSpecError is returned as is. Anything else (a JS error surfacing in Pyodide as
    JsException, an OSError, a bug) keeps the code its message starts with when that code is in
    the table ("E_DEVICE_LOST: ..." or "Error: E_DEVICE_LOST: ..."), and otherwise gets
    `default_code`, with the exception's type and text in the message."""
    if isinstance(exc, ExactSpecError):
        return exc
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    for prefix in ("Error: ", "JsException: ", "PythonError: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    head, sep, rest = text.partition(": ")
    if head in ALL_CODES:
        return ExactSpecError(head, rest)   # rest empty: the code's description
    where = f"{context}: " if context else ""
    return ExactSpecError(default_code, f"{where}{type(exc).__name__}: {text or 'no message'}")
