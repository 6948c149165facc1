"""The pure side of a recall turn: where an exchange puts every token, which cold blocks a plan
over resident and cold blocks brings back, and the array helpers the backend uses for it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvres.policy import RangeError
from kvres.policy.positions import PositionMap
from kvres.policy.ranges import Range, merge_ranges
from kvres.policy.recall import choose_recalls, exchange_layout, union_ranges
from kvres.policy.scoring import block_scores, span_scores


def _evicted_map(n: int, evicted: list[Range], rebase: bool) -> PositionMap:
    m = PositionMap()
    m.append(n)
    for rng in sorted(evicted, reverse=True):
        m.evict(rng, rebase)
    return m


def test_gap_keeping_exchange_puts_blocks_back_where_they_were() -> None:
    m = _evicted_map(40, [Range(8, 16), Range(24, 32)], rebase=False)
    layout = exchange_layout(m, [Range(0, 4)], [(Range(8, 16), list(range(8, 16)))], rebase=False)
    assert layout.positions[:4].tolist() == [-1] * 4  # evicted, not moved
    assert layout.positions[4:16].tolist() == list(range(4, 16))
    assert layout.positions[24:32].tolist() == [-1] * 8  # left cold
    assert layout.positions[32:].tolist() == list(range(32, 40)) and layout.next_pos == 40
    m.relayout(layout.resident, layout.positions, layout.next_pos)
    assert m.resident_ranges() == [Range(4, 24), Range(32, 40)]


def test_rebased_exchange_compacts_like_neighbours() -> None:
    m = _evicted_map(40, [Range(8, 16), Range(24, 32)], rebase=True)
    assert m.all_positions()[32] == 16  # the gaps were closed
    layout = exchange_layout(m, [Range(16, 20)], [(Range(24, 32), list(range(8, 16)))], rebase=True)
    kept = np.nonzero(layout.resident)[0]
    assert layout.positions[kept].tolist() == list(range(kept.size)) and layout.next_pos == kept.size
    assert layout.positions[24] == 12  # right after tokens 0..7 and 20..23


def test_exchange_refuses_collisions_and_overlaps() -> None:
    m = _evicted_map(20, [Range(4, 8)], rebase=True)  # tokens 8.. now sit at 4..
    with pytest.raises(RangeError, match="collide"):
        exchange_layout(m, [], [(Range(4, 8), [4, 5, 6, 7])], rebase=False)
    with pytest.raises(RangeError, match="overlaps"):
        exchange_layout(m, [], [(Range(2, 6), [2, 3, 4, 5])], rebase=True)
    with pytest.raises(RangeError, match="positions for"):
        exchange_layout(m, [], [(Range(4, 8), [4, 5])], rebase=True)
    with pytest.raises(RangeError):
        exchange_layout(m, [Range(4, 8)], [], rebase=True)  # not resident


def test_relayout_checks_its_input() -> None:
    m = PositionMap()
    m.append(4)
    with pytest.raises(RangeError, match="one entry per token"):
        m.relayout([True] * 3, [0, 1, 2], 3)
    with pytest.raises(RangeError, match="increase strictly"):
        m.relayout([True] * 4, [0, 2, 1, 3], 4)
    with pytest.raises(RangeError, match="next_pos"):
        m.relayout([True] * 4, [0, 1, 2, 3], 3)


def test_choose_recalls_brings_back_what_the_plan_kept_whole() -> None:
    resident = [Range(0, 8), Range(24, 32)]
    cold = [Range(8, 12), Range(12, 16), Range(16, 24)]
    dropped = [Range(4, 8), Range(14, 15), Range(24, 28)]
    choice = choose_recalls(resident, cold, [1.0, 2.0, 3.0], dropped, room=100)
    assert choice.imports == (0, 2)  # the middle block lost one token in the plan: it stays cold
    assert choice.evict == (Range(4, 8), Range(24, 28))


def test_choose_recalls_leaves_the_lowest_scores_cold_when_room_is_short() -> None:
    cold = [Range(0, 4), Range(4, 8), Range(8, 12)]
    choice = choose_recalls([Range(12, 16)], cold, [0.5, 0.1, 0.9], [], room=8)
    assert choice.imports == (0, 2) and choice.evict == ()
    assert choose_recalls([Range(12, 16)], cold, [0.5, 0.1, 0.9], [Range(12, 14)], room=6).imports == (0, 2)
    assert choose_recalls([Range(12, 16)], cold, [0.5, 0.1, 0.9], [Range(12, 14)], room=2).imports == (2,)
    with pytest.raises(ValueError, match="scores"):
        choose_recalls([], cold, [1.0], [], room=0)


def test_union_and_span_scores_agree_with_their_range_versions() -> None:
    rng = random.Random(0)
    for _ in range(200):
        ranges = [Range(a, a + rng.randint(0, 5)) for a in (rng.randint(0, 40) for _ in range(rng.randint(0, 9)))]
        assert union_ranges(ranges) == merge_ranges(ranges)
    keys = np.arange(0, 30)
    scores = np.linspace(0.0, 1.0, 30)
    blocks = [Range(0, 4), Range(10, 12), Range(20, 30)]
    starts, ends = np.array([b.start for b in blocks]), np.array([b.end for b in blocks])
    assert np.allclose(span_scores(scores, keys, starts, ends), block_scores(scores, keys, blocks))


@pytest.mark.parametrize("shift", [True, False])
def test_a_turn_on_a_cache_that_cannot_shift_keeps_the_token_before_it(shift: bool) -> None:
    """Resident: sinks [0, 4) and [200, 300); cold: [100, 200); a 64-token turn at [300, 364) with a
    recent window of 32 (the turn alone fills it). The turn's attention favours the cold block
    over [264, 300), so the plan brings it back and drops the tail before the turn, which a cache
    that can shift may do; one that cannot must keep the token the turn is decoded after."""
    from kvres.policy.capabilities import Capabilities
    from kvres.policy.planner import StreamPolicy
    from kvres.policy.recall import plan_recall

    positions = np.arange(364)
    scores = np.full(364, 1.0)
    scores[100:200] = 5.0  # the cold block
    scores[264:300] = 0.0  # the tail before the turn, least attended
    caps = Capabilities(remove_middle=True, position_shift=shift, attention_capture=True, kv_export=True)
    choice = plan_recall(
        [Range(0, 4), Range(200, 300)], np.array([[100, 200]]), Range(300, 364), scores, positions,
        StreamPolicy(True, 4, 32, rebase=shift), 8, 4 + 100 + 64 + 64, caps, room=1000,
    )
    assert choice.imports == (0,)
    dropped = union_ranges(list(choice.evict))
    assert sum(len(r) for r in dropped) >= 36  # 268 tokens to the budget of 232
    assert any(r.end == 300 for r in dropped) == shift
