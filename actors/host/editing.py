"""Changing a session's history: a stream left early, a rollback, a fork.

Primitives:
- ``Editing(ctx, durability, pressure, resumption, kv)``:
  ``cancel(session_id, request_id=None, keep=None) -> Generation | None``: a generate the caller
  left ends now; only its first ``keep`` tokens (all it produced when None) stay in the log and
  the KV, and the call is committed with them (None: no such call runs). A generate given its
  prompt and left before the prompt was all in commits nothing, not even the prompt; nor does one
  whose session was parked for others' room meanwhile (``PREEMPTED``) when no room can be made to
  bring it back and cut it.
  ``truncate(session_id, length)``: the log becomes its first ``length`` tokens and the KV follows
  (resident cells cut; spilled blocks past it released; a suspended session is resumed first, but
  one that keeps every token is cut in its parked record, needing no room now),
  exactly as if the rest had never been appended: at a length where a call of the session ended
  (one of its last ``LAYOUTS_KEPT`` commits), what the dropped tokens made it evict comes back too
  (its spilled blocks imported, the rest recomputed: ``kv.bring_back``), so its resident layout is
  the one it had.
  ``fork(source_id, new_id)``: a new session on this backend from the source's state (the engine
  shares or copies its KV: ``Executor.fork_session``; its spilled blocks copied in the store), both
  continuing independently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvres.coldstore import validate_session_id
from kvres.policy import ArgumentError, Range, RangeError, SessionExistsError

from ..generation import Generation
from .context import HostContext
from .durability import Durability
from .kv_access import SessionKV
from .pressure import Pressure
from .refusals import BackendFullError, SessionBusyError
from .resumption import Resumption
from .scheduler import Job
from .sessions import HostSession, SessionState
from .stepper import generation_of
from .store_ports import ColdRef

_FOREVER = 1 << 62


@dataclass
class Editing:
    ctx: HostContext
    durability: Durability
    pressure: Pressure
    resumption: Resumption
    kv: SessionKV

    def cancel(self, session_id: str, request_id: str | None = None, keep: int | None = None) -> Generation | None:
        ending = self._cancel(session_id, request_id, keep)
        if isinstance(ending, Job):
            ending.wait()  # its next step puts its token in the log; the call ends with it
            assert isinstance(ending.answer, Generation)
            return ending.answer
        return ending

    def _cancel(self, session_id: str, request_id: str | None, keep: int | None) -> Generation | Job | None:
        """The cancelled call's answer; or the call itself where its one token is handed out, kept,
        and not in the log yet (``Job.pending``): that call ends once its next step has put it in."""
        ctx = self.ctx
        with ctx.lock:
            s = ctx.sessions.get(session_id)
            jobs = [j for j in ctx.jobs.pending(session_id)  # one being committed has ended: as if answered
                    if j.kind == "generate" and not j.committing and (request_id is None or j.request_id == request_id)]
            if jobs and jobs[0].pending is not None and (keep is None or keep >= len(jobs[0].produced)):
                job = jobs[0]
                if s is not None:
                    ctx.count(session_id, "cancels")
                job.remaining, job.finish_reason, job.stopped_by = 0, "cancelled", None
                job.ahead = None  # its reader left: the call ends without waiting for it
                ctx.jobs.poke()
                return job
            if s is None or not jobs or not ctx.jobs.withdraw(jobs[0]):
                return None  # it ended (and was committed) already, or never ran here
            job = jobs[0]
            ctx.count(session_id, "cancels")
            job.pending = None  # a token handed out and not kept never reaches the log
            if job.feed:  # left before its prompt was in: the call commits nothing, prompt included
                self.durability.roll_back(session_id)
                job.finish_reason, job.stopped_by, job.remaining = "cancelled", None, 0
                answer = generation_of(ctx, job)
                job.answer = answer
                job.finish()
                ctx.jobs.poke()
                return answer
            kept = len(job.produced) if keep is None else max(0, min(int(keep), len(job.produced)))
            if s.state is SessionState.PREEMPTED and job.start_length >= 0 and \
                    len(s.record.token_log) > job.start_length + kept:
                try:  # parked for others' room mid-call: back on the engine to cut what was not kept
                    self.resumption.resume(session_id)
                    s = ctx.sessions[session_id]
                except BackendFullError:  # no room for that now: the call commits nothing
                    kept = 0
                    self.durability.roll_back(session_id)
            if s.live and job.start_length >= 0:
                self._cut(session_id, s, job.start_length + kept)
            del job.produced[kept:]
            if job.logprobs is not None:
                del job.logprobs[kept:]
            if job.top_logprobs is not None:
                del job.top_logprobs[kept:]
            job.finish_reason, job.stopped_by, job.remaining = "cancelled", None, 0
            answer = generation_of(ctx, job)
            try:
                self.durability.commit(session_id, job.request_id, answer)
            except Exception as exc:
                self.durability.fail(job, exc)
                raise
            job.answer = answer
            job.finish()
            ctx.publish()
            ctx.jobs.poke()
            return answer

    def truncate(self, session_id: str, length: int) -> int:
        """The session's log is its first ``length`` tokens; returns that length."""
        ctx = self.ctx
        if isinstance(length, bool) or not isinstance(length, int):
            raise ArgumentError(f"length must be an int, got {type(length).__name__} {length!r}")
        with ctx.lock:
            s = ctx.get(session_id, live=False)
            if ctx.jobs.pending(session_id):
                raise SessionBusyError(f"session {session_id!r} has a call running; truncate it after")
            held = len(ctx.token_log(session_id))
            if not 0 <= length <= held:
                raise RangeError(f"cannot truncate session {session_id!r} to {length} tokens: its log holds {held}")
            if length == held:
                return held
            ctx.count(session_id, "truncated_tokens", held - length)
            if not s.live and ctx.addresses_kv and s.residency.keeps_every_token:
                self._cut_parked(s, length)  # nothing to bring back: no room needed now
                self.durability.commit(session_id)
                ctx.publish()
                return length
            if not s.live:
                self.resumption.resume(session_id)
                s = ctx.sessions[session_id]
            self._cut(session_id, s, length)
            self.durability.commit(session_id)
            ctx.publish()
            return length

    def _cut(self, session_id: str, s: HostSession, length: int) -> None:
        """Log and KV back to ``length`` tokens (the caller holds the lock)."""
        ctx = self.ctx
        if len(ctx.executor.token_log(session_id)) > length:
            s.last_logits = ctx.executor.truncate(session_id, length)
        past = [ref for ref in s.cold if ref.key.token_range.end > length]
        if past:
            gone = set(past)
            s.cold = [ref for ref in s.cold if ref not in gone]
            if ctx.store is not None:
                ctx.store.release(past)
        if s.ranking is not None:
            s.ranking.drop([Range(length, _FOREVER)])
        s.retrieved, s.recall_ready, s.compressing = [], None, False
        for later in [n for n in s.layouts if n > length]:
            del s.layouts[later]
        layout = s.layouts.get(length)
        if layout is not None and s.residency.evicts:
            self.kv.bring_back(session_id, s, layout)
        ctx.refresh_resident(session_id)

    def _cut_parked(self, s: HostSession, length: int) -> None:
        """A suspended session that keeps every token cut in its record: log and resident ranges
        to ``length``, parked blocks past it released, the last logits left for its resume to take
        again. A block across the cut stays where at least half of it is kept: its resume imports it
        whole and cuts it back (``SessionKV.restore``), cheaper than recomputing the part kept (a
        chat turn whose reply reads back as other tokens cuts a parked session by that reply)."""
        record = s.record
        across = [ref for ref in record.blocks
                  if ref.key.token_range.start < length < ref.key.token_range.end
                  and length - ref.key.token_range.start >= ref.key.token_range.end - length]
        kept = [ref for ref in record.blocks if ref.key.token_range.end <= length] + across
        gone = [ref for ref in record.blocks + s.cold if ref.key.token_range.end > length and ref not in across]
        if gone and self.ctx.store is not None:
            self.ctx.store.release(gone)
        resident = [Range(r.start, min(r.end, length)) for r in record.resident_ranges if r.start < length]
        s.cold = [ref for ref in s.cold if ref.key.token_range.end <= length]
        s.last_logits = None
        s.park(replace(record, token_log=list(record.token_log[:length]), resident_ranges=resident, blocks=kept,
                       cold=list(s.cold), last_logits=None))
        for later in [n for n in s.layouts if n > length]:
            del s.layouts[later]

    def fork(self, source_id: str, new_id: str) -> None:
        ctx = self.ctx
        validate_session_id(new_id)
        with ctx.lock:
            if new_id in ctx.sessions or ctx.journal.load(new_id) is not None:
                raise SessionExistsError(new_id)
            s = ctx.get(source_id, live=False)
            if ctx.jobs.pending(source_id):
                raise SessionBusyError(f"session {source_id!r} has a call running; fork it after")
            if not s.live:
                self.resumption.resume(source_id)
                s = ctx.sessions[source_id]
            s.last_used = ctx.tick()
            self.pressure.make_room({}, newcomer=new_id, newcomer_tokens=s.resident, busy={source_id},
                                    newcomer_tenant=s.policy.tenant)
            ctx.executor.fork_session(source_id, new_id)
            child = ctx.new_session(s.policy)
            child.last_logits = None if s.last_logits is None else s.last_logits.copy()
            child.exact = s.exact
            try:
                child.cold = self._copy_cold(new_id, s.cold)
            except Exception:
                ctx.executor.close_session(new_id)
                raise
            ctx.sessions[new_id] = child
            ctx.refresh_resident(new_id)
            self.durability.commit_new(new_id)
            ctx.publish()

    def _copy_cold(self, new_id: str, cold: list[ColdRef]) -> list[ColdRef]:
        """The source's spilled blocks, parked again under the new session (blocks a store no
        longer has are left out: those tokens stay in the log, their KV is gone)."""
        if not cold or self.ctx.store is None:
            return []
        blocks = [block for block in self.ctx.store.read(cold) if block is not None]
        return self.ctx.store.park([replace(block, session_id=new_id) for block in blocks])
