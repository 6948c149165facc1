"""Blocks: the planner's unit of residency.

Primitives:
- ``BlockFlag``: PINNED, SINK, RECENT, RETRIEVED (``PROTECTED`` = the ones never evicted).
- ``Block(range, flags, last_used)``.
- ``BlockTable``: the same blocks as numpy columns, for sessions with many thousands of blocks;
  ``BlockTable.from_blocks(blocks)``, ``BlockTable.uniform(span, block_size)``,
  ``BlockTable.from_ranges(ranges, block_size)`` (one vectorised pass), ``table[i]``,
  ``table.take(index)``.
- ``split_into_blocks(ranges, block_size)``: cut resident ranges into block-aligned blocks.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .ranges import IntArray, Range


class BlockFlag(enum.IntFlag):
    NONE = 0
    PINNED = 1
    SINK = 2
    RECENT = 4
    RETRIEVED = 8


PROTECTED_FLAGS = BlockFlag.PINNED | BlockFlag.SINK | BlockFlag.RECENT


@dataclass(frozen=True)
class Block:
    range: Range
    flags: BlockFlag = BlockFlag.NONE
    last_used: int = 0

    def __post_init__(self) -> None:
        if self.range.empty:
            raise ValueError(f"Block.range must not be empty, got {self.range}")

    @property
    def tokens(self) -> int:
        return len(self.range)

    @property
    def protected(self) -> bool:
        return bool(self.flags & PROTECTED_FLAGS)


@dataclass(frozen=True)
class BlockTable:
    """Blocks as columns: what the planner works on, without one Python object per block."""

    starts: IntArray
    ends: IntArray
    flags: IntArray
    last_used: IntArray

    def __post_init__(self) -> None:
        n = self.starts.shape[0]
        for name in ("ends", "flags", "last_used"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"BlockTable.{name} has shape {getattr(self, name).shape}, expected ({n},)")
        bad = np.nonzero((self.starts < 0) | (self.ends <= self.starts))[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"BlockTable row {i} has invalid range [{self.starts[i]}, {self.ends[i]})")

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def __getitem__(self, i: int) -> Block:
        return Block(
            Range(int(self.starts[i]), int(self.ends[i])),
            BlockFlag(int(self.flags[i])), int(self.last_used[i]),
        )

    def to_blocks(self, index: Iterable[int] | None = None) -> list[Block]:
        return [self[int(i)] for i in (range(len(self)) if index is None else index)]

    @classmethod
    def from_blocks(cls, blocks: Sequence[Block]) -> BlockTable:
        n = len(blocks)

        def column(values: Iterable[int]) -> IntArray:
            return np.fromiter(values, dtype=np.int64, count=n)

        return cls(
            column(b.range.start for b in blocks), column(b.range.end for b in blocks),
            column(int(b.flags) for b in blocks),
            column(b.last_used for b in blocks),
        )

    @classmethod
    def uniform(cls, span: Range, block_size: int) -> BlockTable:
        """``span`` cut at multiples of ``block_size``; block i was last used at time i."""
        return cls.from_ranges([span], block_size)

    @classmethod
    def from_ranges(cls, ranges: Sequence[Range], block_size: int) -> BlockTable:
        """Every range of ``ranges`` (sorted, disjoint) cut at multiples of ``block_size``, in one
        vectorised pass; block i was last used at time i."""
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        live = [r for r in ranges if r.end > r.start]
        if len(live) == 1:  # the common case, without the per-range bookkeeping
            first = live[0].start // block_size
            cell = np.arange(first, (live[0].end - 1) // block_size + 1, dtype=np.int64)
            starts = cell * block_size
            starts[0] = live[0].start
            ends = starts + block_size - starts % block_size
            ends[-1] = live[0].end
        else:
            lo = np.fromiter((r.start for r in live), dtype=np.int64, count=len(live))
            hi = np.fromiter((r.end for r in live), dtype=np.int64, count=len(live))
            counts = (hi - 1) // block_size - lo // block_size + 1
            row = np.repeat(np.arange(len(live)), counts)
            cell = (lo // block_size)[row] + np.arange(row.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)
            starts = np.maximum(cell * block_size, lo[row])
            ends = np.minimum((cell + 1) * block_size, hi[row])
        n = starts.shape[0]
        return cls._trusted(starts, ends, np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64))

    @classmethod
    def _trusted(cls, starts: IntArray, ends: IntArray, flags: IntArray, last_used: IntArray) -> BlockTable:
        """A table whose columns are valid by construction (cut from ranges, or rows of a valid
        table): skips the checks, which cost as much as planning a small session."""
        table = object.__new__(cls)
        table.__dict__.update(starts=starts, ends=ends, flags=flags, last_used=last_used)
        return table

    def take(self, index: IntArray) -> BlockTable:
        """The rows at ``index``, in that order."""
        return BlockTable._trusted(self.starts[index], self.ends[index], self.flags[index], self.last_used[index])

def split_into_blocks(
    ranges: Iterable[Range],
    block_size: int,
    *,
    last_used: int = 0,
) -> list[Block]:
    """Cut ``ranges`` into blocks whose boundaries are multiples of ``block_size``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    blocks: list[Block] = []
    for r in sorted(ranges):
        start = r.start
        while start < r.end:
            end = min(r.end, (start // block_size + 1) * block_size)
            blocks.append(Block(Range(start, end), last_used=last_used))
            start = end
    return blocks
