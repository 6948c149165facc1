"""Reused buffers for the RAM tier's private copies of payloads.

Primitives:
- ``PayloadPool(max_idle_bytes)``: ``copy(payload) -> memoryview`` (a read-only private copy of
  ``payload``), ``idle_bytes`` and ``idle_buffers`` (what it keeps for the next copies),
  ``reused`` and ``allocated`` (copies made into a kept buffer, into a new one).
- ``size_class(nbytes) -> int``: the capacity a new buffer for ``nbytes`` gets (at most 1/32 more).

A copy goes into a buffer that an earlier copy no longer uses where one of the right size is kept,
else into a new one. A buffer comes back when the last view of its copy is gone (the tier dropped
the block and whoever read it let go), not when the tier drops the block: a block handed out stays
valid as long as it is held. At most ``max_idle_bytes`` of buffers are kept, the oldest released
first beyond that.

Why: a copy into fresh memory pays a page fault per page (and, with transparent huge pages, the
kernel's compaction): on a busy 2-core virtual machine a parked session of ~15 MB cost the cold
store ~19 ms of CPU that way, against 2.7-4 ms into a buffer it already held. A chat fleet's
churn (a session parked for each one brought back) frees about what it takes, in the same sizes.
"""

from __future__ import annotations

import bisect
import threading
import weakref

import numpy as np

from .codec import payload_view

MIN_CLASS_STEP = 4096
HEADROOM_SHIFT = 2


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to a step of 1/32 of its power of two (a page at least)."""
    step = max(MIN_CLASS_STEP, (1 << max(nbytes.bit_length() - 1, 0)) >> 5)
    return -(-nbytes // step) * step


class PayloadPool:
    """Private copies of payloads in buffers that are reused once released."""

    def __init__(self, max_idle_bytes: int) -> None:
        if max_idle_bytes < 0:
            raise ValueError(f"max_idle_bytes must be >= 0, got {max_idle_bytes}")
        self.max_idle_bytes = max_idle_bytes
        self._lock = threading.Lock()
        self._idle: list[tuple[int, int, np.ndarray]] = []  # (capacity, order released, buffer), by capacity
        self._order = 0
        self.idle_bytes = 0
        self.reused = 0
        self.allocated = 0

    @property
    def idle_buffers(self) -> int:
        return len(self._idle)

    def copy(self, payload: bytes | bytearray | memoryview) -> memoryview:
        """A read-only private copy of ``payload``."""
        source = np.frombuffer(payload_view(payload), dtype=np.uint8)
        nbytes = source.size
        buffer = self._take(nbytes)
        view = buffer[:nbytes]
        np.copyto(view, source)
        view.flags.writeable = False
        done = weakref.finalize(view, self._release, buffer)
        done.atexit = False
        return view.data

    def _take(self, nbytes: int) -> np.ndarray:
        """The smallest idle buffer that holds ``nbytes``, where it is no larger than a new one would
        be; else a new one, with a quarter to spare (a session parked again has grown; a buffer's
        pages are touched only as far as a copy writes)."""
        capacity = size_class(nbytes + (nbytes >> HEADROOM_SHIFT))
        with self._lock:
            at = bisect.bisect_left(self._idle, (nbytes,))
            if at < len(self._idle) and self._idle[at][0] <= capacity:
                capacity, _, buffer = self._idle.pop(at)
                self.idle_bytes -= capacity
                self.reused += 1
                return buffer
            self.allocated += 1
        return np.empty(capacity, dtype=np.uint8)

    def _release(self, buffer: np.ndarray) -> None:
        capacity = buffer.size
        with self._lock:
            if capacity > self.max_idle_bytes:
                return
            self._order += 1
            bisect.insort(self._idle, (capacity, self._order, buffer), key=lambda item: item[:2])
            self.idle_bytes += capacity
            while self.idle_bytes > self.max_idle_bytes:
                oldest = min(range(len(self._idle)), key=lambda i: self._idle[i][1])
                self.idle_bytes -= self._idle.pop(oldest)[0]
