"""What the parts of a backend host share: its engine, store, sessions, lock and step loop.

Primitives:
- ``HostContext(config, executor, store, metrics, journal, on_change)``: the session table
  (``sessions``, ``get`` with the journal fallback, ``new_session``, ``tick``), bookkeeping
  (``count``, ``refresh_resident``, ``publish``, ``busy``, ``held``, ``free_tokens``), the engine as
  kvres addresses it (``kv_executor(what)``; None where the engine manages its KV), and the
  hooks the host sets once its parts exist (``rebuild``, ``open_on_engine``, ``watch_retention``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

from kvres.policy import KvresError
from kvres.policy.degrade import effective_residency

from ..config import BackendConfig, SessionPolicy
from ..engines.executor import EngineManagedExecutor, Executor
from ..metrics import Metrics
from .journal import Journal, MemoryJournal, SessionRecord, WriteBehindJournal
from .scheduler import StepLoop, WaitCountingLock
from .sessions import HostSession
from .store_ports import StorePort


class HostContext:
    def __init__(
        self, config: BackendConfig, executor: Executor | EngineManagedExecutor, store: StorePort | None,
        metrics: Metrics, journal: Journal | None, on_change: Callable[[], None] | None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.executor = executor
        self.kv = executor if isinstance(executor, Executor) else None  # kvres addresses its KV
        self.store = store
        self.metrics = metrics
        self.journal = WriteBehindJournal(journal or MemoryJournal())
        self.on_change = on_change
        self.fingerprint = executor.fingerprint
        self.sessions: dict[str, HostSession] = {}
        self.dirty: set[str] = set()  # changed outside a call of theirs: committed after the step
        self.lock = WaitCountingLock()
        self.peak_resident_tokens = 0  # the most the engine held after any step
        self._tenants_shown: set[str] = set(config.tenant_quotas)  # tenant series published (kept at 0 when gone)
        self._clock = itertools.count(1)
        self.loop: StepLoop  # set by the host once its step function exists
        self.rebuild: Callable[[str], HostSession]  # a session the journal has and this process not
        self.open_on_engine: Callable[[str, HostSession, Sequence[int]], None]
        self.watch_retention: Callable[[], None] = lambda: None  # a session with idle / TTL limits came

    # -- the session table ------------------------------------------------------------------
    def tick(self) -> int:
        return next(self._clock)

    def new_session(self, policy: SessionPolicy, record: SessionRecord | None = None, *, parked: bool = False,
                    committed: SessionRecord | None = None) -> HostSession:
        """A session of ``policy`` (degraded to what the engine can run unless strict), empty or
        carrying ``record``'s counters, cold blocks, logits and exactness (``parked``: suspended
        with that record)."""
        residency = effective_residency(policy.residency, self.executor.capabilities(), self.store is not None,
                                        strict=policy.strict, addressed=self.kv is not None)
        s = HostSession(policy, residency, residency.ranking(self.executor.capabilities()), self.tick())
        if record is not None:
            s.counters, s.cold = dict(record.counters), list(record.cold)
            s.last_logits, s.exact = record.last_logits, record.exact
            s.committed = record if committed is None else committed
            if parked:
                s.park(record)
        if policy.idle_suspend_s is not None or policy.ttl_s is not None:
            self.watch_retention()
        return s

    def get(self, session_id: str, *, live: bool = True) -> HostSession:
        s = self.sessions.get(session_id)
        if s is None:
            s = self.rebuild(session_id)
        if live and not s.live:
            raise KvresError(f"session {session_id!r} is suspended; resume it first")
        return s

    def token_log(self, session_id: str) -> list[int]:
        s = self.get(session_id, live=False)
        return list(s.record.token_log) if not s.live else self.executor.token_log(session_id)

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
        return {job.session_id for job in self.loop.pending()}

    def held(self) -> int:
        """Tokens the live sessions hold."""
        return sum(s.resident for s in self.sessions.values() if s.live)

    def free_tokens(self, incoming: Mapping[str, int]) -> int:
        return self.config.kv_budget_tokens - self.held() - sum(incoming.values())

    def kv_executor(self, what: str) -> Executor:
        if self.kv is None:
            raise KvresError(f"backend {self.name!r} ({self.config.engine}) cannot {what}: the engine manages its KV")
        return self.kv
