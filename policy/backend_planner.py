"""Planning across every session of one backend.

Primitives:
- ``SessionView``: what the planner needs to know of one session (resident ranges, last use,
  whether the current call is serving it, its own budget and streaming policy, optional scores,
  its owner's priority and pin, whether it is paused for tools); ``keep_order``, who goes first.
- ``keep_key(priority, last_used, tool_paused=False)``: that order for any caller that picks a
  session to park (the lowest priority, then sessions not paused for tools, then the least
  recently used).
- ``tool_pause_holds(paused_at, now, tool_pause_s) -> bool``: whether a session whose turn ended
  in tool calls at ``paused_at`` still counts as paused at ``now`` (its results are on their way);
  past ``tool_pause_s`` (0: never paused) it is an ordinary idle session.
- ``BackendPlanInput(sessions, budget_tokens, capabilities)``.
- ``Action(kind, session_id, ranges, rebase)``: ``"evict"`` ranges of a session, or ``"suspend"``
  the whole session (export all of its KV, free it on the backend).
- ``plan_backend(BackendPlanInput) -> BackendPlan``.

Order of relief: (1) every session is brought under its own budget by ``plan_hot_set`` (with room
for the tokens about to arrive); (2) if the backend as a whole is still over budget, idle sessions
are suspended, the lowest ``priority`` first, then (within a priority) those not paused for tools,
then the least recently used; (3) then active
sessions that allow eviction are shrunk, in the same order; a ``pinned`` session is neither
suspended nor shrunk for others; (4) what still does not fit is reported as ``over_budget``.

Cost: a streaming session without scores is planned from its ranges (``plan_streaming``), in time
proportional to its ranges and the blocks it loses, not to its length (a session that grew by one
block costs one block's work); a scored one in plain Python up to a few hundred blocks, by
``plan_hot_set`` on its blocks beyond. A session shrunk twice (steps 1 and 3) keeps its scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .blocks import BlockTable
from .capabilities import Capabilities
from .planner import PlanInput, StreamPolicy, plan_hot_set, plan_streaming, trusted_range
from .ranges import Range


def keep_key(priority: int, last_used: int, tool_paused: bool = False) -> tuple[int, bool, int]:
    """Sorted ascending, who is parked or shrunk first when others need room: the lowest
    priority, then, within a priority, a session not paused for tools before one that is (its
    results come back soon, and its next turn should prefill only them), then the least recently used."""
    return priority, tool_paused, last_used


def tool_pause_holds(paused_at: float | None, now: float, tool_pause_s: float) -> bool:
    """Whether a session paused for tools at ``paused_at`` (None: it is not) still is at ``now``:
    for ``tool_pause_s`` seconds at most (0: the pause is not kept at all)."""
    return paused_at is not None and tool_pause_s > 0 and now - paused_at < tool_pause_s


@dataclass(frozen=True)
class SessionView:
    session_id: str
    resident_ranges: tuple[Range, ...]
    last_used: int
    active: bool = False  # served by the current call: never suspended by it
    incoming_tokens: int = 0
    budget_tokens: int | None = None  # the session's own resident budget
    stream_policy: StreamPolicy = field(default_factory=StreamPolicy)
    evictable: bool = False  # its policy allows evicting ranges
    block_size: int = 16
    scores: tuple[float, ...] | None = None  # one per block of ``blocks()``
    priority: int = 0  # its owner's: lower ones are suspended and shrunk for others first
    pinned: bool = False  # never suspended or shrunk for others' room
    tool_paused: bool = False  # its turn ended in tool calls whose results are on their way

    @property
    def keep_order(self) -> tuple[int, bool, int]:
        """Who goes first when others need room (``keep_key``)."""
        return keep_key(self.priority, self.last_used, self.tool_paused)

    @property
    def resident_tokens(self) -> int:
        return sum(len(r) for r in self.resident_ranges)

    def blocks(self) -> BlockTable:
        """The resident ranges in position order, each cut at multiples of ``block_size``;
        block i was last used at time i."""
        return BlockTable.from_ranges(sorted(self.resident_ranges), self.block_size)


@dataclass(frozen=True)
class BackendPlanInput:
    sessions: Sequence[SessionView]
    budget_tokens: int
    capabilities: Capabilities = field(default_factory=Capabilities)


@dataclass(frozen=True)
class Action:
    kind: str  # "evict" | "suspend"
    session_id: str
    ranges: tuple[Range, ...] = ()
    rebase: bool = False


@dataclass(frozen=True)
class BackendPlan:
    actions: list[Action]
    resident_after: dict[str, int]
    budget_tokens: int
    over_budget: bool
    diagnostics: list[str]

    @property
    def suspended(self) -> list[str]:
        return [a.session_id for a in self.actions if a.kind == "suspend"]


_SCORED_IN_PYTHON_UP_TO = 512  # blocks; larger scored sessions are planned by numpy


def _n_blocks(ranges: Sequence[Range], block_size: int) -> int:
    return sum((r.end - 1) // block_size - r.start // block_size + 1 for r in ranges if r.end > r.start)


class _Shrinking:
    """One session while it is planned: what is left of it, and with which scores. Streaming
    sessions are planned from their ranges (``plan_streaming``: scored ones of up to
    ``_SCORED_IN_PYTHON_UP_TO`` blocks too), the rest by ``plan_hot_set`` on their blocks."""

    def __init__(self, view: SessionView) -> None:
        self.view = view
        self.ranges: tuple[Range, ...] = tuple(sorted(view.resident_ranges))
        n = _n_blocks(self.ranges, view.block_size) if view.scores is not None else 0
        self.scores = view.scores if view.scores is not None and len(view.scores) == n else None
        self.table: BlockTable | None = None  # the blocks left, once planned by plan_hot_set
        self.table_scores: npt.NDArray[np.float64] | None = None
        if self.scores is not None and n > _SCORED_IN_PYTHON_UP_TO:
            self._to_table()

    def _to_table(self) -> BlockTable:
        self.table = BlockTable.from_ranges(self.ranges, self.view.block_size)
        if self.scores is not None:
            self.table_scores = np.asarray(self.scores, dtype=np.float64)
        return self.table

    def shrink(self, target: int, caps: Capabilities, diagnostics: list[str]) -> tuple[tuple[Range, ...], int]:
        """Evict down to ``target`` tokens; returns the evicted block ranges and their tokens."""
        view, policy = self.view, self.view.stream_policy
        if self.table is None and policy.enabled and caps.remove_middle and caps.position_shift:
            fast = plan_streaming(self.ranges, view.block_size, max(0, target), policy, self.scores)
            diagnostics.extend(f"{view.session_id}: {d}" for d in fast.diagnostics)
            self.ranges, self.scores = fast.kept_ranges, fast.kept_scores
            return fast.evict_ranges, fast.total_tokens - fast.hot_tokens
        table = self.table if self.table is not None else self._to_table()
        plan = plan_hot_set(PlanInput(table, max(0, target), policy, caps, self.table_scores))
        diagnostics.extend(f"{view.session_id}: {d}" for d in plan.diagnostics)
        if plan.evict_index.size == 0:
            return (), 0
        idx, keep = plan.evict_index, plan.keep_index
        evicted = tuple(map(trusted_range, table.starts[idx].tolist(), table.ends[idx].tolist()))
        self.table = table.take(keep)
        if self.table_scores is not None:
            self.table_scores = self.table_scores[keep]
        return evicted, plan.total_tokens - plan.hot_tokens


def plan_backend(inp: BackendPlanInput) -> BackendPlan:
    if inp.budget_tokens < 0:
        raise ValueError(f"backend budget_tokens must be >= 0, got {inp.budget_tokens}")
    ids = [v.session_id for v in inp.sessions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"session ids must be unique, got {ids}")
    actions: list[Action] = []
    diagnostics: list[str] = []
    resident = {v.session_id: v.resident_tokens for v in inp.sessions}
    incoming = {v.session_id: v.incoming_tokens for v in inp.sessions}
    working: dict[str, _Shrinking] = {}

    def evict(view: SessionView, target: int, why: str) -> None:
        work = working.get(view.session_id) or working.setdefault(view.session_id, _Shrinking(view))
        before = resident[view.session_id]
        new, freed = work.shrink(target, inp.capabilities, diagnostics)
        if not new:
            return
        resident[view.session_id] = before - freed
        ranges = new
        previous = [a for a in actions if a.session_id == view.session_id and a.kind == "evict"]
        if previous:  # one action per session: merged with what step (1) evicted
            actions[:] = [a for a in actions if a not in previous]
            ranges = tuple(sorted(new + previous[0].ranges))
        rebase = view.stream_policy.enabled and view.stream_policy.rebase
        actions.append(Action("evict", view.session_id, ranges, rebase))
        diagnostics.append(f"{view.session_id}: evicted {len(new)} ranges ({why})")

    # (1) each session under its own budget, leaving room for what arrives next
    for view in inp.sessions:
        if view.budget_tokens is None or not view.evictable:
            continue
        if resident[view.session_id] + incoming[view.session_id] > view.budget_tokens:
            evict(view, view.budget_tokens - incoming[view.session_id], "session budget")

    def total() -> int:
        return sum(resident[i] + incoming[i] for i in resident)

    # (2) suspend idle sessions in keep order (priority, not paused for tools first, least recently used)
    for view in sorted(inp.sessions, key=lambda v: v.keep_order):
        if total() <= inp.budget_tokens:
            break
        if view.active or view.pinned or resident[view.session_id] == 0:
            continue
        actions[:] = [a for a in actions if a.session_id != view.session_id]
        actions.append(Action("suspend", view.session_id))
        diagnostics.append(f"{view.session_id}: suspended (idle, backend over budget)")
        resident[view.session_id] = 0

    # (3) shrink active sessions that allow eviction, in the same order
    for view in sorted(inp.sessions, key=lambda v: v.keep_order):
        excess = total() - inp.budget_tokens
        if excess <= 0:
            break
        if not view.active or not view.evictable or view.pinned:
            continue
        evict(view, resident[view.session_id] - excess, "backend budget")

    over = total() > inp.budget_tokens
    if over:
        diagnostics.append(
            f"backend still needs {total()} tokens against a budget of {inp.budget_tokens}"
        )
    return BackendPlan(actions, dict(resident), inp.budget_tokens, over, diagnostics)
