"""kvres metrics for the Ray dashboard and Prometheus (``ray.util.metrics``, prefix ``kvres_``).

Primitives:
- ``Metrics``: the recording interface the actors call; ``NullMetrics`` records nothing (plain
  classes used without Ray); ``RayMetrics(per_session=None)`` records into Ray's metrics agent
  (``declare_backend(name)``: every counter's series of a backend at 0 from its start, so a rate
  reads 0 rather than no data before the first event).
- ``GaugeRefresher``: sets gauge series again, every ``period_s``, from a daemon thread.
- ``session_label(session_id) -> str``: what the ``session`` label holds for a session: a short
  keyed hash ``h-<16 hex digits>`` (BLAKE2b keyed with a per-cluster secret), or the id itself
  where ``KVRES_METRICS_SESSION_IDS=1`` opted in. ``hashed_label(session_id, secret)`` is the pure
  part; ``session_ids_opted_in(env)`` reads the variable.
- ``per_session_series() -> bool``: whether this cluster's counters and resident gauges carry a
  ``session`` label at all (``KVRES_METRICS_PER_SESSION=1`` or ``KVRES_METRICS_SESSION_IDS=1`` in
  the first process; off by default: one series per backend, whatever the number of sessions).
- Names (``{backend}`` series; ``{backend,session}`` where per-session series are on):
  kvres_resident_tokens{backend,session} (per-session only), kvres_backend_resident_tokens{backend},
  kvres_tenant_resident_tokens{backend,tenant} and kvres_tenant_cold_bytes{backend,tenant} (what a
  tenant label's sessions hold, ``kvres.actors.host.quotas``),
  kvres_cold_bytes{node,tier}, kvres_cold_blocks{node,tier}, ``kvres_<counter>_total`` for every
  name in ``COUNTERS`` (evictions, admissions (parked blocks read back on a resume), recalls (evicted
  ranges read back), recomputed_tokens, suspends (forced: to make room), explicit_suspends,
  resumes (implicit: a call for a suspended session), explicit_resumes, degraded (a session runs a
  weaker policy than it asked, ``kvres.policy.degrade``: counted once per session), dropped_blocks
  (blocks a session found gone: recomputed from its log), idle_suspends (parked after its
  ``idle_suspend_s``), ttl_closes (closed after its ``ttl_s``), quota_drops (cold blocks dropped
  to keep its tenant within ``cold_bytes``), preemptions (parked mid-call: its call waited for room
  that only waiting calls held; also counted in suspends), tool_pause_suspends (suspended for room
  while paused for tools: no idle session could go instead; also counted in suspends),
  tool_prefetches (a session parked while paused for tools brought back ahead of its results), ...), kvres_plan_latency_ms (histogram,
  {backend}), kvres_tokens_total{backend,kind} (kind "prompt": tokens appended, "generated": tokens
  decoded), kvres_store_blocks_lost{node,event} (a cold store's blocks not kept since it started:
  event "drops", "spill_errors", "corrupt"; a gauge, present from the start);
  request metrics, measured where the backend actor answers calls and hands out tokens:
  kvres_time_to_first_token_seconds{backend,method} (histogram: a stream's first token; for
  ``generate`` / ``chat`` the whole answer, which is when its first token reaches the caller),
  kvres_inter_token_seconds{backend} (histogram: between a stream's tokens),
  kvres_call_seconds{backend,method} (histogram: every call, from its arrival to its answer),
  kvres_queue_depth{backend} (calls the backend accepted and has not answered: waiting or running);
  kvres_room_queue_depth{backend} (calls waiting for room, ``kvres.actors.host.room_queue``) and
  kvres_room_wait_seconds{backend,outcome} (histogram: how long a call waited for room; outcome
  "room": it got room, "refused": it was refused, at once when the queue was full).

Session ids are what ``SessionManager.session(id)`` needs to take a session over, and the metrics
endpoint has no authentication, so labels carry a keyed hash of the id instead. The secret (or the
opt-in to plain ids) is decided once per Ray cluster, by the first kvres process that needs it
(normally the first ``connect()``), from its ``KVRES_METRICS_SESSION_IDS``, and kept in the GCS
(``cluster_secrets``): every driver and actor of the cluster computes the same labels. Outside Ray
the secret is per process.

Ray drops a gauge series from its metrics endpoint about two report intervals after it was last set
(``metrics_report_interval_ms``, 10 s by default), so a backend at rest would vanish from Prometheus
and Grafana. ``RayMetrics`` therefore sets its gauges again every half interval: per-backend and
per-tier series always, a session's resident tokens while they are not zero (a closed or suspended
session's series then ages out instead of piling up).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from kvres.policy.errors import KvresError

from .cluster_secrets import METRICS_LABEL_SECRET, cluster_secret

SESSION_IDS_ENV = "KVRES_METRICS_SESSION_IDS"
PER_SESSION_ENV = "KVRES_METRICS_PER_SESSION"
PER_SESSION_KEY = "metrics-per-session"  # the cluster's decision, in the GCS beside the label secret
LABEL_DIGEST_BYTES = 8
_process_secret: bytes | None = None

COUNTERS = ("evictions", "admissions", "spills", "spilled_bytes", "spill_dropped", "recalls", "recalled_tokens",
            "recall_us", "recall_prep_us",
            "recomputed_tokens", "suspends", "resumes", "explicit_suspends", "explicit_resumes", "rebuilds",
            "rollbacks", "inexact_recomputed_tokens", "degraded", "dropped_blocks", "idle_suspends", "ttl_closes",
            "quota_drops", "preemptions", "tool_pause_suspends", "tool_prefetches", "truncated_tokens", "cancels")
STORE_EVENTS = ("drops", "spill_errors", "corrupt")  # a cold store's counts, as kvres_store_blocks_lost{event}
# histogram buckets (seconds): a first token or a call takes milliseconds to minutes, a token's gap less
CALL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_GAP_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class MetricsConfigError(KvresError, ValueError):
    """A metrics setting in the environment kvres cannot read; names the variable and the value."""


def _settings(env: Mapping[str, str] | None) -> Any:
    from .settings import SettingsError, read_settings

    try:
        return read_settings(env)
    except SettingsError as exc:
        raise MetricsConfigError(str(exc)) from None


def session_ids_opted_in(env: Mapping[str, str] | None = None) -> bool:
    return bool(_settings(env).metrics_session_ids)


def per_session_opted_in(env: Mapping[str, str] | None = None) -> bool:
    """This process's wish (``KVRES_METRICS_PER_SESSION`` or ``KVRES_METRICS_SESSION_IDS``)."""
    return bool(_settings(env).per_session_series)


