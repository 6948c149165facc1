"""The engine loop of a backend: calls of many sessions become jobs, run together step by step.

Primitives:
- ``Job``: one ``append`` (tokens still to feed) or ``generate`` (tokens still to produce, with its
  own sampler) of one session; ``tokens()`` yields what a generate job produces as it comes
  (``chunks()``: in lists, each every token out by then, those after the first at least
  ``CHUNK_TOKENS`` unless the job produced its last),
  ``wait()`` returns the job's result or raises its error, ``wait_tokens()`` what a (non-streaming)
  generate job produced. A streamed generate given ``ahead`` (``STREAM_AHEAD``: backpressure)
  produces at most that many tokens past what its reader took (``took``), and is committed only
  once its reader took every token (``waits_for_reader``, asked by the step).
- ``WaitCountingLock()``: a reentrant lock that counts the threads waiting for it (``waiting``),
  so the loop lets them in between steps; a plain ``threading.RLock`` works too (unfairly).
- ``JobQueue(lock, name)``: the pending jobs, shared with the parts of a host (built before them,
  while the loop that runs them is built after): ``pending(session_id)``, ``cancel(session_id,
  error)``, ``withdraw(job)``, ``poke()`` (something changed that may unblock a waiting job),
  ``request_idle()`` (background work that went on elsewhere has more to do; ``on_idle`` is called
  again once no job is pending), ``stopping``, ``profile`` (``LoopProfile``: where the loop's time
  went).
- ``StepLoop(lock, step, name, on_busy=None, on_idle=None, on_start=None, jobs=None)``: a daemon
  thread (``on_start()`` runs first in it) that runs ``jobs`` (a ``JobQueue``; its own when None):
  while jobs are pending, it calls ``step(jobs) -> progressed`` under ``lock`` (one engine step for
  all of them) and lets other callers take the lock between steps; ``submit(job)`` (the thread
  starts with the first), and the queue's calls. ``on_busy(True)`` is called when it takes up jobs
  after being idle, ``on_busy(False)`` when the last of them is done. Once no job has come for
  ``IDLE_WORK_AFTER_S`` after that (the calls' answers have left), ``on_idle() -> more`` is called
  until it returns False or a job comes: background work, one short piece per call, called without
  ``lock`` (the hook takes it for the part that must not run beside a call, so what it waits for
  outside, a store's answer, holds up no call that needs only the lock). ``stop()`` ends it once
  the step or piece it is in is done (its pending jobs fail with ``LoopStoppedError``),
  ``join(timeout)`` waits for that.
- ``LoopProfile``: ``steps`` taken (those that moved a call on: a pass in which every call waits,
  for room or for its stream's reader, is not counted), ``step_s`` (seconds inside every pass, the
  lock held), ``engine_s`` and ``engine_tokens`` (seconds inside the engine's batched decode, and the tokens it decoded: the
  step function counts them with ``engine(seconds, tokens)``), ``commit_s`` (seconds writing
  calls' journal records, which a call waits for before its answer); ``as_dict()``. What a step
  costs beyond the engine is ``step_s - engine_s``; the loop's wall time outside steps is idle
  time or control calls.
- ``stop_loops(timeout_s)``: stops every step loop of the process and waits for them; it runs at
  interpreter exit, so no loop thread is still inside an engine (a decode, a scoring pass) while
  the process unloads the engine's libraries under it.

A step is short (one decode of at most ``n_batch`` tokens), so a control call that takes the same
lock waits at most one step, and planning happens between steps, never inside one.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from kvres.policy.errors import KvresError

from ..generation import FinishReason, GenerationRequest, StopRule
from ..sampling import Sampler

IDLE_WORK_AFTER_S = 0.01  # after the last call, how long until idle work (the answers leave first)
WAITERS_IN_WITHIN_S = 1.0  # a safety bound only: a waiter gets the lock as soon as the loop lets it go
STREAM_AHEAD = 8  # tokens a stream produces past what its reader took (its job waits for the reader)
# a stream's chunk after its first waits until it holds this many tokens (or every one its job will
# produce): one Ray object per four tokens, not per token, where the reader keeps up with the steps
CHUNK_TOKENS = 4
COMMIT_POLL_S = 0.002  # how often a loop with nothing else to step looks whether a call's record was written
_loops: weakref.WeakSet[StepLoop] = weakref.WeakSet()


class LoopStoppedError(KvresError, RuntimeError):
    """The backend's step loop has stopped (the process is exiting): the call was not run."""


def stop_loops(timeout_s: float = 5.0) -> None:
    loops = list(_loops)
    deadline = time.monotonic() + timeout_s
    for loop in loops:
        loop.stop(max(0.0, deadline - time.monotonic()))
    for loop in loops:
        loop.join(max(0.0, deadline - time.monotonic()))


