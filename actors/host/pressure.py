"""Memory pressure: a backend's sessions kept within its budget and their own.

Primitives:
- ``Pressure(ctx, plan, suspend)``: ``make_room(incoming, newcomer=None, newcomer_tokens=0,
  ahead=None, busy=None, newcomer_tenant=None)`` (plan when a tenant, a session or the backend
  would go over its quota or budget and carry the plan out: idle sessions suspended through
  ``suspend``, ranges evicted; a tenant over its quota among its own sessions first, ``quotas``;
  the owners' priorities and pins, ``retention``, decide who goes first), ``needs_plan`` and
  ``fits`` (cheap checks before planning), ``evict`` (a spilling session parks the ranges first,
  in one store call), ``keep_spilled`` (a session's spilled bytes kept under its cap and its
  tenant's ``cold_bytes``), ``compress`` /
  ``compress_now`` (a scored session cut to its budget by its ranking; a prompt larger than the
  free room ranked by its own last tokens, ``lookahead``), ``observe`` (an accumulating ranking
  takes the rows of a long call before one capture could not hold them), ``view`` /
  ``with_scores`` (what the planner sees of a session).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from kvres.policy import CapabilityError, KvresError, Range
from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, SessionView
from kvres.policy.scorers import KeyCapture
from kvres.policy.scoring import AttentionCapture

from ..engines.executor import Executor
from .context import HostContext
from .errors import BackendFullError, TenantQuotaError
from .quotas import keep_cold_quota, quota_of, resident_overruns
from .retention import pinned_sessions
from .scheduler import Job
from .sessions import HostSession
from .store_ports import ColdRef


class EngineScores:
    """One session's scoring inputs, read from the engine (``kvres.policy.residency.ScoreSource``).
    ``lookahead``: tokens of the call not appended yet whose attention is the observation window
    (a prompt larger than the free room is scored by its own last tokens, not a chunk's end),
    decoded in a scoring pass after the resident tokens where the engine has one
    (``Executor.recall_attention``); elsewhere the last resident rows stand in."""

    def __init__(self, executor: Executor, session_id: str, s: HostSession,
                 lookahead: Sequence[int] | None = None) -> None:
        self._executor, self._session_id, self._s = executor, session_id, s
        self._lookahead = list(lookahead or ())

    def attention(self, window: int) -> AttentionCapture:
        if self._lookahead:
            try:
                return self._executor.recall_attention(self._session_id, [], self._lookahead,
                                                       len(self._lookahead), self._s.residency.rebase)
            except CapabilityError:
                self._lookahead = []  # no scoring pass on this engine
        return self._executor.attention(self._session_id, window)

    def keys(self) -> KeyCapture:
        return self._executor.keys(self._session_id)

    def log_length(self) -> int:
        return len(self._executor.token_log(self._session_id))

    def resident_tokens(self) -> int:
        return self._s.resident


class Pressure:
    def __init__(
        self, ctx: HostContext, plan: Callable[[BackendPlanInput], BackendPlan], suspend: Callable[[str], object],
    ) -> None:
        self.ctx = ctx
        self._plan = plan
        self._suspend = suspend

    # -- what the planner sees --------------------------------------------------------------
    def view(self, session_id: str, incoming: int, active: bool, pinned: bool = False) -> SessionView:
        s = self.ctx.sessions[session_id]
        r = s.residency
        view = SessionView(
            session_id=session_id,
            resident_ranges=tuple(self.ctx.executor.resident_ranges(session_id)),
            last_used=s.last_used,
            active=active,
            incoming_tokens=incoming,
            budget_tokens=r.planned_budget_tokens,
            stream_policy=r.stream_policy(),
            evictable=r.evicts,
            block_size=r.block_size,
            priority=s.policy.priority,
            pinned=pinned,
        )
        if not s.retrieved:
            return view
        # blocks recalled this turn outrank the rest (which go by recency, as streaming would)
        blocks = view.blocks()
        scores = tuple(float(any(r.start < blocks.ends[i] and blocks.starts[i] < r.end for r in s.retrieved))
                       for i in range(len(blocks)))
        return replace(view, scores=scores)

    def with_scores(self, view: SessionView, lookahead: Sequence[int] | None = None) -> SessionView:
        s = self.ctx.sessions[view.session_id]
        if not s.scored_now or not view.resident_ranges:
            return view
        table = view.blocks()
        ranges = [table[i].range for i in range(len(table))]
        return replace(view, scores=tuple(self.block_scores(view.session_id, ranges, lookahead)))

    def block_scores(self, session_id: str, ranges: list[Range], lookahead: Sequence[int] | None = None
                     ) -> list[float]:
        """One score per range by the session's ranking (``kvres.policy.residency.Ranking``)."""
        s = self.ctx.sessions[session_id]
        if s.ranking is None:
            raise KvresError(f"backend {self.ctx.name!r} has nothing to rank session {session_id!r}'s blocks by")
        ahead = lookahead if s.ranking.by_attention_window else None
        return s.ranking.block_scores(EngineScores(self.ctx.kv_executor("score"), session_id, s, ahead), ranges)

    def observe(self, session_id: str) -> None:
        """An accumulating ranking (H2O) takes the rows processed since its last capture now,
        before more arrive than one capture holds."""
        s = self.ctx.sessions[session_id]
        if s.ranking is not None and s.ranking.accumulates:
            s.ranking.observe(EngineScores(self.ctx.kv_executor("score"), session_id, s))

    # -- compressing a scored session -------------------------------------------------------
    def compress_now(self, s: HostSession, job: Job, done: bool) -> bool:
        """When a scored session is cut to its budget: at the end of its call; during an append
        only when the rest of it does not fit the backend's free room (so the observation window
        is the end of the prompt whenever the prompt fits); during a generate once it outgrows
        its budget (twice the budget: the cache, and so each decode step, stays bounded)."""
        if done:
            return True
        if job.feed:
            return len(job.feed) > self.ctx.free_tokens({})
        budget = s.residency.budget_tokens or 0
        return s.resident > budget + max(s.residency.block_size, budget)

    def compress(self, session_id: str, lookahead: Sequence[int] | None = None) -> None:
        """Cut a scored session (or one on a recall turn) to its budget once, by its ranking;
        ``lookahead``: the last tokens of a prompt still to come, SnapKV's observation window."""
        s = self.ctx.sessions[session_id]
        recalled, s.retrieved = s.retrieved, []  # scores rank them now, not the recall
        try:
            self._cut_to_budget(session_id, lookahead)
        finally:
            if s.compressing:
                s.compressing = False
                kept = self.ctx.executor.resident_ranges(session_id)
                s.retrieved = [r for r in recalled if any(k.start <= r.start and r.end <= k.end for k in kept)]

    def _cut_to_budget(self, session_id: str, lookahead: Sequence[int] | None = None) -> None:
        ctx = self.ctx
        s = ctx.sessions[session_id]
        budget = s.residency.budget_tokens
        if budget is None or s.resident <= budget:
            self.observe(session_id)  # an accumulating ranking still sees the rows of this call
            return
        plan = self._plan(BackendPlanInput([self.with_scores(self.view(session_id, 0, True), lookahead)],
                                           ctx.config.kv_budget_tokens, ctx.executor.capabilities()))
        for action in plan.actions:
            if action.kind == "evict":
                self.evict(session_id, action.ranges, action.rebase)

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
        first. Sessions with a running call (``busy``) are never suspended for it. True when it
        changed anything (a session suspended or a plan carried out)."""
        ctx = self.ctx
        busy = ctx.busy() if busy is None else busy
        live = [sid for sid, s in ctx.sessions.items() if s.live and sid != newcomer]
        changed = False
        if newcomer is not None and len(live) >= ctx.config.n_seq_max:
            victim = self._slot_victim(live, newcomer, busy, incoming)
            self._suspend(victim)
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

    def _carry_out(self, sids: Sequence[str], planned: Mapping[str, int], active: set[str], budget: int,
                   newcomer: tuple[str, int] | None) -> BackendPlan:
        """Plan ``sids`` (and a ``newcomer`` with its tokens) within ``budget`` and carry the plan
        out: idle sessions suspended, ranges evicted."""
        ctx = self.ctx
        pinned = pinned_sessions(ctx)
        views = [self.view(sid, planned.get(sid, 0), sid in active, sid in pinned) for sid in sids]
        views = [self.with_scores(v) if v.incoming_tokens else v for v in views]
        if newcomer is not None:
            views.append(SessionView(newcomer[0], (), last_used=1 << 62, active=True, incoming_tokens=newcomer[1]))
        t0 = time.perf_counter()
        plan = self._plan(BackendPlanInput(views, budget, ctx.executor.capabilities()))
        ctx.metrics.observe_plan_ms(ctx.name, (time.perf_counter() - t0) * 1e3)
        for action in plan.actions:
            if action.kind == "suspend":
                self._suspend(action.session_id)
            else:
                self.evict(action.session_id, action.ranges, action.rebase)
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
        """The idle session to suspend for a newcomer's slot: the one needed last (the lowest
        priority, then the least recently used; never a pinned one). A session whose
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
        return min(settled or idle, key=lambda sid: (ctx.sessions[sid].policy.priority, ctx.sessions[sid].last_used))

    # -- carrying a plan out ----------------------------------------------------------------
    def evict(self, session_id: str, ranges: Sequence[Range], rebase: bool) -> None:
        """Evict ``ranges``; a spilling session parks them first, all in one store call."""
        ctx = self.ctx
        executor = ctx.kv_executor("evict")
        s = ctx.sessions[session_id]
        ordered = sorted(ranges, reverse=True)
        if s.residency.spill and ctx.store is not None and executor.capabilities().kv_export:
            refs = ctx.store.park([executor.export_range(session_id, r) for r in ordered])
            self.keep_spilled(session_id, refs, len(ordered))
        for rng in ordered:
            executor.evict_range(session_id, rng, rebase=rebase)
            ctx.count(session_id, "evictions")
        first = ordered[-1].start if ordered else None
        if first is not None and any(r.end > first for r in executor.resident_ranges(session_id)):
            s.exact = False  # later tokens attended to what left: their KV cannot be recomputed as it is
        ctx.dirty.add(session_id)
        if s.ranking is not None:
            s.ranking.drop(ordered)  # an evicted key's accumulated attention goes with it
        ctx.refresh_resident(session_id)

    def keep_spilled(self, session_id: str, refs: list[ColdRef], blocks: int) -> None:
        """``blocks`` blocks of the session were just parked as ``refs``: counted, and the
        session's spill cap applied."""
        ctx = self.ctx
        ctx.sessions[session_id].cold.extend(refs)
        ctx.count(session_id, "spills", blocks)
        ctx.count(session_id, "spilled_bytes", sum(ref.nbytes for ref in refs))
        self._cap_spill(session_id)
        keep_cold_quota(ctx, ctx.sessions[session_id].policy.tenant)

    def _cap_spill(self, session_id: str) -> None:
        """Keep a session's spilled bytes under its policy's ``spill_cap_bytes``: the oldest
        spills go first (deleted from their stores; their tokens stay in the log)."""
        ctx = self.ctx
        s = ctx.sessions[session_id]
        cap = s.policy.spill_cap_bytes
        if cap is None or ctx.store is None:
            return
        held = sum(ref.nbytes for ref in s.cold)
        dropped: list[ColdRef] = []
        while s.cold and held > cap:
            ref = s.cold.pop(0)
            held -= ref.nbytes
            dropped.append(ref)
        if dropped:
            ctx.store.release(dropped)
            ctx.count(session_id, "spill_dropped", len(dropped))
