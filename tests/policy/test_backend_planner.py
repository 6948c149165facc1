"""plan_backend: per-session budgets, idle sessions suspended first, then active ones shrunk."""

from __future__ import annotations

import pytest

from kvres.policy import Capabilities, Range, StreamPolicy
from kvres.policy.backend_planner import BackendPlanInput, SessionView, plan_backend

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


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="-1"):
        plan_backend(BackendPlanInput([], -1, CAPS))
    with pytest.raises(ValueError, match="unique"):
        plan_backend(BackendPlanInput([view("a", 1, 1), view("a", 2, 2)], 10, CAPS))