atexit.register(stop_loops)


class WaitCountingLock:
    """``threading.RLock`` that knows how many threads are blocked acquiring it. It also serves as
    a ``threading.Condition``'s lock."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self.waiting = 0
        self.served = 0  # acquisitions that had to wait (the loop waits for those it saw waiting)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        with self._count:
            self.waiting += 1
        got = False
        try:
            got = self._lock.acquire(True, timeout)
            return got
        finally:
            with self._count:
                self.waiting -= 1
                self.served += got

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    # what threading.Condition uses of an RLock
    def _is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined, no-any-return]

    def _release_save(self) -> object:
        return self._lock._release_save()  # type: ignore[attr-defined]

    def _acquire_restore(self, state: object) -> None:
        self._lock._acquire_restore(state)  # type: ignore[attr-defined]


@dataclass(eq=False)
class Job:
    session_id: str
    kind: Literal["append", "generate"]
    feed: list[int] = field(default_factory=list)  # append: tokens not yet fed
    remaining: int = 0  # generate: tokens not yet produced
    sampler: Sampler | None = None
    streaming: bool = False  # generate: hand each token out as it comes (else all at the end)
    request_id: str | None = None  # the caller's id for the call (a retry carries the same one)
    result: int = 0  # append: the session's log length when done
    appended: int = 0  # append: how many tokens it appends in all
    produced: list[int] = field(default_factory=list)  # generate: every token so far
    started: bool = False  # the loop has taken its first step
    ran: bool = False  # it has had room in a step (a call that has not yet waits behind earlier ones for room)
    error: BaseException | None = None
    request: GenerationRequest | None = None  # generate: what the caller asked for
    stop: StopRule | None = None  # generate: when it ends before max_tokens
    logprobs: list[float] | None = None  # generate: of each chosen token, when asked
    top_logprobs: list[list[tuple[int, float]]] | None = None  # generate: each step's most likely, when asked
    finish_reason: FinishReason = "length"
    stopped_by: str | int | None = None  # the stop id or string that ended it
    start_length: int = -1  # the session's log length when its first token came (-1: not yet)
    pending: int | None = None  # generate: a token handed out and not yet in the log (its next step decodes it)
    answer: object = None  # what the call answers, once it is committed
    ahead: int | None = None  # streamed generate: the most tokens it produces past what its reader took
    read: int = 0  # streamed generate: tokens its reader took
    held: bool = False  # a step left it waiting for its reader (whose next read wakes the loop)
    committing: bool = False  # done stepping: its record is being written, and it answers once it is
    _done: threading.Event = field(default_factory=threading.Event)
    # streamed tokens not yet taken by the reader, who is woken once what it waits for is there
    # (``_want`` tokens, or the last), not at every token: a wake-up is a context switch beside the engine
    _out: list[int] = field(default_factory=list)
    _ready: threading.Condition = field(default_factory=threading.Condition)
    _want: int = 0  # how many tokens the waiting reader needs (0: none waits)
    _ended: bool = False

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def emit(self, token: int) -> None:
        if not self.streaming:
            self.remaining -= 1
            self.produced.append(token)
            return
        with self._ready:
            self.remaining -= 1
            self.produced.append(token)
            self._out.append(token)
            if self._want and (len(self._out) >= self._want or self.remaining <= 0):
                self._ready.notify()

    def waits_for_reader(self) -> bool:
        """Whether the step leaves this job out (asked under the lock): a streamed generate
        ``ahead`` tokens past what its reader took produces no more, and one whose tokens are all
        out is committed only once its reader took them all (a reader that leaves first commits
        what it took: ``Editing.cancel``). A prompt still to feed, or a token handed out and not
        yet in the log, goes on regardless."""
        if self.ahead is None or self.feed or self.pending is not None or self.done:
            return False
        self.held = True  # set before ``read`` is read: a reader reading on meanwhile sees it, and wakes the loop
        behind = len(self.produced) - self.read
        self.held = behind >= self.ahead or (self.remaining <= 0 and behind > 0)
        if self.held:  # a reader waiting for a fuller chunk than a stopped job will give takes what is out
            with self._ready:
                if self._want:
                    self._ready.notify()
        return self.held

    def took(self, wake: Callable[[], None], count: int = 1) -> None:
        """Its reader took ``count`` more tokens: ``wake`` (the loop) where a step left the job
        waiting for it."""
        self.read += count
        if self.held:
            wake()

    def replay(self, answer: object) -> None:
        """Finish with the answer a committed earlier run of the same call gave."""
        if self.kind == "append":
            if isinstance(answer, tuple):  # (log length before, after); a bare int from older records
                answer = answer[1]
            assert isinstance(answer, int)
            self.result = answer
        else:
            assert isinstance(answer, list)
            for token in answer:
                self.emit(int(token))
        self.answer = answer
        self.finish()

    def finish(self, error: BaseException | None = None) -> None:
        if self._done.is_set():
            return
        self.error = error
        self._done.set()
        with self._ready:
            self._ended = True
            self._ready.notify_all()

    def _take(self, least: int) -> list[int]:
        """The tokens out once there are ``least`` of them, or the job produced its last or ended
        (empty: it ended and every token was taken)."""
        with self._ready:
            # past its last token (remaining 0) any token out will do; none out: wait for the end
            while not self._ended and len(self._out) < (least if self.remaining > 0 else 1):
                self._want = least
                self._ready.wait()
            self._want = 0
            taken, self._out = self._out, []
            return taken

    def tokens(self) -> Iterator[int]:
        while chunk := self._take(1):
            yield from chunk
        if self.error is not None:
            raise self.error

    def chunks(self) -> Iterator[list[int]]:
        """What ``tokens()`` yields, in lists: the first holds every token out when it is taken (it
        waits for one: the first token goes out at once); each later one waits until it holds
        ``CHUNK_TOKENS``, or every token the job will produce (it ended, or produced its last), and
        then holds every token out."""
        least = 1
        while chunk := self._take(least):
            yield chunk
            least = CHUNK_TOKENS

    def wait(self) -> int:
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self.result

    def wait_tokens(self) -> list[int]:
        self.wait()
        return self.produced


@dataclass
class LoopProfile:
    steps: int = 0
    step_s: float = 0.0
    engine_s: float = 0.0
    engine_tokens: int = 0
    commit_s: float = 0.0

    def engine(self, seconds: float, tokens: int) -> None:
        self.engine_s += seconds
        self.engine_tokens += tokens

    def as_dict(self) -> dict[str, float | int]:
        return {"steps": self.steps, "step_s": self.step_s, "engine_s": self.engine_s,
                "engine_tokens": self.engine_tokens, "commit_s": self.commit_s}


class JobQueue:
    """The calls a backend's step loop runs, and what running them cost (``profile``): built before
    the parts of a host, which look at it (``pending``, ``poke``, ``withdraw``, ``cancel``,
    ``request_idle``), while the loop that runs it is built after them. Its condition is on the
    host's lock, so a change made under the lock wakes the loop."""

    def __init__(self, lock: threading.RLock | WaitCountingLock, name: str) -> None:
        self.lock = lock
        self.name = name
        self.wake = threading.Condition(lock)  # type: ignore[arg-type]  # a WaitCountingLock is an RLock to it
        self.jobs: list[Job] = []
        self.stopping = False
        self.idle_requested = False
        self.profile = LoopProfile()

    def request_idle(self) -> None:
        with self.lock:
            self.idle_requested = True
            self.wake.notify()

    def stop(self, timeout_s: float = 5.0) -> None:
        """No step or idle piece starts after this; pending jobs fail. Waits at most ``timeout_s``
        for the lock (held by the step or piece under way)."""
        self.stopping = True
        if not self.lock.acquire(timeout=timeout_s):
            return  # the flag alone ends the loop after its current step
        try:
            for job in self.jobs:
                if job.committing:
                    continue  # stepped to its end: answered once its record is written
                job.finish(LoopStoppedError(f"backend {self.name!r} stopped before session {job.session_id!r}'s call ran"))
            self.jobs.clear()
            self.wake.notify_all()
        finally:
            self.lock.release()

    def add(self, job: Job) -> None:
        """Queue ``job`` (the caller holds the lock)."""
        if self.stopping:
            raise LoopStoppedError(f"backend {self.name!r} has stopped (its process is exiting): "
                                   f"session {job.session_id!r}'s call was not run")
        if any(j.session_id == job.session_id and not j.done for j in self.jobs):
            raise RuntimeError(f"session {job.session_id!r} already has a running call")
        self.jobs.append(job)
        self.wake.notify()

    def pending(self, session_id: str | None = None) -> list[Job]:
        """The calls not yet answered (a call answered once its record was written, off the loop,
        leaves the list at the loop's next pass)."""
        with self.lock:
            return [j for j in self.jobs if not j.done and (session_id is None or j.session_id == session_id)]

    def poke(self) -> None:
        with self.lock:
            self.wake.notify()

    def withdraw(self, job: Job) -> bool:
        """Take ``job`` out of the loop unfinished (its caller finishes it); False if it was not in."""
        with self.lock:
            if job not in self.jobs:
                return False
            self.jobs.remove(job)
            return True

    def cancel(self, session_id: str, error: BaseException) -> None:
        with self.lock:
            for job in [j for j in self.jobs if j.session_id == session_id]:
                self.jobs.remove(job)
                job.finish(error)


