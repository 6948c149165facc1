"""plan_hot_set: exact partitions, degrade paths, validation errors and hypothesis properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvres.policy import (
    Block,
    BlockFlag,
    Capabilities,
    PlanInput,
    Range,
    StreamPolicy,
    plan_hot_set,
    split_into_blocks,
)

FULL = Capabilities(remove_middle=True, position_shift=True)


def blocks_of(n_tokens: int, size: int = 16) -> list[Block]:
    return [
        Block(b.range, last_used=i) for i, b in enumerate(split_into_blocks([Range(0, n_tokens)], size))
    ]


def starts(blocks: list[Block]) -> list[int]:
    return [b.range.start for b in blocks]


def test_under_budget_keeps_everything() -> None:
    plan = plan_hot_set(PlanInput(blocks_of(100), 100, capabilities=FULL))
    assert plan.evict_cold == [] and plan.hot_tokens == 100 and not plan.over_budget


def test_recency_evicts_least_recently_used_first() -> None:
    blocks = blocks_of(64)  # 4 blocks, last_used 0..3
    blocks[0] = Block(blocks[0].range, last_used=10)  # block 0 touched most recently
    plan = plan_hot_set(PlanInput(blocks, 32, capabilities=FULL))
    assert starts(plan.evict_cold) == [16, 32]
    assert starts(plan.keep_hot) == [0, 48]
    assert plan.hot_tokens == 32


def test_streaming_partition_keeps_sinks_and_recent() -> None:
    policy = StreamPolicy(True, sink_tokens=4, recent_tokens=32)
    plan = plan_hot_set(PlanInput(blocks_of(256), 96, policy, FULL))
    assert starts(plan.keep_hot) == [0, 176, 192, 208, 224, 240]
    assert plan.hot_tokens == 96 and plan.rebase_positions
    assert starts(plan.evict_cold) == list(range(16, 176, 16))


def test_streaming_needs_remove_middle_and_position_shift() -> None:
    policy = StreamPolicy(True, 4, 32)
    for missing in ("remove_middle", "position_shift"):
        plan = plan_hot_set(PlanInput(blocks_of(256), 96, policy, FULL.without(missing)))
        assert plan.is_noop and plan.over_budget
        assert any(missing in d and "no-op" in d for d in plan.diagnostics)


def test_eviction_without_remove_middle_is_a_noop_with_diagnostic() -> None:
    plan = plan_hot_set(PlanInput(blocks_of(64), 16, capabilities=Capabilities()))
    assert plan.is_noop and plan.over_budget and "remove_middle" in plan.diagnostics[0]


def test_scored_eviction_lowest_score_first_within_class() -> None:
    blocks = blocks_of(64)
    plan = plan_hot_set(PlanInput(blocks, 32, capabilities=FULL, scores=[0.9, 0.1, 0.5, 0.2]))
    assert starts(plan.evict_cold) == [16, 48]
    pinned = [Block(blocks[0].range, BlockFlag.PINNED)] + blocks[1:]
    plan = plan_hot_set(PlanInput(pinned, 48, capabilities=FULL, scores=[0.0, 0.1, 0.5, 0.2]))
    assert starts(plan.evict_cold) == [16]  # block 0 scores lowest but is pinned


def test_protected_over_budget_is_reported_not_broken() -> None:
    blocks = [Block(b.range, flags=BlockFlag.PINNED, last_used=b.last_used) for b in blocks_of(48)]
    blocks.append(Block(Range(48, 64), last_used=0))
    plan = plan_hot_set(PlanInput(blocks, 32, capabilities=FULL))
    assert starts(plan.evict_cold) == [48]
    assert plan.over_budget and plan.protected_tokens == 48
    assert any("protected" in d for d in plan.diagnostics)


@pytest.mark.parametrize(
    ("blocks", "budget", "scores", "message"),
    [
        ([Block(Range(0, 10)), Block(Range(5, 15))], 10, None, r"overlap: \[0, 10\) and \[5, 15\)"),
        (blocks_of(32), -1, None, "budget_tokens must be >= 0, got -1"),
        (blocks_of(32), 16, [1.0], "scores has 1 entries but there are 2 blocks"),
        (blocks_of(32), 16, [1.0, float("nan")], "finite"),
    ],
)
def test_bad_input_raises_value_error_naming_values(blocks, budget, scores, message) -> None:
    with pytest.raises(ValueError, match=message):
        plan_hot_set(PlanInput(blocks, budget, capabilities=FULL, scores=scores))


def test_range_and_block_validation() -> None:
    with pytest.raises(ValueError, match="end must be >= start"):
        Range(5, 3)
    with pytest.raises(ValueError, match=">= 0"):
        Range(-1, 3)
    with pytest.raises(ValueError, match="empty"):
        Block(Range(3, 3))
    with pytest.raises(ValueError, match="sink_tokens"):
        StreamPolicy(True, -1, 4)


# -- properties ---------------------------------------------------------------------------

@st.composite
def plan_inputs(draw: st.DrawFn) -> PlanInput:
    sizes = draw(st.lists(st.integers(1, 40), min_size=0, max_size=40))
    blocks, pos = [], 0
    for size in sizes:
        pos += draw(st.integers(0, 3))  # gaps allowed
        flags = draw(st.sampled_from([BlockFlag.NONE] * 4 + list(BlockFlag)[1:]))
        blocks.append(
            Block(Range(pos, pos + size), flags, last_used=draw(st.integers(0, 50)))
        )
        pos += size
    with_scores = draw(st.booleans())
    scores = (
        draw(st.lists(st.floats(0, 10), min_size=len(blocks), max_size=len(blocks)))
        if with_scores else None
    )
    stream = StreamPolicy(draw(st.booleans()), draw(st.integers(0, 20)), draw(st.integers(0, 60)))
    caps = Capabilities(remove_middle=draw(st.booleans()), position_shift=draw(st.booleans()))
    return PlanInput(blocks, draw(st.integers(0, sum(sizes) + 10)), stream, caps, scores)


@settings(max_examples=300, deadline=None)
@given(plan_inputs())
def test_keep_and_evict_partition_the_input(inp: PlanInput) -> None:
    plan = plan_hot_set(inp)
    kept, evicted = [b.range for b in plan.keep_hot], [b.range for b in plan.evict_cold]
    assert sorted(kept + evicted) == sorted(b.range for b in inp.blocks)
    assert len(set(kept) & set(evicted)) == 0
    assert plan.hot_tokens == sum(len(r) for r in kept)
    assert plan.over_budget == (plan.hot_tokens > inp.budget_tokens)


@settings(max_examples=300, deadline=None)
@given(plan_inputs())
def test_protected_blocks_are_never_evicted(inp: PlanInput) -> None:
    plan = plan_hot_set(inp)
    assert not any(b.protected for b in plan.evict_cold)
    if inp.stream_policy.enabled and plan.evict_cold:
        ordered = sorted(b.range for b in inp.blocks)
        assert ordered[0] not in {b.range for b in plan.evict_cold} or inp.stream_policy.sink_tokens == 0
        assert ordered[-1] not in {b.range for b in plan.evict_cold} or inp.stream_policy.recent_tokens == 0


@settings(max_examples=300, deadline=None)
@given(plan_inputs())
def test_no_or_equal_scores_equal_recency_planning(inp: PlanInput) -> None:
    unscored = PlanInput(inp.blocks, inp.budget_tokens, inp.stream_policy, inp.capabilities, None)
    flat = PlanInput(inp.blocks, inp.budget_tokens, inp.stream_policy, inp.capabilities,
                     [1.0] * len(inp.blocks))
    a, b = plan_hot_set(unscored), plan_hot_set(flat)
    assert a.evict_cold == b.evict_cold and a.keep_hot == b.keep_hot


def test_62500_blocks_plan_fast_enough_to_be_vectorised() -> None:
    """Not a timing test: checks the result on the 1M-token shape the benchmark times."""
    blocks = blocks_of(1_000_000)
    scores = np.random.default_rng(0).random(len(blocks))
    plan = plan_hot_set(PlanInput(blocks, 250_000, StreamPolicy(True, 4, 4096), FULL, scores))
    assert len(blocks) == 62_500
    assert plan.hot_tokens <= 250_000 and plan.hot_tokens > 250_000 - 16


def test_streaming_can_keep_position_gaps() -> None:
    gaps = plan_hot_set(PlanInput(blocks_of(256), 96, StreamPolicy(True, 4, 32, rebase=False), FULL))
    rebased = plan_hot_set(PlanInput(blocks_of(256), 96, StreamPolicy(True, 4, 32), FULL))
    assert gaps.evict_cold == rebased.evict_cold
    assert rebased.rebase_positions and not gaps.rebase_positions
