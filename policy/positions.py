"""Position bookkeeping of one session: token-log index -> engine cache position.

Primitives:
- ``PositionMap``: which token-log positions are resident and at which cache position.
  ``append(n)``, ``evict(rng, rebase) -> EvictOp``, ``admit(rng, offsets) -> AdmitOp``,
  ``resident_ranges()``, ``positions(rng)``, checks that raise ``RangeError``;
  ``relayout(resident, positions, next_pos)``: adopt a whole layout at once (a batched exchange).
- ``EvictOp(p0, p1, shift)``: remove cache positions ``[p0, p1)``, then move ``[p1, inf)`` by
  ``shift`` (0 or negative).
- ``AdmitOp(first_position, tail_from, tail_shift)``: move ``[tail_from, inf)`` up by
  ``tail_shift`` first, then place the admitted tokens from ``first_position``.

Every executor shares this one rule set, so the same plan gives the same positions everywhere.
Resident cache positions always increase strictly with the token-log index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .errors import RangeError
from .ranges import IntArray, Range


@dataclass(frozen=True)
class EvictOp:
    p0: int
    p1: int
    shift: int


@dataclass(frozen=True)
class AdmitOp:
    first_position: int
    tail_from: int
    tail_shift: int
    positions: tuple[int, ...]


class PositionMap:
    def __init__(self) -> None:
        self._resident = np.zeros(0, dtype=bool)
        self._pos: IntArray = np.zeros(0, dtype=np.int64)
        self.next_pos = 0
        self._count = 0  # resident tokens, kept with every change (an executor sums them every step)

    @property
    def length(self) -> int:
        """Tokens in the log (resident or not)."""
        return int(self._resident.shape[0])

    @property
    def resident_count(self) -> int:
        return self._count

    def copy(self) -> PositionMap:
        clone = PositionMap()
        clone._resident = self._resident.copy()
        clone._pos = self._pos.copy()
        clone.next_pos = self.next_pos
        clone._count = self._count
        return clone

    # -- checks ---------------------------------------------------------------------------
    def check_in_log(self, rng: Range) -> None:
        if rng.empty or rng.end > self.length:
            raise RangeError(
                f"range {rng} is outside the session's token log of {self.length} tokens"
                if not rng.empty
                else f"range {rng} is empty"
            )

    def check_resident(self, rng: Range) -> None:
        self.check_in_log(rng)
        missing = np.nonzero(~self._resident[rng.start : rng.end])[0]
        if missing.size:
            raise RangeError(
                f"range {rng} is not fully resident (token {rng.start + int(missing[0])} is evicted)"
            )

    def check_evicted(self, rng: Range) -> None:
        self.check_in_log(rng)
        present = np.nonzero(self._resident[rng.start : rng.end])[0]
        if present.size:
            raise RangeError(
                f"range {rng} is not fully evicted (token {rng.start + int(present[0])} is resident)"
            )

    # -- queries --------------------------------------------------------------------------
    def resident_ranges(self) -> list[Range]:
        r = self._resident.astype(np.int8)
        edges = np.diff(np.concatenate(([0], r, [0])))
        starts = np.nonzero(edges == 1)[0]
        ends = np.nonzero(edges == -1)[0]
        return [Range(int(s), int(e)) for s, e in zip(starts, ends, strict=True)]

    def positions(self, rng: Range) -> IntArray:
        self.check_resident(rng)
        return self._pos[rng.start : rng.end].copy()

    def resident_mask(self) -> npt.NDArray[np.bool_]:
        return self._resident.copy()

    def all_positions(self) -> IntArray:
        """Cache position per log index; -1 where evicted."""
        return np.where(self._resident, self._pos, -1)

    # -- updates --------------------------------------------------------------------------
    def extend_evicted(self, n: int) -> None:
        """Add ``n`` tokens to the log without KV (a restored session before its blocks return)."""
        if n < 0:
            raise ValueError(f"cannot extend the log by {n} tokens")
        self._resident = np.concatenate([self._resident, np.zeros(n, dtype=bool)])
        self._pos = np.concatenate([self._pos, np.zeros(n, dtype=np.int64)])

    def append(self, n: int) -> int:
        """Make room for ``n`` new resident tokens; returns the first one's cache position."""
        if n < 0:
            raise ValueError(f"cannot append {n} tokens")
        first = self.next_pos
        self._resident = np.concatenate([self._resident, np.ones(n, dtype=bool)])
        self._pos = np.concatenate([self._pos, first + np.arange(n, dtype=np.int64)])
        self.next_pos = first + n
        self._count += n
        return first

    def evict(self, rng: Range, rebase: bool) -> EvictOp:
        self.check_resident(rng)
        p0 = int(self._pos[rng.start])
        p1 = int(self._pos[rng.end - 1]) + 1
        self._resident[rng.start : rng.end] = False
        self._count -= len(rng)  # every one of them was resident (checked above)
        shift = 0
        if rebase:
            shift = -(p1 - p0)
            tail = np.arange(self.length) >= rng.end
            self._pos[tail & self._resident] += shift
            self.next_pos += shift
        return EvictOp(p0, p1, shift)

    def relayout(self, resident: npt.ArrayLike, positions: npt.ArrayLike, next_pos: int) -> None:
        """Adopt a new layout of the whole log at once: ``resident`` and ``positions`` (one per
        log index; positions of resident tokens must be >= 0 and increase strictly, and stay below
        ``next_pos``). Used where many evictions and imports are carried out in one engine step."""
        mask = np.asarray(resident, dtype=bool)
        pos = np.asarray(positions, dtype=np.int64)
        if mask.shape != (self.length,) or pos.shape != (self.length,):
            raise RangeError(
                f"a layout needs one entry per token of the {self.length}-token log, got "
                f"{mask.shape[0] if mask.ndim else 0} flags and {pos.shape[0] if pos.ndim else 0} positions"
            )
        held = pos[mask]
        if held.size and (held[0] < 0 or np.any(np.diff(held) <= 0) or next_pos <= held[-1]):
            raise RangeError("resident positions must be >= 0, increase strictly with the log index and "
                             f"lie below next_pos={next_pos}")
        self._resident = mask.copy()
        self._count = int(mask.sum())
        self._pos = np.where(mask, pos, 0)
        self.next_pos = int(next_pos)

    def plan_admit(
        self, rng: Range, offsets: IntArray | None = None, preferred_first: int | None = None
    ) -> AdmitOp:
        """Where ``rng`` would go if admitted now (no change made).

        ``preferred_first`` (an imported block's original first position) is used when it lies
        after the previous resident token, so a suspended session comes back at exactly the
        positions it had; otherwise the distance rule of the module docstring applies.
        """
        self.check_evicted(rng)
        if offsets is None:
            offsets = np.arange(len(rng), dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.shape != (len(rng),) or offsets[0] != 0 or np.any(np.diff(offsets) <= 0):
            raise RangeError(
                f"admission offsets for {rng} must start at 0 and increase strictly, got {offsets[:8]}"
            )
        span = int(offsets[-1]) + 1
        before = np.nonzero(self._resident[: rng.start])[0]
        after = np.nonzero(self._resident[rng.end :])[0]
        nxt = int(after[0]) + rng.end if after.size else None
        if before.size:
            prev = int(before[-1])
            first = int(self._pos[prev]) + (rng.start - prev)
        elif nxt is not None:
            first = max(0, int(self._pos[nxt]) - (nxt - rng.start))
        else:
            first = max(0, self.next_pos - (self.length - rng.start))
        if preferred_first is not None and preferred_first >= 0 and (
            not before.size or preferred_first > int(self._pos[before[-1]])
        ):
            first = preferred_first
        tail_from = int(self._pos[nxt]) if nxt is not None else self.next_pos
        tail_shift = max(0, first + span - tail_from) if nxt is not None else 0
        return AdmitOp(first, tail_from, tail_shift, tuple((np.asarray(offsets, dtype=np.int64) + first).tolist()))

    def admit(
        self, rng: Range, offsets: IntArray | None = None, preferred_first: int | None = None
    ) -> AdmitOp:
        op = self.plan_admit(rng, offsets, preferred_first)
        if op.tail_shift:
            tail = np.arange(self.length) >= rng.end
            self._pos[tail & self._resident] += op.tail_shift
            self.next_pos += op.tail_shift
        self._resident[rng.start : rng.end] = True
        self._count += len(rng)  # none of them was resident (plan_admit checked)
        self._pos[rng.start : rng.end] = np.asarray(op.positions, dtype=np.int64)
        self.next_pos = max(self.next_pos, op.positions[-1] + 1)
        return op
