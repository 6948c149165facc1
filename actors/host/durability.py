"""A session's durability: its journal record, written after every call, and what a failure undoes.

Primitives:
- ``Durability(ctx)``: ``commit(session_id, request_id=None, result=None, backend=None, later=False,
  replaceable=False)`` (the session's record to the journal; ``later``: written behind, for
  changes that add no token; ``replaceable``: after a while, unless a newer record replaces it:
  ``WriteBehindJournal.save_later``), ``commit_call(job, answer)`` (a call's commit, then its answer: where the journal is
  remote, written behind the step loop and answered once written), ``commit_new`` (a new
  session's first record, or no session), ``flush_dirty`` (sessions others' calls changed), ``fail(job, error)`` and ``roll_back(session_id)`` (a failed call commits
  nothing: back to the last commit, from a live session or one preempted during the call); a
  commit of a preempted session makes it an ordinary suspended one. (A session the journal has and
  this process does not is rebuilt by ``HostContext.get``.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .context import HostContext
from .journal import SessionRecord
from .scheduler import Job
from .sessions import SessionState

log = logging.getLogger("kvres.backend")


class Durability:
    def __init__(self, ctx: HostContext) -> None:
        self.ctx = ctx

    def snapshot(self, session_id: str) -> SessionRecord:
        ctx = self.ctx
        s = ctx.sessions[session_id]
        if not s.live:
            record = replace(s.record, counters=dict(s.counters), backend=ctx.name, state="suspended", exact=s.exact)
        else:
            record = SessionRecord(
                session_id, list(ctx.executor.token_log(session_id)), list(ctx.executor.resident_ranges(session_id)),
                [], list(s.cold), s.policy, s.last_logits, dict(s.counters), ctx.fingerprint,
                backend=ctx.name, state="live", exact=s.exact,
            )
        if s.committed is not None:
            record.request_id, record.result = s.committed.request_id, s.committed.result
            record.generation = s.committed.generation
        record.generation += 1
        return record

    def commit_call(self, job: Job, answer: object) -> None:
        """A call's commit, then its answer. Where the journal is remote the record is written
        behind, off the step loop (which steps the other calls meanwhile), and the call answered
        once it is written (``Job.committing`` until then); else at once. A write that fails fails
        the call: its session back to its last record."""
        s = self.ctx.sessions[job.session_id]
        if s.ephemeral or not self.ctx.journal.remote:
            try:
                self.commit(job.session_id, job.request_id, answer)
            except Exception as exc:
                self.fail(job, exc)
                return
            job.answer = answer
            job.finish()
            return
        previous = s.committed
        queued: list[SessionRecord] = []  # the record written (set before the writer can fail it: under the lock)

        def written(error: BaseException | None) -> None:
            if error is None:
                job.answer = answer
                job.finish()
                return
            with self.ctx.lock:
                if queued and s.committed is not previous:  # (or a suspend's since, which carries this call's)
                    s.committed = previous  # never written: the last record is the one before
                self.fail(job, error)
                self.ctx.jobs.poke()

        job.committing = True
        queued.append(self.commit(job.session_id, job.request_id, answer, written=written))

    def commit(
        self, session_id: str, request_id: str | None = None, result: Any = None, backend: str | None = None,
        later: bool = False, written: Callable[[BaseException | None], None] | None = None,
        replaceable: bool = False,
    ) -> SessionRecord:
        """Write the session's record to the journal (``backend`` overrides who serves it: ""
        while it moves; an ephemeral session's is kept in memory only); a call's commit also
        records its request id and result. ``written``: the record is written behind, and
        ``written(error)`` told once it is (``commit_call``)."""
        record = self.snapshot(session_id)
        if request_id is not None:
            record.request_id, record.result = request_id, result
        if backend is not None:
            record.backend = backend
        s = self.ctx.sessions[session_id]
        if s.ephemeral:
            pass  # opened for one call, closed by it: its record is kept in memory only
        elif written is not None:
            self.ctx.journal.save_soon(record, written)
        elif later:
            self.ctx.journal.save_later(record, replaceable=replaceable)
        else:
            started = time.perf_counter()
            self.ctx.journal.save(record)
            self.ctx.jobs.profile.commit_s += time.perf_counter() - started
        s.committed = record
        if s.state is SessionState.PREEMPTED:  # what its call did is committed: simply suspended now
            s.park(s.record)
        if s.live:
            s.remember_layout(len(record.token_log), record.resident_ranges)
        self.ctx.dirty.discard(session_id)
        return record

    def commit_new(self, session_id: str) -> None:
        """A new session's first record; if it cannot be written the session is not opened."""
        try:
            self.commit(session_id)
        except BaseException:
            s = self.ctx.sessions.pop(session_id)
            if s.live:
                self.ctx.executor.close_session(session_id)
            raise

    def flush_dirty(self) -> None:
        """Commit sessions changed by others' calls (evicted, suspended for room); a session with
        a call of its own running is committed by that call."""
        ctx = self.ctx
        if not ctx.dirty:
            return
        running = ctx.busy()
        for sid in list(ctx.dirty):
            if sid not in ctx.sessions:
                ctx.dirty.discard(sid)
            elif sid not in running:
                self.commit(sid, later=True)

    def fail(self, job: Job, error: BaseException) -> None:
        """A call that fails commits nothing: its session goes back to its last commit."""
        if not job.done:
            try:
                self.roll_back(job.session_id, committing=job.committing)
            except Exception:
                log.exception("rolling back session %r after a failed call failed", job.session_id)
        job.finish(error)

    def roll_back(self, session_id: str, committing: bool = False) -> None:
        """Undo what a failed call did to a live or preempted session: back to its committed record
        (suspended by it, so the next call resumes it: parked blocks imported, the rest recomputed),
        blocks it spilled or was parked in since released. Nothing to do when none of the call's
        tokens landed. ``committing``: the call failed writing its record, and a session parked
        meanwhile (for others' room) is undone like a preempted one, its suspend's record, still to
        be written, replaced by the one it goes back to."""
        ctx = self.ctx
        s = ctx.sessions.get(session_id)
        record = None if s is None else s.committed
        parked_committing = s is not None and committing and s.state is SessionState.SUSPENDED
        if s is None or record is None or (s.state is SessionState.SUSPENDED and not parked_committing):
            return
        preempted = s.state is SessionState.PREEMPTED or parked_committing
        log = s.record.token_log if preempted else ctx.executor.token_log(session_id)
        landed = len(log) != len(record.token_log) or record.state != "live"
        if not landed and s.cold == record.cold:
            if preempted:  # parked before any of its call landed: as it was, suspended
                s.park(s.record)
                self.commit(session_id, later=True)
            return
        keep = set(record.cold) | set(record.blocks)
        dropped = [ref for ref in s.cold + (s.record.blocks if preempted else []) if ref not in keep]
        if dropped and ctx.store is not None:
            ctx.store.release(dropped)
        if not preempted:
            ctx.executor.close_session(session_id)
        ctx.count(session_id, "rollbacks")
        s.park(replace(record, counters=dict(s.counters), state="suspended"))
        s.cold, s.last_logits, s.exact = list(record.cold), record.last_logits, record.exact
        s.forget_turn()
        if parked_committing:
            self.commit(session_id, later=True)
        ctx.publish()
