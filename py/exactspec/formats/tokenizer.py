"""BPE tokenizer read from a Hugging Face tokenizer.json, in pure Python.

Standard library only (it also runs in Pyodide). It implements exactly the components it
recognises and refuses the rest with E_MODEL_LOAD naming the component, so an unsupported
tokenizer never silently produces different ids from Hugging Face `tokenizers`.

Pipeline (the order `tokenizers` uses):
  1. split out added tokens that match the raw text (normalized=False ones), leftmost-longest;
  2. normalize the remaining pieces, then split out normalized added tokens;
  3. pre-tokenize each piece (pretokenize.py: ByteLevel, Split, Digits, Metaspace, Sequence);
  4. BPE on each pre-token (rank-ordered merge heap, byte fallback, cached per pre-token);
  5. post-process (TemplateProcessing single sequence) when add_special_tokens.
Decoding maps ids to token strings and runs the decoder chain (token_decoders.py): ByteLevel,
or the Llama 2 kind (Replace, ByteFallback, Fuse, Strip), or Metaspace.
"""
from __future__ import annotations

import heapq
import json
import unicodedata

from .config import read_regular_file
from ..core.errors import E_BAD_ARGUMENT, E_MODEL_LOAD, ExactSpecError
from .pretokenize import (  # noqa: F401  (re-exported: the tokenizer's public names)
    BYTE_TO_CHAR, CHAR_TO_BYTE, LETTER, NUMBER, OTHER, SPACE, build_pre_tokenizer, chain, char_class,
    is_white_space, is_word_char, split_gpt2, spec_list as _list, spec_object as _object,
)
from .token_decoders import build_decoder, byte_fallback_value, byte_level_bytes

MAX_TOKENIZER_BYTES = 1 << 28   # tokenizer.json: the largest real ones are tens of MB

# ---------------------------------------------------------------------------------------------
# Normalizers (only those that are a pure function of each character or the whole string).
# ---------------------------------------------------------------------------------------------


# Where tokenizers 0.23 and Python 3.11's unicodedata disagree (measured over every code
# point; the tests re-check): tokenizers' normalization tables predate some compatibility
# mappings, so these characters stay unchanged there (they are all starters, so normalizing
# the text between them separately is equivalent) ...
_COMPAT_KEEP = ((0x032FF, 0x032FF), (0x0A7F2, 0x0A7F4), (0x0AB69, 0x0AB69), (0x10781, 0x10785),
                (0x10787, 0x107B0), (0x107B2, 0x107BA), (0x1F16C, 0x1F16C), (0x1FBF0, 0x1FBF9))
# ... and these combining marks (non-zero combining class in Python) are plain starters there.
_STARTERS_THERE = (
    (0x007FD, 0x007FD), (0x00898, 0x0089F), (0x008CA, 0x008D3), (0x009FE, 0x009FE), (0x00C3C, 0x00C3C),
    (0x00D3B, 0x00D3C), (0x00EBA, 0x00EBA), (0x01715, 0x01715), (0x01ABF, 0x01ACE), (0x01DF6, 0x01DFA),
    (0x0A82C, 0x0A82C), (0x10D24, 0x10D27), (0x10EAB, 0x10EAC), (0x10F46, 0x10F50), (0x10F82, 0x10F85),
    (0x11070, 0x11070), (0x1133B, 0x1133B), (0x1145E, 0x1145E), (0x11839, 0x1183A), (0x1193D, 0x1193E),
    (0x11943, 0x11943), (0x119E0, 0x119E0), (0x11A34, 0x11A34), (0x11A47, 0x11A47), (0x11A99, 0x11A99),
    (0x11D42, 0x11D42), (0x11D44, 0x11D45), (0x11D97, 0x11D97), (0x16FF0, 0x16FF1), (0x1E130, 0x1E136),
    (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF))


def _chars(ranges) -> frozenset:
    return frozenset(chr(c) for lo, hi in ranges for c in range(lo, hi + 1))


