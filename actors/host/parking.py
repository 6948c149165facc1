"""Suspend and resume: a session's KV parked in the cold store as a whole, and brought back.

Primitives:
- ``Parking(ctx, durability, pressure, recall_costs=None)``: ``suspend(session_id, forced=True)``
  (every resident range exported as one block, all of them in one ``put_many``; the engine's copy
  freed; a forced one, for others' room, counted once in ``suspends``, in the counters its record
  carries),
  ``detach(session_id)`` (suspended and forgotten here: it moves to another backend),
  ``resume(session_id, record=None, busy=None)`` (a slot made, the parked blocks worth reading
  imported with one ``pop_many`` per store, the rest recomputed from the token log; returns the
  tokens recomputed). ``recall_costs`` says which blocks are cheaper to recompute than to read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from kvres.coldstore import ColdStoreError
from kvres.policy import (
    BlockMismatchError,
    CapabilityError,
    KvresError,
    RangeError,
    SessionExistsError,
    subtract_range,
)
from kvres.policy.recall import RecallCosts

from .context import HostContext
from .durability import Durability
from .errors import SessionBusyError
from .journal import SessionRecord
from .pressure import Pressure
from .quotas import keep_cold_quota
from .sessions import SuspendRecord
from .store_ports import ColdRef

log = logging.getLogger("kvres.backend")


class Parking:
    def __init__(
        self, ctx: HostContext, durability: Durability, pressure: Pressure,
        recall_costs: Callable[[], RecallCosts | None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.durability = durability
        self.pressure = pressure
        self._recall_costs = recall_costs

    def suspend(self, session_id: str, forced: bool = True) -> SuspendRecord:
        """Export all of the session's KV to the cold store and free it on the engine (a session
        already suspended stays as it is). ``forced``: to make room for others (counted in
        ``suspends``; a caller's, an idle timer's or a migration's suspend is counted where it is
        asked for)."""
        ctx = self.ctx
        with ctx.lock:
            s = ctx.get(session_id, live=False)
            if not s.live:
                return s.record
            if ctx.loop.pending(session_id):
                raise SessionBusyError(f"session {session_id!r} has a call running; suspend it after")
            if ctx.store is None:
                raise KvresError(f"backend {ctx.name!r} has no cold store: cannot suspend {session_id!r}")
            resident = ctx.executor.resident_ranges(session_id)  # none where the engine manages KV
            if forced:
                ctx.count(session_id, "suspends")  # before the record: a resume carries its counters on
            refs: list[ColdRef] = []
            if resident and ctx.executor.capabilities().kv_export:
                executor = ctx.kv_executor("suspend")
                refs = ctx.store.park([executor.export_range(session_id, r) for r in resident])
            s.park(SessionRecord(
                session_id, ctx.executor.token_log(session_id), resident, refs, list(s.cold),
                s.policy, s.last_logits, dict(s.counters), ctx.fingerprint,
            ))
            ctx.executor.close_session(session_id)
            keep_cold_quota(ctx, s.policy.tenant)  # (may drop this very state, if the tenant keeps too much)
            s.park(self.durability.commit(session_id, later=True))
            ctx.publish()
            ctx.loop.poke()
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

    def resume(self, session_id: str, record: SuspendRecord | None = None, busy: set[str] | None = None,
               incoming: Mapping[str, int] | None = None) -> int:
        """Bring a suspended session back (from this backend's record or one handed over);
        returns the number of tokens that had to be recomputed. The caller holds the lock;
        ``incoming``: tokens other sessions bring in the step under way (room is made for them too)."""
        ctx = self.ctx
        if record is None:
            parked = ctx.get(session_id, live=False)
            if parked.live:
                return 0
            record = parked.record
        elif session_id in ctx.sessions:
            raise SessionExistsError(session_id)
        if ctx.store is None and record.blocks:
            raise KvresError(f"backend {ctx.name!r} has no cold store: cannot resume {session_id!r}")
        previous = ctx.sessions.pop(session_id, None)
        s = ctx.new_session(record.policy, record, committed=previous.committed if previous else None)
        try:
            self.pressure.make_room(incoming or {}, newcomer=session_id,
                                    newcomer_tokens=sum(len(r) for r in record.resident_ranges), busy=busy,
                                    newcomer_tenant=record.policy.tenant)
            ctx.open_on_engine(session_id, s, record.token_log)
        except BaseException:
            if previous is not None:
                ctx.sessions[session_id] = previous  # still suspended, nothing lost
            raise
        ctx.sessions[session_id] = s
        try:
            recomputed = self._restore(session_id, record) if record.resident_ranges else 0
        except BaseException:
            ctx.executor.close_session(session_id)
            if previous is not None:
                ctx.sessions[session_id] = previous
            else:
                del ctx.sessions[session_id]
            raise
        ctx.refresh_resident(session_id)
        if recomputed and not s.exact:
            ctx.count(session_id, "inexact_recomputed_tokens", recomputed)
            log.warning("session %r: %d tokens recomputed from its log differ from the KV they replace "
                        "(it evicted tokens that later ones had attended to); its continuation may differ "
                        "from an uninterrupted run", session_id, recomputed)
        self.durability.commit(session_id, later=True)
        ctx.publish()
        return recomputed

    def _restore(self, session_id: str, record: SuspendRecord) -> int:
        """Import the parked blocks worth reading (one ``pop_many`` per store, which also frees
        them), recompute the rest from the token log."""
        ctx = self.ctx
        executor = ctx.kv_executor("resume")
        can_shift = executor.capabilities().position_shift
        # without position_shift, a recomputed range after a gap may be impossible: read every block
        costs = self._recall_costs() if self._recall_costs is not None and can_shift else None
        parked = ctx.store.take(record.blocks, costs) if ctx.store is not None and record.blocks else []
        for block in parked:
            if block is None:
                continue  # gone, unreadable or cheaper to recompute: recomputed below
            try:
                executor.import_range(session_id, block)
                ctx.count(session_id, "admissions")
            except (ColdStoreError, BlockMismatchError, RangeError):
                continue
        recomputed = 0
        for rng in record.resident_ranges:
            missing = [rng]
            for have in executor.resident_ranges(session_id):
                missing = [m for part in missing for m in subtract_range([part], have)]
            for part in missing:
                try:
                    executor.admit_range(session_id, part)
                except CapabilityError:
                    if can_shift:
                        raise
                    continue  # it would need a K-shift: the range stays evicted, its tokens in the log
                recomputed += len(part)
        if recomputed:
            ctx.count(session_id, "recomputed_tokens", recomputed)
        return recomputed
