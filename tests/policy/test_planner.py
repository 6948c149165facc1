"""plan_hot_set: exact partitions, degrade paths, validation errors and hypothesis properties; its
fast paths (partial selection, plans straight from ranges) against a plain sort."""

from __future__ import annotations

import contextlib

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
    merge_ranges,
    plan_hot_set,
    split_into_blocks,
)
from kvres.policy import planner as planner_module
from kvres.policy.blocks import BlockTable
from kvres.policy.planner import missing_capabilities, plan_streaming
from tests.hypothesis_profiles import examples

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


def test_a_plan_that_keeps_gaps_needs_no_position_shift() -> None:
    """rebase=False moves no cell: a backend that cannot shift (a quantized K cache) still runs
    streaming and scored plans; rebase=True there is the no-op naming position_shift."""
    no_shift = FULL.without("position_shift")
    gaps = StreamPolicy(True, 4, 32, rebase=False)
    plan = plan_hot_set(PlanInput(blocks_of(256), 96, gaps, no_shift))
    assert plan.hot_tokens == 96 and not plan.over_budget and not plan.rebase_positions
    assert plan.evict_cold == plan_hot_set(PlanInput(blocks_of(256), 96, gaps, FULL)).evict_cold
    scored = plan_hot_set(PlanInput(blocks_of(256), 96, gaps, no_shift, scores=list(range(16, 0, -1))))
    assert scored.hot_tokens == 96 and starts(scored.evict_cold) == list(range(64, 224, 16))
    rebased = plan_hot_set(PlanInput(blocks_of(256), 96, StreamPolicy(True, 4, 32), no_shift))
    assert rebased.is_noop and rebased.over_budget
    assert rebased.diagnostics == ["streaming policy with rebase=True needs position_shift; backend "
                                   "lacks it: no-op plan"]
    assert missing_capabilities(gaps, no_shift) == ()
    assert missing_capabilities(StreamPolicy(True, 4, 32), no_shift) == ("position_shift",)
    assert missing_capabilities(gaps, Capabilities()) == ("remove_middle",)
    assert missing_capabilities(StreamPolicy(), Capabilities()) == ()  # not streaming: nothing asked


def test_without_position_shift_the_newest_block_stays() -> None:
    """With no recent window the newest block would go first by score; a backend that cannot
    shift keeps it, since the next token must follow the last cell."""
    gaps = StreamPolicy(True, 0, 0, rebase=False)
    scores = [1.0, 1.0, 1.0, 0.0]  # the newest block scores lowest
    shifting = plan_hot_set(PlanInput(blocks_of(64), 48, gaps, FULL, scores=scores))
    assert starts(shifting.evict_cold) == [48]
    kept_tail = plan_hot_set(PlanInput(blocks_of(64), 48, gaps, FULL.without("position_shift"), scores=scores))
    assert starts(kept_tail.evict_cold) == [0] and kept_tail.protected_tokens == 16
    fast = plan_streaming([Range(0, 64)], 16, 48, gaps, scores, capabilities=FULL.without("position_shift"))
    assert fast.evict_ranges == (Range(0, 16),)
    lru = plan_hot_set(PlanInput(blocks_of(64)[::-1], 16, capabilities=FULL.without("position_shift")))
    assert starts(lru.keep_hot) == [48]  # not streaming either: the newest block by position stays


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
    stream = StreamPolicy(draw(st.booleans()), draw(st.integers(0, 20)), draw(st.integers(0, 60)),
                          rebase=draw(st.booleans()))
    caps = Capabilities(remove_middle=draw(st.booleans()), position_shift=draw(st.booleans()))
    return PlanInput(blocks, draw(st.integers(0, sum(sizes) + 10)), stream, caps, scores)


@settings(max_examples=examples(300), deadline=None)
@given(plan_inputs())
def test_keep_and_evict_partition_the_input(inp: PlanInput) -> None:
    plan = plan_hot_set(inp)
    kept, evicted = [b.range for b in plan.keep_hot], [b.range for b in plan.evict_cold]
    assert sorted(kept + evicted) == sorted(b.range for b in inp.blocks)
    assert len(set(kept) & set(evicted)) == 0
    assert plan.hot_tokens == sum(len(r) for r in kept)
    assert plan.over_budget == (plan.hot_tokens > inp.budget_tokens)


