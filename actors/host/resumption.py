"""Resume: a suspended session brought back, its parked KV imported or recomputed.

Primitives:
- ``Resumption(ctx, durability, pressure, kv)``: ``resume(session_id, record=None, busy=None,
  incoming=None)`` (from this backend's record or one handed over: a slot and room made through
  ``pressure``, the session reopened on the engine with its whole log non-resident, then
  ``kv.restore``: the parked blocks worth reading imported with one ``pop_many`` per store, the
  rest recomputed from the token log; returns the tokens recomputed). If it fails, the session
  stays suspended with its record. A record without the last logits (cut while parked) has them
  computed again from the last token. A session preempted during a call of its own comes back as
  that call left it, not committed (the call commits it). What its calls noted on it (a pause for
  tools, the prefix break its turn's answer reports, being ephemeral) goes on with it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kvres.policy import KvresError, SessionExistsError

from .context import HostContext
from .durability import Durability
from .kv_access import SessionKV
from .pressure import Pressure
from .sessions import SessionState, SuspendRecord

log = logging.getLogger("kvres.backend")


class Resumption:
    def __init__(self, ctx: HostContext, durability: Durability, pressure: Pressure, kv: SessionKV) -> None:
        self.ctx = ctx
        self.durability = durability
        self.pressure = pressure
        self.kv = kv

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
        if previous is not None:  # what its calls noted goes on: a pause for tools, the break its turn reports
            s.tool_paused_at, s.prefix_break = previous.tool_paused_at, previous.prefix_break
            s.ephemeral = previous.ephemeral
        try:
            overhang = sum(max(0, ref.key.token_range.end - len(record.token_log)) for ref in record.blocks)
            self.pressure.make_room(incoming or {}, newcomer=session_id,
                                    newcomer_tokens=sum(len(r) for r in record.resident_ranges) + overhang, busy=busy,
                                    newcomer_tenant=record.policy.tenant)
            self.kv.open_on_engine(session_id, s, record.token_log)
        except BaseException:
            if previous is not None:
                ctx.sessions[session_id] = previous  # still suspended, nothing lost
            raise
        ctx.sessions[session_id] = s
        try:
            recomputed = self.kv.restore(session_id, record) if record.resident_ranges else 0
        except BaseException:
            ctx.executor.close_session(session_id)
            if previous is not None:
                ctx.sessions[session_id] = previous
            else:
                del ctx.sessions[session_id]
            raise
        ctx.refresh_resident(session_id)
        if ctx.addresses_kv and s.last_logits is None and record.token_log:  # cut while parked: take them again
            s.last_logits = ctx.executor.truncate(session_id, len(record.token_log))
        mid_call = previous is not None and previous.state is SessionState.PREEMPTED
        if previous is not None and mid_call:  # its call goes on: what that turn scored and recalled holds
            s.ranking, s.compressing, s.retrieved = previous.ranking, previous.compressing, previous.retrieved
        if recomputed and not s.exact:
            ctx.count(session_id, "inexact_recomputed_tokens", recomputed)
            log.warning("session %r: %d tokens recomputed from its log differ from the KV they replace "
                        "(it evicted tokens that later ones had attended to); its continuation may differ "
                        "from an uninterrupted run", session_id, recomputed)
        if not mid_call:  # (a preempted session's call commits it when it is done)
            # brought back for a call: its record may wait for that call's commit
            self.durability.commit(session_id, later=True, replaceable=bool(ctx.jobs.pending(session_id)))
        ctx.publish()
        return recomputed