class StepLoop:
    def __init__(
        self, lock: threading.RLock | WaitCountingLock, step: Callable[[list[Job]], bool], name: str,
        on_busy: Callable[[bool], None] | None = None,
        on_idle: Callable[[], bool] | None = None,
        on_start: Callable[[], None] | None = None,
        jobs: JobQueue | None = None,
    ) -> None:
        self.jobs = JobQueue(lock, name) if jobs is None else jobs
        self._lock = lock
        self._on_busy = on_busy
        self._on_idle = on_idle
        self._on_start = on_start
        self._step = step
        self._thread: threading.Thread | None = None
        _loops.add(self)

    @property
    def stopping(self) -> bool:
        return self.jobs.stopping

    @property
    def profile(self) -> LoopProfile:
        return self.jobs.profile

    def request_idle(self) -> None:
        self.jobs.request_idle()

    def stop(self, timeout_s: float = 5.0) -> None:
        """No step or idle piece starts after this; pending jobs fail (``JobQueue.stop``)."""
        self.jobs.stop(timeout_s)

    def join(self, timeout_s: float | None = None) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def submit(self, job: Job) -> Job:
        with self._lock:
            self.jobs.add(job)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=f"kvres-steps-{self.jobs.name}", daemon=True)
                self._thread.start()
        return job

    def pending(self, session_id: str | None = None) -> list[Job]:
        return self.jobs.pending(session_id)

    def poke(self) -> None:
        self.jobs.poke()

    def withdraw(self, job: Job) -> bool:
        return self.jobs.withdraw(job)

    def cancel(self, session_id: str, error: BaseException) -> None:
        self.jobs.cancel(session_id, error)

    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception:  # a hook must not stop the engine loop (its callers would wait forever)
                logging.getLogger("kvres.backend").exception("on_start() failed")
        q = self.jobs
        busy = False
        idle_work = False  # the loop went idle and on_idle may have work
        while True:
            with self._lock:
                if q.stopping:
                    return
                if not q.jobs and busy:
                    busy = False
                    self._busy(False)
                    idle_work = self._on_idle is not None
                    q.wake.wait(timeout=IDLE_WORK_AFTER_S)
                if q.idle_requested:
                    q.idle_requested = False
                    idle_work = self._on_idle is not None
                run_idle = not q.jobs and idle_work and not q.stopping
            if run_idle:
                idle_work = self._idle()  # without the lock: the hook takes it for what needs it
                continue
            with self._lock:
                while not q.jobs and not q.stopping and not q.idle_requested:
                    q.wake.wait()
                if q.stopping:
                    return
                if not q.jobs:
                    continue  # idle work was asked for
                if not busy:
                    busy = True
                    self._busy(True)
                jobs = list(q.jobs)
                started = time.perf_counter()
                try:
                    progressed = self._step(jobs)
                except BaseException as exc:  # a bug in a step must not hang its callers
                    progressed = True
                    for job in jobs:
                        job.finish(exc)
                q.profile.steps += progressed  # a pass in which every call waits (for room, for its reader) is none
                q.profile.step_s += time.perf_counter() - started
                for job in jobs:
                    if job.done and job in q.jobs:
                        q.jobs.remove(job)
                if not progressed:  # every job waits for room, or for its record's write: sleep until something changes
                    q.wake.wait(timeout=COMMIT_POLL_S if any(j.committing and not j.done for j in q.jobs) else 0.05)
            # the lock is free here: control calls and new submissions get their turn
            self._let_waiters_in()

    def _let_waiters_in(self) -> None:
        """A lock is not fair: this thread would take it again before a woken waiter runs (a call
        could wait many steps to join the batch). Every thread seen waiting gets the lock before
        the next step (the GIL given up until each has; one that gave up waiting is not waited for)."""
        lock = self._lock
        if not isinstance(lock, WaitCountingLock) or not lock.waiting:  # a plain lock cannot tell
            return
        target = lock.served + lock.waiting
        deadline = time.monotonic() + WAITERS_IN_WITHIN_S
        while lock.served < target and lock.waiting and time.monotonic() < deadline:
            time.sleep(0)

    def _idle(self) -> bool:
        hook = self._on_idle
        if hook is None:
            return False
        try:
            return hook()
        except Exception:  # background work must not stop the engine loop
            logging.getLogger("kvres.backend").exception("on_idle() failed")
            return False

    def _busy(self, busy: bool) -> None:
        if self._on_busy is not None:
            try:
                self._on_busy(busy)
            except Exception:  # a hook must not stop the engine loop
                logging.getLogger("kvres.backend").exception("on_busy(%s) failed", busy)
