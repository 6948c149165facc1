"""PositionMap: the shared token-log -> cache-position rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvres.policy import Range, RangeError
from kvres.policy.positions import PositionMap
from tests.hypothesis_profiles import examples


def make(n: int) -> PositionMap:
    m = PositionMap()
    m.append(n)
    return m


def test_evict_with_and_without_rebase() -> None:
    m = make(10)
    op = m.evict(Range(2, 5), rebase=False)
    assert (op.p0, op.p1, op.shift) == (2, 5, 0)
    assert m.all_positions().tolist() == [0, 1, -1, -1, -1, 5, 6, 7, 8, 9]
    op = m.evict(Range(6, 8), rebase=True)
    assert (op.p0, op.p1, op.shift) == (6, 8, -2)
    assert m.all_positions().tolist() == [0, 1, -1, -1, -1, 5, -1, -1, 6, 7]
    assert m.append(1) == 8
    assert m.resident_ranges() == [Range(0, 2), Range(5, 6), Range(8, 11)]


def test_admit_after_rebase_shifts_the_tail_back() -> None:
    m = make(10)
    m.evict(Range(3, 6), rebase=True)
    op = m.admit(Range(3, 6))
    assert (op.first_position, op.tail_from, op.tail_shift) == (3, 3, 3)
    assert m.all_positions().tolist() == list(range(10))
    assert m.next_pos == 10


def test_admit_into_gap_needs_no_shift() -> None:
    m = make(10)
    m.evict(Range(3, 6), rebase=False)
    op = m.admit(Range(3, 6))
    assert op.tail_shift == 0 and m.all_positions().tolist() == list(range(10))


def test_admit_leading_range_and_tail() -> None:
    m = make(10)
    m.evict(Range(0, 4), rebase=True)
    op = m.admit(Range(0, 4))
    assert op.tail_shift == 4 and m.all_positions().tolist() == list(range(10))
    m.evict(Range(7, 10), rebase=True)
    m.admit(Range(7, 10))
    assert m.all_positions().tolist() == list(range(10)) and m.next_pos == 10


def test_checks_raise_range_error() -> None:
    m = make(10)
    with pytest.raises(RangeError, match="outside the session's token log of 10"):
        m.evict(Range(5, 12), rebase=False)
    with pytest.raises(RangeError, match="not fully evicted"):
        m.admit(Range(1, 2))
    m.evict(Range(1, 3), rebase=False)
    with pytest.raises(RangeError, match="token 2 is evicted"):
        m.positions(Range(2, 4))
    with pytest.raises(RangeError, match="increase strictly"):
        m.admit(Range(1, 3), np.array([0, 0]))


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "extend", "evict", "admit", "relayout", "copy"]),
                          st.integers(0, 40), st.integers(1, 12), st.booleans()), max_size=30))
def test_resident_count_follows_every_change(ops: list[tuple[str, int, int, bool]]) -> None:
    """The resident count an executor reads every step is kept with each change, not summed:
    after any run of changes it is what the resident mask says."""
    m = PositionMap()
    for op, at, n, flag in ops:
        ranges = m.resident_ranges()
        if op == "append":
            m.append(n)
        elif op == "extend":
            m.extend_evicted(n)
        elif op == "evict" and ranges:
            r = ranges[at % len(ranges)]
            m.evict(Range(r.start, min(r.end, r.start + n)), rebase=flag)
        elif op == "admit":
            mask = m.resident_mask()
            gaps = [i for i in range(m.length) if not mask[i]]
            if gaps:
                start = gaps[at % len(gaps)]
                end = start
                while end < m.length and not mask[end] and end - start < n:
                    end += 1
                m.admit(Range(start, end))
        elif op == "relayout" and m.length:
            keep = np.arange(m.length) % 2 == (1 if flag else 0)
            m.relayout(keep, np.cumsum(keep) - 1, int(keep.sum()) + 1)
        elif op == "copy":
            m = m.copy()
        assert m.resident_count == int(m.resident_mask().sum())
