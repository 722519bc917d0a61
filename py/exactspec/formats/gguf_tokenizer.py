"""The tokenizer a GGUF file describes (tokenizer.ggml.*), as the tokenizer.json dict exactspec.formats.tokenizer reads.

Pure Python (runs in Pyodide). `tokenizer_spec(gguf)` rebuilds the Hugging Face tokenizer.json of
the two model kinds llama.cpp writes for llama and qwen2 files:
  - "gpt2" (byte-level BPE): vocabulary and merges as stored; the pre-tokenizer named by
    tokenizer.ggml.pre, exactly as the families' tokenizer.json files have it:
      gpt-2             ByteLevel with GPT-2's split
      smollm            Digits (each digit alone), then ByteLevel with GPT-2's split
      llama-bpe/llama3  Split on Llama 3's regex, then ByteLevel; merges ignored for whole words
      qwen2             NFC, then Split on Qwen2's regex, then ByteLevel
    any other pre-tokenizer is refused, named (its split would differ);
  - "llama" (SentencePiece vocabulary with scores): byte-fallback BPE whose merges are recovered
    from the scores as transformers does (every split of a token into two tokens, best score
    first), Metaspace with the prefix space unless tokenizer.ggml.add_space_prefix is false.
Tokens typed CONTROL (3) or UNKNOWN (2) become special added tokens, USER_DEFINED (4) plain added
tokens. BOS/EOS are added as tokenizer.ggml.add_bos_token / add_eos_token say (absent: BOS for
"llama" and llama-bpe, as llama.cpp does). `tokenizer_config(gguf)` holds the chat template
(tokenizer.chat_template), the BOS/EOS token strings and the add flags; `stop_token_ids` the EOS,
EOT and EOM ids. Every refusal is `E_MODEL_LOAD: <file>: metadata['<key>']: what is wrong`.
"""
from __future__ import annotations

import math

from .gguf import refuse
from .pretokenize import BYTE_TO_CHAR
from .tokenizer import Tokenizer

METASPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_INTEGER_TYPES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64")

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_BYTE_LEVEL_SPLIT = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_BYTE_LEVEL_ONLY = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def _split(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


# tokenizer.ggml.pre -> (normalizer, pre_tokenizer, ignore_merges, BOS added when the file does not say)
PRE_TOKENIZERS = {
    "gpt-2": (None, _BYTE_LEVEL_SPLIT, False, False),
    "smollm": (None, {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                            _BYTE_LEVEL_SPLIT]}, False, False),
    "llama-bpe": (None, {"type": "Sequence", "pretokenizers": [_split(LLAMA3_SPLIT), _BYTE_LEVEL_ONLY]}, True, True),
    "qwen2": ({"type": "NFC"}, {"type": "Sequence", "pretokenizers": [_split(QWEN2_SPLIT), _BYTE_LEVEL_ONLY]},
              False, False),
}
PRE_TOKENIZERS["llama3"] = PRE_TOKENIZERS["llama-v3"] = PRE_TOKENIZERS["llama-bpe"]
_BYTE_ALPHABET = frozenset(BYTE_TO_CHAR)


class _Metadata:
    """Typed access to one GGUFFile's metadata, every refusal naming the key."""

    def __init__(self, gguf):
        self.path, self.values, self.types = gguf.path, gguf.metadata, gguf.value_types

    def get(self, key: str, types: tuple, default=None, required: bool = False):
        if key not in self.values:
            if required:
                raise refuse(self.path, f"metadata[{key!r}]", "is missing")
            return default
        if self.types[key] not in types:
            raise refuse(self.path, f"metadata[{key!r}]", f"must be {' or '.join(types)}, not {self.types[key]}")
        return self.values[key]

    def token_id(self, key: str, n_tokens: int):
        value = self.get(key, _INTEGER_TYPES)
        if value is not None and not 0 <= value < n_tokens:
            raise refuse(self.path, f"metadata[{key!r}]", f"token id {value} is outside [0, {n_tokens})")
        return value

    def refuse(self, key: str, problem: str):
        return refuse(self.path, f"metadata[{key!r}]", problem)


