"""Suspend: a session's KV parked in the cold store as a whole, and the engine's copy freed.

Primitives:
- ``Parking(ctx, durability, kv)``: ``suspend(session_id, forced=True)`` (every resident range
  exported as one block, ``kv.export_resident``, all of them in one ``put_many``; the engine's copy
  freed; a forced one, for others' room, counted once in ``suspends``, in the counters its record
  carries, and in ``tool_pause_suspends`` too while the session is paused for tools (one that is
  not forced ends its pause: it is not brought back ahead of its next call); a forced one
  of a session whose own call waits for room parks it ``PREEMPTED``: its record is not committed,
  that call resumes it and commits or rolls it back), ``detach(session_id)`` (suspended and
  forgotten here: it moves to another backend).
  It sits below ``Pressure``, which suspends idle sessions through it; bringing a session back is
  ``resumption.Resumption``.
"""

from __future__ import annotations

import time

from kvres.policy import KvresError

from .context import HostContext
from .durability import Durability
from .journal import SessionRecord
from .kv_access import SessionKV
from .quotas import keep_cold_quota
from .refusals import SessionBusyError
from .sessions import SessionState, SuspendRecord
from .store_ports import ColdRef


class Parking:
    def __init__(self, ctx: HostContext, durability: Durability, kv: SessionKV) -> None:
        self.ctx = ctx
        self.durability = durability
        self.kv = kv

    def suspend(self, session_id: str, forced: bool = True) -> SuspendRecord:
        """Export all of the session's KV to the cold store and free it on the engine (a session
        already suspended stays as it is). ``forced``: to make room for others (counted in
        ``suspends``; a caller's, an idle timer's or a migration's suspend is counted where it is
        asked for)."""
        ctx = self.ctx
        with ctx.lock:
            s = ctx.get(session_id, live=False)
            # only pressure parks it then: its call waits for room (a call whose record is being
            # written is done with it: parked as it stands, that record goes with the suspend's)
            pending = ctx.jobs.pending(session_id)
            mid_call = any(not job.committing for job in pending)
            if not forced and (pending or s.state is SessionState.PREEMPTED):
                raise SessionBusyError(f"session {session_id!r} has a call running; suspend it after")
            if not forced:
                s.tool_paused_at = None  # parked as its owner or its idle clock asked: not brought back ahead
            if not s.live:
                return s.record
            if ctx.store is None:
                raise KvresError(f"backend {ctx.name!r} has no cold store: cannot suspend {session_id!r}")
            resident = ctx.executor.resident_ranges(session_id)  # none where the engine manages KV
            if forced:
                ctx.count(session_id, "suspends")  # before the record: a resume carries its counters on
                if s.paused_for_tools(time.monotonic()):
                    ctx.count(session_id, "tool_pause_suspends")
            if mid_call:
                ctx.count(session_id, "preemptions")
            blocks = self.kv.export_resident(session_id, resident)
            refs: list[ColdRef] = ctx.store.park(blocks) if blocks else []
            s.park(SessionRecord(
                session_id, ctx.executor.token_log(session_id), resident, refs, list(s.cold),
                s.policy, s.last_logits, dict(s.counters), ctx.fingerprint,
            ), SessionState.PREEMPTED if mid_call else SessionState.SUSPENDED)
            ctx.executor.close_session(session_id)
            keep_cold_quota(ctx, s.policy.tenant)  # (may drop this very state, if the tenant keeps too much)
            if mid_call:  # what its call did so far is parked with it: committed when the call is done
                ctx.room.counts["preempted"] += 1
            else:
                # parked for room: its record may wait for the commit of the turn that brings it back
                s.park(self.durability.commit(session_id, later=True, replaceable=forced))
            ctx.publish()
            ctx.jobs.poke()
            if not forced:  # a slot freed: a session parked while paused for tools may come back
                ctx.jobs.request_idle()
            return s.record

    def detach(self, session_id: str) -> SuspendRecord:
        """Suspend and forget the session here (it moves to another backend)."""
        ctx = self.ctx
        with ctx.lock:
            self.suspend(session_id, forced=False)
            if ctx.store is not None:
                ctx.store.flush()  # whoever resumes it reads its blocks from the store: they are there
            record = self.durability.commit(session_id, backend="")  # on its way: no backend rebuilds it
            del ctx.sessions[session_id]
            ctx.metrics.set_resident(ctx.name, session_id, 0)
            ctx.publish()
            return record
