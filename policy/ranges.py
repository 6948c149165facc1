"""Token ranges.

Primitives:
- ``Range(start, end)``: a half-open interval ``[start, end)`` of token positions, validated.
- ``merge_ranges(ranges)``: sorted, coalesced union of ranges.
- ``subtract_range(ranges, cut)``: the ranges with ``cut`` removed.
- ``IntArray``: the numpy type of position columns (int64).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, order=True)
class Range:
    """Half-open token interval ``[start, end)``; empty when ``start == end``."""

    start: int
    end: int

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Range.{name} must be an int, got {value!r}")
        if self.start < 0:
            raise ValueError(f"Range.start must be >= 0, got {self.start}")
        if self.end < self.start:
            raise ValueError(f"Range.end must be >= start, got [{self.start}, {self.end})")

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def empty(self) -> bool:
        return self.end == self.start

    def overlaps(self, other: Range) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"


def merge_ranges(ranges: Iterable[Range]) -> list[Range]:
    """Sorted union of ``ranges`` with touching or overlapping ranges coalesced; empties dropped."""
    merged: list[Range] = []
    for r in sorted(r for r in ranges if not r.empty):
        if merged and r.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Range(last.start, max(last.end, r.end))
        else:
            merged.append(r)
    return merged


def subtract_range(ranges: Iterable[Range], cut: Range) -> list[Range]:
    """The union of ``ranges`` with ``cut`` removed, merged and sorted."""
    out: list[Range] = []
    for r in merge_ranges(ranges):
        if not r.overlaps(cut):
            out.append(r)
            continue
        if r.start < cut.start:
            out.append(Range(r.start, cut.start))
        if cut.end < r.end:
            out.append(Range(cut.end, r.end))
    return out
