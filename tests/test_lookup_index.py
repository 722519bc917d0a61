"""Prompt lookup's n-gram index gives exactly the scan's answer (its definition), round after round
of a growing list, across lists, and after a list is replaced; a broken index is caught."""
import random

import pytest

from exactspec.core import backends
from exactspec.core.backends import LookupProposer


def _grow_and_compare(lookup, rng, vocab, n_tokens, k=8):
    tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
    while len(tokens) < n_tokens:
        assert lookup.find_continuation(tokens, k) == lookup.find_continuation_scan(tokens, k), tokens
        tokens.extend(rng.randrange(vocab) for _ in range(rng.randrange(1, 4)))   # a round commits 1..3 ids


@pytest.mark.parametrize("vocab", [2, 3, 7, 50])
def test_the_index_equals_the_scan_on_growing_lists(vocab):
    rng = random.Random(vocab)
    lookup = LookupProposer(vocab)
    for _ in range(30):                      # a new list each time: the index is rebuilt
        _grow_and_compare(lookup, rng, vocab, 80)


def test_a_replaced_or_shortened_list_rebuilds_the_index():
    lookup = LookupProposer(10)
    a = [1, 2, 3, 1, 2]
    assert lookup.find_continuation(a, 4) == [3, 1, 2]
    b = [5, 6, 5]                            # another list (another request)
    assert lookup.find_continuation(b, 4) == lookup.find_continuation_scan(b, 4) == [6, 5]
    del b[1:]                                 # the same list, shorter: rebuilt
    b.extend([7, 5])
    assert lookup.find_continuation(b, 4) == lookup.find_continuation_scan(b, 4)
    b[-1] = 9                                 # the same length, another last id: rebuilt
    assert lookup.find_continuation(b, 4) == lookup.find_continuation_scan(b, 4)
    lookup.forget()
    assert lookup._index is None


def test_a_broken_index_is_caught(monkeypatch):
    """An index that keeps each n-gram's first occurrence instead of its latest differs
    from the scan on some list: the comparison above would fail."""
    def add_keeping_first(self, tokens):
        for end in range(max(self.seen - 1, 0), len(tokens) - 1):
            for n in self.ns:
                start = end - n + 1
                if start >= 0:
                    key = tokens[end] if n == 1 else tuple(tokens[start:end + 1])
                    self.latest[n].setdefault(key, start)
        self.tokens, self.seen, self.last = tokens, len(tokens), tokens[-1] if tokens else None
    _assert_caught(monkeypatch, add_keeping_first, seed=0)


def test_an_index_that_includes_the_suffix_itself_is_caught(monkeypatch):
    """The index leaves out the n-grams ending at the list's last id (the suffix would find itself,
    with nothing after it); one that indexes them too differs from the scan."""
    real_add = backends._NgramIndex.add

    def add_through_last(self, tokens):
        real_add(self, tokens + [tokens[-1] if tokens else 0])      # one id more: the last id's n-grams indexed
        self.tokens, self.seen, self.last = tokens, len(tokens), tokens[-1] if tokens else None
    _assert_caught(monkeypatch, add_through_last, seed=1)


def _assert_caught(monkeypatch, broken_add, seed: int):
    """With the index's add replaced by `broken_add`, the index-against-scan comparison fails."""
    monkeypatch.setattr(backends._NgramIndex, "add", broken_add)
    rng = random.Random(seed)
    with pytest.raises(AssertionError):
        for _ in range(30):
            _grow_and_compare(LookupProposer(3), rng, 3, 80)
