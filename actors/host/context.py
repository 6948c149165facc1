"""What the parts of a backend host share: its engine, store, sessions, lock and pending calls.

Primitives:
- ``HostContext(config, executor, store, metrics, journal, on_change)``: the session table
  (``sessions``; ``get``, which brings back a session the journal says this backend serves and this
  process does not hold, ``rebuild``; ``new_session``, ``tick``; ``close``), bookkeeping
  (``count``, ``refresh_resident``, ``publish``, ``busy``, ``held``, ``free_tokens``), the lock,
  the calls pending (``jobs``: the step loop's ``JobQueue``, built here so every part can look at
  it before the loop that runs it exists), the calls among them that wait for room (``room``: a
  ``RoomQueue``) and ``retention_wake`` (set when the first session with idle or TTL limits comes,
  or one with a limit under ``RETENTION_POLL_S``: it wakes the retention timer, which otherwise
  looks at least that often).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace

from kvres.coldstore import ColdStoreError, validate_session_id
from kvres.policy import KvresError, UnknownSessionError
from kvres.policy.degrade import effective_residency

from ..config import BackendConfig, SessionPolicy
from ..engines.executor import EngineManagedExecutor, Executor
from ..metrics import Metrics
from .journal import Journal, MemoryJournal, SessionRecord, WriteBehindJournal
from .refusals import SessionBusyError
from .room_queue import RoomQueue
from .scheduler import JobQueue, WaitCountingLock
from .sessions import HostSession
from .store_ports import StorePort

RETENTION_POLL_S = 1.0  # the longest the retention timer sleeps between looks (a nearer deadline wakes it sooner)

log = logging.getLogger("kvres.backend")


class HostContext:
    def __init__(
        self, config: BackendConfig, executor: Executor | EngineManagedExecutor, store: StorePort | None,
        metrics: Metrics, journal: Journal | None, on_change: Callable[[], None] | None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.executor = executor
        self.addresses_kv = isinstance(executor, Executor)  # kvres evicts, parks and recalls its KV by range
        self.store = store
        self.metrics = metrics
        self.journal = WriteBehindJournal(journal or MemoryJournal())
        self.on_change = on_change
        self.fingerprint = executor.fingerprint
        self.sessions: dict[str, HostSession] = {}
        self.dirty: set[str] = set()  # changed outside a call of theirs: committed after the step
        self.lock = WaitCountingLock()
        self.jobs = JobQueue(self.lock, config.name)
        self.room = RoomQueue(config.name, config.max_room_wait_s, config.max_waiting_calls, metrics)
        self.retention_wake = threading.Event()
        self.retention_looking = False  # the retention timer looks at least every RETENTION_POLL_S now
        self.peak_resident_tokens = 0  # the most the engine held after any step
        self._tenants_shown: set[str] = set(config.tenant_quotas)  # tenant series published (kept at 0 when gone)
        self._clock = itertools.count(1)

    # -- the session table ------------------------------------------------------------------
    def tick(self) -> int:
        return next(self._clock)

    def new_session(self, policy: SessionPolicy, record: SessionRecord | None = None, *, parked: bool = False,
                    committed: SessionRecord | None = None) -> HostSession:
        """A session of ``policy`` (degraded to what the engine can run unless strict), empty or
        carrying ``record``'s counters, cold blocks, logits and exactness (``parked``: suspended
        with that record)."""
        residency = effective_residency(policy.residency, self.executor.capabilities(), self.store is not None,
                                        strict=policy.strict, addressed=self.addresses_kv)
        s = HostSession(policy, residency, residency.ranking(self.executor.capabilities()), self.tick())
        if record is not None:
            s.counters, s.cold = dict(record.counters), list(record.cold)
            s.last_logits, s.exact = record.last_logits, record.exact
            s.committed = record if committed is None else committed
            if parked:
                s.park(record)
        limits = [limit for limit in (policy.idle_suspend_s, policy.ttl_s) if limit is not None]
        # woken for the first such session, or a limit shorter than its longest sleep: not at every
        # resume (a resumed session's clock starts now, and the timer looks within its sleep anyway)
        if limits and (not self.retention_looking or min(limits) < RETENTION_POLL_S):
            self.retention_wake.set()
        return s

    def get(self, session_id: str, *, live: bool = True) -> HostSession:
        s = self.sessions.get(session_id)
        if s is None:
            s = self.rebuild(session_id)
        if live and not s.live:
            raise KvresError(f"session {session_id!r} is suspended; resume it first")
        return s

    def rebuild(self, session_id: str) -> HostSession:
        """A session the journal says this backend serves but this process does not hold (the
        backend was restarted): it comes back suspended, and its next call resumes it (parked
        blocks imported, the rest recomputed from its token log)."""
        try:
            validate_session_id(session_id)
        except ColdStoreError:
            raise UnknownSessionError(session_id) from None
        record = self.journal.load(session_id)
        if record is None or record.backend != self.name:
            raise UnknownSessionError(session_id)
        if record.fingerprint != self.fingerprint:
            raise KvresError(
                f"session {session_id!r} was made with model fingerprint {record.fingerprint!r}; backend "
                f"{self.name!r} now runs {self.fingerprint!r} and cannot rebuild it"
            )
        s = self.new_session(record.policy, record, parked=True)
        self.sessions[session_id] = s
        self.count(session_id, "rebuilds")
        s.park(replace(record, counters=dict(s.counters)))
        log.warning("backend %r rebuilt session %r from its journal (%d tokens, %s)", self.name, session_id,
                    len(record.token_log), "was live" if record.state == "live" else "was suspended")
        return s

    def token_log(self, session_id: str) -> list[int]:
        s = self.get(session_id, live=False)
        return list(s.record.token_log) if not s.live else self.executor.token_log(session_id)

    def close(self, session_id: str) -> None:
        """Close the session, ending a call it has running (that call raises ``SessionBusyError``):
        closed on the engine if live, every block it parked or spilled released, its record deleted."""
        with self.lock:
            s = self.get(session_id, live=False)
            self.jobs.cancel(session_id, SessionBusyError(f"session {session_id!r} was closed during the call"))
            if s.live:
                self.executor.close_session(session_id)
            if self.store is not None:
                self.store.release(s.cold + ([] if s.live else s.record.blocks))
            del self.sessions[session_id]
            if not s.ephemeral:
                self.journal.delete(session_id)
            self.metrics.set_resident(self.name, session_id, 0)
            self.publish()
            self.jobs.poke()
            if s.live:  # a slot freed: a session parked while paused for tools may come back
                self.jobs.request_idle()

    # -- bookkeeping ------------------------------------------------------------------------
    def count(self, session_id: str, name: str, value: int = 1) -> None:
        counters = self.sessions[session_id].counters
        counters[name] = counters.get(name, 0) + value
        self.metrics.count(name, self.name, session_id, value)

    def refresh_resident(self, session_id: str) -> int:
        s = self.sessions[session_id]
        s.resident = sum(len(r) for r in self.executor.resident_ranges(session_id)) if s.live else 0
        s.peak = max(s.peak, s.resident)  # a resume, a hand-over or a fork brings KV in without a step
        self.peak_resident_tokens = max(self.peak_resident_tokens, self.held())
        return s.resident

    def publish(self) -> None:
        """Metrics and the load report (``on_change``) after a change of sessions or residency."""
        total = 0
        tenants: dict[str, list[int]] = {t: [0, 0] for t in self._tenants_shown}
        for sid, s in self.sessions.items():
            total += s.resident
            self.metrics.set_resident(self.name, sid, s.resident)
            if s.policy.tenant is not None:
                held = tenants.setdefault(s.policy.tenant, [0, 0])
                held[0] += s.resident
                held[1] += s.cold_bytes
        self.metrics.set_backend_resident(self.name, total)
        for tenant, (resident, cold) in tenants.items():
            self.metrics.set_tenant(self.name, tenant, resident, cold)
        self._tenants_shown.update(tenants)
        if self.on_change is not None:
            self.on_change()

    def busy(self) -> set[str]:
        return {job.session_id for job in self.jobs.pending()}

    def held(self) -> int:
        """Tokens the live sessions hold."""
        return sum(s.resident for s in self.sessions.values() if s.live)

    def free_tokens(self, incoming: Mapping[str, int]) -> int:
        return self.config.kv_budget_tokens - self.held() - sum(incoming.values())
