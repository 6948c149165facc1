"""Memory pressure: a backend's sessions kept within its budget and their own.

Primitives:
- ``Evictor``: what room-making needs of eviction: ``with_scores(view)`` and ``evict(session_id,
  ranges, rebase)`` (``eviction.Eviction`` where kvres addresses the engine's KV;
  ``engine_managed.ManagedKV``, which never has ranges to evict, where the engine manages it).
- ``Pressure(ctx, plan, parking, eviction)``: ``make_room(incoming, newcomer=None,
  newcomer_tokens=0, ahead=None, busy=None, newcomer_tenant=None)`` (plan when a tenant, a session
  or the backend would go over its quota or budget and carry the plan out: idle sessions
  suspended through ``parking``, ranges evicted through ``eviction``; a tenant over its quota among
  its own sessions first, ``quotas``; the owners' priorities and pins, ``retention``, and tool
  pauses, ``keep_key``, decide who goes first), ``needs_plan`` and ``fits`` (cheap checks before planning); ``preempt(session_id)``
  (park a session whose own call waits for room, so that the calls ahead of it get its room).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from kvres.policy import Range
from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, SessionView, keep_key

from .context import HostContext
from .eviction import session_view
from .parking import Parking
from .quotas import quota_of, resident_overruns
from .refusals import BackendFullError, TenantQuotaError
from .retention import pinned_sessions
from .sessions import HostSession


class Evictor(Protocol):
    def with_scores(self, view: SessionView, lookahead: Sequence[int] | None = None) -> SessionView: ...

    def evict(self, session_id: str, ranges: Sequence[Range], rebase: bool) -> None: ...


class Pressure:
    def __init__(
        self, ctx: HostContext, plan: Callable[[BackendPlanInput], BackendPlan], parking: Parking, eviction: Evictor,
    ) -> None:
        self.ctx = ctx
        self._plan = plan
        self._parking = parking
        self._eviction = eviction

    # -- budget checks and planning ---------------------------------------------------------
    def needs_plan(self, incoming: Mapping[str, int], newcomer_tokens: int, newcomer_tenant: str | None = None
                   ) -> bool:
        ctx = self.ctx
        if resident_overruns(ctx, incoming, newcomer_tokens, newcomer_tenant):
            return True
        live = [(sid, s) for sid, s in ctx.sessions.items() if s.live]
        total = sum(s.resident for _, s in live) + sum(incoming.values()) + newcomer_tokens
        if total > ctx.config.kv_budget_tokens:
            return True
        for sid, s in live:
            if s.scored_now and sid in incoming:
                continue  # compressed after its chunk, not before: only the backend budget binds
            budget = s.residency.planned_budget_tokens
            if budget is not None and s.resident + incoming.get(sid, 0) > budget:
                return True
        return False

    def fits(self, s: HostSession, n: int, used: int) -> bool:
        """What ``needs_plan`` would find for ``n`` more tokens of ``s`` (not yet in the step)
        when its last check in this step found nothing to plan and ``used`` tokens are held or
        coming: only the backend's budget and the session's own can bind (a session under a
        tenant quota is always looked at by ``needs_plan``)."""
        if used + n > self.ctx.config.kv_budget_tokens:
            return False
        if quota_of(self.ctx, s.policy.tenant) is not None:
            return False  # its tenant's quota binds too: needs_plan looks
        budget = s.residency.planned_budget_tokens
        if s.scored_now or budget is None:
            return True
        return s.resident + n <= budget

    def make_room(
        self,
        incoming: Mapping[str, int],
        newcomer: str | None = None,
        newcomer_tokens: int = 0,
        ahead: Mapping[str, int] | None = None,
        busy: set[str] | None = None,
        newcomer_tenant: str | None = None,
    ) -> bool:
        """Make room for ``incoming`` tokens per live session (and, for a ``newcomer`` being
        opened or resumed, a sequence slot and ``newcomer_tokens``; ``newcomer_tenant``: the
        tenant label its policy names): plan when a tenant, a session or the backend would go
        over its quota or budget, planning room for ``ahead`` tokens where given, and carry the
        plan out. A tenant over its ``resident_tokens`` quota makes room among its own sessions
        first. Sessions in ``busy`` (by default every session with a call pending; the step loop
        names those whose calls ran or are ahead in the room queue) are never suspended for it; one
        outside it whose call waits is parked as it stands (``PREEMPTED``). True when it changed
        anything (a session suspended or a plan carried out)."""
        ctx = self.ctx
        busy = ctx.busy() if busy is None else busy
        live = [sid for sid, s in ctx.sessions.items() if s.live and sid != newcomer]
        changed = False
        if newcomer is not None and len(live) >= ctx.config.n_seq_max:
            victim = self._slot_victim(live, newcomer, busy, incoming)
            self._parking.suspend(victim)
            live.remove(victim)
            changed = True
        if not self.needs_plan(incoming, newcomer_tokens, newcomer_tenant):
            return changed
        if self._keep_tenants(incoming, newcomer, newcomer_tokens, newcomer_tenant, ahead, busy):
            live = [sid for sid, s in ctx.sessions.items() if s.live and sid != newcomer]
            if not self.needs_plan(incoming, newcomer_tokens, newcomer_tenant):
                return True
        planned = {**incoming, **(ahead or {})}
        plan = self._carry_out(live, planned, set(planned) | busy, ctx.config.kv_budget_tokens,
                               None if newcomer is None else (newcomer, newcomer_tokens))
        if plan.over_budget and self.needs_plan(incoming, newcomer_tokens, newcomer_tenant):
            who = newcomer if newcomer is not None else ", ".join(sorted(incoming))
            more = newcomer_tokens if newcomer is not None else sum(incoming.values())
            raise BackendFullError(
                f"backend {ctx.name!r} cannot fit {more} more tokens for session {who!r} "
                f"within kv_budget_tokens={ctx.config.kv_budget_tokens}: " + "; ".join(plan.diagnostics[-2:])
            )
        return True

    def preempt(self, session_id: str) -> None:
        """Park a live session whose call waits for room (``PREEMPTED``: not committed; that call
        resumes it when room comes), for the calls ahead of it in the room queue."""
        self._parking.suspend(session_id)

    def _carry_out(self, sids: Sequence[str], planned: Mapping[str, int], active: set[str], budget: int,
                   newcomer: tuple[str, int] | None) -> BackendPlan:
        """Plan ``sids`` (and a ``newcomer`` with its tokens) within ``budget`` and carry the plan
        out: idle sessions suspended, ranges evicted."""
        ctx = self.ctx
        pinned = pinned_sessions(ctx)
        views = [session_view(ctx, sid, planned.get(sid, 0), sid in active, sid in pinned) for sid in sids]
        views = [self._eviction.with_scores(v) if v.incoming_tokens else v for v in views]
        if newcomer is not None:
            views.append(SessionView(newcomer[0], (), last_used=1 << 62, active=True, incoming_tokens=newcomer[1]))
        t0 = time.perf_counter()
        plan = self._plan(BackendPlanInput(views, budget, ctx.executor.capabilities()))
        ctx.metrics.observe_plan_ms(ctx.name, (time.perf_counter() - t0) * 1e3)
        for action in plan.actions:
            if action.kind == "suspend":
                self._parking.suspend(action.session_id)
            else:
                self._eviction.evict(action.session_id, action.ranges, action.rebase)
        return plan

    def _keep_tenants(self, incoming: Mapping[str, int], newcomer: str | None, newcomer_tokens: int,
                      newcomer_tenant: str | None, ahead: Mapping[str, int] | None, busy: set[str]) -> bool:
        """Each tenant the tokens coming would take over its ``resident_tokens`` quota makes room
        among its own sessions (planned as a backend whose budget is the quota: its idle sessions
        suspended, the lowest priority first, then its evicting ones shrunk); what still does not
        fit is refused (``TenantQuotaError``). True when it changed anything."""
        ctx = self.ctx
        over = resident_overruns(ctx, incoming, newcomer_tokens, newcomer_tenant)
        if not over:
            return False
        planned = {**incoming, **(ahead or {})}
        for tenant, (_, quota) in over.items():
            mine = [sid for sid, s in ctx.sessions.items() if s.live and sid != newcomer and s.policy.tenant == tenant]
            coming = (newcomer, newcomer_tokens) if newcomer is not None and newcomer_tenant == tenant else None
            self._carry_out(mine, planned, set(planned) | busy, quota, coming)
        still = resident_overruns(ctx, incoming, newcomer_tokens, newcomer_tenant)
        for tenant, (need, quota) in still.items():
            held = sum(s.resident for s in ctx.sessions.values() if s.live and s.policy.tenant == tenant)
            who = newcomer if newcomer is not None and newcomer_tenant == tenant else ", ".join(
                sorted(sid for sid in incoming if ctx.sessions[sid].policy.tenant == tenant))
            raise TenantQuotaError(
                f"tenant {tenant!r} cannot hold {need} resident tokens on backend {ctx.name!r}: its "
                f"resident_tokens quota is {quota}; its sessions hold {held} and session {who!r} needs "
                f"{need - held} more, and the rest is held by its sessions that are running, pinned or do not evict"
            )
        return True

    def _slot_victim(self, live: list[str], newcomer: str, busy: set[str], incoming: Mapping[str, int]) -> str:
        """The idle session to suspend for a newcomer's slot: the one needed last (``keep_key``:
        the lowest priority, then one not paused for tools, then the least recently used; never a
        pinned one). A session whose
        append just ended waits for its reply (the same turn's generate is on its way): it goes
        only when no other idle session can, and not while a running call will soon free a slot
        (then the newcomer waits, rather than resuming that session again right after)."""
        ctx = self.ctx
        pinned = pinned_sessions(ctx)
        idle = [sid for sid in live if sid not in busy and sid not in incoming and sid not in pinned]
        now = time.monotonic()
        settled = [sid for sid in idle if ctx.sessions[sid].mid_turn_until <= now]
        running = any(sid != newcomer and sid in ctx.sessions and ctx.sessions[sid].live for sid in busy)
        if not settled and (not idle or running):
            holders = "pinned sessions, running calls or turns under way" if pinned & set(live) \
                else "running calls or turns under way"
            raise BackendFullError(
                f"backend {ctx.name!r} has all n_seq_max={ctx.config.n_seq_max} sequence slots "
                f"held by {holders}: none for session {newcomer!r} now (a call of it waits for one)"
            )
        sessions = ctx.sessions
        return min(settled or idle, key=lambda sid: keep_key(sessions[sid].policy.priority, sessions[sid].last_used,
                                                             sessions[sid].paused_for_tools(now)))
