"""plan_backend: per-session budgets, idle sessions suspended first, then active ones shrunk; plans
straight from ranges equal to plans by blocks; scores kept across steps."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvres.policy import Capabilities, Range, StreamPolicy, backend_planner
from kvres.policy.backend_planner import BackendPlanInput, SessionView, plan_backend
from kvres.policy.planner import plan_streaming
from tests.hypothesis_profiles import examples

CAPS = Capabilities(remove_middle=True, position_shift=True)
STREAM = StreamPolicy(True, sink_tokens=4, recent_tokens=32)


def view(sid: str, n: int, last_used: int, **kw) -> SessionView:
    return SessionView(sid, (Range(0, n),), last_used, **kw)


def test_session_budget_with_room_for_incoming() -> None:
    s = view("a", 128, 1, active=True, incoming_tokens=16, budget_tokens=96,
             stream_policy=STREAM, evictable=True)
    plan = plan_backend(BackendPlanInput([s], 10_000, CAPS))
    assert [a.kind for a in plan.actions] == ["evict"]
    assert plan.actions[0].rebase
    assert plan.resident_after["a"] + 16 <= 96
    assert plan.actions[0].ranges[0].start == 16  # sinks kept


def test_idle_sessions_suspended_lru_first_before_active_eviction() -> None:
    sessions = [
        view("old", 100, 1), view("mid", 100, 2),
        view("me", 100, 3, active=True, incoming_tokens=20, evictable=True, stream_policy=STREAM),
    ]
    plan = plan_backend(BackendPlanInput(sessions, 230, CAPS))
    assert plan.suspended == ["old"]
    assert not plan.over_budget
    plan = plan_backend(BackendPlanInput(sessions, 100, CAPS))
    assert plan.suspended == ["old", "mid"]
    evicts = [a for a in plan.actions if a.kind == "evict"]
    assert evicts and evicts[0].session_id == "me"
    assert plan.resident_after["me"] + 20 <= 100


def test_unevictable_active_session_reports_over_budget() -> None:
    plan = plan_backend(BackendPlanInput([view("me", 100, 1, active=True, incoming_tokens=10)], 50, CAPS))
    assert plan.actions == [] and plan.over_budget
    assert "budget of 50" in plan.diagnostics[-1]


def test_gap_keeping_sessions_shrink_on_a_backend_that_cannot_shift() -> None:
    """A quantized K cache (no position_shift): rebase=False streaming and scored sessions are
    shrunk without re-basing; rebase=True ones get the no-op naming position_shift."""
    no_shift = CAPS.without("position_shift")
    gaps = StreamPolicy(True, sink_tokens=4, recent_tokens=32, rebase=False)
    for scores in (None, tuple(float(i % 3) for i in range(8))):
        s = view("a", 128, 1, active=True, incoming_tokens=16, budget_tokens=96, stream_policy=gaps,
                 evictable=True, scores=scores)
        plan = plan_backend(BackendPlanInput([s], 10_000, no_shift))
        assert [(a.kind, a.rebase) for a in plan.actions] == [("evict", False)]
        assert plan.resident_after["a"] + 16 <= 96 and not plan.over_budget
    rebased = view("a", 128, 1, active=True, incoming_tokens=16, budget_tokens=96, stream_policy=STREAM,
                   evictable=True)
    plan = plan_backend(BackendPlanInput([rebased], 10_000, no_shift))
    assert plan.actions == [] and any("needs position_shift" in d for d in plan.diagnostics)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="-1"):
        plan_backend(BackendPlanInput([], -1, CAPS))
    with pytest.raises(ValueError, match="unique"):
        plan_backend(BackendPlanInput([view("a", 1, 1), view("a", 2, 2)], 10, CAPS))


def test_a_scored_session_shrunk_twice_keeps_its_scores() -> None:
    """Step (1) brings the session under its own budget by score; step (3) shrinks it again for
    the backend and must still go by score, not fall back to recency."""
    scores = (9.0, 0.1, 9.0, 1.0, 0.2, 0.3, 9.0, 9.0)  # blocks of 16: 0 is a sink, 6-7 recent
    me = view("me", 128, 1, active=True, incoming_tokens=16, budget_tokens=96,
              stream_policy=STREAM, evictable=True, scores=scores)
    plan = plan_backend(BackendPlanInput([me], 80, CAPS))
    (action,) = plan.actions
    assert [(r.start, r.end) for r in action.ranges] == [(16, 32), (48, 64), (64, 80), (80, 96)]
    assert plan.resident_after["me"] == 64 and not plan.over_budget


@st.composite
def backends(draw: st.DrawFn) -> BackendPlanInput:
    views = []
    for i in range(draw(st.integers(1, 5))):
        ranges, pos = [], draw(st.integers(0, 8))
        for size in draw(st.lists(st.integers(1, 90), min_size=1, max_size=4)):
            ranges.append(Range(pos, pos + size))
            pos += size + draw(st.integers(0, 16))
        evictable = draw(st.booleans())
        views.append(SessionView(
            f"s{i}", tuple(ranges), draw(st.integers(0, 9)), active=draw(st.booleans()),
            incoming_tokens=draw(st.integers(0, 24)),
            budget_tokens=draw(st.integers(40, 200)) if evictable else None,
            stream_policy=StreamPolicy(evictable, draw(st.integers(0, 8)), draw(st.integers(0, 40))),
            evictable=evictable, block_size=draw(st.sampled_from([4, 16])),
        ))
    return BackendPlanInput(views, draw(st.integers(0, 600)), CAPS)


@settings(max_examples=examples(200), deadline=None)
@given(backends(), st.data())
def test_plans_from_ranges_equal_plans_from_blocks(inp: BackendPlanInput, data) -> None:
    """Three roads to one plan: plan_streaming on ranges without scores; with equal scores, which
    order blocks as recency does, in Python; and the same by plan_hot_set on blocks (numpy)."""
    flat = [SessionView(**{**v.__dict__, "scores": (1.0,) * len(v.blocks())}) for v in inp.sessions]
    a, b = plan_backend(inp), plan_backend(BackendPlanInput(flat, inp.budget_tokens, CAPS))
    with scored_by_numpy():
        c = plan_backend(BackendPlanInput(flat, inp.budget_tokens, CAPS))
    assert a.actions == b.actions == c.actions and a.resident_after == b.resident_after == c.resident_after
    assert a.over_budget == b.over_budget == c.over_budget and b.diagnostics == c.diagnostics
    for action in a.actions:
        resident = dict((v.session_id, v.resident_ranges) for v in inp.sessions)[action.session_id]
        assert all(any(r.start >= h.start and r.end <= h.end for h in resident) for r in action.ranges)
    for v in inp.sessions:
        if v.budget_tokens is not None and v.session_id not in a.suspended and not a.over_budget:
            assert a.resident_after[v.session_id] <= max(v.budget_tokens - v.incoming_tokens, _protected(v))
    scored = [SessionView(**{**v.__dict__, "scores": tuple(data.draw(st.lists(
        st.sampled_from([0.0, 0.5, 2.0]), min_size=len(v.blocks()), max_size=len(v.blocks()))))})
        for v in inp.sessions]
    python = plan_backend(BackendPlanInput(scored, inp.budget_tokens, CAPS))
    with scored_by_numpy():
        vectorised = plan_backend(BackendPlanInput(scored, inp.budget_tokens, CAPS))
    assert python == vectorised


@contextlib.contextmanager
def scored_by_numpy():
    saved = backend_planner._SCORED_IN_PYTHON_UP_TO
    backend_planner._SCORED_IN_PYTHON_UP_TO = -1
    try:
        yield
    finally:
        backend_planner._SCORED_IN_PYTHON_UP_TO = saved


def _protected(v: SessionView) -> int:
    return plan_streaming(v.resident_ranges, v.block_size, 0, v.stream_policy).protected_tokens


def test_lower_priority_is_suspended_before_the_least_recently_used() -> None:
    sessions = [view("old-but-high", 100, 1, priority=5), view("recent-but-low", 100, 2, priority=-1),
                view("me", 100, 3, active=True, incoming_tokens=20)]
    plan = plan_backend(BackendPlanInput(sessions, 230, CAPS))
    assert plan.suspended == ["recent-but-low"]


def test_a_pinned_session_is_neither_suspended_nor_shrunk_for_others() -> None:
    pinned = view("pinned", 100, 1, pinned=True, active=True, evictable=True, stream_policy=STREAM)
    sessions = [view("idle-pinned", 100, 0, pinned=True), pinned,
                view("me", 100, 3, active=True, incoming_tokens=60, evictable=True, stream_policy=STREAM)]
    plan = plan_backend(BackendPlanInput(sessions, 300, CAPS))
    assert "idle-pinned" not in plan.suspended
    assert {a.session_id for a in plan.actions} == {"me"}  # only the unpinned one gives room
    assert plan.resident_after["pinned"] == 100 and plan.resident_after["idle-pinned"] == 100


def test_a_session_paused_for_tools_is_suspended_after_the_idle_ones() -> None:
    """Paused for tools (its results on their way), the least recently used session goes after
    every idle one of its priority; only when they are not enough is it suspended."""
    sessions = [view("paused-oldest", 100, 1, tool_paused=True), view("idle", 100, 2), view("idle-recent", 100, 3),
                view("me", 100, 4, active=True, incoming_tokens=20)]
    plan = plan_backend(BackendPlanInput(sessions, 230, CAPS))
    assert plan.suspended == ["idle", "idle-recent"]
    plan = plan_backend(BackendPlanInput(sessions, 120, CAPS))
    assert plan.suspended == ["idle", "idle-recent", "paused-oldest"]


def test_priority_still_decides_before_a_tool_pause() -> None:
    sessions = [view("paused-low", 100, 2, tool_paused=True, priority=-1), view("idle-high", 100, 1, priority=5),
                view("me", 100, 3, active=True, incoming_tokens=20)]
    plan = plan_backend(BackendPlanInput(sessions, 230, CAPS))
    assert plan.suspended == ["paused-low"]


def test_keep_key_orders_paused_sessions_last_within_a_priority() -> None:
    keys = {"idle-old": backend_planner.keep_key(0, 1), "idle-new": backend_planner.keep_key(0, 9),
            "paused-old": backend_planner.keep_key(0, 0, tool_paused=True),
            "low-paused": backend_planner.keep_key(-1, 5, tool_paused=True)}
    assert sorted(keys, key=keys.__getitem__) == ["low-paused", "idle-old", "idle-new", "paused-old"]


@pytest.mark.parametrize(("paused_at", "now", "limit", "holds"), [
    (None, 5.0, 30.0, False),  # never paused (or its next call came)
    (10.0, 10.0, 30.0, True),
    (10.0, 39.9, 30.0, True),
    (10.0, 40.0, 30.0, False),  # past tool_pause_s: an ordinary idle session
    (10.0, 10.5, 0.0, False),  # tool_pause_s=0: pauses are not kept
])
def test_a_tool_pause_holds_for_tool_pause_s(paused_at: float | None, now: float, limit: float, holds: bool) -> None:
    assert backend_planner.tool_pause_holds(paused_at, now, limit) is holds
