"""Cell-level KV operations on one llama context: what the executor's mechanism is made of.

Primitives:
- ``CacheOps(ctx, n_sessions, filler_token, can_shift)``: session sequences are ``0..n_sessions-1``; it
  owns sequence ``n_sessions + i`` (the parking sequence of session ``i``, see below) and
  ``scratch = 2 * n_sessions`` (export / import / recompute staging), and counts the cells
  sessions hold (``live``) and the parked ones.
  ``place(seq, tokens, first) -> logits``: compute tokens into ``seq`` at positions ``first..``
  attending to the sequence's cells before ``first``.
  ``peek(seq, token, position) -> logits``: what ``token`` at ``position`` gives over the cells of
  ``seq`` before it, decoded in the scratch sequence (``seq`` does not change).
  ``place_many(items) -> logits per item``: ``(seq, tokens, first)`` items, each continuing its
  sequence at its last position + 1, decoded in the same batches (continuous batching).
  ``remove(seq, positions, shift)``: drop the cells at ``positions`` (one contiguous span of
  the sequence), then move the cells after them by ``shift`` (re-basing).
  ``check_remove(seq, positions)``: whether ``remove`` can (always, here; not for ``stream_ops``).
  ``shift(seq, p0, delta)``: move ``[p0, inf)``. ``drop(seq)``: free a whole sequence.
  ``share(src, dst)``: ``dst`` (an empty session sequence) holds every cell of ``src`` too (a fork).
  ``export(seq, p0, p1) -> bytes``: serialise positions ``[p0, p1)`` of a sequence.
  ``restore(seq, payload, positions, delta, empty=None) -> bool``: put serialised cells (exported
  at ``positions``) into ``seq`` moved by ``delta`` positions (``empty``: ``seq`` holds no cell).

Why parking: with flash attention, llama.cpp's CPU kernel accumulates V in f16 in KV *cell*
order, so the same cells in another physical order give logits that differ by ~1e-3. llama.cpp
refills the first free cell, so a token appended after an eviction would land in the hole, in
front of older cells. Removed cells are therefore parked (shared into the session's parking
sequence, invisible to every query) instead of freed: new cells go after the existing ones and a
session's cells stay in position order. Re-admitting or importing a range first frees the
parked cells at its positions, so it refills its own hole. Parked cells are all released when
the allocator would otherwise run short; they count as free for capacity.

Why shared cells are copied before they move: llama.cpp keeps one position per cell, so
``seq_add`` on one sequence moves a shared cell for every sequence holding it. Sequences that
may share cells (a source and its forks) form a group, the source first. Before a fork moves its
cells it gets its own copy of them (serialised and restored through ``scratch``, after every other
cell) and leaves the group; before the source moves its cells, each fork gets its copy. So the
source keeps its layout: it goes on exactly as if it had never been forked.

Why ``place`` can stage in ``scratch``: llama.cpp accepts a decode for a sequence only at its
last position + 1. Tokens that go anywhere else (the middle, or after a gap of evicted
positions) are decoded in the scratch sequence, which shares the session's cells before the
target, and then shared into the session. After a gap they are computed right after the last
earlier cell and moved up to their target (a K-shift), since no decode can leave a gap.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvres.policy.errors import CapabilityError

from .engine import LlamaContext
from .llama_errors import ContextFullError
from .state_blob import read_cell_positions


class CacheOps:
    def __init__(self, ctx: LlamaContext, n_sessions: int, filler_token: int, can_shift: bool) -> None:
        self.ctx = ctx
        self.can_shift = can_shift
        self.n_sessions = n_sessions
        self.scratch = 2 * n_sessions
        self.filler_token = filler_token
        self.live = 0  # cells held by session sequences
        self._parked: dict[int, npt.NDArray[np.int64]] = {}  # session seq -> parked positions
        self.shift_pending = False  # llama.cpp applies K-shifts at the start of the next decode
        self._groups: dict[int, list[int]] = {}  # session seq -> seqs that may share cells, source first

    @property
    def parked(self) -> int:
        return sum(int(p.size) for p in self._parked.values())

    # -- physical room --------------------------------------------------------------------
    def reserve(self, n: int) -> None:
        """Make sure the allocator finds ``n`` empty cells, releasing parked cells if needed."""
        if self.ctx.n_cells - self.live - self.parked >= n:
            return
        for seq in list(self._parked):
            self.unpark(seq)
        if self.ctx.n_cells - self.live < n:
            raise ContextFullError(
                f"the engine context has {self.ctx.n_cells - self.live} empty cells; {n} are needed",
                needed=n, free=self.ctx.n_cells - self.live,
            )

    def _park(self, seq: int, positions: npt.NDArray[np.int64]) -> None:
        self.ctx.seq_cp(seq, self.n_sessions + seq, int(positions[0]), int(positions[-1]) + 1)
        held = self._parked.get(seq, np.zeros(0, dtype=np.int64))
        self._parked[seq] = np.concatenate([held, positions.astype(np.int64)])

    def unpark(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        """Free the session's parked cells at positions ``[p0, p1)`` (all with the defaults)."""
        held = self._parked.get(seq)
        if held is None:
            return
        hit = (held >= p0) & ((held < p1) if p1 >= 0 else True)
        if not np.any(hit):
            return
        self.ctx.seq_rm(self.n_sessions + seq, p0, p1)
        rest = held[~hit]
        if rest.size:
            self._parked[seq] = rest
        else:
            del self._parked[seq]

    # -- placing tokens -------------------------------------------------------------------
    def place(self, seq: int, tokens: Sequence[int], first: int) -> npt.NDArray[np.float32]:
        ctx, scratch = self.ctx, self.scratch
        n = len(tokens)
        last = ctx.pos_max(seq)
        if last < 0 or last + 1 == first:
            self.unpark(seq, first, first + n)
            self.reserve(n)
            logits = ctx.decode(tokens, first, seq)
            self.shift_pending = False
            self.live += n
            return logits
        ctx.seq_rm(scratch, -1, -1)
        if first > 0:
            ctx.seq_cp(seq, scratch, 0, first)
        prefix_end = ctx.pos_max(scratch)
        start = first if prefix_end < 0 else prefix_end + 1
        if start != first and not self.can_shift:
            ctx.seq_rm(scratch, -1, -1)
            raise CapabilityError(
                f"placing tokens at position {first} after a gap (last earlier cell at {prefix_end}) "
                "needs a K-shift, which this cache cannot do"
            )
        self.unpark(seq, first, first + n)
        try:
            self.reserve(n)
            logits = ctx.decode(tokens, start, scratch)
        except BaseException:
            ctx.seq_rm(scratch, -1, -1)
            raise
        self.shift_pending = False
        try:
            if start != first:
                ctx.seq_add(scratch, start, -1, first - start)
                self.shift_pending = True
            ctx.seq_cp(scratch, seq, first, first + n)
        finally:
            ctx.seq_rm(scratch, -1, -1)
        self.live += n
        return logits

    def peek(self, seq: int, token: int, position: int) -> npt.NDArray[np.float32]:
        ctx, scratch = self.ctx, self.scratch
        ctx.seq_rm(scratch, -1, -1)
        if position > 0:
            ctx.seq_cp(seq, scratch, 0, position)
        prefix_end = ctx.pos_max(scratch)
        try:
            self.reserve(1)
            # after a gap the token sits right after the last earlier cell, as ``place`` computes it
            logits = ctx.decode([token], position if prefix_end < 0 else prefix_end + 1, scratch)
        finally:
            ctx.seq_rm(scratch, -1, -1)
        self.shift_pending = False
        return logits

    def place_many(self, items: Sequence[tuple[int, Sequence[int], int]]) -> list[npt.NDArray[np.float32]]:
        for seq, tokens, first in items:
            self.unpark(seq, first, first + len(tokens))
        n = sum(len(tokens) for _, tokens, _ in items)
        self.reserve(n)
        logits = self.ctx.decode_many([(tokens, first, seq) for seq, tokens, first in items])
        self.shift_pending = False
        self.live += n
        return logits

    def flush_shifts(self) -> None:
        """Apply pending K-shifts now (by decoding one throwaway token in the scratch sequence)."""
        if not self.shift_pending:
            return
        self.reserve(1)
        self.ctx.seq_rm(self.scratch, -1, -1)
        self.ctx.decode([self.filler_token], 0, self.scratch, logits=False)
        self.ctx.seq_rm(self.scratch, -1, -1)
        self.shift_pending = False

    # -- removing and moving --------------------------------------------------------------
    def remove(self, seq: int, positions: npt.NDArray[np.int64], shift: int = 0) -> None:
        p0, p1 = int(positions[0]), int(positions[-1]) + 1
        if shift:
            self._unshare(seq)  # before parking, so a copy keeps the holes the original would
        self._park(seq, positions)
        self.ctx.seq_rm(seq, p0, p1)
        self.live -= int(positions.size)
        if shift:
            self.shift(seq, p1, shift)

    def check_remove(self, seq: int, positions: npt.NDArray[np.int64]) -> None:
        """Raises ``CapabilityError`` where ``remove`` of these positions is impossible (never here)."""

    def require_shift(self, what: str) -> None:
        if not self.can_shift:
            raise CapabilityError(f"{what} needs a K-shift, which this cache cannot do "
                                  "(llama.cpp cannot rotate a quantized K cache)")

    def shift(self, seq: int, p0: int, delta: int) -> None:
        self.require_shift(f"moving positions [{p0}, ...) by {delta}")
        self._unshare(seq)
        self.ctx.seq_add(seq, p0, -1, delta)
        self.shift_pending = True

    def drop(self, seq: int, n_cells: int) -> None:
        """Free a session's sequence (``n_cells`` live cells) and its parked cells."""
        self.unpark(seq)
        self.ctx.seq_rm(seq, -1, -1)
        self.live -= n_cells
        self._leave(seq)

    # -- shared cells ---------------------------------------------------------------------
    def share(self, src: int, dst: int, p1: int = -1) -> None:
        """``dst`` also holds the cells of ``src`` (those before position ``p1``; -1: all)."""
        self.ctx.seq_cp(src, dst, -1 if p1 < 0 else 0, p1)
        group = self._groups.get(src, [src])
        group.append(dst)
        for member in group:
            self._groups[member] = group

    def _leave(self, seq: int) -> None:
        group = self._groups.pop(seq, None)
        if group is not None:
            group.remove(seq)
            if len(group) == 1:
                self._groups.pop(group[0], None)

    def _unshare(self, seq: int) -> None:
        """Before ``seq`` moves its cells: a source's forks each get their own copy (the source keeps
        its layout), or a fork gets its own copy."""
        group = self._groups.get(seq)
        if group is None:
            return
        for member in group[1:] if group[0] == seq else [seq]:
            self._copy_cells(member)
            self._leave(member)

    def _copy_cells(self, seq: int) -> None:
        """Replace the cells of ``seq`` by copies of them (serialised and restored through
        ``scratch``, placed after the others); the old cells stay with whoever else holds them."""
        if self.ctx.pos_max(seq) < 0:
            return
        self.flush_shifts()  # the serialised K rows must carry their rotation
        ctx, scratch = self.ctx, self.scratch
        payload = ctx.state_get(seq)
        ctx.seq_rm(scratch, -1, -1)
        if not ctx.state_set(scratch, payload):
            for parked in list(self._parked):
                self.unpark(parked)
            if not ctx.state_set(scratch, payload):
                ctx.seq_rm(scratch, -1, -1)
                n = len(read_cell_positions(payload))
                raise ContextFullError(f"no room to copy the {n} cells sequence {seq} shares with a fork "
                                       "before they move", needed=n)
        ctx.seq_rm(seq, -1, -1)
        ctx.seq_cp(scratch, seq, -1, -1)
        ctx.seq_rm(scratch, -1, -1)

    # -- serialising ----------------------------------------------------------------------
    def export(self, seq: int, p0: int, p1: int, whole: bool = False) -> bytes | memoryview:
        """The serialised cells of ``seq`` at positions ``[p0, p1)``; ``whole`` says they are all
        of its cells, so the sequence is read as it is (no copy through the scratch sequence)."""
        # the serialised K rows must carry their rotation, so pending shifts go first
        self.flush_shifts()
        ctx, scratch = self.ctx, self.scratch
        if whole:
            return ctx.state_get(seq)
        ctx.seq_rm(scratch, -1, -1)
        ctx.seq_cp(seq, scratch, p0, p1)
        try:
            return ctx.state_get(scratch)
        finally:
            ctx.seq_rm(scratch, -1, -1)

    def restore(
        self, seq: int, payload: bytes | bytearray | memoryview, positions: Sequence[int], delta: int,
        empty: bool | None = None,
    ) -> bool:
        """``empty``: whether ``seq`` holds no cell yet, where the caller knows (llama.cpp's
        ``seq_pos_max`` of a sliding-window model reads its windowed cache, which a restored block
        from before the window leaves empty); None asks llama.cpp."""
        ctx, scratch = self.ctx, self.scratch
        n_cells = len(positions)
        if delta:
            self.require_shift(f"restoring cells exported at {positions[0]}.. {delta:+d} positions away")
        self.unpark(seq, int(positions[0]), int(positions[-1]) + 1)
        self.reserve(n_cells)
        if not delta and (ctx.pos_max(seq) < 0 if empty is None else empty):  # takes the blob as it is
            if not ctx.state_set(seq, payload):
                return False
            self.live += n_cells
            return True
        ctx.seq_rm(scratch, -1, -1)
        try:
            if not ctx.state_set(scratch, payload):
                return False
            if delta:
                ctx.seq_add(scratch, 0, -1, delta)
                self.shift_pending = True
            ctx.seq_cp(scratch, seq, 0, -1)
        finally:
            ctx.seq_rm(scratch, -1, -1)
        self.live += n_cells
        return True
