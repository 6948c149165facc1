"""Cell-level KV operations on a llama context with one KV stream per session (``kv_unified=False``).

Primitives:
- ``StreamOps(ctx, n_sessions, cells_per_session)``: ``CacheOps``'s operations where each session
  sequence ``0..n_sessions-1`` is its own stream of ``cells_per_session`` cells (llama.cpp's split
  layout), and there are no parking or scratch sequences. ``place`` / ``place_many`` decode at a
  sequence's end (``place_many`` in sequence order, idle streams filled where that saves passes,
  ``stream_batches``); ``peek`` recomputes the last cell; ``remove`` drops a sequence's tail;
  ``share`` copies a whole sequence (or its first positions) through a state export;
  ``export`` / ``restore`` move a whole sequence, as the one-stream blob a unified cache reads and
  writes (``one_stream`` / ``all_streams`` convert, without a copy on export and into one buffer kept
  between restores), so blocks move between layouts. What needs cells moved, a middle removed or a
  range of a sequence staged elsewhere raises ``CapabilityError`` (the executor reports
  ``remove_middle`` and ``position_shift`` false, so policies degrade to no eviction).
  ``reserve_for(seq, n)``: ``ContextFullError`` unless the sequence's stream has ``n`` more cells;
  ``check_places(items)``: what ``place_many`` would refuse, raised before anything changes.
  With ``spare=True`` the context has one stream more, sequence ``n_sessions``, which no session
  holds: ``swap(a, b)`` exchanges two sessions' streams through it (whole streams copied by
  llama.cpp when the next ``llama_decode`` starts; either may be empty).

Why a split layout: in one unified cache every token attends over every occupied cell of every
sequence (the mask hides the others' cells, the kernels still walk them), so with many resident
sessions each decode and prefill costs what the whole cache holds (docs/notes.md, Fleet). In a
split layout a session's tokens attend over its own stream only. The price: a session holds at
most ``cells_per_session`` cells, and cells cannot be copied between sequences by range
(llama.cpp copies across streams only whole), which is what parking, staging and prefix sharing
by range need; here a copy goes through the session's serialised state instead.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvres.policy.errors import BlockMismatchError, CapabilityError

from .cache_ops import CacheOps
from .engine import LlamaContext
from .llama_errors import ContextFullError
from .stream_batches import gap_fillers

_SPLIT = "kv_layout='split'"
_HEADER = struct.Struct("<3I")  # magic, the source sequence id, n_stream (``state_blob``)
RESTORE_BUFFER_MAX_BYTES = 256 << 20  # the reused buffer a restore converts a blob in: at most this


def one_stream(payload: bytes | bytearray | memoryview, *, owned: bool = False) -> bytes | memoryview:
    """A split context's sequence blob (one cell count per stream, all but one of them 0) as the
    one-stream blob a unified cache writes: what kvres stores, whatever the layout. ``owned``: the
    payload is a ``bytes`` nobody else has seen yet (``state_get``'s), whose one-stream blob is
    written in place, the header just before the stream's cells: a view of it is returned, no copy."""
    buf = memoryview(payload).cast("B")
    magic, seq, n_stream = _HEADER.unpack_from(buf, 0)
    if n_stream == 1:
        return payload if isinstance(payload, bytes) else bytes(buf)
    counts = _HEADER.size
    for s in range(n_stream):
        (count,) = struct.unpack_from("<I", buf, counts)
        if count:
            end = buf.nbytes - 4 * (n_stream - 1 - s)  # the streams after it each wrote a 0 count
            if any(buf[end:]):
                raise BlockMismatchError(f"a sequence state holds cells in more than one of its {n_stream} streams")
            header = _HEADER.pack(magic, seq, 1)
            if owned and isinstance(payload, bytes):
                start = counts - _HEADER.size  # over the earlier streams' 0 counts (and the old header)
                address = ctypes.cast(ctypes.c_char_p(payload), ctypes.c_void_p).value
                assert address is not None
                ctypes.memmove(address + start, header, len(header))
                return buf[start:end]
            return header + bytes(buf[counts:end])
        counts += 4
    return _HEADER.pack(magic, seq, 1) + struct.pack("<I", 0)


def all_streams(payload: bytes | bytearray | memoryview, n_stream: int,
                into: npt.NDArray[np.uint8] | None = None) -> bytes | bytearray | memoryview:
    """A one-stream blob as a context of ``n_stream`` streams reads it (llama.cpp restores the
    stream that holds cells into the target sequence's own): the payload itself where it already
    is one, else written into ``into`` where that is large enough (a view of it, valid until
    ``into`` is written again), else into new bytes."""
    buf = memoryview(payload).cast("B")
    magic, seq, have = _HEADER.unpack_from(buf, 0)
    if have == n_stream:
        return payload
    if have != 1:
        raise BlockMismatchError(f"KV payload holds {have} streams; expected 1")
    total = buf.nbytes + 4 * (n_stream - 1)
    if into is None or into.size < total:
        return _HEADER.pack(magic, seq, n_stream) + bytes(buf[_HEADER.size:]) + bytes(4 * (n_stream - 1))
    out = into[:total]
    _HEADER.pack_into(out, 0, magic, seq, n_stream)  # type: ignore[arg-type]
    out[_HEADER.size:buf.nbytes] = np.frombuffer(buf, dtype=np.uint8, offset=_HEADER.size)
    out[buf.nbytes:] = 0
    return out.data


class StreamOps(CacheOps):
    def __init__(self, ctx: LlamaContext, n_sessions: int, cells_per_session: int, spare: bool = False) -> None:
        super().__init__(ctx, n_sessions, filler_token=0, can_shift=False)
        self.cells_per_session = cells_per_session
        self.spare = n_sessions if spare else None  # the stream no session holds (``swap``)
        self.n_streams = n_sessions + spare
        self._held: dict[int, int] = {}  # session seq -> cells in its stream
        self._restore_into: npt.NDArray[np.uint8] = np.empty(0, dtype=np.uint8)

    def swap(self, a: int, b: int) -> None:
        """Sessions ``a`` and ``b`` exchange streams (cells, positions and all): the next
        ``llama_decode`` copies them, in this order, before it computes anything."""
        if self.spare is None:
            raise CapabilityError(f"moving a session to another stream needs the spare stream ({_SPLIT})")
        ctx, spare = self.ctx, self.spare
        for src, dst in ((a, spare), (b, a), (spare, b)):
            ctx.seq_cp(src, dst, -1, -1)  # across streams llama.cpp copies only whole streams
            ctx.seq_rm(src, -1, -1)
        held_a, held_b = self._held.pop(a, 0), self._held.pop(b, 0)
        if held_b:
            self._held[a] = held_b
        if held_a:
            self._held[b] = held_a

    # -- room ---------------------------------------------------------------------------------
    def reserve_for(self, seq: int, n: int) -> None:
        held = self._held.get(seq, 0)
        if held + n > self.cells_per_session:
            raise ContextFullError(
                f"a session's stream holds {self.cells_per_session} KV cells ({_SPLIT}: n_ctx / n_seq_max); "
                f"this one holds {held} and {n} more do not fit",
                needed=n, free=self.cells_per_session - held)

    def reserve(self, n: int) -> None:
        if self.ctx.n_cells - self.live < n:
            raise ContextFullError(f"the engine context has {self.ctx.n_cells - self.live} empty cells; "
                                   f"{n} are needed", needed=n, free=self.ctx.n_cells - self.live)

    def _took(self, seq: int, n: int) -> None:
        self._held[seq] = self._held.get(seq, 0) + n
        self.live += n

    def unpark(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        return None  # nothing is parked: a stream's freed cells are its tail, refilled in order

    # -- placing tokens -------------------------------------------------------------------------
    def _at_end(self, seq: int, first: int, what: str) -> None:
        last = self.ctx.pos_max(seq)
        if last >= 0 and last + 1 != first:
            raise CapabilityError(f"{what} at position {first} (the sequence ends at {last}): {_SPLIT} decodes "
                                  "only at a sequence's end")

    def place(self, seq: int, tokens: Sequence[int], first: int) -> npt.NDArray[np.float32]:
        self._at_end(seq, first, "placing tokens")
        self.reserve_for(seq, len(tokens))
        logits = self.ctx.decode(tokens, first, seq)
        self._took(seq, len(tokens))
        return logits

    def peek(self, seq: int, token: int, position: int) -> npt.NDArray[np.float32]:
        """The logits of the sequence's last cell, recomputed in place (its KV comes out the same)."""
        if self.ctx.pos_max(seq) != position:
            raise CapabilityError(f"{_SPLIT} can recompute only a sequence's last cell, not position {position}")
        self.ctx.seq_rm(seq, position, -1)
        return self.ctx.decode([token], position, seq)

    def check_places(self, items: Sequence[tuple[int, Sequence[int], int]]) -> None:
        """What ``place_many`` refuses (``CapabilityError``, ``ContextFullError``), before anything changes."""
        for seq, tokens, first in items:
            self._at_end(seq, first, "placing tokens")
            self.reserve_for(seq, len(tokens))

    def place_many(self, items: Sequence[tuple[int, Sequence[int], int]]) -> list[npt.NDArray[np.float32]]:
        """Every item in one ``llama_decode``, in sequence order, with a throwaway token on the idle
        sequences that join runs of the others (``stream_batches``), removed again after."""
        self.check_places(items)
        busy = {seq for seq, _, _ in items}
        fillers = set(gap_fillers([(seq, len(tokens)) for seq, tokens, _ in items], self.ctx.n_batch,
                                  lambda s: s not in busy and self._held.get(s, 0) < self.cells_per_session))
        # llama.cpp cuts micro-batches in batch order: sequence order
        placed = sorted([(tokens, first, seq) for seq, tokens, first in items]
                        + [([self.filler_token], self.ctx.pos_max(s) + 1, s) for s in fillers], key=lambda it: it[2])
        answers = self.ctx.decode_many(placed, silent=[seq in fillers for _, _, seq in placed])
        for _, first, seq in placed:
            if seq in fillers:
                self.ctx.seq_rm(seq, first, -1)
        by_seq = {seq: out for (_, _, seq), out in zip(placed, answers, strict=True)}
        for seq, tokens, _ in items:
            self._took(seq, len(tokens))
        return [by_seq[seq] for seq, _, _ in items]

    def flush_shifts(self) -> None:
        return None  # no cell ever moves

    # -- removing -------------------------------------------------------------------------------
    def check_remove(self, seq: int, positions: npt.NDArray[np.int64]) -> None:
        p0, p1 = int(positions[0]), int(positions[-1]) + 1
        if p1 - 1 != self.ctx.pos_max(seq) or positions.size != p1 - p0:
            raise CapabilityError(f"removing positions [{p0}, {p1}) of a sequence that ends at "
                                  f"{self.ctx.pos_max(seq)}: {_SPLIT} removes only a sequence's tail")

    def remove(self, seq: int, positions: npt.NDArray[np.int64], shift: int = 0) -> None:
        self.check_remove(seq, positions)
        if shift:
            self.require_shift(f"moving the cells after {int(positions[-1])} by {shift}")
        self.ctx.seq_rm(seq, int(positions[0]), -1)
        self._took(seq, -int(positions.size))

    def shift(self, seq: int, p0: int, delta: int) -> None:
        self.require_shift(f"moving positions [{p0}, ...) by {delta}")

    def drop(self, seq: int, n_cells: int) -> None:
        self.ctx.seq_rm(seq, -1, -1)
        self.live -= self._held.pop(seq, 0)

    # -- copies and serialising -------------------------------------------------------------------
    def share(self, src: int, dst: int, p1: int = -1) -> None:
        """``dst`` (an empty session) gets a copy of the cells of ``src`` before position ``p1``
        (-1: all of them), through ``src``'s serialised state."""
        payload = self.ctx.state_get(src)
        held = self._held.get(src, 0)
        n = held if p1 < 0 else min(held, p1)
        self.reserve_for(dst, n)
        self.reserve(n)
        if not self.ctx.state_set(dst, payload):
            raise ContextFullError(f"llama.cpp could not copy {held} cells into a new session's stream", needed=held)
        if 0 <= p1 < held:
            self.ctx.seq_rm(dst, p1, -1)
        self._held[dst] = n  # (the caller counts them in ``live``, as for a unified cache's share)

    def _restore_buffer(self, payload: bytes | bytearray | memoryview) -> npt.NDArray[np.uint8] | None:
        """The buffer a restore writes its blob in, kept from one restore to the next (a copy into
        memory the process holds is a memcpy; into fresh memory, a page fault per page), grown with
        a quarter to spare; None for a blob larger than ``RESTORE_BUFFER_MAX_BYTES``."""
        needed = memoryview(payload).nbytes + 4 * self.n_streams
        if needed > RESTORE_BUFFER_MAX_BYTES:
            return None
        if self._restore_into.size < needed:
            self._restore_into = np.empty(min(needed + (needed >> 2), RESTORE_BUFFER_MAX_BYTES), dtype=np.uint8)
        return self._restore_into

    def export(self, seq: int, p0: int, p1: int, whole: bool = False) -> bytes | memoryview:
        if not whole and (p0 != 0 or p1 - 1 != self.ctx.pos_max(seq)):
            raise CapabilityError(f"exporting positions [{p0}, {p1}) alone: {_SPLIT} exports whole sessions")
        return one_stream(self.ctx.state_get(seq), owned=True)

    def restore(
        self, seq: int, payload: bytes | bytearray | memoryview, positions: Sequence[int], delta: int,
        empty: bool | None = None,
    ) -> bool:
        if delta or self.ctx.pos_max(seq) >= 0:
            raise CapabilityError(f"restoring cells into a session that holds some, or moved by {delta}: "
                                  f"{_SPLIT} restores whole sessions in place")
        self.reserve_for(seq, len(positions))
        if not self.ctx.state_set(seq, all_streams(payload, self.n_streams, self._restore_buffer(payload))):
            return False
        self._took(seq, len(positions))
        return True
