"""Incremental text with stop strings that may span token boundaries.

Text is released only once it can no longer be (a) the start of a stop string or (b) an
incomplete UTF-8 character (the decoder's U+FFFD at the end). When a stop string appears, the
text before it is final and the answer ends there. Pure Python (runs in Pyodide too).

With a streaming decoder (`tokenizer.streaming_decoder()`: push(id) -> the text that is final,
flush() -> the rest) each token costs O(1) instead of re-decoding every id so far (O(n) per token,
O(n^2) per answer: ~1 ms a round at 90 tokens under Pyodide); without one, `decode(ids)` is called
per token as before. Both release the same text.
"""
from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"


class TextAssembler:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop_strings: Sequence[str] = (), stream=None):
        self.decode = decode
        self.stream = stream       # a streaming decoder, or None: decode(ids) per token
        self.streamed = ""         # stream mode: the text of every complete character so far
        self.stop_strings = tuple(s for s in stop_strings if s)
        self._longest_stop = max((len(s) for s in self.stop_strings), default=0)
        self.ids: list[int] = []
        self.released = 0          # characters of the decoded text already released
        self.stopped = False
        self.final_text = None

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        keep = 0
        for stop in self.stop_strings:
            for n in range(min(len(stop) - 1, len(text)), keep, -1):
                if text.endswith(stop[:n]):
                    keep = n
                    break
        return keep

    def push(self, token_id: int) -> str:
        """Add one token; returns newly releasable text ("" if held back). Sets .stopped on a match."""
        assert not self.stopped
        self.ids.append(token_id)
        if self.stream is not None:
            self.streamed += self.stream.push(token_id)
            text = self.streamed
        else:
            text = self.decode(self.ids)
        hits = ()
        if self.stop_strings:
            search_from = max(0, self.released - self._longest_stop)
            hits = [i for i in (text.find(s, search_from) for s in self.stop_strings) if i >= 0]
        if hits:
            cut = min(hits)
            self.stopped = True
            self.final_text = text[:cut]
            delta = text[self.released:cut] if cut > self.released else ""
            self.released = max(self.released, cut)
            return delta
        end = len(text)
        while end > self.released and text[end - 1] == REPLACEMENT:
            end -= 1
        end = max(self.released, min(end, len(text) - self._holdback(text)))
        delta = text[self.released:end]
        self.released = end
        return delta

    def finish(self) -> str:
        """End of generation (not by a stop string): release everything held back."""
        if self.stopped:
            return ""
        if self.stream is not None:
            self.streamed += self.stream.flush()
            text = self.streamed
        else:
            text = self.decode(self.ids)
        delta = text[self.released:]
        self.released = len(text)
        self.final_text = text
        return delta

    def text(self) -> str:
        if self.final_text is not None:
            return self.final_text
        return (self.streamed if self.stream is not None else self.decode(self.ids))[:self.released]