# U+11938 = U+11935 U+11930 is a canonical pair tokenizers does not know: it neither splits
# U+11938 nor composes the pair, so both U+11938 and U+11930 are kept out of Python's hands.
_DIVES_AKURU = ((0x11930, 0x11930), (0x11938, 0x11938))
_NF_KEEP = {
    "NFC": _chars(_STARTERS_THERE + _DIVES_AKURU),
    "NFD": _chars(_STARTERS_THERE + _DIVES_AKURU),
    "NFKC": _chars(_STARTERS_THERE + _DIVES_AKURU + _COMPAT_KEEP),
    "NFKD": _chars(_STARTERS_THERE + _DIVES_AKURU + _COMPAT_KEEP),
}
# ... and Rust's lowercase knows the Unicode 16 case pairs: (first, last, offset to lowercase).
_NEWER_LOWER = ((0x01C89, 0x01C89, 1), (0x0A7CB, 0x0A7CB, 0x0264 - 0xA7CB), (0x0A7CC, 0x0A7CC, 1),
                (0x0A7CE, 0x0A7CE, 1), (0x0A7D2, 0x0A7D2, 1), (0x0A7D4, 0x0A7D4, 1),
                (0x0A7DA, 0x0A7DA, 1), (0x0A7DC, 0x0A7DC, 0x019B - 0xA7DC),
                (0x10D50, 0x10D65, 0x20), (0x16EA0, 0x16EB8, 0x1B))


def _lower_char(c: str) -> str:
    o = ord(c)
    for lo, hi, delta in _NEWER_LOWER:
        if lo <= o <= hi:
            return chr(o + delta)
    return c.lower()


def _unicode_normalizer(form: str):
    keep = _NF_KEEP[form]

    def run(s: str) -> str:
        if keep.isdisjoint(s):
            return unicodedata.normalize(form, s)
        out, start = [], 0
        for i, c in enumerate(s):
            if c in keep:
                out.append(unicodedata.normalize(form, s[start:i]))
                out.append(c)
                start = i + 1
        out.append(unicodedata.normalize(form, s[start:]))
        return "".join(out)
    return run


def _build_normalizer(spec):
    if spec is None:
        return None
    kind = _object(spec, "normalizer").get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return _unicode_normalizer(kind)
    if kind == "Prepend":                         # prepends to every non-empty piece
        prefix = spec.get("prepend")
        if not isinstance(prefix, str):
            raise ExactSpecError(E_MODEL_LOAD, "normalizer Prepend needs a string 'prepend'")
        return lambda s: prefix + s if s else s
    if kind == "Replace":
        pattern = _object(spec.get("pattern"), "normalizer Replace pattern")
        old, new = pattern.get("String"), spec.get("content")
        if not isinstance(old, str) or not old or not isinstance(new, str):
            raise ExactSpecError(E_MODEL_LOAD, "unsupported normalizer Replace (a non-empty String pattern is required)")
        return lambda s: s.replace(old, new)
    if kind == "Lowercase":
        # tokenizers lowercases char by char (no final-sigma context rule).
        return lambda s: "".join([_lower_char(c) for c in s])
    if kind == "Sequence":
        steps = [_build_normalizer(x) for x in _list(spec.get("normalizers", []), "normalizers")]
        return chain([f for f in steps if f is not None])
    raise ExactSpecError(E_MODEL_LOAD, f"unsupported normalizer {kind!r}")


def _build_post_processor(spec):
    """Returns f(ids) -> ids applied when add_special_tokens=True."""
    if spec is None:
        return lambda ids: ids
    kind = _object(spec, "post_processor").get("type")
    if kind == "ByteLevel":                       # only touches offsets
        return lambda ids: ids
    if kind == "Sequence":
        return chain([_build_post_processor(x) for x in _list(spec.get("processors", []), "processors")])
    if kind == "TemplateProcessing":
        specials = _object(spec.get("special_tokens", {}), "TemplateProcessing special_tokens")
        parts: list = []                           # ints are literal ids, None is $A
        for item in _list(spec.get("single", []), "TemplateProcessing single"):
            item = _object(item, "TemplateProcessing item")
            if "Sequence" in item:
                if _object(item["Sequence"], "TemplateProcessing Sequence").get("id") != "A":
                    raise ExactSpecError(E_MODEL_LOAD, "TemplateProcessing single uses a sequence other than $A")
                parts.append(None)
            elif "SpecialToken" in item:
                name = _object(item["SpecialToken"], "TemplateProcessing SpecialToken").get("id")
                if not isinstance(name, str) or name not in specials:
                    raise ExactSpecError(E_MODEL_LOAD, f"TemplateProcessing special token {name!r} has no ids")
                ids = _list(_object(specials[name], f"special token {name!r}").get("ids"), f"ids of {name!r}")
                if not all(_is_token_id(i) for i in ids):
                    raise ExactSpecError(E_MODEL_LOAD, f"TemplateProcessing ids of {name!r} are not token ids")
                parts.extend(ids)
            else:
                raise ExactSpecError(E_MODEL_LOAD, f"unsupported TemplateProcessing item {item!r}")

        def run(ids):
            out = []
            for p in parts:
                if p is None:
                    out.extend(ids)
                else:
                    out.append(p)
            return out
        return run
    raise ExactSpecError(E_MODEL_LOAD, f"unsupported post_processor {kind!r}")