@settings(max_examples=examples(300), deadline=None)
@given(plan_inputs())
def test_protected_blocks_are_never_evicted(inp: PlanInput) -> None:
    plan = plan_hot_set(inp)
    assert not any(b.protected for b in plan.evict_cold)
    if inp.stream_policy.enabled and plan.evict_cold:
        ordered = sorted(b.range for b in inp.blocks)
        assert ordered[0] not in {b.range for b in plan.evict_cold} or inp.stream_policy.sink_tokens == 0
        assert ordered[-1] not in {b.range for b in plan.evict_cold} or (
            inp.stream_policy.recent_tokens == 0 and inp.capabilities.position_shift)
    if not inp.capabilities.position_shift and inp.blocks:  # the next token follows the last cell
        assert max(b.range for b in inp.blocks) not in {b.range for b in plan.evict_cold}


@settings(max_examples=examples(300), deadline=None)
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


# -- the fast paths against a plain sort ---------------------------------------------------

def sorted_plan(inp: PlanInput) -> tuple[set[Range], bool]:
    """What the planner promises, computed the slow, obvious way: sort every unprotected block
    by (score, recency, position) and evict the shortest prefix that covers the excess."""
    blocks = list(inp.blocks)
    total = sum(b.tokens for b in blocks)
    caps, policy = inp.capabilities, inp.stream_policy
    protected = [b.protected for b in blocks]
    if policy.enabled:
        if not caps.remove_middle or (policy.rebase and not caps.position_shift):
            return set(), total > inp.budget_tokens
        before = 0
        for i in sorted(range(len(blocks)), key=lambda i: blocks[i].range.start):
            after = total - before - blocks[i].tokens
            protected[i] |= before < policy.sink_tokens or after < policy.recent_tokens
            before += blocks[i].tokens
    if blocks and caps.remove_middle and not caps.position_shift:
        protected[max(range(len(blocks)), key=lambda i: blocks[i].range.start)] = True
    if total <= inp.budget_tokens or not caps.remove_middle:
        return set(), total > inp.budget_tokens
    scores = list(inp.scores) if inp.scores is not None else [0.0] * len(blocks)

    def key(i: int) -> tuple[float, int, int]:
        b = blocks[i]
        return scores[i], b.range.start if policy.enabled else b.last_used, b.range.start

    evicted, freed, need = set(), 0, total - inp.budget_tokens
    for i in sorted((i for i in range(len(blocks)) if not protected[i]), key=key):
        if freed >= need:
            break
        evicted.add(blocks[i].range)
        freed += blocks[i].tokens
    return evicted, total - freed > inp.budget_tokens


@contextlib.contextmanager
def quickselect_everywhere():
    """Plan even tiny inputs by partitioning (normally only pools over 256 blocks are)."""
    saved = planner_module._SORT_BELOW
    planner_module._SORT_BELOW = 0
    try:
        yield
    finally:
        planner_module._SORT_BELOW = saved


@st.composite
def tied_plan_inputs(draw: st.DrawFn) -> PlanInput:
    """Like plan_inputs, with few distinct scores and stamps (ties everywhere) and unsorted blocks."""
    inp = draw(plan_inputs())
    blocks = [Block(b.range, b.flags, last_used=draw(st.integers(0, 3))) for b in inp.blocks]
    scores = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=len(blocks), max_size=len(blocks)))
    order = draw(st.permutations(range(len(blocks))))
    return PlanInput([blocks[i] for i in order], inp.budget_tokens, inp.stream_policy, inp.capabilities,
                     [scores[i] for i in order] if draw(st.booleans()) else None)


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(plan_inputs(), tied_plan_inputs()))
def test_plan_evicts_exactly_the_sorted_prefix(inp: PlanInput) -> None:
    expected = sorted_plan(inp)
    plan = plan_hot_set(inp)
    assert ({b.range for b in plan.evict_cold}, plan.over_budget) == expected
    assert [b.range for b in plan.evict_cold] == sorted(b.range for b in plan.evict_cold)
    with quickselect_everywhere():
        plan = plan_hot_set(inp)
    assert ({b.range for b in plan.evict_cold}, plan.over_budget) == expected


