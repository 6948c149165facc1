"""One backend: an executor (one engine instance) and the sessions on it, kept under budget.

Primitives:
- ``BackendHost(config, executor, plan=plan_backend, store=None, metrics=None, recall_costs=None)``:
  a plain, thread-safe class (works without Ray). ``open_session``, ``append``, ``append_text``,
  ``generate``, ``stream``, ``suspend``, ``resume``, ``detach``, ``close``, ``session_stats``,
  ``stats``.
- ``BackendFullError``, ``SessionBusyError``: typed refusals.

Calls of different sessions run concurrently: ``append`` / ``generate`` / ``stream`` become jobs
of a ``StepLoop`` (``kvres.actors.host.scheduler``), and every engine step decodes the next token of
every generating session plus prefill chunks of appending ones in one ``append_many`` (one
``llama_decode`` batch on llama.cpp), sampling per session with the session's own sampler. Between
steps, sessions that need room are planned (``plan``: by default ``plan_backend`` of
``kvres.policy.backend_planner``, in this process) and the plan carried out: idle sessions
suspended to the cold store, ranges evicted (exported to the cold store first when the session
spills). Control calls (``stats``, ``suspend`` of another session, ``close``) take the same lock
and so wait at most one step. A session suspended to make room comes back by itself on its next
call, as soon as a sequence slot is free.
- ``SuspendRecord``: everything needed to bring a session back on any backend of the same model.

The executor is a ``kvres.actors.engines.executor.Executor`` (kvres addresses its KV) or an
``EngineManagedExecutor`` (the engine evicts by itself). Blocks go through a
``kvres.actors.host.store_ports.StorePort``; every operation moves all of its blocks in one batched call
per store (a suspend one ``put_many``, a resume one ``pop_many``, an eviction one ``put_many``).
Whatever a session parked is deleted when it closes. An engine that cannot export KV (a llama.cpp
sliding-window model) suspends by its token log alone and recomputes on resume.

A session's token log is the source of truth: no failure on the way (a lost or corrupt block, a
foreign block) loses tokens; missing KV is recomputed from the log.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.engines.executor import RECALL_PREP_BYTES, EngineManagedExecutor, Executor
from kvres.actors.metrics import COUNTERS, Metrics, NullMetrics
from kvres.coldstore import ColdStoreError, validate_session_id
from kvres.policy import (
    BlockMismatchError,
    CapabilityError,
    KvresError,
    Range,
    RangeError,
    SessionExistsError,
    StreamPolicy,
    UnknownSessionError,
    subtract_range,
)
from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, SessionView, plan_backend
from kvres.policy.planner import missing_capabilities
from kvres.policy.recall import RecallCosts
from kvres.policy.scorers import scorer_for
from kvres.policy.scoring import H2OAccumulator, block_scores
from kvres.policy.tokens import token_ids

from .journal import Journal, MemoryJournal, SessionRecord, WriteBehindJournal
from .sampling import TokenSampler
from .scheduler import Job, StepLoop, WaitCountingLock
from .store_ports import ColdRef, StorePort

log = logging.getLogger("kvres.backend")
STEP_TOKENS = 512  # tokens one engine step decodes at most (llama.cpp's default n_batch)


class BackendFullError(KvresError):
    """The backend cannot make room: its budget is taken by sessions it may not evict."""


class SessionBusyError(KvresError):
    """The session has a call running (an append or a generate); the operation must wait for it."""


class ProbedRecallCosts:
    """This device's measured costs (``kvres.actors.sizing.probes.probed_recall_costs``), probed on first
    use and cached per device: the RAM tier costs what a measured block import costs, the disk tier
    a measured block file read plus the import, recompute what a measured prefill costs."""

    def __init__(self, model_path: str) -> None:
        self._model_path = model_path
        self._costs: RecallCosts | None = None
        self._probed = False

    def __call__(self) -> RecallCosts | None:
        if not self._probed:
            from kvres.actors.sizing.probes import probed_recall_costs

            self._costs = probed_recall_costs(self._model_path)
            self._probed = True
        return self._costs


SuspendRecord = SessionRecord  # what a suspend hands over: the session's record


@dataclass
class _Session:
    policy: SessionPolicy
    last_used: int
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    cold: list[ColdRef] = field(default_factory=list)  # spilled by eviction
    last_logits: npt.NDArray[np.float32] | None = None
    suspended: SuspendRecord | None = None
    resident: int = 0  # resident tokens, kept in step with the executor (cheap budget checks)
    peak: int = 0  # the most this session held after any step
    h2o: H2OAccumulator | None = None  # scored by H2O: attention every processed row gave each key
    scored_upto: int = 0  # token-log length whose rows the H2O accumulator has seen
    compressing: bool = False  # this turn recalled cold blocks: compress after the append
    committed: SessionRecord | None = None  # as of its last commit (what a failed call rolls back to)
    exact: bool = True  # recomputing its resident ranges from the log gives the KV they hold
    retrieved: list[Range] = field(default_factory=list)  # recalled this turn and kept: kept first
    recall_ready: _RecallReady | None = None  # its cold blocks, read while the backend was idle


@dataclass(frozen=True)
class _RecallReady:
    """A spilling session's cold blocks as read for its next recall (while the backend was
    idle): ``refs`` and their ``blocks`` (``tokens`` of them, ``nbytes``), valid while ``cold`` is
    its list; prepared again after any call of the session (``used``: its ``last_used`` then).
    ``refs`` None: considered and not held (it failed, or others were more recent)."""

    cold: list[ColdRef]
    used: int
    refs: list[ColdRef] | None = None
    blocks: list[Any] = field(default_factory=list)
    tokens: int = 0
    nbytes: int = 0


class BackendHost:
    def __init__(
        self,
        config: BackendConfig,
        executor: Executor | EngineManagedExecutor,
        plan: Callable[[BackendPlanInput], BackendPlan] = plan_backend,
        store: StorePort | None = None,
        metrics: Metrics | None = None,
        recall_costs: Callable[[], RecallCosts | None] | None = None,
        on_change: Callable[[], None] | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.executor = executor
        self._plan = plan
        self._store = store
        self._metrics = metrics or NullMetrics()
        self._recall_costs = recall_costs
        self._on_change = on_change
        self._journal = WriteBehindJournal(journal or MemoryJournal())
        self._dirty: set[str] = set()  # sessions changed outside a call of theirs: commit after the step
        self._clock = itertools.count(1)
        self._reading = False  # a recall's cold blocks are being read ahead (prepare_recalls)
        self._sessions: dict[str, _Session] = {}
        self.fingerprint = executor.fingerprint
        self._lock = WaitCountingLock()
        self._loop = StepLoop(self._lock, self._step, config.name,
                              on_busy=store.defer_writes if store is not None else None, on_idle=self.prepare_recalls,
                              on_start=self._claim_decode_threads)
        # the engine's multi-threaded decodes belong to the step loop's thread (see
        # kvres.actors.engines.llama.engine): other threads decode on one thread until it has started
        reserve = getattr(executor, "reserve_decode_threads", None)
        if reserve is not None:
            reserve()
        self.step_tokens = STEP_TOKENS
        self.peak_resident_tokens = 0  # the most the engine held after any step

    def _claim_decode_threads(self) -> None:
        claim = getattr(self.executor, "claim_decode_threads", None)
        if claim is not None:
            claim()

    # -- bookkeeping ------------------------------------------------------------------------
    def _get(self, session_id: str, *, live: bool = True) -> _Session:
        s = self._sessions.get(session_id)
        if s is None:
            s = self._rebuild(session_id)
        if live and s.suspended is not None:
            raise KvresError(f"session {session_id!r} is suspended; resume it first")
        return s

    def _count(self, session_id: str, name: str, value: int = 1) -> None:
        counters = self._sessions[session_id].counters
        counters[name] = counters.get(name, 0) + value
        self._metrics.count(name, self.name, session_id, value)

    def _refresh_resident(self, session_id: str) -> int:
        s = self._sessions[session_id]
        s.resident = 0 if s.suspended else sum(len(r) for r in self.executor.resident_ranges(session_id))
        return s.resident

    def _publish(self) -> None:
        """Metrics and the load report (``on_change``) after a change of sessions or residency."""
        total = 0
        for sid, s in self._sessions.items():
            total += s.resident
            self._metrics.set_resident(self.name, sid, s.resident)
        self._metrics.set_backend_resident(self.name, total)
        if self._on_change is not None:
            self._on_change()

    def load(self) -> tuple[int, int, int]:
        """(resident tokens, live sessions, suspended sessions), read under the lock."""
        with self._lock:
            live = [s for s in self._sessions.values() if s.suspended is None]
            return sum(s.resident for s in live), len(live), len(self._sessions) - len(live)

    # -- durability -------------------------------------------------------------------------
    def _snapshot(self, session_id: str) -> SessionRecord:
        s = self._sessions[session_id]
        if s.suspended is not None:
            record = replace(s.suspended, counters=dict(s.counters), backend=self.name, state="suspended",
                             exact=s.exact)
        else:
            record = SessionRecord(
                session_id, list(self.executor.token_log(session_id)), list(self.executor.resident_ranges(session_id)),
                [], list(s.cold), s.policy, s.last_logits, dict(s.counters), self.fingerprint,
                backend=self.name, state="live", exact=s.exact,
            )
        if s.committed is not None:
            record.request_id, record.result = s.committed.request_id, s.committed.result
            record.generation = s.committed.generation
        record.generation += 1
        return record

    def _commit(
        self, session_id: str, request_id: str | None = None, result: Any = None, backend: str | None = None,
        later: bool = False,
    ) -> SessionRecord:
        """Write the session's record to the journal (``backend`` overrides who serves it: ""
        while it moves); a call's commit also records its request id and result. ``later``: a
        change that adds no token (suspend, resume, eviction) is written behind, off the call's path.
        """
        record = self._snapshot(session_id)
        if request_id is not None:
            record.request_id, record.result = request_id, result
        if backend is not None:
            record.backend = backend
        if later:
            self._journal.save_later(record)
        else:
            self._journal.save(record)
        self._sessions[session_id].committed = record
        self._dirty.discard(session_id)
        return record

    def _flush_dirty(self) -> None:
        """Commit sessions changed by others' calls (evicted, suspended for room); a session with
        a call of its own running is committed by that call."""
        if not self._dirty:
            return
        running = self._busy()
        for sid in list(self._dirty):
            if sid not in self._sessions:
                self._dirty.discard(sid)
            elif sid not in running:
                self._commit(sid, later=True)

    def _rebuild(self, session_id: str) -> _Session:
        """A session the journal says this backend serves but this process does not hold (the
        backend was restarted): it comes back suspended, and its next call resumes it (parked
        blocks imported, the rest recomputed from its token log)."""
        try:
            validate_session_id(session_id)
        except ColdStoreError:
            raise UnknownSessionError(session_id) from None
        record = self._journal.load(session_id)
        if record is None or record.backend != self.name:
            raise UnknownSessionError(session_id)
        if record.fingerprint != self.fingerprint:
            raise KvresError(
                f"session {session_id!r} was made with model fingerprint {record.fingerprint!r}; backend "
                f"{self.name!r} now runs {self.fingerprint!r} and cannot rebuild it"
            )
        s = _Session(record.policy, next(self._clock), dict(record.counters), list(record.cold),
                     record.last_logits, suspended=record, committed=record, exact=record.exact)
        self._sessions[session_id] = s
        self._count(session_id, "rebuilds")
        s.suspended = replace(record, counters=dict(s.counters))
        log.warning("backend %r rebuilt session %r from its journal (%d tokens, %s)", self.name, session_id,
                    len(record.token_log), "was live" if record.state == "live" else "was suspended")
        return s

    def _fail(self, job: Job, error: BaseException) -> None:
        """A call that fails commits nothing: its session goes back to its last commit."""
        if not job.done:
            try:
                self._roll_back(job.session_id)
            except Exception:
                log.exception("rolling back session %r after a failed call failed", job.session_id)
        job.finish(error)

    def _roll_back(self, session_id: str) -> None:
        """Undo what a failed call did to a live session: back to its committed record (suspended
        by it, so the next call resumes it: parked blocks imported, the rest recomputed), blocks it
        spilled since released. Nothing to do when none of the call's tokens landed."""
        s = self._sessions.get(session_id)
        record = None if s is None else s.committed
        if s is None or record is None or s.suspended is not None:
            return
        landed = len(self.executor.token_log(session_id)) != len(record.token_log) or record.state != "live"
        if not landed and s.cold == record.cold:
            return
        keep = set(record.cold) | set(record.blocks)
        spilled = [ref for ref in s.cold if ref not in keep]
        if spilled and self._store is not None:
            self._store.release(spilled)
        self.executor.close_session(session_id)
        self._count(session_id, "rollbacks")
        s.suspended = replace(record, counters=dict(s.counters), state="suspended")
        s.cold, s.last_logits, s.resident, s.exact = list(record.cold), record.last_logits, 0, record.exact
        s.h2o, s.scored_upto, s.compressing, s.retrieved = None, 0, False, []
        self._publish()

    def _busy(self) -> set[str]:
        return {job.session_id for job in self._loop.pending()}

    def sessions(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    def token_count(self, session_id: str) -> int:
        with self._lock:
            s = self._get(session_id, live=False)
            return len(s.suspended.token_log if s.suspended else self.executor.token_log(session_id))

    # -- session lifecycle -----------------------------------------------------------------
    def open_session(self, session_id: str, policy: SessionPolicy | None = None) -> None:
        with self._lock:
            if session_id in self._sessions or self._journal.load(session_id) is not None:
                raise SessionExistsError(session_id)
            policy = policy or SessionPolicy()
            self._check_policy(policy)
            try:
                self._make_room({}, newcomer=session_id)
            except BackendFullError:
                if self._store is None:
                    raise
                # every slot serves a running call: the session starts suspended (holding no
                # engine slot) and comes in as soon as one frees
                record = SessionRecord(session_id, [], [], [], [], policy, None,
                                       dict.fromkeys(COUNTERS, 0), self.fingerprint)
                self._sessions[session_id] = _Session(policy, next(self._clock), suspended=record)
                self._commit_new(session_id)
                return
            self._open_on_engine(session_id, policy)
            self._sessions[session_id] = _Session(policy, next(self._clock))
            self._commit_new(session_id)
            self._publish()

    def _commit_new(self, session_id: str) -> None:
        """A new session's first record; if it cannot be written the session is not opened."""
        try:
            self._commit(session_id)
        except BaseException:
            s = self._sessions.pop(session_id)
            if s.suspended is None:
                self.executor.close_session(session_id)
            raise

    def _check_policy(self, policy: SessionPolicy) -> None:
        engine_managed = isinstance(self.executor, EngineManagedExecutor)
        if policy.kind == "engine" and not engine_managed:
            raise ValueError(
                f"policy kind 'engine' needs an engine that evicts by itself (engine='openvino-genai'); "
                f"backend {self.name!r} runs {self.config.engine!r}"
            )
        if engine_managed and policy.kvres_evicts:
            raise ValueError(
                f"backend {self.name!r} runs openvino-genai, whose KV kvres cannot address: policy kind "
                f"{policy.kind!r} is not possible there; use kind='engine' (let the engine evict) or 'none'"
            )
        if policy.kvres_evicts and policy.budget_tokens and policy.budget_tokens > self.config.kv_budget_tokens:
            raise ValueError(
                f"session budget_tokens={policy.budget_tokens} exceeds backend {self.name!r} "
                f"kv_budget_tokens={self.config.kv_budget_tokens}"
            )
        if policy.kind == "scored":
            caps = self.executor.capabilities()
            needs = scorer_for(policy.scorer, policy.observation_window).needs
            if needs == "attention" and not caps.attention_capture:
                raise ValueError(
                    f"scorer {policy.scorer!r} needs attention probabilities, which backend {self.name!r} "
                    f"({self.config.engine}) cannot capture; use scorer='keynorm'"
                )
            if needs == "keys" and not caps.key_access:
                raise ValueError(
                    f"scorer 'keynorm' needs the resident keys, which backend {self.name!r} "
                    f"({self.config.engine}, type_k={self.config.type_k}) cannot read as floats"
                )
        if policy.kvres_evicts and not engine_managed:
            missing = missing_capabilities(StreamPolicy(True, rebase=policy.rebase), self.executor.capabilities())
            if missing:
                raise CapabilityError(
                    f"policy kind {policy.kind!r} with rebase={policy.rebase} needs {' and '.join(missing)}, "
                    f"which backend {self.name!r} ({self.config.engine}, type_k={self.config.type_k}) cannot "
                    "do; use rebase=False"
                )

    def _open_on_engine(self, session_id: str, policy: SessionPolicy, tokens: Sequence[int] = ()) -> None:
        self.executor.open_session(session_id, tokens)
        if policy.kind == "engine" and isinstance(self.executor, EngineManagedExecutor):
            self.executor.set_eviction(session_id, StreamPolicy(True, policy.sink_tokens, policy.recent_tokens),
                                       policy.budget_tokens or 0, policy.aggregation)

    def close(self, session_id: str) -> None:
        """Close the session, ending a call it has running (that call raises ``SessionBusyError``)."""
        with self._lock:
            s = self._get(session_id, live=False)
            self._loop.cancel(session_id, SessionBusyError(f"session {session_id!r} was closed during the call"))
            if s.suspended is None:
                self.executor.close_session(session_id)
            if self._store is not None:
                self._store.release(s.cold + (s.suspended.blocks if s.suspended else []))
            del self._sessions[session_id]
            self._journal.delete(session_id)
            self._metrics.set_resident(self.name, session_id, 0)
            self._publish()
            self._loop.poke()

    # -- tokens in and out (jobs of the step loop) -----------------------------------------
    def _chunk(self, policy: SessionPolicy, remaining: int) -> int:
        if not policy.kvres_evicts or policy.budget_tokens is None or policy.kind == "scored":
            return remaining
        room = policy.budget_tokens - policy.sink_tokens - policy.recent_tokens
        return min(remaining, max(1, room // 2))

    def _submit(self, job: Job) -> Job:
        with self._lock:
            s = self._get(job.session_id, live=False)
            if self._loop.pending(job.session_id):
                raise SessionBusyError(f"session {job.session_id!r} already has a call running")
            s.last_used = next(self._clock)
            done = s.committed
            if job.request_id is not None and done is not None and done.request_id == job.request_id:
                job.replay(done.result)  # a retry of a call that committed: its answer, not a rerun
                return job
            return self._loop.submit(job)

    def append(self, session_id: str, tokens: Sequence[int], request_id: str | None = None) -> int:
        """Append tokens (prefilled in chunks that fit the budget); returns the log length. All of
        them are committed or none; a call repeated with the same ``request_id`` after it committed
        returns its answer without appending again."""
        toks = token_ids(tokens)
        if not toks:
            raise ValueError("append needs at least one token")
        return self._submit(Job(session_id, "append", feed=toks, appended=len(toks), request_id=request_id)).wait()

    def append_text(self, session_id: str, text: str, request_id: str | None = None) -> list[int]:
        """Tokenize ``text`` (with BOS when the session is still empty) and append it; returns the
        token ids. A call repeated with the same ``request_id`` after it committed returns the ids
        it appended (read from the session's log), not a new tokenization: the session is no
        longer empty by then."""
        with self._lock:
            done = self._get(session_id, live=False).committed
            if request_id is not None and done is not None and done.request_id == request_id \
                    and isinstance(done.result, tuple):
                start, end = done.result
                return list(done.token_log[start:end])
            add_bos = self.token_count(session_id) == 0
        tokens = self.executor.tokenize(text, add_bos)
        self.append(session_id, tokens, request_id)
        return tokens

    def stream(
        self, session_id: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
        request_id: str | None = None,
    ) -> Iterator[int]:
        return self._generate_job(session_id, max_tokens, temperature, seed, True, request_id).tokens()

    def generate(
        self, session_id: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
        request_id: str | None = None,
    ) -> list[int]:
        """Generate up to ``max_tokens`` tokens; like an append, all of them are committed or none."""
        return self._generate_job(session_id, max_tokens, temperature, seed, False, request_id).wait_tokens()

    def _generate_job(
        self, session_id: str, max_tokens: int, temperature: float, seed: int | None, streaming: bool,
        request_id: str | None,
    ) -> Job:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        sampler = TokenSampler(temperature, seed)
        return self._submit(Job(session_id, "generate", remaining=max_tokens, sampler=sampler, streaming=streaming,
                                request_id=request_id))

    def _complete(self, job: Job) -> None:
        """The call is done: commit the session (with the call's id and answer), then answer."""
        job.result = len(self.executor.token_log(job.session_id))
        answer: object = (job.result - job.appended, job.result) if job.kind == "append" else list(job.produced)
        try:
            self._commit(job.session_id, job.request_id, answer)
        except Exception as exc:
            self._fail(job, exc)
            return
        job.finish()

    def _step(self, jobs: list[Job]) -> bool:
        """One engine step for ``jobs`` (under the lock): admit suspended sessions where a slot
        frees, make room between steps, then one ``append_many`` for everything that fits. A call
        that fails is rolled back; sessions others' calls changed are committed after the step."""
        try:
            return self._step_jobs(jobs)
        except BaseException as exc:  # a bug in a step must not leave a call half applied
            for job in jobs:
                self._fail(job, exc)
            return True
        finally:
            self._flush_dirty()

    def _step_jobs(self, jobs: list[Job]) -> bool:
        if isinstance(self.executor, EngineManagedExecutor):
            for job in jobs:
                self._run_engine_managed(self.executor, job)
            return True
        progressed = False
        busy = {job.session_id for job in jobs}
        batch: list[tuple[Job, list[int]]] = []
        incoming: dict[str, int] = {}
        capacity = self.step_tokens
        held: int | None = None  # what live sessions hold, as of a room check that changed nothing
        for job in jobs:
            s = self._sessions.get(job.session_id)
            if s is None:
                self._fail(job, UnknownSessionError(job.session_id))
                progressed = True
                continue
            if s.suspended is not None:
                held = None
                admitted = self._admit(job, busy)
                progressed |= admitted or job.done
                if not admitted:
                    continue
                s = self._sessions[job.session_id]
            if job.kind == "generate" and (job.remaining == 0 or s.last_logits is None):
                job.finish(None if job.remaining == 0 else KvresError(
                    f"session {job.session_id!r} has no tokens yet: append a prompt first"))
                progressed = True
                continue
            if job.kind == "append" and not job.started:
                held = None  # a recall may change what the session holds
                job.started = True
                try:
                    self._recall(job.session_id, len(job.feed))
                except Exception as exc:
                    self._fail(job, exc)
                    progressed = True
                    continue
            want = 1 if job.kind == "generate" else self._chunk(s.policy, len(job.feed))
            if (s.policy.kind == "scored" or s.compressing) and job.kind == "append":
                want = min(want, max(1, self._free_tokens(incoming)))  # compress after each chunk
            n = min(want, capacity)
            if n <= 0:
                break
            try:
                if held is None or not self._fits(s, n, held + sum(incoming.values())):
                    # room for the whole chunk ahead (a generate plans ahead like an append would)
                    ahead = n if job.kind == "append" or s.policy.kind == "scored" else self._chunk(s.policy, job.remaining)
                    changed = self._make_room({**incoming, job.session_id: n}, ahead={job.session_id: ahead}, busy=busy)
                    held = None if changed else sum(x.resident for x in self._sessions.values() if x.suspended is None)
            except BackendFullError as exc:
                if not batch:
                    self._fail(job, exc)
                    progressed = True
                continue  # otherwise it waits for the jobs ahead of it
            except Exception as exc:
                self._fail(job, exc)
                progressed = True
                continue
            toks = [job.sampler.sample(s.last_logits)] if job.sampler is not None and s.last_logits is not None \
                else job.feed[:n]
            batch.append((job, toks))
            incoming[job.session_id] = n
            capacity -= n
        if not batch:
            return progressed
        try:
            logits = self.executor.append_many([(job.session_id, toks) for job, toks in batch])
        except Exception as exc:
            for job, _ in batch:
                self._refresh_resident(job.session_id)
                self._fail(job, exc)
            return True
        generated = sum(1 for job, _ in batch if job.kind == "generate")
        self._metrics.count_tokens(self.name, "generated", generated)
        self._metrics.count_tokens(self.name, "prompt", sum(len(t) for j, t in batch if j.kind == "append"))
        finished = False
        self.peak_resident_tokens = max(self.peak_resident_tokens, sum(
            s.resident + incoming.get(sid, 0) for sid, s in self._sessions.items()))
        for (job, toks), lg in zip(batch, logits, strict=True):
            s = self._sessions[job.session_id]
            s.last_logits = lg
            s.resident += len(toks)
            s.peak = max(s.peak, s.resident)
            if job.kind == "generate":
                job.emit(toks[0])
                done = job.remaining == 0
            else:
                del job.feed[: len(toks)]
                done = not job.feed
            try:
                if (s.policy.kind == "scored" or s.compressing) and self._compress_now(s, job, done):
                    self._compress(job.session_id)
            except Exception as exc:
                self._fail(job, exc)
            if done and not job.done:
                self._complete(job)
            finished |= job.done
        if finished:
            self._publish()
        return True

    def _run_engine_managed(self, executor: EngineManagedExecutor, job: Job) -> None:
        """An engine that evicts by itself runs a whole call at once (it cannot batch across
        sessions from here)."""
        try:
            if job.session_id in self._sessions and self._sessions[job.session_id].suspended is not None:
                self._resume(job.session_id, None)
            if job.kind == "append":
                executor.append(job.session_id, job.feed)
                self._metrics.count_tokens(self.name, "prompt", len(job.feed))
            else:
                assert job.sampler is not None
                tokens = executor.generate(job.session_id, job.remaining, job.sampler.temperature, job.sampler.seed)
                for token in tokens:
                    job.emit(token)
                self._metrics.count_tokens(self.name, "generated", len(tokens))
            self._complete(job)
        except Exception as exc:
            self._fail(job, exc)

    def _admit(self, job: Job, busy: set[str]) -> bool:
        """Bring a suspended session in for its job if a slot can be had (an idle session may be
        suspended for it); False while every slot serves a running call."""
        try:
            self._resume(job.session_id, None, busy=busy)
            self._count(job.session_id, "resumes")
            return True
        except BackendFullError as exc:
            if not any(sid in self._sessions and self._sessions[sid].suspended is None for sid in busy):
                job.finish(exc)  # nothing running will ever free room for it
            return False
        except Exception as exc:
            job.finish(exc)
            return False

    # -- pressure --------------------------------------------------------------------------
    def _view(self, session_id: str, incoming: int, active: bool) -> SessionView:
        s = self._sessions[session_id]
        p = s.policy
        view = SessionView(
            session_id=session_id,
            resident_ranges=tuple(self.executor.resident_ranges(session_id)),
            last_used=s.last_used,
            active=active,
            incoming_tokens=incoming,
            budget_tokens=p.budget_tokens if p.kvres_evicts else None,
            stream_policy=StreamPolicy(p.kvres_evicts, p.sink_tokens, p.recent_tokens, p.rebase),
            evictable=p.kvres_evicts,
            block_size=p.block_size,
        )
        if not s.retrieved:
            return view
        # blocks recalled this turn outrank the rest (which go by recency, as streaming would)
        blocks = view.blocks()
        scores = tuple(float(any(r.start < blocks.ends[i] and blocks.starts[i] < r.end for r in s.retrieved))
                       for i in range(len(blocks)))
        return replace(view, scores=scores)

    def _with_scores(self, view: SessionView) -> SessionView:
        s = self._sessions[view.session_id]
        if (s.policy.kind != "scored" and not s.compressing) or not view.resident_ranges:
            return view
        table = view.blocks()
        ranges = [table[i].range for i in range(len(table))]
        return replace(view, scores=tuple(self._block_scores(view.session_id, ranges)))

    def _block_scores(self, session_id: str, ranges: list[Range]) -> list[float]:
        """One score per range by the session's scorer (``kvres.policy.scorers``): SnapKV over the
        last ``observation_window`` resident rows, H2O from the rows the session processed,
        KeyNorm from the resident keys."""
        s = self._sessions[session_id]
        executor = self._kv_executor("score")
        name = self._turn_scorer(s)
        scorer = scorer_for(name, s.policy.observation_window)
        if name == "snapkv" and s.policy.kind != "scored":
            return scorer.block_scores(executor.attention(session_id, s.policy.observation_window), ranges)
        if scorer.needs == "keys":
            return scorer.block_scores(executor.keys(session_id), ranges)
        if s.policy.scorer == "snapkv":
            return scorer.block_scores(executor.attention(session_id, s.policy.observation_window), ranges)
        # H2O: add the rows processed since the last capture (each row counted once), then score
        # every resident key by all the attention it has received
        log_len = len(executor.token_log(session_id))
        new_rows = min(log_len - s.scored_upto, s.resident)
        if s.h2o is None:
            s.h2o = H2OAccumulator()
        if new_rows > 0:
            capture = executor.attention(session_id, new_rows)
            s.h2o.add(capture.probs, capture.key_positions)
        s.scored_upto = log_len
        totals = s.h2o.scores
        return [float(x) for x in block_scores(totals, np.arange(totals.size), ranges)]

    def _compress_now(self, s: _Session, job: Job, done: bool) -> bool:
        """When a scored session is cut to its budget: at the end of its call; during an append
        only when the rest of it does not fit the backend's free room (so the observation window
        is the end of the prompt whenever the prompt fits); during a generate once it outgrows
        its budget (twice the budget: the cache, and so each decode step, stays bounded)."""
        if done:
            return True
        if job.kind == "append":
            return len(job.feed) > self._free_tokens({})
        budget = s.policy.budget_tokens or 0
        return s.resident > budget + max(s.policy.block_size, budget)

    def _recall_scorer(self) -> str:
        """What ranks blocks on a recall turn of a session that has no scorer of its own."""
        caps = self.executor.capabilities()
        return "snapkv" if caps.attention_capture else "keynorm" if caps.key_access else ""

    def _turn_scorer(self, s: _Session) -> str:
        """What ranks a session's blocks on its recall turns ("snapkv": by a scoring pass)."""
        return s.policy.scorer if s.policy.kind == "scored" else self._recall_scorer()

    def _recall(self, session_id: str, incoming: int) -> None:
        """A new turn of a spilling session brings back the cold blocks it attends to, before its
        tokens are prefilled (so they see them). Where the engine scores blocks it has not imported
        (``Executor.recall_attention``), the turn's tokens are decoded once in a scoring pass over
        the resident tokens and the cold blocks placed as if recalled; SnapKV ranks resident and
        cold blocks together by that attention, the plan cuts them to the budget (the turn's room
        kept), and one ``exchange`` imports the cold blocks it keeps and spills the resident ones it
        drops; the engine keeps the scoring pass's decode of the turn, and the append takes it
        instead of decoding the turn again. Otherwise the blocks are imported first (as many as the
        free room takes, the most recent first) and the session is compressed once after the
        append, by the new tokens' attention. The recalled blocks that stay rank first for the
        rest of the turn."""
        s = self._sessions[session_id]
        s.retrieved = []
        if not (s.policy.kvres_evicts and s.policy.spill and s.cold and self._store is not None):
            return
        scorer = self._turn_scorer(s)
        if s.policy.kind != "scored" and not scorer:
            return  # nothing could tell which recalled blocks matter: leave them cold
        executor = self._kv_executor("recall")
        t0 = time.perf_counter()
        turn = next((job.feed for job in self._loop.pending(session_id) if job.kind == "append"), None)
        recalled: list[Range] = []
        if scorer == "snapkv" and turn:
            from kvres.policy.recall import plan_recall

            p = s.policy
            resident = executor.resident_ranges(session_id)
            log_len = len(executor.token_log(session_id))
            refs, blocks = self._recall_candidates(session_id, s, sum(r.end - r.start for r in resident) + len(turn))
            try:
                capture = executor.recall_attention(session_id, blocks, turn, p.observation_window, p.rebase)
            except (KvresError, ColdStoreError, ValueError) as exc:
                log.debug("session %r: recall by import first (%s)", session_id, exc)
                capture = None
            if capture is not None:
                cold = np.array([(r.key.token_range.start, r.key.token_range.end) for r in refs], dtype=np.int64)
                choice = plan_recall(
                    resident, cold.reshape(-1, 2), Range(log_len, log_len + len(turn)),
                    scorer_for("snapkv", p.observation_window).score(capture), capture.key_positions,
                    StreamPolicy(True, p.sink_tokens, p.recent_tokens, p.rebase), p.block_size,
                    p.budget_tokens or 0, executor.capabilities(), self._free_tokens({}) - incoming,
                )
                back = [refs[i] for i in choice.imports]
                if back or choice.evict:
                    exported = executor.exchange(session_id, choice.evict, [blocks[i] for i in choice.imports],
                                                 p.rebase)
                    back_ids = {id(ref) for ref in back}
                    s.cold = [ref for ref in s.cold if id(ref) not in back_ids]
                    self._store.take(back)  # read above: this only removes them
                    if exported:
                        parked = self._store.park(exported)
                        s.cold.extend(parked)
                        self._count(session_id, "spills", len(parked))
                        self._count(session_id, "spilled_bytes", sum(ref.nbytes for ref in parked))
                        self._cap_spill(session_id)
                    self._count(session_id, "evictions", len(choice.evict))
                    if s.h2o is not None:
                        s.h2o.drop(choice.evict)
                    recalled = [ref.key.token_range for ref in back]
                s.retrieved = recalled
                self._refresh_resident(session_id)
                self._count(session_id, "recalls", len(recalled))
                self._count(session_id, "recalled_tokens", sum(len(r) for r in recalled))
                self._count(session_id, "recall_us", int((time.perf_counter() - t0) * 1e6))
                return
            if not s.cold:
                return
        room = self._free_tokens({}) - incoming
        chosen: list[ColdRef] = []
        for ref in sorted(s.cold, key=lambda r: r.key.token_range.start, reverse=True):
            if len(ref.key.token_range) <= room:
                chosen.append(ref)
                room -= len(ref.key.token_range)
        if not chosen:
            return
        taken = set(chosen)
        s.cold = [ref for ref in s.cold if ref not in taken]
        for block in self._store.take(sorted(chosen, key=lambda r: r.key.token_range.start)):
            if block is None:
                continue
            try:
                executor.import_range(session_id, block)
            except (ColdStoreError, BlockMismatchError, RangeError, CapabilityError):
                continue
            recalled.append(block.token_range)
        s.compressing = True
        s.retrieved = recalled
        self._refresh_resident(session_id)
        self._count(session_id, "recalls", len(recalled))
        self._count(session_id, "recalled_tokens", sum(len(r) for r in recalled))
        self._count(session_id, "recall_us", int((time.perf_counter() - t0) * 1e6))

    def _recall_candidates(self, session_id: str, s: _Session, held: int) -> tuple[list[ColdRef], list[Any]]:
        """The cold blocks a scoring pass over ``held`` more tokens has room for (the newest first),
        read from their stores (read, not taken: only the blocks brought back leave), in log
        order; blocks a store no longer has are dropped from the session. What the idle backend
        read for the session (``prepare_recalls``) serves while its cold blocks are the same."""
        ready, s.recall_ready = s.recall_ready, None
        if ready is not None and ready.refs is not None and ready.cold == s.cold \
                and ready.tokens <= self.config.n_ctx - held:
            return ready.refs, ready.blocks
        candidates = self._recall_picks(s, held)
        return self._keep_read(s, candidates, self._read_cold(candidates))

    def _recall_picks(self, s: _Session, held: int) -> list[ColdRef]:
        """The cold blocks a scoring pass over ``held`` more tokens has room for, the newest first."""
        fits = self.config.n_ctx - held
        candidates: list[ColdRef] = []
        for ref in sorted(s.cold, key=lambda r: r.key.token_range.start, reverse=True):
            n = ref.key.token_range.end - ref.key.token_range.start
            if n <= fits:
                candidates.append(ref)
                fits -= n
        return candidates

    def _read_cold(self, refs: Sequence[ColdRef]) -> list[Any]:
        """The blocks behind ``refs`` (None where gone), one ``get_many`` per store."""
        assert self._store is not None
        by_store: dict[str, list[int]] = {}
        for i, ref in enumerate(refs):
            by_store.setdefault(ref.store, []).append(i)
        read: list[Any] = [None] * len(refs)
        for store, idx in by_store.items():
            got = self._store.at(store).get_many([refs[i].key for i in idx])
            for i, block in zip(idx, got, strict=True):
                read[i] = block
        return read

    def _keep_read(self, s: _Session, candidates: list[ColdRef], read: list[Any]) -> tuple[list[ColdRef], list[Any]]:
        """The blocks read, in log order; those a store no longer has leave the session."""
        assert self._store is not None
        gone = [ref for ref, block in zip(candidates, read, strict=True) if block is None]
        if gone:
            lost = {id(ref) for ref in gone}
            s.cold = [ref for ref in s.cold if id(ref) not in lost]
            self._store.release(gone)
        order = sorted((i for i, block in enumerate(read) if block is not None),
                       key=lambda i: candidates[i].key.token_range.start)
        return [candidates[i] for i in order], [read[i] for i in order]

    def prepare_recalls(self) -> bool:
        """Idle work (the step loop calls it when no call runs): for the most recently used
        spilling session whose next turn would recall, read its cold blocks and let the executor
        do the part of the recall that needs no turn (``Executor.prepare_recall``), so the turn
        pays only for the scoring pass, the plan and the exchange. The blocks are read by a reader
        thread, without the host lock: neither a control call nor the next step waits for a
        store's answer. What was read is used only if the session did not change meanwhile; then
        the reader asks the loop for the next piece (``StepLoop.request_idle``). Returns False:
        the loop has nothing more to do itself."""
        with self._lock:
            if self._store is None or self._loop.pending() or self._reading:
                return False
            waiting = [(s.last_used, sid) for sid, s in self._sessions.items()
                       if s.suspended is None and s.cold and s.policy.kvres_evicts and s.policy.spill
                       and self._turn_scorer(s) == "snapkv"
                       and (s.recall_ready is None or s.recall_ready.used != s.last_used or s.recall_ready.cold != s.cold)]
            if not waiting:
                return False
            session_id = max(waiting)[1]
            s = self._sessions[session_id]
            piece = (session_id, list(s.cold), s.last_used, self._recall_picks(s, s.resident))
            self._reading = True
        threading.Thread(target=self._prepare_read, args=piece, name=f"kvres-recall-read-{self.name}",
                         daemon=True).start()
        return False

    def _prepare_read(self, session_id: str, cold: list[ColdRef], used: int, candidates: list[ColdRef]) -> None:
        """One piece of ``prepare_recalls``, on the reader thread."""
        t0 = time.perf_counter()
        try:
            try:
                read: list[Any] | None = self._read_cold(candidates)
            except Exception as exc:
                read = None
                log.debug("session %r: cold blocks not read ahead (%s)", session_id, exc)
            with self._lock:
                s = self._sessions.get(session_id)
                if self._loop.stopping or s is None or s.suspended is not None or s.cold != cold \
                        or s.last_used != used or self._loop.pending():
                    return  # it changed meanwhile (or a call runs): the loop looks again when idle
                self._prepare_from(session_id, s, candidates, read)
                self._count(session_id, "recall_prep_us", int((time.perf_counter() - t0) * 1e6))
        finally:
            with self._lock:
                self._reading = False
            self._loop.request_idle()

    def _prepare_from(self, session_id: str, s: _Session, candidates: list[ColdRef], read: list[Any] | None) -> None:
        try:
            if read is None:
                raise KvresError("cold blocks not read")
            refs, blocks = self._keep_read(s, candidates, read)
            self._kv_executor("recall").prepare_recall(session_id, blocks, s.policy.rebase)
            s.recall_ready = _RecallReady(list(s.cold), s.last_used, refs, blocks,
                                          sum(len(r.key.token_range) for r in refs), sum(r.nbytes for r in refs))
        except Exception as exc:  # the turn does it all itself then
            log.debug("session %r: recall not prepared (%s)", session_id, exc)
            s.recall_ready = _RecallReady(list(s.cold), s.last_used)
        # what the blocks read ahead may hold, all sessions together: the least recently used let go
        ready = sorted((x.recall_ready.used, x.recall_ready.nbytes, sid) for sid, x in self._sessions.items()
                       if x.recall_ready is not None and x.recall_ready.refs is not None)
        held = sum(nbytes for _, nbytes, _ in ready)
        for used_at, nbytes, sid in ready[:-1]:
            if held <= RECALL_PREP_BYTES:
                break
            held -= nbytes
            self._sessions[sid].recall_ready = _RecallReady(list(self._sessions[sid].cold), used_at)

    def _compress(self, session_id: str) -> None:
        """Cut a scored session (or one on a recall turn) to its budget once, by its scorer."""
        s = self._sessions[session_id]
        recalled, s.retrieved = s.retrieved, []  # scores rank them now, not the recall
        try:
            self._cut_to_budget(session_id)
        finally:
            if s.compressing:
                s.compressing = False
                kept = self.executor.resident_ranges(session_id)
                s.retrieved = [r for r in recalled if any(k.start <= r.start and r.end <= k.end for k in kept)]

    def _cut_to_budget(self, session_id: str) -> None:
        s = self._sessions[session_id]
        budget = s.policy.budget_tokens
        if s.policy.scorer == "h2o" or (budget is not None and s.resident > budget):
            view = self._view(session_id, 0, True)
            if budget is None or s.resident <= budget:
                self._with_scores(view)  # H2O still sees the rows of this call
                return
            plan = self._plan(BackendPlanInput([self._with_scores(view)], self.config.kv_budget_tokens,
                                               self.executor.capabilities()))
            for action in plan.actions:
                if action.kind == "evict":
                    self._evict(session_id, action.ranges, action.rebase)

    def _needs_plan(self, incoming: Mapping[str, int], newcomer_tokens: int) -> bool:
        live = [(sid, s) for sid, s in self._sessions.items() if s.suspended is None]
        total = sum(s.resident for _, s in live) + sum(incoming.values()) + newcomer_tokens
        if total > self.config.kv_budget_tokens:
            return True
        for sid, s in live:
            if (s.policy.kind == "scored" or s.compressing) and sid in incoming:
                continue  # compressed after its chunk, not before: only the backend budget binds
            budget = s.policy.budget_tokens if s.policy.kvres_evicts else None
            if budget is not None and s.resident + incoming.get(sid, 0) > budget:
                return True
        return False

    def _fits(self, s: _Session, n: int, used: int) -> bool:
        """What ``_needs_plan`` would find for ``n`` more tokens of ``s`` (not yet in the step)
        when its last check in this step found nothing to plan and ``used`` tokens are held or
        coming: only the backend's budget and the session's own can bind."""
        if used + n > self.config.kv_budget_tokens:
            return False
        if s.policy.kind == "scored" or s.compressing or not s.policy.kvres_evicts or s.policy.budget_tokens is None:
            return True
        return s.resident + n <= s.policy.budget_tokens

    def _free_tokens(self, incoming: Mapping[str, int]) -> int:
        used = sum(s.resident for s in self._sessions.values() if s.suspended is None)
        return self.config.kv_budget_tokens - used - sum(incoming.values())

    def _make_room(
        self,
        incoming: Mapping[str, int],
        newcomer: str | None = None,
        newcomer_tokens: int = 0,
        ahead: Mapping[str, int] | None = None,
        busy: set[str] | None = None,
    ) -> bool:
        """Make room for ``incoming`` tokens per live session (and, for a ``newcomer`` being
        opened or resumed, a sequence slot and ``newcomer_tokens``): plan when a session or the
        backend would go over budget, planning room for ``ahead`` tokens where given, and carry
        the plan out. Sessions with a running call (``busy``) are never suspended for it. True
        when it changed anything (a session suspended or a plan carried out)."""
        busy = self._busy() if busy is None else busy
        live = [sid for sid, s in self._sessions.items() if s.suspended is None and sid != newcomer]
        if newcomer is not None and len(live) >= self.config.n_seq_max:
            # every sequence slot is taken: the least recently used idle session has to go
            idle = [sid for sid in live if sid not in busy and sid not in incoming]
            if not idle:
                raise BackendFullError(
                    f"backend {self.name!r} has all n_seq_max={self.config.n_seq_max} sequence slots "
                    f"serving running calls; {newcomer!r} has to wait for one"
                )
            victim = min(idle, key=lambda sid: self._sessions[sid].last_used)
            self.suspend(victim)
            self._count(victim, "suspends")
            live.remove(victim)
            if not self._needs_plan(incoming, newcomer_tokens):
                return True
        elif not self._needs_plan(incoming, newcomer_tokens):
            return False
        planned = {**incoming, **(ahead or {})}
        active = set(planned) | busy
        views = [self._view(sid, planned.get(sid, 0), sid in active) for sid in live]
        views = [self._with_scores(v) if v.incoming_tokens else v for v in views]
        if newcomer is not None:
            views.append(SessionView(newcomer, (), last_used=1 << 62, active=True,
                                     incoming_tokens=newcomer_tokens))
        t0 = time.perf_counter()
        plan = self._plan(BackendPlanInput(views, self.config.kv_budget_tokens, self.executor.capabilities()))
        self._metrics.observe_plan_ms(self.name, (time.perf_counter() - t0) * 1e3)
        for action in plan.actions:
            if action.kind == "suspend":
                self.suspend(action.session_id)
                self._count(action.session_id, "suspends")
            else:
                self._evict(action.session_id, action.ranges, action.rebase)
        if plan.over_budget and self._needs_plan(incoming, newcomer_tokens):
            who = newcomer if newcomer is not None else ", ".join(sorted(incoming))
            more = newcomer_tokens if newcomer is not None else sum(incoming.values())
            raise BackendFullError(
                f"backend {self.name!r} cannot fit {more} more tokens for session {who!r} "
                f"within kv_budget_tokens={self.config.kv_budget_tokens}: "
                + "; ".join(plan.diagnostics[-2:])
            )
        return True

    def _kv_executor(self, what: str) -> Executor:
        if not isinstance(self.executor, Executor):
            raise KvresError(f"backend {self.name!r} ({self.config.engine}) cannot {what}: the engine manages its KV")
        return self.executor

    def _evict(self, session_id: str, ranges: Sequence[Range], rebase: bool) -> None:
        """Evict ``ranges``; a spilling session parks them first, all in one store call."""
        executor = self._kv_executor("evict")
        s = self._sessions[session_id]
        ordered = sorted(ranges, reverse=True)
        if s.policy.spill and self._store is not None and executor.capabilities().kv_export:
            refs = self._store.park([executor.export_range(session_id, r) for r in ordered])
            s.cold.extend(refs)
            self._count(session_id, "spills", len(ordered))
            self._count(session_id, "spilled_bytes", sum(ref.nbytes for ref in refs))
            self._cap_spill(session_id)
        for rng in ordered:
            executor.evict_range(session_id, rng, rebase=rebase)
            self._count(session_id, "evictions")
        first = ordered[-1].start if ordered else None
        if first is not None and any(r.end > first for r in executor.resident_ranges(session_id)):
            s.exact = False  # later tokens attended to what left: their KV cannot be recomputed as it is
        self._dirty.add(session_id)
        if s.h2o is not None:
            s.h2o.drop(ordered)  # an evicted key's accumulated attention goes with it
        self._refresh_resident(session_id)

    def _cap_spill(self, session_id: str) -> None:
        """Keep a session's spilled bytes under its policy's ``spill_cap_bytes``: the oldest
        spills go first (deleted from their stores; their tokens stay in the log)."""
        s = self._sessions[session_id]
        cap = s.policy.spill_cap_bytes
        if cap is None or self._store is None:
            return
        held = sum(ref.nbytes for ref in s.cold)
        dropped: list[ColdRef] = []
        while s.cold and held > cap:
            ref = s.cold.pop(0)
            held -= ref.nbytes
            dropped.append(ref)
        if dropped:
            self._store.release(dropped)
            self._count(session_id, "spill_dropped", len(dropped))

    # -- suspend / resume ------------------------------------------------------------------
    def suspend(self, session_id: str) -> SuspendRecord:
        """Export all of the session's KV to the cold store and free it on the engine (a session
        already suspended stays as it is)."""
        with self._lock:
            s = self._get(session_id, live=False)
            if s.suspended is not None:
                return s.suspended
            if self._loop.pending(session_id):
                raise SessionBusyError(f"session {session_id!r} has a call running; suspend it after")
            if self._store is None:
                raise KvresError(f"backend {self.name!r} has no cold store: cannot suspend {session_id!r}")
            resident = self.executor.resident_ranges(session_id)  # none where the engine manages KV
            refs: list[ColdRef] = []
            if resident and self.executor.capabilities().kv_export:
                executor = self._kv_executor("suspend")
                refs = self._store.park([executor.export_range(session_id, r) for r in resident])
            s.suspended = SessionRecord(
                session_id, self.executor.token_log(session_id), resident, refs, list(s.cold),
                s.policy, s.last_logits, dict(s.counters), self.fingerprint,
            )
            self.executor.close_session(session_id)
            s.resident, s.recall_ready = 0, None
            s.suspended = self._commit(session_id, later=True)
            self._publish()
            self._loop.poke()
            return s.suspended

    def detach(self, session_id: str) -> SuspendRecord:
        """Suspend and forget the session here (it moves to another backend)."""
        with self._lock:
            self.suspend(session_id)
            if self._store is not None:
                self._store.send_now()  # whoever resumes it reads its blocks from the store
            record = self._commit(session_id, backend="")  # on its way: no backend rebuilds it
            del self._sessions[session_id]
            self._metrics.set_resident(self.name, session_id, 0)
            self._publish()
            return record

    def resume(self, session_id: str, record: SuspendRecord | None = None) -> int:
        """Bring a suspended session back (from this backend's record or one handed over);
        returns the number of tokens that had to be recomputed."""
        with self._lock:
            return self._resume(session_id, record)

    def _resume(self, session_id: str, record: SuspendRecord | None, busy: set[str] | None = None) -> int:
        if record is None:
            record = self._get(session_id, live=False).suspended
            if record is None:
                return 0  # already live
        elif session_id in self._sessions:
            raise SessionExistsError(session_id)
        if self._store is None and record.blocks:
            raise KvresError(f"backend {self.name!r} has no cold store: cannot resume {session_id!r}")
        previous = self._sessions.pop(session_id, None)
        try:
            self._make_room({}, newcomer=session_id,
                            newcomer_tokens=sum(len(r) for r in record.resident_ranges), busy=busy)
            self._open_on_engine(session_id, record.policy, record.token_log)
        except BaseException:
            if previous is not None:
                self._sessions[session_id] = previous  # still suspended, nothing lost
            raise
        s = _Session(record.policy, next(self._clock), dict(record.counters), list(record.cold),
                     record.last_logits, committed=previous.committed if previous else record, exact=record.exact)
        self._sessions[session_id] = s
        try:
            recomputed = self._restore(session_id, record) if record.resident_ranges else 0
        except BaseException:
            self.executor.close_session(session_id)
            if previous is not None:
                self._sessions[session_id] = previous
            else:
                del self._sessions[session_id]
            raise
        self._refresh_resident(session_id)
        if recomputed and not s.exact:
            self._count(session_id, "inexact_recomputed_tokens", recomputed)
            log.warning("session %r: %d tokens recomputed from its log differ from the KV they replace "
                        "(it evicted tokens that later ones had attended to); its continuation may differ "
                        "from an uninterrupted run", session_id, recomputed)
        self._commit(session_id, later=True)
        self._publish()
        return recomputed

    def _restore(self, session_id: str, record: SuspendRecord) -> int:
        """Import the parked blocks worth reading (one ``pop_many`` per store, which also frees
        them), recompute the rest from the token log."""
        executor = self._kv_executor("resume")
        can_shift = executor.capabilities().position_shift
        # without position_shift, a recomputed range after a gap may be impossible: read every block
        costs = self._recall_costs() if self._recall_costs is not None and can_shift else None
        parked = self._store.take(record.blocks, costs) if self._store is not None and record.blocks else []
        for block in parked:
            if block is None:
                continue  # gone, unreadable or cheaper to recompute: recomputed below
            try:
                executor.import_range(session_id, block)
                self._count(session_id, "admissions")
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
            self._count(session_id, "recomputed_tokens", recomputed)
        return recomputed

    # -- stats -----------------------------------------------------------------------------
    def session_stats(self, session_id: str) -> dict[str, Any]:
        with self._lock:
            return self._session_stats(session_id)

    def _session_stats(self, session_id: str) -> dict[str, Any]:
        s = self._get(session_id, live=False)
        live = s.suspended is None
        resident = self.executor.resident_ranges(session_id) if live else []
        refs = list(s.cold) + (list(s.suspended.blocks) if s.suspended else [])
        tiers = self._store.tiers_of(refs) if self._store is not None else [None] * len(refs)
        # blocks the store dropped for its own budget are gone: forget their refs
        gone = {ref for ref, tier in zip(refs, tiers, strict=True) if tier is None}
        if gone:
            s.cold = [ref for ref in s.cold if ref not in gone]
        cold: dict[str, dict[str, int]] = {}
        for ref, tier in zip(refs, tiers, strict=True):
            if tier is None:
                continue
            entry = cold.setdefault(tier, {"blocks": 0, "bytes": 0})
            entry["blocks"] += 1
            entry["bytes"] += ref.nbytes
        return {
            "session_id": session_id,
            "backend": self.name,
            "state": "live" if live else "suspended",
            "policy": s.policy.model_dump(),
            "token_count": len(s.suspended.token_log if s.suspended else self.executor.token_log(session_id)),
            "resident_ranges": [(r.start, r.end) for r in resident],
            "resident_tokens": sum(len(r) for r in resident),
            "peak_resident_tokens": s.peak,
            "recompute_exact": s.exact,
            "cold": cold,
            "counters": dict(s.counters),
        }

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self._stats()

    def _stats(self) -> dict[str, Any]:
        live = {sid: s.resident for sid, s in self._sessions.items() if s.suspended is None}
        # KV bytes from the engine's profile (docs/policies.md, T0): each session keeps its own window
        if not hasattr(self, "_kv_bytes_profile"):
            kv_profile = getattr(self.executor, "kv_profile", None)
            self._kv_bytes_profile = kv_profile() if callable(kv_profile) else None
        profile = self._kv_bytes_profile
        resident_bytes = None if profile is None else sum(profile.kv_bytes_for_context(t) for t in live.values())
        budget_bytes = self.config.kv_memory_bytes or (None if profile is None else profile.for_sessions(
            self.config.n_seq_max).kv_bytes_for_context(self.config.kv_budget_tokens))
        return {
            "backend": self.name,
            "engine": self.config.engine,
            "model": str(self.config.model_path),
            "fingerprint": self.fingerprint,
            "kv_budget_tokens": self.config.kv_budget_tokens,
            "resident_tokens": sum(live.values()),
            "peak_resident_tokens": self.peak_resident_tokens,
            "free_tokens": self.config.kv_budget_tokens - sum(live.values()),
            "kv_budget_bytes": budget_bytes,
            "resident_kv_bytes": resident_bytes,
            "free_kv_bytes": None if budget_bytes is None or resident_bytes is None else budget_bytes - resident_bytes,
            "sessions": {
                sid: {"state": "suspended" if s.suspended else "live", "resident_tokens": live.get(sid, 0)}
                for sid, s in self._sessions.items()
            },
        }
