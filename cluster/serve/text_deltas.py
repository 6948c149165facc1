"""A reply's text handed out piece by piece as its tokens arrive, never a piece to take back.

Primitives:
- ``TextDeltas(detokenize, stop=())``: ``push(token) -> str`` (the text that may be sent now: the
  whole reply decoded again, less an unfinished UTF-8 character at its end, cut before a completed
  stop string, less an end that may still become a stop string); ``finish(final_text) -> str``
  (what is left to send of the reply's final text); ``sent`` (the text sent so far) and
  ``covered`` (how many tokens that text covers: the tokens a client that leaves now received).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextDeltas:
    def __init__(self, detokenize: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._detokenize = detokenize
        self._stop = tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.sent = ""
        self.covered = 0

    def _held_back(self, text: str) -> int:
        """How many characters at the end of ``text`` could still begin a stop string."""
        longest = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def push(self, token: int) -> str:
        self.tokens.append(int(token))
        text = self._detokenize(self.tokens)
        safe = text.rstrip("\ufffd")
        for s in self._stop:
            cut = safe.find(s)
            if cut >= 0:
                safe = safe[:cut]
        hold = self._held_back(safe)
        if hold:
            safe = safe[:-hold]
        if not safe.startswith(self.sent):
            return ""  # decoding more tokens rewrote text already sent: send the rest at the end
        delta = safe[len(self.sent):]
        self.sent = safe
        if safe == text:
            self.covered = len(self.tokens)
        return delta

    def finish(self, final_text: str) -> str:
        if not final_text.startswith(self.sent):
            return ""
        delta = final_text[len(self.sent):]
        self.sent = final_text
        self.covered = len(self.tokens)
        return delta
