"""Retention a session's owner controls: priority and pins in who goes first, idle sessions parked,
expired ones closed.

Primitives:
- ``pinned_sessions(ctx) -> set[str]``: the live sessions whose pin holds now: pinned sessions in
  the order they were opened, while what they hold together stays within the backend's
  ``max_pinned_tokens`` (default: half its ``kv_budget_tokens``); a pinned session past that
  cap is treated as unpinned until the others shrink or leave (``stats()["pinned"]`` says which).
- ``RetentionTimer(ctx, suspend, on_closed=None)``: a daemon thread that sleeps until a session
  asks for ``idle_suspend_s`` or ``ttl_s`` (``HostContext.new_session`` sets ``ctx.retention_wake``),
  then parks a live session after ``idle_suspend_s`` without a call (``suspend``; counted in
  ``idle_suspends``; not while it is paused for tools, ``HostSession.paused_for_tools``) and closes a session after ``ttl_s`` without one (``HostContext.close``: its
  blocks deleted; ``on_closed(session_id)`` then, for the directory). A session with a call running
  is never touched; a call resets its clock (``HostSession.touched_at``). ``stop()`` ends the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .context import RETENTION_POLL_S, HostContext

log = logging.getLogger("kvres.backend")


def pin_cap(ctx: HostContext) -> int:
    cap = ctx.config.max_pinned_tokens
    return ctx.config.kv_budget_tokens // 2 if cap is None else cap


def pinned_sessions(ctx: HostContext) -> set[str]:
    held, cap, pinned = 0, pin_cap(ctx), set()
    for sid, s in ctx.sessions.items():  # in the order they were opened
        if s.policy.pin and s.live and held + s.resident <= cap:
            held += s.resident
            pinned.add(sid)
    return pinned


class RetentionTimer:
    def __init__(self, ctx: HostContext, suspend: Callable[[str], object],
                 on_closed: Callable[[str], None] | None = None) -> None:
        self._ctx = ctx
        self._suspend = suspend
        self._on_closed = on_closed
        self._wake = ctx.retention_wake  # set when a session with an idle or TTL limit comes (or changed)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"kvres-retention-{ctx.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def _run(self) -> None:
        self._wake.wait()  # nothing to look at before the first session with a limit
        self._ctx.retention_looking = True
        while not self._stopping:
            try:
                wait = self.check(time.monotonic())
            except Exception:  # the timer must outlive a failed park or close (it is tried again)
                log.exception("backend %r: retention check failed", self._ctx.name)
                wait = RETENTION_POLL_S
            self._wake.wait(wait)
            self._wake.clear()

    def check(self, now: float) -> float:
        """Park and close what is due at ``now``; returns how long until the next deadline (at
        most ``RETENTION_POLL_S``)."""
        ctx = self._ctx
        due_close: list[str] = []
        due_park: list[str] = []
        wait = RETENTION_POLL_S
        with ctx.lock:
            busy = ctx.busy()
            for sid, s in ctx.sessions.items():
                if sid in busy:
                    continue
                idle = now - s.touched_at
                ttl, park = s.policy.ttl_s, s.policy.idle_suspend_s
                if ttl is not None and idle >= ttl:
                    due_close.append(sid)
                elif park is not None and s.live and idle >= park and ctx.store is not None \
                        and not s.paused_for_tools(now):  # (looked at again within RETENTION_POLL_S once the pause ends)
                    due_park.append(sid)  # (without a cold store there is nowhere to park it)
                for limit in (ttl, park if s.live else None):
                    if limit is not None and idle < limit:
                        wait = min(wait, limit - idle)
            for sid in due_park:
                ctx.count(sid, "idle_suspends")  # before the record: its resume carries the count on
                try:
                    self._suspend(sid)
                except Exception as exc:  # tried again at the next look; the others go on
                    log.warning("backend %r: parking idle session %r failed: %s", ctx.name, sid, exc)
                    continue
                log.info("backend %r: session %r parked after %.1f s without a call", ctx.name, sid,
                         now - ctx.sessions[sid].touched_at)
            for sid in list(due_close):
                ctx.count(sid, "ttl_closes")  # the backend's series keeps it once the session is gone
                try:
                    ctx.close(sid)
                except Exception as exc:
                    log.warning("backend %r: closing expired session %r failed: %s", ctx.name, sid, exc)
                    due_close.remove(sid)
                    continue
                log.info("backend %r: session %r closed: its ttl_s ran out", ctx.name, sid)
        for sid in due_close:
            if self._on_closed is not None:
                try:
                    self._on_closed(sid)
                except Exception as exc:  # the directory learns it on the next call instead
                    log.warning("backend %r: session %r closed by its ttl_s; telling the directory failed: %s",
                                ctx.name, sid, exc)
        return max(0.01, wait)