def test_quickselect_on_many_tied_blocks_of_uneven_length() -> None:
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 17, 5_000)
    starts = np.cumsum(lengths + rng.integers(0, 3, 5_000)) - lengths
    blocks = [Block(Range(int(s), int(s + n)), last_used=int(u))
              for s, n, u in zip(starts, lengths, rng.integers(0, 5, 5_000), strict=True)]
    scores = rng.integers(0, 20, 5_000).astype(float)
    for policy in (StreamPolicy(), StreamPolicy(True, 4, 64)):
        for with_scores in (scores, None):
            inp = PlanInput(blocks, int(lengths.sum()) // 3, policy, FULL, with_scores)
            assert {b.range for b in plan_hot_set(inp).evict_cold} == sorted_plan(inp)[0]


@st.composite
def streaming_sessions(draw: st.DrawFn) -> tuple[list[Range], int, int, StreamPolicy]:
    ranges, pos = [], 0
    for size in draw(st.lists(st.integers(1, 70), max_size=12)):
        pos += draw(st.integers(0, 20))
        ranges.append(Range(pos, pos + size))
        pos += size
    total = sum(len(r) for r in ranges)
    policy = StreamPolicy(True, draw(st.integers(0, 40)), draw(st.integers(0, 90)), draw(st.booleans()))
    return ranges, draw(st.sampled_from([1, 4, 16, 32])), draw(st.integers(0, total + 8)), policy


@settings(max_examples=examples(300), deadline=None)
@given(streaming_sessions(), st.data())
def test_plan_streaming_is_plan_hot_set_from_ranges(case, data) -> None:
    ranges, block_size, budget, policy = case
    table = BlockTable.from_ranges(ranges, block_size)
    scores = data.draw(st.none() | st.lists(st.sampled_from([0.0, 0.25, 1.0, 3.5]), min_size=len(table),
                                            max_size=len(table)))
    caps = data.draw(st.sampled_from([None, FULL, FULL.without("position_shift"), FULL.without("remove_middle")]))
    plan = plan_hot_set(PlanInput(table, budget, policy, caps or FULL, scores))
    fast = plan_streaming(ranges, block_size, budget, policy, scores, capabilities=caps)
    assert list(fast.evict_ranges) == plan.evict_ranges
    assert (fast.hot_tokens, fast.protected_tokens, fast.over_budget) == (
        plan.hot_tokens, plan.protected_tokens, plan.over_budget)
    assert list(fast.diagnostics) == plan.diagnostics
    assert merge_ranges(fast.kept_ranges) == merge_ranges(b.range for b in plan.keep_hot)
    kept = BlockTable.from_ranges(fast.kept_ranges, block_size)  # kept ranges cut into the kept blocks
    assert kept.to_blocks() == [Block(b.range, last_used=i) for i, b in enumerate(plan.keep_hot)]
    if scores is not None:
        assert list(fast.kept_scores or ()) == [scores[int(i)] for i in plan.keep_index]


def test_plan_streaming_bad_input() -> None:
    policy = StreamPolicy(True, 4, 32)
    with pytest.raises(ValueError, match="sorted and disjoint"):
        plan_streaming([Range(10, 20), Range(0, 12)], 16, 8, policy)
    with pytest.raises(ValueError, match="budget_tokens must be >= 0, got -3"):
        plan_streaming([Range(0, 20)], 16, -3, policy)
    with pytest.raises(ValueError, match="block_size must be > 0, got 0"):
        plan_streaming([Range(0, 20)], 0, 8, policy)
    with pytest.raises(ValueError, match="scores has 1 entries but there are 2 blocks"):
        plan_streaming([Range(0, 20)], 16, 8, policy, [1.0])
    with pytest.raises(ValueError, match="finite, got nan for block 1"):
        plan_streaming([Range(0, 20)], 16, 8, policy, [1.0, float("nan")])


@settings(max_examples=examples(200), deadline=None)
@given(streaming_sessions())
def test_block_table_from_ranges_cuts_like_split_into_blocks(case) -> None:
    ranges, block_size, _, _ = case
    table = BlockTable.from_ranges(ranges, block_size)
    assert [b.range for b in table.to_blocks()] == [b.range for b in split_into_blocks(ranges, block_size)]
    assert table.last_used.tolist() == list(range(len(table)))
