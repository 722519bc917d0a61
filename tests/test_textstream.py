"""Incremental text (textstream.TextAssembler): with the tokenizer's streaming decoder (O(1) per
token) it releases exactly what it releases re-decoding every id (O(n) per token), and the
released pieces always add up to the decoded answer, with stop strings across tokens."""
import numpy as np
import pytest

from exactspec.core.textstream import TextAssembler
from exactspec.formats.tokenizer import Tokenizer
from pathlib import Path

TOKENIZER = Path(__file__).resolve().parents[1] / "web" / "models" / "champion" / "tokenizer.json"


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_json_str(TOKENIZER.read_text())


def run(tok, ids, stops, streamed: bool):
    decode = lambda i: tok.decode(i, skip_special_tokens=True)
    ta = TextAssembler(decode, stops, tok.streaming_decoder(skip_special_tokens=True) if streamed else None)
    pieces = []
    for t in ids:
        pieces.append(ta.push(t))
        if ta.stopped:
            break
    pieces.append(ta.finish())
    return pieces, ta.text(), ta.stopped, len(ta.ids)


def samples(tok):
    text = ("And the LORD said unto Moses, Speak unto the children — «ünïcödé» 日本語 🙂👍🏽 naïve café\n"
            "\tand say unto them: {\"k\": [1, 2]} ")
    gen = np.random.default_rng(3)
    base = tok.encode(text, add_special_tokens=False)
    yield base
    for _ in range(30):                      # random ids: split characters, specials, oddities
        yield [int(x) for x in gen.integers(0, tok.vocab_size, 40)]
    # byte tokens of a 4-byte character split across ids (the text is complete only at the end)
    yield tok.encode("🙂🙂 x", add_special_tokens=False)


@pytest.mark.parametrize("stops", [(), ("unto",), ("d u", "🙂"), ("é",), ("zzz-never",)])
def test_streaming_decoder_releases_what_redecoding_releases(tok, stops):
    n = 0
    for ids in samples(tok):
        slow = run(tok, ids, stops, streamed=False)
        fast = run(tok, ids, stops, streamed=True)
        assert "".join(fast[0]) == fast[1] and "".join(slow[0]) == slow[1]
        assert fast[1:] == slow[1:], (ids, stops)
        if not fast[2]:                       # not stopped: the whole answer is released
            assert fast[1] == tok.decode(ids, skip_special_tokens=True)
        n += 1
    assert n >= 30
