"""Decoded text for a stream of token ids, with stop sequences.

`TextStream.push(token_bytes)` returns the text that may be sent now. It never returns a partial
UTF-8 character (bytes wait until the character is whole) nor any text that could be the start of a
stop sequence (that waits until it is known not to be one), so a stop sequence split across tokens is
still found and never reaches the client, even in part. Once a stop sequence appears, `stopped` is
True and the text before it was the last returned."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text not yet returned: it may begin a stop sequence
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Feed one token's bytes; the text that is safe to emit now."""
        if self.stopped:
            return ""
        return self._scan(self._held + self._decoder.decode(data))

    def finish(self) -> str:
        """The end of generation: everything still held back (an incomplete character as U+FFFD)."""
        if self.stopped:
            return ""
        text = self._scan(self._held + self._decoder.decode(b"", final=True))
        if self.stopped:
            return text
        rest, self._held = self._held, ""
        return text + rest

    def _scan(self, text: str) -> str:
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return text[:cut]
        keep = self._partial_stop(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def _partial_stop(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper beginning of some stop sequence."""
        return max((partial_suffix(text, s) for s in self.stops), default=0)


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper beginning of `marker` (text to hold back: it may
    begin the marker)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
