"""The tokenizer against Hugging Face `tokenizers` on the real families' kind and size.

SmolLM2 (49,152, Digits + ByteLevel), Qwen2.5 (151,665 + NFC + Split regex), Llama 3 (128,256,
Split regex, ignore_merges, BOS template) and TinyLlama / Llama 2 (32,000, byte fallback, in the
published normalizer form and in the newer Metaspace form), built by tests/tokenizer_families.py,
over hostile text: ids (with and without the post-processor, with and without special-token
parsing) and decoded text must be identical.
"""
from __future__ import annotations

import json
import random

import pytest
import tokenizers

import tokenizer_families as families
from exactspec.formats.pretokenize import NUMBER, translate_oniguruma
from exactspec.formats.tokenizer import Tokenizer

M = families.METASPACE
HOSTILE = [
    "", " ", "  ", "   x", "x   ", "\n", "\n\n\n", "\t", " \t\n ", "\r\n", "a\r\nb", "hello world",
    " leading space", "  two leading", "multiple    spaces   inside", "tabs\tand\ttabs\t\t", "trailing\n",
    "e\u0301 \u00e9", "A\u030a \u00c5", "Z\u0335\u0321\u0327a\u0336l\u0338g\u0337o", "\u1100\u1161\u11a8 \uac01",
    "👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 🧑🏿‍💻 1️⃣ 🇫🇷", "עברית \u200fRTL\u200f \u202eoverride\u202c العربية ١٢٣",
    "中文：我能吞下玻璃而不伤身体。日本語 カタカナ 한국어", "𓀀 𝔸𝔹ℂ \U0001fae0 \U000e0001 \ue000 \U0010fffd",
    "\x00\x01\x07\x1b[0m\x7f\x85\u200b\u200d\u2028\u2029\ufeff", "\u3000x a\u00a0b",
    "12345678901234 3.14159 1,000,000 ½ ² Ⅻ ٣ ๓ 0x1F a1b2 ９９", "x = 10**12; y -= 3", "I'm it's we'LL he'D 'S 'ſ 'K 'Ll",
    "<s>", "</s>", "<unk>", "<s>hello</s>", "a<s>b", " <s> ", "<s><s>", "<0x41>", "<0xE2><0x82>", M, M + M + "x",
    "a" + M + "b", " " + M, "<|im_start|>user\nHi<|im_end|>\n", "<|endoftext|>", "<|begin_of_text|>x<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>\n\n", "<|reserved_special_token_5|>", "<|im_start", "<|<|im_end|>|>",
    "<tool_call>{}</tool_call>", "<repo_name>x", "def f(x):\n    return x  # ok\n\n\n\tpass\n",
    "   \n   \n", "!!!???...", " !x", "a\u00a0\u00a0b", "Straße İstanbul ǅ ﬁ ｆｕｌｌ",
]


def _texts() -> list[str]:
    rng = random.Random(7)
    lines = families.corpus()
    docs = ["\n".join(rng.sample(lines, 8)) for _ in range(40)]
    junk = ["".join(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF), rng.randint(0x1F300, 0x1FAFF),
                                    rng.randint(0x4E00, 0x9FFF), rng.randint(0x10000, 0x3FFFF)]))
                    for _ in range(rng.randint(1, 30))) for _ in range(120)]
    return HOSTILE + docs + junk


@pytest.fixture(scope="module")
def byte_level_base():
    return families.byte_level_base()


FAMILIES = ["smollm2", "qwen2", "llama3", "llama2_legacy", "llama2_metaspace", "metaspace_split"]
SIZES = {"smollm2": 49152, "qwen2": 151665, "llama3": 128256, "llama2_legacy": 32000, "llama2_metaspace": 32000,
         "metaspace_split": 32000}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, byte_level_base):
    name = request.param
    if name.startswith("llama2"):
        spec = families.llama2(name.split("_")[1])
    elif name == "metaspace_split":      # Metaspace both ways (older Mistral-style files)
        spec = families.llama2("metaspace")
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": M, "prepend_scheme": "always", "split": True}
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": M, "prepend_scheme": "always", "split": True}]}
    else:
        spec = getattr(families, name)(byte_level_base)
    s = json.dumps(spec)
    return name, Tokenizer.from_json_str(s), tokenizers.Tokenizer.from_str(s)


