"""Tool pauses: a session whose turn ended in tool calls, kept for the turn that brings the results.

Primitives:
- ``ToolPauses(ctx, resumption, room_free)``: ``pause(session_id)`` (the session's last turn ended
  in tool calls, its results are on their way: it is parked after the idle sessions, for its
  policy's ``tool_pause_s``, ``kvres.policy.backend_planner.keep_key``; its next call ends the
  pause, ``BackendHost._submit``); ``prefetch() -> bool`` (the step loop's idle work: a session
  parked while paused is brought back ahead of its results, ``Resumption.resume``, when a sequence
  slot is free and its tokens fit without parking or evicting anyone, ``room_free``; counted in
  ``tool_prefetches``; True when it brought one back, so the loop asks again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .context import HostContext
from .resumption import Resumption

log = logging.getLogger("kvres.backend")


class ToolPauses:
    def __init__(self, ctx: HostContext, resumption: Resumption,
                 room_free: Callable[[int, str | None], bool]) -> None:
        self.ctx = ctx
        self._resumption = resumption
        self._room_free = room_free  # (tokens, tenant): they fit with nothing planned (Pressure.needs_plan)

    def pause(self, session_id: str) -> None:
        ctx = self.ctx
        with ctx.lock:
            s = ctx.get(session_id, live=False)
            if ctx.jobs.pending(session_id):
                return  # its next call is already here: nothing to wait for
            s.tool_paused_at = time.monotonic()
            parked = not s.live
        if parked:
            ctx.jobs.request_idle()  # parked already: brought back once a slot and room are free

    def prefetch(self) -> bool:
        ctx = self.ctx
        now = time.monotonic()
        with ctx.lock:
            if ctx.jobs.pending() or ctx.jobs.stopping:
                return False
            if sum(1 for s in ctx.sessions.values() if s.live) >= ctx.config.n_seq_max:
                return False
            waiting = [(s.tool_paused_at or 0.0, sid) for sid, s in ctx.sessions.items()
                       if not s.live and s.parked is not None and s.paused_for_tools(now)]
            for _, sid in sorted(waiting):  # the longest paused first: its results come soonest
                s = ctx.sessions[sid]
                tokens = sum(len(r) for r in s.record.resident_ranges)
                if not self._room_free(tokens, s.policy.tenant):
                    continue
                try:
                    self._resumption.resume(sid)
                except Exception as exc:  # its next call resumes it as ever
                    log.warning("backend %r: bringing session %r back ahead of its tool results failed: %s",
                                ctx.name, sid, exc)
                    return False
                ctx.count(sid, "tool_prefetches")
                return True
        return False