# ---------------------------------------------------------------------------------------------
# BPE model
# ---------------------------------------------------------------------------------------------


class _BPE:
    def __init__(self, spec: dict):
        kind = spec.get("type", "BPE")
        if kind != "BPE":
            raise ExactSpecError(E_MODEL_LOAD, f"unsupported model {kind!r} (BPE required)")
        if spec.get("dropout") not in (None, 0, 0.0):
            raise ExactSpecError(E_MODEL_LOAD, "unsupported BPE dropout (non-deterministic)")
        vocab = spec.get("vocab")
        if not isinstance(vocab, dict):
            raise ExactSpecError(E_MODEL_LOAD, "BPE model has no vocab object")
        self.vocab: dict[str, int] = {}
        for tok, i in vocab.items():
            if not _is_token_id(i):
                raise ExactSpecError(E_MODEL_LOAD, f"BPE vocab id for {tok!r} is not an integer in [0, 2^32)")
            self.vocab[tok] = i
        self.vocab_r = {i: t for t, i in self.vocab.items()}
        if len(self.vocab_r) != len(self.vocab):
            raise ExactSpecError(E_MODEL_LOAD, "BPE vocab maps two tokens to the same id")
        for key in ("unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
            if not isinstance(spec.get(key), (str, type(None))):
                raise ExactSpecError(E_MODEL_LOAD, f"BPE {key} must be a string or null")
        self.unk_token = spec.get("unk_token")
        self.prefix = spec.get("continuing_subword_prefix") or ""
        self.suffix = spec.get("end_of_word_suffix") or ""
        self.fuse_unk = bool(spec.get("fuse_unk", False))
        self.byte_fallback = bool(spec.get("byte_fallback", False))
        self.ignore_merges = bool(spec.get("ignore_merges", False))
        if self.unk_token is not None and self.unk_token not in self.vocab:
            raise ExactSpecError(E_MODEL_LOAD, f"BPE unk_token {self.unk_token!r} not in vocab")
        self.merges = self._load_merges(spec.get("merges", []))
        self._cache: dict[str, list[int]] = {}

    def _load_merges(self, raw) -> dict[tuple[int, int], tuple[int, int]]:
        """(left id, right id) -> (rank, merged id). Later duplicates win, as in tokenizers."""
        if not isinstance(raw, list):
            raise ExactSpecError(E_MODEL_LOAD, "BPE merges is not a list")
        out = {}
        plen = len(self.prefix)
        for rank, m in enumerate(raw):
            if isinstance(m, str):
                parts = m.split(" ")
            elif isinstance(m, list) and all(isinstance(x, str) for x in m):
                parts = m
            else:
                parts = None
            if parts is None or len(parts) != 2:
                raise ExactSpecError(E_MODEL_LOAD, f"BPE merge #{rank + 1} is malformed: {m!r}")
            a, b = parts
            merged = a + b[plen:]
            try:
                out[(self.vocab[a], self.vocab[b])] = (rank, self.vocab[merged])
            except KeyError as e:
                raise ExactSpecError(E_MODEL_LOAD, f"BPE merge #{rank + 1} {m!r} uses token {e.args[0]!r} not in vocab") from None
        return out

    def tokenize(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self._tokenize(word)
            if len(self._cache) < 200_000 and len(word) <= 256:   # no pre-tokenizer: long words
                self._cache[word] = ids
        return ids

    def _tokenize(self, word: str) -> list[int]:
        vocab = self.vocab
        if self.ignore_merges and word in vocab:
            return [vocab[word]]
        symbols: list[int] = []
        unk = None                                   # pending unk id (fused runs)
        last = len(word) - 1
        for i, ch in enumerate(word):
            s = ch
            if i > 0 and self.prefix:
                s = self.prefix + s
            if i == last and self.suffix:
                s = s + self.suffix
            tid = vocab.get(s)
            if tid is not None:
                if unk is not None:
                    symbols.append(unk)
                    unk = None
                symbols.append(tid)
                continue
            if self.byte_fallback:
                fb = [vocab.get(f"<0x{b:02X}>") for b in s.encode("utf-8")]
                if all(x is not None for x in fb):
                    symbols.extend(fb)
                    continue
            if self.unk_token is not None:
                if unk is not None and not self.fuse_unk:
                    symbols.append(unk)
                unk = vocab[self.unk_token]
            # no unk token: the character is dropped, as tokenizers does
        if unk is not None:
            symbols.append(unk)
        return self._merge(symbols)

    def _merge(self, c: list[int]) -> list[int]:
        """tokenizers' Word::merge_all: pop the lowest (rank, position) pair, re-check it is
        still the pair that was queued, merge, queue the two new neighbour pairs."""
        n = len(c)
        if n < 2:
            return c
        merges = self.merges
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        alive = [True] * n
        heap = []
        for i in range(n - 1):
            m = merges.get((c[i], c[i + 1]))
            if m is not None:
                heap.append((m[0], i, m[1]))
        if not heap:
            return c
        heapq.heapify(heap)
        while heap:
            _, pos, new_id = heapq.heappop(heap)
            if not alive[pos]:
                continue
            r = nxt[pos]
            if r == -1:
                continue
            m = merges.get((c[pos], c[r]))
            if m is None or m[1] != new_id:
                continue                              # stale queue entry
            c[pos] = new_id
            alive[r] = False
            nn = nxt[r]
            nxt[pos] = nn
            if nn != -1:
                prev[nn] = pos
            p = prev[pos]
            if p != -1:
                m = merges.get((c[p], new_id))
                if m is not None:
                    heapq.heappush(heap, (m[0], p, m[1]))
            if nn != -1:
                m = merges.get((new_id, c[nn]))
                if m is not None:
                    heapq.heappush(heap, (m[0], pos, m[1]))
        return [c[i] for i in range(n) if alive[i]]


# ---------------------------------------------------------------------------------------------
# Added tokens
# ---------------------------------------------------------------------------------------------


def _is_token_id(value) -> bool:
    """A JSON integer that fits tokenizers' u32 ids."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32


class AddedToken:
    __slots__ = ("id", "content", "single_word", "lstrip", "rstrip", "normalized", "special")

    def __init__(self, d: dict):
        if not isinstance(d, dict) or not _is_token_id(d.get("id")) or not isinstance(d.get("content"), str):
            raise ExactSpecError(E_MODEL_LOAD, f"added token without an integer id and a string content: {d!r}"[:300])
        self.id = d["id"]
        self.content = d["content"]
        self.single_word = bool(d.get("single_word", False))
        self.lstrip = bool(d.get("lstrip", False))
        self.rstrip = bool(d.get("rstrip", False))
        self.special = bool(d.get("special", False))
        self.normalized = bool(d.get("normalized", not self.special))


class _Matcher:
    """Leftmost-longest matching of added tokens (what aho-corasick LeftmostLongest does),
    followed by tokenizers' single_word / lstrip / rstrip handling."""

    def __init__(self, patterns: list[tuple[str, AddedToken]]):
        self.by_first: dict[str, list[tuple[str, AddedToken]]] = {}
        for pat, tok in patterns:
            if pat:
                self.by_first.setdefault(pat[0], []).append((pat, tok))
        for lst in self.by_first.values():
            lst.sort(key=lambda x: -len(x[0]))    # stable: first declared wins on equal length

    def split(self, s: str, split_special_tokens: bool = False, untrusted=None) -> list[tuple[str, AddedToken | None]]:
        """With split_special_tokens, a matched *special* token is not taken: its text stays
        plain text (tokenizers' encode_special_tokens; the match still consumes its span).
        untrusted(start, stop) -> True does the same for a special match overlapping text that
        must not be parsed (chat message text); the concatenated pieces always equal s."""
        if not self.by_first or not s:
            return [(s, None)]
        by_first = self.by_first
        out = []
        start_offset = 0
        i = 0
        n = len(s)
        while i < n:
            cands = by_first.get(s[i])
            hit = None
            if cands:
                for pat, tok in cands:
                    if s.startswith(pat, i):
                        hit = (pat, tok)
                        break
            if hit is None:
                i += 1
                continue
            pat, tok = hit
            start, stop = i, i + len(pat)
            i = stop                                   # matches never overlap
            if tok.special and (split_special_tokens or (untrusted is not None and untrusted(start, stop))):
                continue
            if tok.single_word:
                start_space = start == 0 or not is_word_char(s[start - 1])
                stop_space = stop == n or not is_word_char(s[stop])
                if not (start_space and stop_space):
                    continue
            if tok.lstrip:
                j = start
                while j > 0 and is_white_space(s[j - 1]):
                    j -= 1
                start = max(j, start_offset)
            if tok.rstrip:
                while stop < n and is_white_space(s[stop]):
                    stop += 1
            if start_offset < start:
                out.append((s[start_offset:start], None))
            out.append((s[start:stop], tok))
            start_offset = stop
        if start_offset != n:
            out.append((s[start_offset:], None))
        return out


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

_KNOWN_TOP = {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
              "model", "post_processor", "decoder"}


def _overlap_test(spans):
    """f(start, stop) -> whether [start, stop) overlaps one of spans; None when there are none."""
    return (lambda a, b: any(x < b and a < y for x, y in spans)) if spans else None


class Tokenizer:
    """encode/decode identical to Hugging Face `tokenizers` for the supported configurations."""

    def __init__(self, spec: dict):
        if not isinstance(spec, dict):
            raise ExactSpecError(E_MODEL_LOAD, "tokenizer.json is not a JSON object")
        unknown = sorted(set(spec) - _KNOWN_TOP)
        if unknown:
            raise ExactSpecError(E_MODEL_LOAD, f"unsupported tokenizer.json fields {unknown}")
        for field in ("truncation", "padding"):
            if spec.get(field) is not None:
                raise ExactSpecError(E_MODEL_LOAD, f"unsupported {field} (must be null)")
        if not isinstance(spec.get("model"), dict):
            raise ExactSpecError(E_MODEL_LOAD, "tokenizer.json has no model object")
        self.model = _BPE(spec["model"])
        self.normalize = _build_normalizer(spec.get("normalizer"))
        self.pre_tokenize = build_pre_tokenizer(spec.get("pre_tokenizer"))
        dec = spec.get("decoder")
        self.decode_chain = build_decoder(dec)
        self.byte_level_decoder = isinstance(dec, dict) and dec.get("type") == "ByteLevel"

        self.added: dict[int, AddedToken] = {}
        self.added_by_content: dict[str, AddedToken] = {}
        for d in _list(spec.get("added_tokens") or [], "added_tokens"):
            tok = AddedToken(d)
            if not tok.content:
                continue
            model_id = self.model.vocab.get(tok.content)
            if model_id is not None and model_id != tok.id:
                raise ExactSpecError(E_MODEL_LOAD, f"added token {tok.content!r} has id {tok.id} but the model vocab says {model_id}")
            other = self.model.vocab_r.get(tok.id)
            if other is not None and other != tok.content:
                raise ExactSpecError(E_MODEL_LOAD, f"added token {tok.content!r} reuses id {tok.id} of model token {other!r}")
            if tok.id in self.added or tok.content in self.added_by_content:
                raise ExactSpecError(E_MODEL_LOAD, f"added token {tok.content!r} / id {tok.id} declared twice")
            self.added[tok.id] = tok
            self.added_by_content[tok.content] = tok
        # tokenizers orders the tries special tokens first, then the others, in file order.
        ordered = ([t for t in self.added.values() if t.special]
                   + [t for t in self.added.values() if not t.special])
        self._raw_matcher = _Matcher([(t.content, t) for t in ordered if not t.normalized])
        norm = self.normalize or (lambda s: s)
        self._norm_matcher = _Matcher([(norm(t.content), t) for t in ordered if t.normalized])
        self.special_ids = frozenset(t.id for t in self.added.values() if t.special)
        self.post_process = _build_post_processor(spec.get("post_processor"))
        ids = set(self.model.vocab_r) | set(self.added)
        self.vocab_size = max(ids) + 1 if ids else 0

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_json_str(cls, s: str) -> "Tokenizer":
        try:
            spec = json.loads(s)
        except (ValueError, TypeError, RecursionError) as e:   # RecursionError: nesting too deep
            raise ExactSpecError(E_MODEL_LOAD, f"tokenizer.json is not valid JSON: {e}") from None
        return cls(spec)

    @classmethod
    def from_file(cls, path) -> "Tokenizer":
        raw = read_regular_file(path, max_bytes=MAX_TOKENIZER_BYTES)   # no FIFO, device or giant file
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ExactSpecError(E_MODEL_LOAD, f"tokenizer {path} is not UTF-8: {e}") from None
        try:
            return cls.from_json_str(text)
        except ExactSpecError as e:
            raise ExactSpecError(e.code, f"{path}: {e.message}") from None

    # -- vocabulary -----------------------------------------------------------------------

    def token_to_id(self, token: str) -> int | None:
        t = self.added_by_content.get(token)
        return t.id if t is not None else self.model.vocab.get(token)

    def id_to_token(self, i: int) -> str | None:
        t = self.added.get(i)
        return t.content if t is not None else self.model.vocab_r.get(i)

    # -- encode ---------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False,
               untrusted_spans=()) -> list[int]:
        """add_special_tokens: apply the post-processor (e.g. prepend BOS).
        split_special_tokens: special added tokens written in `text` are NOT recognised and are
        tokenized as plain text (HF tokenizers' `encode_special_tokens = True`, transformers'
        `split_special_tokens=True`); non-special added tokens still match. Use it for untrusted
        text, so it cannot forge control tokens such as chat turn markers.
        untrusted_spans: sorted, disjoint (start, stop) character ranges of `text` treated so
        (a special token is taken only if its own characters lie outside them), while the text
        around them is tokenized as one string: for ranges free of special-token strings the ids
        are those of encode(text) (chat prompts: message text inside a rendered template)."""
        if not isinstance(text, str):
            raise ExactSpecError(E_BAD_ARGUMENT, "encode expects a str")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ExactSpecError(E_BAD_ARGUMENT, f"text has a lone surrogate at index {e.start}") from None
        ids: list[int] = []
        # at_start: the piece begins at offset 0 of the text (Metaspace prepend_scheme "first")
        spans = [(a, b) for a, b in untrusted_spans if b > a]
        untrusted = _overlap_test(spans)
        offset = 0
        for i, (piece, tok) in enumerate(self._raw_matcher.split(text, split_special_tokens, untrusted)):
            start, offset = offset, offset + len(piece)
            if tok is not None:
                ids.append(tok.id)
                continue
            piece, piece_untrusted = self._normalize_piece(piece, start, spans)
            for j, (sub, ntok) in enumerate(self._norm_matcher.split(piece, split_special_tokens, piece_untrusted)):
                if ntok is not None:
                    ids.append(ntok.id)
                elif sub:
                    for word in self.pre_tokenize(sub, i == 0 and j == 0):
                        ids.extend(self.model.tokenize(word))
        return self.post_process(ids) if add_special_tokens else ids

    def _normalize_piece(self, piece: str, start: int, spans):
        """(normalized piece, untrusted test in its offsets or None). The untrusted ranges are
        carried through normalization when normalizing the trusted and untrusted parts apart
        gives the same string as normalizing the whole; otherwise the whole piece is untrusted."""
        stop = start + len(piece)
        local = [(max(a, start) - start, min(b, stop) - start) for a, b in spans if a < stop and start < b]
        if self.normalize is None:
            return piece, _overlap_test(local)
        whole = self.normalize(piece)
        if not local:
            return whole, None
        cuts = sorted({0, len(piece)} | {x for span in local for x in span})
        parts = [self.normalize(piece[a:b]) for a, b in zip(cuts, cuts[1:])]
        if "".join(parts) != whole:
            return whole, lambda a, b: True
        bounds = [0]
        for part in parts:
            bounds.append(bounds[-1] + len(part))
        where = {c: bounds[k] for k, c in enumerate(cuts)}
        return whole, _overlap_test([(where[a], where[b]) for a, b in local])

    # -- decode ---------------------------------------------------------------------------

    def _token(self, i) -> str:
        tok = self.id_to_token(i) if isinstance(i, int) and not isinstance(i, bool) else None
        if tok is None:
            raise ExactSpecError(E_BAD_ARGUMENT, f"token id {i} is outside the vocabulary")
        return tok

    def token_bytes(self, i: int) -> bytes:
        """The bytes one id contributes to a ByteLevel decode (raw UTF-8 when a token has a
        character outside the byte alphabet, e.g. most added tokens). Other decoders are not
        a concatenation of per-token bytes (Strip, ByteFallback's U+FFFD per byte): for them
        this is the byte of a `<0xNN>` token, else the token's UTF-8."""
        tok = self._token(i)
        if self.byte_level_decoder:
            return byte_level_bytes(tok)
        b = byte_fallback_value(tok)
        return bytes([b]) if b is not None else tok.encode("utf-8")

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        tokens = [self._token(i) for i in ids if not (skip_special_tokens and i in self.special_ids)]
        return "".join(self.decode_chain(tokens))

    def streaming_decoder(self, skip_special_tokens: bool = False) -> "StreamingDecoder":
        return StreamingDecoder(self, skip_special_tokens)


# ---------------------------------------------------------------------------------------------
# Streaming decode
# ---------------------------------------------------------------------------------------------


def _incomplete_tail(buf: bytearray) -> int:
    """Length of the trailing bytes that are a valid but unfinished UTF-8 sequence (0..3).
    Only those are held back; anything already invalid is emitted (as U+FFFD) at once,
    which keeps the concatenated output identical to a one-shot lossy decode."""
    n = len(buf)
    for k in range(1, min(3, n) + 1):
        lead = buf[n - k]
        if 0x80 <= lead <= 0xBF:
            continue
        if 0xC2 <= lead <= 0xDF:
            need = 2
        elif 0xE0 <= lead <= 0xEF:
            need = 3
        elif 0xF0 <= lead <= 0xF4:
            need = 4
        else:
            return 0
        if k >= need:
            return 0
        for idx in range(1, k):
            b = buf[n - k + idx]
            lo, hi = 0x80, 0xBF
            if idx == 1:
                if lead == 0xE0:
                    lo = 0xA0
                elif lead == 0xED:
                    hi = 0x9F
                elif lead == 0xF0:
                    lo = 0x90
                elif lead == 0xF4:
                    hi = 0x8F
            if not lo <= b <= hi:
                return 0
        return k
    return 0


class StreamingDecoder:
    """push(id) returns only text that is final: never half a UTF-8 character. The
    concatenation of every push() plus flush() equals tokenizer.decode(all ids).
    ByteLevel decoders stream bytes; other decoder chains re-decode the ids so far and hold
    back a trailing run of `<0xNN>` tokens (ByteFallback decides their text when it ends)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._pending = bytearray()                   # at most 3 bytes of an unfinished char
        self._ids: list[int] = []                     # non-ByteLevel chains: ids so far
        self._emitted = 0                             # ... and characters already returned

    def _chain_text(self, final: bool) -> str:
        text = self.tokenizer.decode(self._ids)
        if not final and self._ids and byte_fallback_value(self.tokenizer.id_to_token(self._ids[-1])) is not None:
            return ""
        out = text[self._emitted:]
        self._emitted = len(text)
        return out

    def push(self, token_id: int) -> str:
        if self.skip_special_tokens and token_id in self.tokenizer.special_ids:
            return ""
        if not self.tokenizer.byte_level_decoder:
            self.tokenizer.token_bytes(token_id)      # refuses an id outside the vocabulary
            self._ids.append(token_id)
            return self._chain_text(final=False)
        buf = self._pending + self.tokenizer.token_bytes(token_id)
        keep = _incomplete_tail(buf)
        cut = len(buf) - keep
        self._pending = buf[cut:]
        return bytes(buf[:cut]).decode("utf-8", "replace")

    def flush(self) -> str:
        if not self.tokenizer.byte_level_decoder:
            return self._chain_text(final=True)
        out = bytes(self._pending).decode("utf-8", "replace")
        self._pending = bytearray()
        return out
