"""Conformance of the pure-Python tokenizer with Hugging Face `tokenizers`.

A tokenizer with the project's exact configuration is trained here on generated multilingual
text; the shipped champion tokenizer is checked the same way. "Identical" means identical ids
(with and without special tokens), identical decode, and exact round trips.
"""
from __future__ import annotations

import json
import os
import random
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

from exactspec.core.errors import E_MODEL_LOAD, ExactSpecError  # noqa: E402
from exactspec.formats.tokenizer import (  # noqa: E402
    BYTE_TO_CHAR, LETTER, NUMBER, OTHER, SPACE, Tokenizer, char_class, is_word_char, split_gpt2,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAMPION_TOKENIZER = os.path.join(REPO, "web", "models", "champion", "tokenizer.json")
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# ---------------------------------------------------------------------------------------------
# Test text: every category the tokenizer must get right.
# ---------------------------------------------------------------------------------------------

SAMPLES = [
    "The quick brown fox jumps over the lazy dog. It's, we're, they've, I'm, you'll, he'd, don't.",
    "IT'S LOUD. 'S 'T 'RE x's y'all ''s '' 'd'll She said 'hello' and ’curly’ quotes — dashes – … !",
    "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο. ΣΊΣΥΦΟΣ σοφός ς.",
    "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю. Ёжик.",
    "العربية: نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ١٢٣٤٥ ۱۲۳",
    "עברית: דג סקרן שט בים מאוכזב ולפתע מצא חברה \u200fRTL\u200f mark \u202eoverride\u202c",
    "中文：我能吞下玻璃而不伤身体。日本語：いろはにほへと ちりぬるを カタカナ。한국어: 다람쥐 헌 쳇바퀴에 타고파",
    "हिन्दी: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले भगवान श्रीराम। १२३",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷 🧑🏿‍💻 👩🏻‍❤️‍💋‍👨🏼 ✌︎ 1️⃣ 🫠🫶🏾",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0335\u0321\u0327a\u0336l\u0338g\u0337o vs é ä ñ; Å vs A\u030a; ﬁ; ｆｕｌｌ",
    "Digits 0123456789 3.14159 1,000,000 ½ ² Ⅻ ٣ ๓ 1e-9 0x1F 12ab34 a1b2",
    "Spaces:  two   three    four\ttab\t\ttabs\nnewline\n\nblank\r\nCRLF \u00a0nbsp\u2003em\u3000cjk  \n  \n\t end   ",
    "Control: \x00\x01\x07\x1b[0m\x7f\x85\u200b\u200d\u2028\u2029\ufeff\x1c\x1d\x1e\x1f",
    "Code: def f(x):\n    return x**2  # comment\n\tif (a&&b) { c->d[0] = \"s\"; }\n",
    "Mixed: naïve café coöperate résumé Straße İstanbul ǅ ﬀ ß ẞ",
    "Thai: ภาษาไทย Tamil: தமிழ் Georgian: ქართული Armenian: Հայերեն Amharic: አማርኛ",
    "Math: ∀x∈ℝ, ∑ᵢ xᵢ² ≤ ∞; 𝔸𝔹ℂ 𝟘𝟙𝟚 α→β ⊕ ⊗",
    "URLs: https://example.com/path?q=1&r=2#frag user@mail.org C:\\Windows\\path",
]
_WORDS = " ".join(SAMPLES).split()
_SEPS = [" ", "  ", "\n", "\t", " \n", "\n\n", "   ", "", ", ", ". ", "\r\n", " \t "]
_RANGES = [(0x20, 0x7E), (0xA0, 0x2FFF), (0x3000, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF),
           (0x0, 0x1F), (0x10000, 0x3FFFF)]


def generate_texts(n_bytes: int, seed: int) -> list[str]:
    """Deterministic varied documents: samples, shuffled words with odd separators, and raw
    random code points (unassigned ones included)."""
    rng = random.Random(seed)
    out, total = [], 0
    while total < n_bytes:
        r = rng.random()
        if r < 0.25:
            s = rng.choice(SAMPLES)
        elif r < 0.8:
            s = "".join(rng.choice(_WORDS) + rng.choice(_SEPS) for _ in range(rng.randint(3, 30)))
        else:
            chars = []
            for _ in range(rng.randint(1, 40)):
                lo, hi = rng.choice(_RANGES)
                cp = rng.randint(lo, hi)
                if not 0xD800 <= cp <= 0xDFFF:
                    chars.append(chr(cp))
            s = "".join(chars)
        out.append(s)
        total += len(s.encode("utf-8"))
    return out


EDGE_TEXTS = [
    "", " ", "  ", "\n", " \n ", "a", "'", "'s", " 's", "''s", "a's", "\t\t", "x \t y", "   x",
    "x   ", "<|bos|>", "<|bos|><|eos|>", "a<|end|>b", "<|bos", "<|user|>\nHi!<|end|>\n<|assistant|>\n",
    " <|user|> ", "<|<|bos|>|>", "e\u0301", "\u00e9", "👨‍👩‍👧‍👦", "🏽", "\ufeff", "\x00", "\u0085x",
    "\u2028\u2029", "1 2  3", " 1", "!!! ???", " !x", "\r\n\r\n", "\u3000x", "a\u00a0b", "a \u00a0b",
]


def conformance_texts() -> list[str]:
    return SAMPLES + EDGE_TEXTS + generate_texts(150_000, seed=1)


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


def train_project_tokenizer(vocab_size: int, n_bytes: int, seed: int = 0) -> "tokenizers.Tokenizer":
    """Same configuration as tools/train/train_tokenizer.py, on generated text."""
    tok = tokenizers.Tokenizer(models.BPE(dropout=None, unk_token=None, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(generate_texts(n_bytes, seed), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", 0)])
    return tok


@pytest.fixture(scope="session")
def trained_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    train_project_tokenizer(3000, 400_000).save(path)
    return path


def _champion_path() -> str:
    # The champion tokenizer is produced by the training pipeline; its absence is a failure.
    assert os.path.exists(CHAMPION_TOKENIZER), f"missing {CHAMPION_TOKENIZER}"
    return CHAMPION_TOKENIZER


@pytest.fixture(scope="session", params=["trained", "champion"])
def pair(request, trained_path):
    """(our Tokenizer, HF Tokenizer) loaded from the same file."""
    path = trained_path if request.param == "trained" else _champion_path()
    return Tokenizer.from_file(path), tokenizers.Tokenizer.from_file(path)


def assert_conforms(ours: Tokenizer, hf, text: str) -> None:
    ids = ours.encode(text, add_special_tokens=False)
    assert ids == hf.encode(text, add_special_tokens=False).ids, repr(text)
    assert ours.encode(text) == hf.encode(text).ids, repr(text)
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False) == text, repr(text)
    with_specials = ours.encode(text)
    assert ours.decode(with_specials, skip_special_tokens=True) == hf.decode(with_specials, skip_special_tokens=True)
    assert ours.decode(with_specials) == hf.decode(with_specials, skip_special_tokens=False)


# ---------------------------------------------------------------------------------------------
# Character classes: all 1,112,064 Unicode scalar values, against tokenizers' own regex.
# ---------------------------------------------------------------------------------------------


def test_char_classes_match_tokenizers_for_every_code_point():
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    groups = {LETTER: [], NUMBER: [], OTHER: [], SPACE: []}
    for cp in range(0x110000):
        if not 0xD800 <= cp <= 0xDFFF:
            groups[char_class(chr(cp))].append(chr(cp))
    # A run of one class after an anchor of that class is one piece iff tokenizers agrees on
    # the class of every character: ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+', '\s+(?!\S)'.
    anchors = {LETTER: "a", NUMBER: "1", OTHER: "!", SPACE: " "}

    def check(cls, chars):
        pieces = pre.pre_tokenize_str(anchors[cls] + "".join(chars))
        if len(pieces) == 1:
            return
        if len(chars) == 1:
            pytest.fail(f"U+{ord(chars[0]):04X} class {cls} disagrees with tokenizers")
        half = len(chars) // 2
        check(cls, chars[:half])
        check(cls, chars[half:])

    for cls, chars in groups.items():
        check(cls, chars)
    assert sum(map(len, groups.values())) == 1_112_064


def test_single_word_boundaries_match_tokenizers_for_every_code_point(trained_path):
    # Added tokens with single_word=True use Rust regex \w on their neighbours. A token "₪"
    # between every pair of characters of one predicted kind matches either everywhere
    # (non-word neighbours) or nowhere (word neighbours); bisect on any disagreement.
    with open(trained_path, encoding="utf-8") as f:
        spec = json.load(f)
    spec["model"]["merges"] = []                               # only the match count matters
    spec["pre_tokenizer"]["use_regex"] = False
    new_id = max(spec["model"]["vocab"].values()) + 1
    spec["added_tokens"].append({"id": new_id, "content": "₪", "single_word": True, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": False})
    hf = tokenizers.Tokenizer.from_str(json.dumps(spec))
    groups = {True: [], False: []}
    for cp in range(0x110000):
        if not 0xD800 <= cp <= 0xDFFF and cp != 0x20AA:
            groups[is_word_char(chr(cp))].append(chr(cp))

    def check(word, chars):
        got = hf.encode("₪" + "₪".join(chars) + "₪", add_special_tokens=False).ids.count(new_id)
        if got == (0 if word else len(chars) + 1):
            return
        if len(chars) == 1:
            pytest.fail(f"U+{ord(chars[0]):04X} word={word} disagrees with tokenizers")
        half = len(chars) // 2
        check(word, chars[:half])
        check(word, chars[half:])

    for word, chars in groups.items():
        for i in range(0, len(chars), 4_000):       # short texts: tokenizers' \w$ test is O(prefix)
            check(word, chars[i:i + 4_000])


@pytest.mark.parametrize("form", ["NFC", "NFD", "NFKC", "NFKD", "Lowercase"])
def test_normalizers_match_tokenizers_for_every_code_point(form):
    from tokenizers import normalizers
    from exactspec.formats.tokenizer import _build_normalizer
    theirs = getattr(normalizers, form)()
    ours = _build_normalizer({"type": form})
    seps = [" ", "a\u0301", "\u0316", "\u0345"]
    scalars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for start in range(0, len(scalars), 100_000):
        text = "".join(c + seps[i % 4] for i, c in enumerate(scalars[start:start + 100_000]))
        assert ours(text) == theirs.normalize_str(text), f"{form} differs near U+{ord(scalars[start]):04X}"
    # Reordering and composition around every combining mark.
    marks = [c for c in scalars if unicodedata.combining(c)] + ["\U00011930", "\U00011935"]
    contexts = ["a\u0301", "\u0316", "\u0334", "e\u0345", "\U00011935"]
    texts = [left + c + right for c in marks for left in contexts for right in contexts]
    joined = " ".join(texts)
    if ours(joined) != theirs.normalize_str(joined):
        bad = [t for t in texts if ours(t) != theirs.normalize_str(t)]
        pytest.fail(f"{form} differs on {[hex(ord(ch)) for ch in bad[0]]}")


# One representative per class and every character the regex treats specially.
_SPLIT_ALPHABET = " \t\n\r\x0b\x0c\x85\xa0\u2028\u3000\x1c'strevlmdSTa1!é٣\u0301\u200d😀Ⅻ_"


@settings(max_examples=1500, deadline=None)
@given(text=st.text(st.sampled_from(_SPLIT_ALPHABET), max_size=24))
def test_split_matches_tokenizers_regex(text):
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    ours = ["".join(BYTE_TO_CHAR[b] for b in w.encode("utf-8")) for w in split_gpt2(text)]
    assert ours == [w for w, _ in pre.pre_tokenize_str(text)]


# ---------------------------------------------------------------------------------------------
# Conformance
# ---------------------------------------------------------------------------------------------


def test_vocabulary_matches(pair):
    ours, hf = pair
    assert ours.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    for token, i in hf.get_vocab(with_added_tokens=True).items():
        assert ours.token_to_id(token) == i
        assert ours.id_to_token(i) == token
    assert ours.token_to_id("<|bos|>") == 0 and ours.token_to_id("<|end|>") == 6
    assert ours.special_ids == frozenset(range(7))


def test_conformance_on_varied_texts(pair):
    ours, hf = pair
    texts = conformance_texts()
    encoded = hf.encode_batch(texts, add_special_tokens=False)
    n_identical = sum(ours.encode(t, add_special_tokens=False) == e.ids for t, e in zip(texts, encoded))
    assert n_identical == len(texts)
    for text in texts:
        assert_conforms(ours, hf, text)


def test_conformance_on_long_document(pair):
    ours, hf = pair
    doc = "".join(generate_texts(60_000, seed=7))
    ids = ours.encode(doc)
    assert ids == hf.encode(doc).ids
    assert ours.decode(ids, skip_special_tokens=True) == doc


_fragment = st.sampled_from(
    SAMPLES + EDGE_TEXTS + SPECIAL_TOKENS + ["'", "s", "re", "ll", " ", "\t", "\n", "\u200d", "🏿",
                                             "\u0301", "9", "٣", "x", "Σ", "ﬁ", "\r"])
_random_text = st.one_of(
    st.text(max_size=60),
    st.text(st.characters(codec="utf-8"), max_size=60),
    st.lists(st.one_of(_fragment, st.text(max_size=4)), max_size=12).map("".join),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_random_text)
def test_conformance_on_random_unicode(pair, text):
    ours, hf = pair
    assert_conforms(ours, hf, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_decode_of_arbitrary_ids_matches_lossy_utf8(pair, data):
    # Arbitrary id sequences produce invalid UTF-8; both must replace it the same way.
    ours, hf = pair
    ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), max_size=40))
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    stream = ours.streaming_decoder()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == ours.decode(ids)


# ---------------------------------------------------------------------------------------------
# Streaming decode
# ---------------------------------------------------------------------------------------------


def test_streaming_decoder_never_emits_partial_characters(pair):
    ours, _ = pair
    n_split_chars = 0
    for text in SAMPLES + EDGE_TEXTS + ["🏳️‍🌈👩🏻‍❤️‍💋‍👨🏼🫠" * 3, "ऋषियों" * 5, "\U0010FFFD\U000E0001"]:
        ids = ours.encode(text)
        stream = ours.streaming_decoder()
        pieces = [stream.push(i) for i in ids]
        pieces.append(stream.flush())
        assert "".join(pieces) == ours.decode(ids)
        assert all("\ufffd" not in p for p in pieces), text
        n_split_chars += sum(1 for i in ids if _is_partial_utf8(ours.token_bytes(i)))
    assert n_split_chars > 0          # some multi-byte characters really were split across ids


def _is_partial_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_streaming_decoder_holds_back_an_emoji_split_byte_by_byte(pair):
    ours, _ = pair
    # Spell the emoji one byte per token, from the byte alphabet.
    byte_ids = [ours.token_to_id(BYTE_TO_CHAR[b]) for b in "😀".encode("utf-8")]
    stream = ours.streaming_decoder()
    assert [stream.push(i) for i in byte_ids] == ["", "", "", "😀"]
    assert stream.flush() == ""
    stream.push(byte_ids[0])
    assert stream.flush() == "\ufffd"        # an unfinished character at the end is replaced


def test_streaming_decoder_skips_special_tokens(pair):
    ours, _ = pair
    ids = ours.encode("<|user|>hé<|end|>")
    stream = ours.streaming_decoder(skip_special_tokens=True)
    assert "".join(stream.push(i) for i in ids) + stream.flush() == "hé"


# ---------------------------------------------------------------------------------------------
# Other declared configurations, each compared with tokenizers on the same file.
# ---------------------------------------------------------------------------------------------


def _variant(path: str, mutate) -> tuple[Tokenizer, object]:
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    mutate(spec)
    s = json.dumps(spec)
    return Tokenizer.from_json_str(s), tokenizers.Tokenizer.from_str(s)


def _set(key, value):
    def mutate(spec):
        spec[key] = value
    return mutate


def _added(**flags):
    def mutate(spec):
        base = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": False}
        n = max(t["id"] for t in spec["added_tokens"]) + 1
        n = max(n, max(spec["model"]["vocab"].values()) + 1)
        for content in ["xyz", "<tag>", "ab", "Ωmega"]:
            # a content already in the model vocab keeps its model id (here probably "ab")
            i = spec["model"]["vocab"].get(content)
            if i is None:
                i, n = n, n + 1
            spec["added_tokens"].append(dict(base, id=i, content=content, **flags))
    return mutate


def _merges_as_strings(spec):
    spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]


def _no_post_processor(spec):
    spec["post_processor"] = None


def _sequence_post_processor(spec):
    spec["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        spec["post_processor"]]}


VARIANTS = {
    "nfc": _set("normalizer", {"type": "NFC"}),
    "nfd": _set("normalizer", {"type": "NFD"}),
    "nfkc": _set("normalizer", {"type": "NFKC"}),
    "nfkd": _set("normalizer", {"type": "NFKD"}),
    "lowercase": _set("normalizer", {"type": "Lowercase"}),
    "sequence": _set("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "Lowercase"}]}),
    "prefix_space": _set("pre_tokenizer", {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}),
    "no_regex": _set("pre_tokenizer", {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}),
    "string_merges": _merges_as_strings,
    "no_post_processor": _no_post_processor,
    "sequence_post_processor": _sequence_post_processor,
    "added_plain": _added(),
    "added_normalized": _added(normalized=True),
    "added_lstrip_rstrip": _added(lstrip=True, rstrip=True, special=True),
    "added_single_word": _added(single_word=True),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_declared_variants_conform(trained_path, name):
    ours, hf = _variant(trained_path, VARIANTS[name])
    texts = SAMPLES + EDGE_TEXTS + generate_texts(20_000, seed=3) + [
        "xyz", " xyz ", "axyzb", "a xyz b", "<tag>  hello  <tag>", "  <tag>", "ab abc cab ab",
        "ΩMEGA Ωmega ωmega", "x<|bos|> <tag>xyz\txyz\n", "abxyz", "xyzab", "ab-ab", "éab ab_ ab1"]
    for text in texts:
        ids = ours.encode(text)
        assert ids == hf.encode(text).ids, (name, text)
        assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), (name, text)
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_random_text, name=st.sampled_from(sorted(VARIANTS)))
def test_declared_variants_conform_on_random_text(trained_path, text, name):
    ours, hf = _variant_cached(trained_path, name)
    assert ours.encode(text) == hf.encode(text).ids


_variant_cache: dict = {}


def _variant_cached(path, name):
    if (path, name) not in _variant_cache:
        _variant_cache[(path, name)] = _variant(path, VARIANTS[name])
    return _variant_cache[(path, name)]


def test_unk_and_byte_fallback_models_conform():
    # A tiny BPE without the byte alphabet: unknown characters go to <unk>, fused or not,
    # or to <0xNN> byte tokens when byte_fallback is set.
    vocab = {"<unk>": 0, "a": 1, "b": 2, "ab": 3, "<0xC3>": 4, "<0xA9>": 5}
    base = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": [["a", "b"]]}}
    for fuse in (False, True):
        for fallback in (False, True):
            for unk in ("<unk>", None):
                spec = json.loads(json.dumps(base))
                spec["model"].update(fuse_unk=fuse, byte_fallback=fallback, unk_token=unk)
                s = json.dumps(spec)
                ours, hf = Tokenizer.from_json_str(s), tokenizers.Tokenizer.from_str(s)
                for text in ["ab", "abxyab", "xx", "", "aé", "zzabzz", "ab ab"]:
                    assert ours.encode(text) == hf.encode(text).ids, (fuse, fallback, unk, text)


# ---------------------------------------------------------------------------------------------
# Refusals: anything not implemented is refused by name instead of tokenizing differently.
# ---------------------------------------------------------------------------------------------

REFUSALS = {
    "normalizer 'Strip'": lambda s: s.update(normalizer={"type": "Strip", "strip_left": True, "strip_right": True}),
    "normalizer 'BertNormalizer'": lambda s: s.update(normalizer={"type": "Sequence", "normalizers": [{"type": "BertNormalizer"}]}),
    "pre_tokenizer 'Whitespace'": lambda s: s.update(pre_tokenizer={"type": "Whitespace"}),
    "pre_tokenizer 'BertPreTokenizer'": lambda s: s.update(pre_tokenizer={"type": "BertPreTokenizer"}),
    "model 'WordPiece'": lambda s: s["model"].update(type="WordPiece"),
    "decoder None": lambda s: s.update(decoder=None),
    "decoder 'WordPiece'": lambda s: s.update(decoder={"type": "WordPiece"}),
    "post_processor 'BertProcessing'": lambda s: s.update(post_processor={"type": "BertProcessing"}),
    "dropout": lambda s: s["model"].update(dropout=0.1),
    "truncation": lambda s: s.update(truncation={"max_length": 8}),
    "padding": lambda s: s.update(padding={"length": 8}),
    "merge #1": lambda s: s["model"].update(merges=["a b c"] + s["model"]["merges"]),
    "fields": lambda s: s.update(extra_component={}),
    "reuses id": lambda s: s["added_tokens"].append(dict(s["added_tokens"][0], content="<new>", id=100)),
}


@pytest.mark.parametrize("needle", sorted(REFUSALS))
def test_unsupported_components_are_refused_by_name(trained_path, needle):
    with open(trained_path, encoding="utf-8") as f:
        spec = json.load(f)
    REFUSALS[needle](spec)
    with pytest.raises(ExactSpecError) as err:
        Tokenizer.from_json_str(json.dumps(spec))
    assert err.value.code == E_MODEL_LOAD
    assert needle in err.value.message


def test_bad_arguments_are_refused(trained_path):
    ours = Tokenizer.from_file(trained_path)
    for bad_ids in ([ours.vocab_size], [-1], [True], ["3"]):
        with pytest.raises(ExactSpecError) as err:
            ours.decode(bad_ids)
        assert err.value.code == "E_BAD_ARGUMENT"
    with pytest.raises(ExactSpecError) as err:
        ours.encode("a\ud800b")
    assert err.value.code == "E_BAD_ARGUMENT"


def test_unreadable_files_are_refused(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ExactSpecError) as err:
        Tokenizer.from_file(missing)
    assert err.value.code == E_MODEL_LOAD and str(missing) in err.value.message
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ExactSpecError) as err:
        Tokenizer.from_file(bad)
    assert err.value.code == E_MODEL_LOAD and str(bad) in err.value.message
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(ExactSpecError) as err:
        Tokenizer.from_file(bad)
    assert err.value.code == E_MODEL_LOAD and "UTF-8" in err.value.message


def test_champion_matches_transformers_tokenizer():
    # What transformers builds from the whole model directory (tokenizer_config flags included)
    # gives the same ids and text as our tokenizer.json reading.
    transformers = pytest.importorskip("transformers")
    model_dir = os.path.dirname(_champion_path())
    theirs = transformers.AutoTokenizer.from_pretrained(model_dir)
    ours = Tokenizer.from_file(_champion_path())
    for text in SAMPLES + EDGE_TEXTS + generate_texts(20_000, seed=5):
        ids = ours.encode(text)
        assert theirs(text)["input_ids"] == ids, repr(text)
        assert theirs.decode(ids, skip_special_tokens=True) == ours.decode(ids, skip_special_tokens=True)
