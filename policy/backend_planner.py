"""Planning across every session of one backend.

Primitives:
- ``SessionView``: what the planner needs to know of one session (resident ranges, last use,
  whether the current call is serving it, its own budget and streaming policy, optional scores).
- ``BackendPlanInput(sessions, budget_tokens, capabilities)``.
- ``Action(kind, session_id, ranges, rebase)``: ``"evict"`` ranges of a session, or ``"suspend"``
  the whole session (export all of its KV, free it on the backend).
- ``plan_backend(BackendPlanInput) -> BackendPlan``.

Order of relief: (1) every session is brought under its own budget by ``plan_hot_set`` (with room
for the tokens about to arrive); (2) if the backend as a whole is still over budget, idle sessions
are suspended, least recently used first; (3) then active sessions that allow eviction are shrunk,
least recently used first; (4) what still does not fit is reported as ``over_budget``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .blocks import BlockTable
from .capabilities import Capabilities
from .planner import Plan, PlanInput, StreamPolicy, plan_hot_set
from .ranges import Range


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

    @property
    def resident_tokens(self) -> int:
        return sum(len(r) for r in self.resident_ranges)

    def blocks(self) -> BlockTable:
        tables = [BlockTable.uniform(r, self.block_size) for r in sorted(self.resident_ranges)]
        if not tables:
            return BlockTable.uniform(Range(0, 0), self.block_size)
        joined = {
            name: np.concatenate([getattr(t, name) for t in tables])
            for name in ("starts", "ends", "flags")
        }
        joined["last_used"] = np.arange(joined["starts"].shape[0], dtype=np.int64)
        return BlockTable(**joined)


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


def _shrink(view: SessionView, target: int, caps: Capabilities) -> Plan:
    blocks = view.blocks()
    scores = view.scores if view.scores is not None and len(view.scores) == len(blocks) else None
    return plan_hot_set(PlanInput(blocks, max(0, target), view.stream_policy, caps, scores))


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
    shrunk: dict[str, SessionView] = {}

    def evict(view: SessionView, target: int, why: str) -> None:
        plan = _shrink(view, target, inp.capabilities)
        diagnostics.extend(f"{view.session_id}: {d}" for d in plan.diagnostics)
        if plan.evict_index.size:
            ranges = tuple(plan.evict_ranges)
            actions.append(Action("evict", view.session_id, ranges, plan.rebase_positions))
            resident[view.session_id] = plan.hot_tokens
            kept = tuple(sorted(b.range for b in plan.keep_hot))
            shrunk[view.session_id] = SessionView(
                view.session_id, kept, view.last_used, view.active, view.incoming_tokens,
                view.budget_tokens, view.stream_policy, view.evictable, view.block_size,
                None,
            )
            diagnostics.append(f"{view.session_id}: evicted {len(ranges)} ranges ({why})")

    # (1) each session under its own budget, leaving room for what arrives next
    for view in inp.sessions:
        if view.budget_tokens is None or not view.evictable:
            continue
        if resident[view.session_id] + incoming[view.session_id] > view.budget_tokens:
            evict(view, view.budget_tokens - incoming[view.session_id], "session budget")

    def total() -> int:
        return sum(resident[i] + incoming[i] for i in resident)

    # (2) suspend idle sessions, least recently used first
    for view in sorted(inp.sessions, key=lambda v: v.last_used):
        if total() <= inp.budget_tokens:
            break
        if view.active or resident[view.session_id] == 0:
            continue
        actions = [a for a in actions if a.session_id != view.session_id]
        actions.append(Action("suspend", view.session_id))
        diagnostics.append(f"{view.session_id}: suspended (idle, backend over budget)")
        resident[view.session_id] = 0

    # (3) shrink active sessions that allow eviction, least recently used first
    for view in sorted(inp.sessions, key=lambda v: v.last_used):
        excess = total() - inp.budget_tokens
        if excess <= 0:
            break
        if not view.active or not view.evictable:
            continue
        current = shrunk.get(view.session_id, view)
        evict(current, resident[view.session_id] - excess, "backend budget")
        merged = [a for a in actions if a.session_id == view.session_id and a.kind == "evict"]
        if len(merged) > 1:
            ranges = tuple(sorted(r for a in merged for r in a.ranges))
            actions = [a for a in actions if not (a.session_id == view.session_id and a.kind == "evict")]
            actions.append(Action("evict", view.session_id, ranges, merged[0].rebase))

    over = total() > inp.budget_tokens
    if over:
        diagnostics.append(
            f"backend still needs {total()} tokens against a budget of {inp.budget_tokens}"
        )
    return BackendPlan(actions, dict(resident), inp.budget_tokens, over, diagnostics)