def _new_label_secret() -> bytes:
    """The empty secret stands for plain ids (opted in)."""
    return b"" if session_ids_opted_in() else secrets.token_bytes(16)


def per_session_series() -> bool:
    """Whether this cluster's metrics carry per-session series (decided by its first process)."""
    import ray

    if ray.is_initialized():
        return cluster_secret(PER_SESSION_KEY, lambda: b"1" if per_session_opted_in() else b"0") == b"1"
    return per_session_opted_in()


def label_secret() -> bytes:
    """The cluster's label secret (the process's outside Ray); empty when ids are opted in. The
    first call on a cluster also decides whether it has per-session series at all."""
    global _process_secret
    import ray

    if ray.is_initialized():
        per_session_series()
        return cluster_secret(METRICS_LABEL_SECRET, _new_label_secret)
    if _process_secret is None:
        _process_secret = _new_label_secret()
    return _process_secret


def hashed_label(session_id: str, secret: bytes) -> str:
    if not secret:
        return session_id
    digest = hashlib.blake2b(session_id.encode(), key=secret, digest_size=LABEL_DIGEST_BYTES)
    return f"h-{digest.hexdigest()}"


def session_label(session_id: str) -> str:
    """The ``session`` label of ``session_id``'s series on this cluster (one GCS read)."""
    return hashed_label(session_id, label_secret())