def _vocabulary(md: _Metadata) -> tuple:
    """(tokens, token types), checked: non-empty, no token twice, one known type per token."""
    tokens = md.get("tokenizer.ggml.tokens", ("ARRAY[STRING]",), required=True)
    if not tokens:
        raise md.refuse("tokenizer.ggml.tokens", "is empty")
    types = md.get("tokenizer.ggml.token_type", ("ARRAY[INT32]", "ARRAY[UINT32]"), [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise md.refuse("tokenizer.ggml.token_type", f"has {len(types)} entries for {len(tokens)} tokens")
    bad = next((i for i, t in enumerate(types) if not NORMAL <= t <= BYTE), None)
    if bad is not None:
        raise md.refuse("tokenizer.ggml.token_type", f"entry {bad} is {types[bad]}, not a token type (1..6)")
    seen = {}
    for i, tok in enumerate(tokens):
        if not tok:
            raise md.refuse("tokenizer.ggml.tokens", f"token {i} is empty")
        if tok in seen:
            raise md.refuse("tokenizer.ggml.tokens", f"token {i} {tok[:40]!r} repeats token {seen[tok]}")
        seen[tok] = i
    return tokens, types


def _added_tokens(tokens: list, types: list) -> list:
    return [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": kind != USER_DEFINED}
            for i, (tok, kind) in enumerate(zip(tokens, types)) if kind in (UNKNOWN, CONTROL, USER_DEFINED)]


def _add_bos(md: _Metadata) -> bool:
    """tokenizer.ggml.add_bos_token, else llama.cpp's default: BOS for "llama" and Llama 3's BPE."""
    kind = md.get("tokenizer.ggml.model", ("STRING",), required=True)
    pre = md.get("tokenizer.ggml.pre", ("STRING",), "gpt-2")
    default = kind == "llama" or (kind == "gpt2" and pre in PRE_TOKENIZERS and PRE_TOKENIZERS[pre][3])
    return md.get("tokenizer.ggml.add_bos_token", ("BOOL",), default)


def _post_processor(md: _Metadata, tokens: list) -> dict | None:
    add_bos = _add_bos(md)
    add_eos = md.get("tokenizer.ggml.add_eos_token", ("BOOL",), False)
    single, specials = [{"Sequence": {"id": "A", "type_id": 0}}], {}
    for add, key, where in ((add_bos, "tokenizer.ggml.bos_token_id", 0), (add_eos, "tokenizer.ggml.eos_token_id", 1)):
        if not add:
            continue
        token_id = md.token_id(key, len(tokens))
        if token_id is None:
            raise md.refuse(key, "is missing, but the file asks for that token to be added")
        item = {"SpecialToken": {"id": tokens[token_id], "type_id": 0}}
        if where == 0:
            single.insert(0, item)
        else:
            single.append(item)
        specials[tokens[token_id]] = {"id": tokens[token_id], "ids": [token_id], "tokens": [tokens[token_id]]}
    if not specials:
        return None
    return {"type": "TemplateProcessing", "single": single, "pair": single, "special_tokens": specials}


def _byte_level_spec(md: _Metadata, tokens: list, types: list) -> dict:
    pre = md.get("tokenizer.ggml.pre", ("STRING",), "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise md.refuse("tokenizer.ggml.pre", f"{pre[:40]!r} is not supported (supported: "
                        f"{', '.join(sorted(PRE_TOKENIZERS))})")
    normalizer, pre_tokenizer, ignore_merges, _ = PRE_TOKENIZERS[pre]
    vocab = {}
    for i, (tok, kind) in enumerate(zip(tokens, types)):
        if _BYTE_ALPHABET.issuperset(tok):
            vocab[tok] = i
        elif kind not in (UNKNOWN, CONTROL, USER_DEFINED):   # added tokens may be plain text
            raise md.refuse("tokenizer.ggml.tokens", f"token {i} {tok[:40]!r} is not in the byte-level alphabet")
    merges = md.get("tokenizer.ggml.merges", ("ARRAY[STRING]",), required=True)
    return {"normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
            "model": {"type": "BPE", "vocab": vocab, "merges": merges, "unk_token": None, "byte_fallback": False,
                      "fuse_unk": False, "ignore_merges": ignore_merges, "dropout": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "post_processor": _post_processor(md, tokens)}


def sentencepiece_merges(tokens: list, scores: list) -> list:
    """Merges of a SentencePiece vocabulary as transformers recovers them (generate_merges with
    scores): for each token, every split into two vocabulary tokens (ordered by their ids), all
    sorted by the token's score, then left and right length, best first (a stable sort)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for tok, score in zip(tokens, scores):
        local = [(tok[:k], tok[k:], score) for k in range(1, len(tok)) if tok[:k] in vocab and tok[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [[a, b] for a, b, _ in merges]


def _sentencepiece_spec(md: _Metadata, tokens: list, types: list) -> dict:
    scores = md.get("tokenizer.ggml.scores", ("ARRAY[FLOAT32]",), required=True)
    if len(scores) != len(tokens):
        raise md.refuse("tokenizer.ggml.scores", f"has {len(scores)} entries for {len(tokens)} tokens")
    bad = next((i for i, s in enumerate(scores) if not math.isfinite(s)), None)
    if bad is not None:
        raise md.refuse("tokenizer.ggml.scores", f"entry {bad} is {scores[bad]}, not finite")
    unk_id = md.token_id("tokenizer.ggml.unknown_token_id", len(tokens))
    unk = tokens[unk_id] if unk_id is not None else ("<unk>" if "<unk>" in tokens else None)
    prefix = md.get("tokenizer.ggml.add_space_prefix", ("BOOL",), True)
    decoders = [{"type": "Replace", "pattern": {"String": METASPACE}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}] + ([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])
    return {"normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": METASPACE,
                              "prepend_scheme": "first" if prefix else "never", "split": False},
            "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)},
                      "merges": sentencepiece_merges(tokens, scores), "unk_token": unk, "byte_fallback": True,
                      "fuse_unk": True, "ignore_merges": False, "dropout": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None},
            "decoder": {"type": "Sequence", "decoders": decoders},
            "post_processor": _post_processor(md, tokens)}


def tokenizer_spec(gguf) -> dict:
    """The tokenizer.json dict of a GGUFFile (see module docstring)."""
    md = _Metadata(gguf)
    kind = md.get("tokenizer.ggml.model", ("STRING",), required=True)
    tokens, types = _vocabulary(md)
    if kind == "gpt2":
        spec = _byte_level_spec(md, tokens, types)
    elif kind == "llama":
        spec = _sentencepiece_spec(md, tokens, types)
    else:
        raise md.refuse("tokenizer.ggml.model", f"{kind[:40]!r} is not supported (supported: gpt2, llama)")
    spec.update(version="1.0", truncation=None, padding=None, added_tokens=_added_tokens(tokens, types))
    return spec


def load_tokenizer(gguf) -> Tokenizer:
    """exactspec.formats.tokenizer.Tokenizer of a GGUFFile; its own refusals name the file."""
    from ..core.errors import ExactSpecError
    spec = tokenizer_spec(gguf)
    try:
        return Tokenizer(spec)
    except ExactSpecError as e:
        raise refuse(gguf.path, "tokenizer.ggml.*", e.message) from None


def tokenizer_config(gguf) -> dict:
    """The tokenizer_config.json a GGUFFile implies: chat_template, bos/eos/unk/pad token strings,
    add_bos_token and add_eos_token."""
    md = _Metadata(gguf)
    tokens, _ = _vocabulary(md)
    out = {"add_bos_token": _add_bos(md),
           "add_eos_token": md.get("tokenizer.ggml.add_eos_token", ("BOOL",), False)}
    template = md.get("tokenizer.chat_template", ("STRING",))
    if template is not None:
        out["chat_template"] = template
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = md.token_id("tokenizer.ggml." + key, len(tokens))
        if token_id is not None:
            out[name] = tokens[token_id]
    return out


def stop_token_ids(gguf) -> tuple:
    """EOS, then EOT and EOM when the file names them (distinct, in that order)."""
    md = _Metadata(gguf)
    tokens, _ = _vocabulary(md)
    ids = [md.token_id(f"tokenizer.ggml.{k}_token_id", len(tokens)) for k in ("eos", "eot", "eom")]
    return tuple(dict.fromkeys(i for i in ids if i is not None))
