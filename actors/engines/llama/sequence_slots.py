"""Which llama sequence (in the split layout: which KV stream) each session of an executor holds.

Primitives:
- ``SequenceSlots(n)``: sequence ids ``0..n-1``; ``has_free()``; ``take()`` the lowest free one
  (the sessions of a split layout stay on few, consecutive streams, which llama.cpp decodes
  together, ``stream_batches``); ``release(seq)``.
- ``gather(placing, sessions, ops)``: before a split layout's step, the sessions whose turn starts
  in it move down to the lowest streams no session of the step holds (below).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .session import Session
from .stream_ops import StreamOps


class SequenceSlots:
    def __init__(self, n: int) -> None:
        self._free = set(range(n))

    def has_free(self) -> bool:
        return bool(self._free)

    def take(self) -> int:
        seq = min(self._free)
        self._free.discard(seq)
        return seq

    def release(self, seq: int) -> None:
        self._free.add(seq)

    def gather(self, placing: Sequence[tuple[Session, str, list[int]]], sessions: Iterable[Session],
               ops: StreamOps) -> None:
        """A split layout's step runs a pass over the weights per run of consecutive streams
        (``stream_batches``): a session whose turn starts here (a chunk of two tokens or more) on a
        stream above one that no session of this step holds moves down to it, exchanging streams
        with the session there, if any (``StreamOps.swap``: three whole-stream copies through the
        spare, once a turn), so the sessions under way gather on the lowest streams."""
        starting = [item for item in placing if len(item[2]) >= 2]
        if not starting:
            return  # a step of decodes alone (most steps): nothing to look up
        taken = {s.seq for s, _, _ in placing}
        holder = {s.seq: s for s in sessions}
        for s, _, _ in sorted(starting, key=lambda item: -item[0].seq):
            lower = min((q for q in range(s.seq) if q not in taken), default=None)
            if lower is None:
                continue
            other = holder.get(lower)
            ops.swap(s.seq, lower)
            taken.discard(s.seq)
            taken.add(lower)
            if other is None:
                self._free.discard(lower)
                self._free.add(s.seq)
            else:
                other.seq = s.seq
            s.seq = lower
