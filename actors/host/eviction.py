"""Eviction: a session's KV cut to a budget on an engine whose KV kvres addresses, scored where its
policy ranks blocks, spilled to the cold store where it spills.

Primitives:
- ``session_view(ctx, session_id, incoming, active, pinned=False)``: what the planner sees of a
  session (blocks recalled this turn outrank the rest).
- ``EngineScores(executor, session_id, s, lookahead=None)``: one session's scoring inputs, read
  from the engine.
- ``Eviction(ctx, executor, plan)``: ``evict`` (a spilling session parks the ranges first, in one
  store call), ``keep_spilled`` (a session's spilled bytes kept under its cap and its tenant's
  ``cold_bytes``), ``compress`` / ``compress_now`` (a scored session cut to its budget by its
  ranking; a prompt larger than the free room ranked by its own last tokens, ``lookahead``),
  ``observe`` (an accumulating ranking takes the rows of a long call before one capture could not
  hold them), ``with_scores`` / ``block_scores`` (what the planner sees of a session's blocks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from kvres.policy import CapabilityError, KvresError, Range
from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, SessionView
from kvres.policy.scorers import KeyCapture
from kvres.policy.scoring import AttentionCapture

from ..engines.executor import Executor
from .context import HostContext
from .quotas import keep_cold_quota
from .scheduler import Job
from .sessions import HostSession
from .store_ports import ColdRef


def session_view(ctx: HostContext, session_id: str, incoming: int, active: bool, pinned: bool = False) -> SessionView:
    """What the planner sees of a session (``incoming`` tokens coming, ``active``: it has a call)."""
    s = ctx.sessions[session_id]
    r = s.residency
    view = SessionView(
        session_id=session_id,
        resident_ranges=tuple(ctx.executor.resident_ranges(session_id)),
        last_used=s.last_used,
        active=active,
        incoming_tokens=incoming,
        budget_tokens=r.planned_budget_tokens,
        stream_policy=r.stream_policy(),
        evictable=r.evicts,
        block_size=r.block_size,
        priority=s.policy.priority,
        pinned=pinned,
        tool_paused=s.paused_for_tools(time.monotonic()),
    )
    if not s.retrieved:
        return view
    # blocks recalled this turn outrank the rest (which go by recency, as streaming would)
    blocks = view.blocks()
    scores = tuple(float(any(r.start < blocks.ends[i] and blocks.starts[i] < r.end for r in s.retrieved))
                   for i in range(len(blocks)))
    return replace(view, scores=scores)


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


class Eviction:
    def __init__(self, ctx: HostContext, executor: Executor, plan: Callable[[BackendPlanInput], BackendPlan]) -> None:
        self.ctx = ctx
        self.executor = executor
        self._plan = plan

    # -- what the planner sees --------------------------------------------------------------
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
        return s.ranking.block_scores(EngineScores(self.executor, session_id, s, ahead), ranges)

    def observe(self, session_id: str) -> None:
        """An accumulating ranking (H2O) takes the rows processed since its last capture now,
        before more arrive than one capture holds."""
        s = self.ctx.sessions[session_id]
        if s.ranking is not None and s.ranking.accumulates:
            s.ranking.observe(EngineScores(self.executor, session_id, s))

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
        plan = self._plan(BackendPlanInput([self.with_scores(session_view(ctx, session_id, 0, True), lookahead)],
                                           ctx.config.kv_budget_tokens, ctx.executor.capabilities()))
        for action in plan.actions:
            if action.kind == "evict":
                self.evict(session_id, action.ranges, action.rebase)

    # -- carrying a plan out ----------------------------------------------------------------
    def evict(self, session_id: str, ranges: Sequence[Range], rebase: bool) -> None:
        """Evict ``ranges``; a spilling session parks them first, all in one store call."""
        ctx, executor = self.ctx, self.executor
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
