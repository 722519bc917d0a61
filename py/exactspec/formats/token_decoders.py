"""Decoders of Hugging Face tokenizer.json (token strings -> text), in pure Python.

`tokenizers` decodes by mapping ids to token strings, running the decoder's `decode_chain`
(each step maps a list of strings to a list of strings) and joining the result. Supported
steps, each as `tokenizers` 0.23 defines it: ByteLevel (bytes of the GPT-2 alphabet, then lossy
UTF-8 over the whole run, one U+FFFD per maximal invalid subpart as Rust's from_utf8_lossy),
Replace (a String pattern), ByteFallback (runs of `<0xNN>` tokens become their bytes' UTF-8, or
one U+FFFD per byte when invalid), Fuse, Strip, Metaspace and Sequence. Anything else is refused.
"""
from __future__ import annotations

from ..core.errors import E_MODEL_LOAD, ExactSpecError
from .pretokenize import CHAR_TO_BYTE, METASPACE, chain, spec_list, spec_object

_HEX = frozenset("0123456789abcdefABCDEF")


def byte_fallback_value(token: str) -> int | None:
    """The byte of a `<0xNN>` token as tokenizers parses it (u8::from_str_radix, so a '+'
    sign is accepted, e.g. `<0x+A>`), else None."""
    if len(token.encode("utf-8")) != 6 or not token.startswith("<0x") or not token.endswith(">"):
        return None
    digits = token[3:5]
    body = digits[1:] if digits[0] == "+" else digits
    return int(body, 16) if body and all(c in _HEX for c in body) else None


def byte_level_bytes(token: str) -> bytes:
    """ByteLevel: the token's bytes in the GPT-2 alphabet, or its UTF-8 when it has a
    character outside that alphabet (most added tokens)."""
    try:
        return bytes([CHAR_TO_BYTE[c] for c in token])
    except KeyError:
        return token.encode("utf-8")


def _byte_level(tokens):
    return [b"".join([byte_level_bytes(t) for t in tokens]).decode("utf-8", "replace")]


def _byte_fallback(tokens):
    out, run = [], bytearray()
    for t in tokens:
        b = byte_fallback_value(t)
        if b is not None:
            run.append(b)
            continue
        if run:
            out.append(_flush_bytes(run))
            run = bytearray()
        out.append(t)
    if run:
        out.append(_flush_bytes(run))
    return out


def _flush_bytes(run: bytearray) -> str:
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)


def _strip_step(content: str, start: int, stop: int):
    def run(tokens):
        out = []
        for t in tokens:
            a = 0
            while a < min(start, len(t)) and t[a] == content:
                a += 1
            b = len(t)
            while len(t) - b < stop and b > a and t[b - 1] == content:
                b -= 1
            out.append(t[a:b])
        return out
    return run


def _metaspace_step(spec):
    repl = spec.get("replacement", METASPACE)
    scheme = spec.get("prepend_scheme")
    if scheme is None:
        scheme = "always" if spec.get("add_prefix_space", True) else "never"
    if scheme not in ("always", "first", "never") or not isinstance(repl, str) or len(repl) != 1:
        raise ExactSpecError(E_MODEL_LOAD, "unsupported Metaspace decoder settings")

    def run(tokens):
        # tokenizers drops every replacement character of the first token (unless "never")
        return [t.replace(repl, "" if i == 0 and scheme != "never" else " ") for i, t in enumerate(tokens)]
    return run


def _int_field(spec, key) -> int:
    v = spec.get(key, 0)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ExactSpecError(E_MODEL_LOAD, f"decoder Strip {key} must be a non-negative integer")
    return v


def build_decoder(spec):
    """f(list of token strings) -> list of strings (join them for the text)."""
    if spec is None:
        raise ExactSpecError(E_MODEL_LOAD, "unsupported decoder None")
    kind = spec_object(spec, "decoder").get("type")
    if kind == "ByteLevel":
        return _byte_level
    if kind == "ByteFallback":
        return _byte_fallback
    if kind == "Fuse":
        return lambda tokens: ["".join(tokens)]
    if kind == "Strip":
        content = spec.get("content", " ")
        if not isinstance(content, str) or len(content) != 1:
            raise ExactSpecError(E_MODEL_LOAD, "decoder Strip content must be one character")
        return _strip_step(content, _int_field(spec, "start"), _int_field(spec, "stop"))
    if kind == "Replace":
        pattern = spec_object(spec.get("pattern"), "decoder Replace pattern")
        old, new = pattern.get("String"), spec.get("content")
        if not isinstance(old, str) or not old or not isinstance(new, str):
            raise ExactSpecError(E_MODEL_LOAD, "unsupported decoder Replace (a non-empty String pattern is required)")
        return lambda tokens: [t.replace(old, new) for t in tokens]
    if kind == "Metaspace":
        return _metaspace_step(spec)
    if kind == "Sequence":
        return chain([build_decoder(s) for s in spec_list(spec.get("decoders", []), "decoders")])
    raise ExactSpecError(E_MODEL_LOAD, f"unsupported decoder {kind!r}")