class Metrics:
    def set_resident(self, backend: str, session: str, tokens: int) -> None: ...

    def set_backend_resident(self, backend: str, tokens: int) -> None: ...

    def set_tenant(self, backend: str, tenant: str, resident_tokens: int, cold_bytes: int) -> None: ...

    def count(self, name: str, backend: str, session: str, value: int = 1) -> None: ...

    def declare_backend(self, backend: str) -> None: ...

    def observe_plan_ms(self, backend: str, ms: float) -> None: ...

    def set_cold(self, node: str, tier: str, nbytes: int, blocks: int) -> None: ...

    def count_tokens(self, backend: str, kind: str, n: int) -> None: ...

    def set_store_events(self, node: str, counts: Mapping[str, int]) -> None: ...

    def observe_call(self, backend: str, method: str, seconds: float) -> None: ...

    def observe_first_token(self, backend: str, method: str, seconds: float) -> None: ...

    def observe_token_gap(self, backend: str, seconds: float) -> None: ...

    def set_queue_depth(self, backend: str, calls: int) -> None: ...

    def set_room_queue_depth(self, backend: str, calls: int) -> None: ...

    def observe_room_wait(self, backend: str, seconds: float, outcome: str) -> None: ...


NullMetrics = Metrics


class GaugeRefresher:
    """Gauge values and counter increments handed to Ray's metrics off the caller's path (one
    record costs about half a millisecond, too much for a suspend or a resume): ``record`` keeps the
    last value of a gauge series, ``add`` sums a counter's increments and ``observe`` queues a
    histogram's observations (``add`` of 0 declares a counter's series at 0); a daemon thread, started
    on first use, hands what changed to Ray within ``FLUSH_S`` and sets every gauge series again every
    ``period_s`` seconds. ``keep_zero=False`` series are forgotten at zero."""

    FLUSH_S = 0.05

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._series: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[Any, dict[str, str], float]] = {}
        self._changed: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[Any, dict[str, str], float]] = {}
        self._increments: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[Any, dict[str, str], float]] = {}
        self._observations: list[tuple[Any, dict[str, str], float]] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def record(self, gauge: Any, value: float, tags: dict[str, str], keep_zero: bool = True) -> None:
        key = (id(gauge), tuple(sorted(tags.items())))
        with self._lock:
            self._changed[key] = (gauge, tags, value)
            if value or keep_zero:
                self._series[key] = (gauge, tags, value)
            else:
                self._series.pop(key, None)
            self._start()

    def add(self, counter: Any, value: float, tags: dict[str, str]) -> None:
        key = (id(counter), tuple(sorted(tags.items())))
        with self._lock:
            _, _, sofar = self._increments.get(key, (counter, tags, 0.0))
            self._increments[key] = (counter, tags, sofar + value)
            self._start()

    def observe(self, histogram: Any, value: float, tags: dict[str, str]) -> None:
        with self._lock:
            if len(self._observations) < 10_000:  # beyond that (Ray gone?) drop rather than grow
                self._observations.append((histogram, tags, value))
            self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvres-metrics", daemon=True)
            self._thread.start()
        self._wake.notify()

    def flush(self) -> None:
        """Hand everything changed since the last flush to Ray now."""
        with self._lock:
            changed, self._changed = self._changed, {}
            increments, self._increments = self._increments, {}
            observations, self._observations = self._observations, []
        for histogram, tags, value in observations:
            histogram.observe(value, tags=tags)
        for gauge, tags, value in changed.values():
            gauge.set(value, tags=tags)
        for counter, tags, value in increments.values():
            if value:
                counter.inc(value, tags=tags)
            else:  # declared: the series exists at 0 before its first event (inc refuses 0)
                counter._record(0, tags=tags)

    def refresh(self) -> None:
        with self._lock:
            series = list(self._series.values())
        for gauge, tags, value in series:
            gauge.set(value, tags=tags)

    def _run(self) -> None:
        last_refresh = time.monotonic()
        while True:
            with self._lock:
                if not self._changed and not self._increments and not self._observations:
                    self._wake.wait(timeout=max(0.0, last_refresh + self.period_s - time.monotonic()))
            time.sleep(self.FLUSH_S)  # gather what else changes meanwhile into one flush
            try:
                self.flush()
                if time.monotonic() >= last_refresh + self.period_s:
                    self.refresh()
                    last_refresh = time.monotonic()
            except Exception:  # Ray is shutting down: nothing left to publish to
                return