def test_family_conforms(family):
    name, ours, hf = family
    assert ours.vocab_size == hf.get_vocab_size() == SIZES[name]
    plain = tokenizers.Tokenizer.from_str(hf.to_str())
    plain.encode_special_tokens = True
    for text in _texts():
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == hf.encode(text, add_special_tokens=False).ids, (name, text)
        with_specials = ours.encode(text)
        assert with_specials == hf.encode(text).ids, (name, text)
        assert ours.encode(text, split_special_tokens=True) == plain.encode(text).ids, (name, text)
        for skip in (False, True):
            assert ours.decode(with_specials, skip) == hf.decode(with_specials, skip_special_tokens=skip), (name, text)


def test_family_decodes_arbitrary_ids(family):
    # Runs of <0xNN> tokens that are not valid UTF-8, special tokens anywhere, ids never produced.
    name, ours, hf = family
    rng = random.Random(3)
    pools = [list(range(0, 300)), list(range(hf.get_vocab_size() - 300, hf.get_vocab_size())),
             list(range(300, 5000))]
    for _ in range(300):
        ids = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 12))]
        for skip in (False, True):
            assert ours.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip), (name, ids)
        stream = ours.streaming_decoder()
        assert "".join(stream.push(i) for i in ids) + stream.flush() == ours.decode(ids), (name, ids)


def test_regex_translation_covers_every_code_point_like_oniguruma():
    # One Split per class: a code point is a match exactly when Oniguruma puts it in the class.
    import re
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(map(chr, cps))
    for cls in (r"\p{L}", r"\p{N}", r"\s", r"[^\s\p{L}\p{N}]"):
        hf = tokenizers.pre_tokenizers.Split(tokenizers.Regex(cls), behavior="removed")
        kept = "".join(p for p, _ in hf.pre_tokenize_str(text))          # the non-matching code points
        ours = re.sub(translate_oniguruma(cls), "", text)
        assert kept == ours, cls


def test_digits_split_every_numeric_code_point_like_tokenizers():
    # "a" between code points: a numeric one comes out alone, any other stays inside a run of "a"s.
    from exactspec.formats.pretokenize import char_class
    digits = tokenizers.pre_tokenizers.Digits(individual_digits=True)
    cps = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c != ord("a")]
    theirs = {p for p, _ in digits.pre_tokenize_str("a".join(cps)) if len(p) == 1 and p != "a"}
    from exactspec.formats.pretokenize import _RUST_NEWER_NUMERIC
    assert theirs == {c for c in cps if char_class(c) == NUMBER or c in _RUST_NEWER_NUMERIC}


REFUSED = {
    "unsupported regex escape": {"type": "Split", "pattern": {"Regex": r"\w+"}, "behavior": "Isolated"},
    "unsupported Split behavior": {"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways"},
    "unsupported Metaspace prepend_scheme": {"type": "Metaspace", "replacement": M, "prepend_scheme": "twice"},
    "named group": {"type": "Split", "pattern": {"Regex": r"(?<x>a)"}, "behavior": "Isolated"},
}


@pytest.mark.parametrize("needle", sorted(REFUSED))
def test_unknown_pre_tokenizer_settings_are_refused(needle):
    from exactspec.core.errors import ExactSpecError
    spec = families.llama2("metaspace")
    spec["pre_tokenizer"] = REFUSED[needle]
    with pytest.raises(ExactSpecError) as err:
        Tokenizer.from_json_str(json.dumps(spec))
    assert err.value.code == "E_MODEL_LOAD" and needle in err.value.message


@pytest.mark.parametrize("behavior", ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"])
@pytest.mark.parametrize("invert", [False, True])
def test_split_behaviors_conform(byte_level_base, behavior, invert):
    spec = families.smollm2(byte_level_base)
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+|\p{N}"}, "behavior": behavior, "invert": invert},
        {"type": "Metaspace", "replacement": M, "prepend_scheme": "first", "split": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}
    s = json.dumps(spec)
    ours, hf = Tokenizer.from_json_str(s), tokenizers.Tokenizer.from_str(s)
    for text in HOSTILE:
        assert ours.encode(text) == hf.encode(text).ids, (behavior, invert, text)