def _refresh_period_s() -> float:
    import ray

    try:
        interval_ms = max(int(ray._config.metrics_report_interval_ms()), 1000)
    except Exception:  # no Ray config in this process: Ray's default interval
        interval_ms = 10_000
    return interval_ms / 2000


class RayMetrics(Metrics):
    """``per_session``: whether counters and resident gauges carry a ``session`` label (default:
    the cluster's decision, ``per_session_series()``)."""

    def __init__(self, per_session: bool | None = None) -> None:
        from ray.util import metrics

        self._refresher = GaugeRefresher(_refresh_period_s())
        self._label_secret: bytes | None = None  # read at the first session series
        self.per_session = per_session_series() if per_session is None else per_session
        counter_tags = ("backend", "session") if self.per_session else ("backend",)
        self._seen: set[tuple[str, str]] = set()  # (backend, session) whose counters are declared

        self._resident = metrics.Gauge(
            "kvres_resident_tokens", "Resident KV tokens of a session", tag_keys=("backend", "session")
        )
        self._backend = metrics.Gauge(
            "kvres_backend_resident_tokens", "Resident KV tokens of a backend", tag_keys=("backend",)
        )
        self._tenant_resident = metrics.Gauge(
            "kvres_tenant_resident_tokens", "Resident KV tokens of a tenant's sessions on a backend",
            tag_keys=("backend", "tenant"))
        self._tenant_cold = metrics.Gauge(
            "kvres_tenant_cold_bytes", "Bytes a tenant's sessions on a backend keep in the cold store (spilled "
            "blocks and parked states)", tag_keys=("backend", "tenant"))
        self._cold_bytes = metrics.Gauge(
            "kvres_cold_bytes", "Bytes held by a cold-store tier", tag_keys=("node", "tier")
        )
        self._cold_blocks = metrics.Gauge(
            "kvres_cold_blocks", "Blocks held by a cold-store tier", tag_keys=("node", "tier")
        )
        self._counters: dict[str, Any] = {
            name: metrics.Counter(f"kvres_{name}_total", f"kvres {name.replace('_', ' ')}", tag_keys=counter_tags)
            for name in COUNTERS
        }
        self._plan = metrics.Histogram(
            "kvres_plan_latency_ms", "Planner latency per backend plan (ms)",
            boundaries=[0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000], tag_keys=("backend",),
        )
        self._store_events = metrics.Gauge(
            "kvres_store_blocks_lost", "Blocks a cold store did not keep since it started, by event: drops (its "
            "budget, a full disk), spill_errors (failed disk writes), corrupt (refused when read)",
            tag_keys=("node", "event"))
        self._tokens = metrics.Counter(
            "kvres_tokens_total", "Tokens a backend prefilled (kind=prompt) or generated (kind=generated)",
            tag_keys=("backend", "kind"),
        )
        self._first_token = metrics.Histogram(
            "kvres_time_to_first_token_seconds", "From a call's arrival to its first token reaching the caller "
            "(a stream's first token; generate / chat: the answer)",
            boundaries=list(CALL_BUCKETS_S), tag_keys=("backend", "method"))
        self._token_gap = metrics.Histogram(
            "kvres_inter_token_seconds", "Time between two tokens of a stream",
            boundaries=list(TOKEN_GAP_BUCKETS_S), tag_keys=("backend",))
        self._call = metrics.Histogram(
            "kvres_call_seconds", "A backend call from its arrival to its answer",
            boundaries=list(CALL_BUCKETS_S), tag_keys=("backend", "method"))
        self._queue = metrics.Gauge(
            "kvres_queue_depth", "Calls a backend accepted and has not answered yet (waiting or running)",
            tag_keys=("backend",))
        self._room_queue = metrics.Gauge(
            "kvres_room_queue_depth", "Calls waiting for room on a backend (first come, first served within a "
            "priority, up to its max_room_wait_s)", tag_keys=("backend",))
        self._room_wait = metrics.Histogram(
            "kvres_room_wait_seconds", "How long a call waited for room: outcome=room (it got room) or refused "
            "(past max_room_wait_s, or at once when max_waiting_calls wait)",
            boundaries=list(CALL_BUCKETS_S), tag_keys=("backend", "outcome"))

    def _session(self, session_id: str) -> str:
        if self._label_secret is None:
            self._label_secret = label_secret()
        return hashed_label(session_id, self._label_secret)

    def set_resident(self, backend: str, session: str, tokens: int) -> None:
        if self.per_session:
            self._refresher.record(self._resident, tokens, self._counter_tags(backend, session), keep_zero=False)

    def set_backend_resident(self, backend: str, tokens: int) -> None:
        self._refresher.record(self._backend, tokens, {"backend": backend})

    def set_tenant(self, backend: str, tenant: str, resident_tokens: int, cold_bytes: int) -> None:
        self._refresher.record(self._tenant_resident, resident_tokens, {"backend": backend, "tenant": tenant})
        self._refresher.record(self._tenant_cold, cold_bytes, {"backend": backend, "tenant": tenant})

    def declare_backend(self, backend: str) -> None:
        """Every counter's series of ``backend`` at 0 (per-session series: at each session's first
        sight), so a rate reads 0, not "no data", before the first event."""
        if not self.per_session:
            for counter in self._counters.values():
                self._refresher.add(counter, 0, {"backend": backend})

    def _counter_tags(self, backend: str, session: str) -> dict[str, str]:
        if not self.per_session:
            return {"backend": backend}
        tags = {"backend": backend, "session": self._session(session)}
        if (backend, session) not in self._seen:
            self._seen.add((backend, session))
            for counter in self._counters.values():
                self._refresher.add(counter, 0, tags)
        return tags

    def count(self, name: str, backend: str, session: str, value: int = 1) -> None:
        if value:
            self._refresher.add(self._counters[name], value, self._counter_tags(backend, session))

    def observe_plan_ms(self, backend: str, ms: float) -> None:
        self._refresher.observe(self._plan, ms, {"backend": backend})

    def set_cold(self, node: str, tier: str, nbytes: int, blocks: int) -> None:
        self._refresher.record(self._cold_bytes, nbytes, {"node": node, "tier": tier})
        self._refresher.record(self._cold_blocks, blocks, {"node": node, "tier": tier})

    def count_tokens(self, backend: str, kind: str, n: int) -> None:
        if n:
            self._refresher.add(self._tokens, n, {"backend": backend, "kind": kind})

    def set_store_events(self, node: str, counts: Mapping[str, int]) -> None:
        for event, n in counts.items():
            self._refresher.record(self._store_events, n, {"node": node, "event": event})

    def observe_call(self, backend: str, method: str, seconds: float) -> None:
        self._refresher.observe(self._call, seconds, {"backend": backend, "method": method})

    def observe_first_token(self, backend: str, method: str, seconds: float) -> None:
        self._refresher.observe(self._first_token, seconds, {"backend": backend, "method": method})

    def observe_token_gap(self, backend: str, seconds: float) -> None:
        self._refresher.observe(self._token_gap, seconds, {"backend": backend})

    def set_queue_depth(self, backend: str, calls: int) -> None:
        self._refresher.record(self._queue, calls, {"backend": backend})

    def set_room_queue_depth(self, backend: str, calls: int) -> None:
        self._refresher.record(self._room_queue, calls, {"backend": backend})

    def observe_room_wait(self, backend: str, seconds: float, outcome: str) -> None:
        self._refresher.observe(self._room_wait, seconds, {"backend": backend, "outcome": outcome})
