"""kvres metrics for the Ray dashboard and Prometheus (``ray.util.metrics``, prefix ``kvres_``).

Primitives:
- ``Metrics``: the recording interface the actors call; ``NullMetrics`` records nothing (plain
  classes used without Ray); ``RayMetrics`` records into Ray's metrics agent.
- ``GaugeRefresher``: sets gauge series again, every ``period_s``, from a daemon thread.
- ``session_label(session_id) -> str``: what the ``session`` label holds for a session: a short
  keyed hash ``h-<16 hex digits>`` (BLAKE2b keyed with a per-cluster secret), or the id itself
  where ``KVRES_METRICS_SESSION_IDS=1`` opted in. ``hashed_label(session_id, secret)`` is the pure
  part; ``session_ids_opted_in(env)`` reads the variable.
- Names: kvres_resident_tokens{backend,session}, kvres_backend_resident_tokens{backend},
  kvres_cold_bytes{node,tier}, kvres_cold_blocks{node,tier}, kvres_evictions_total{backend,session},
  kvres_admissions_total, kvres_spills_total, kvres_recomputed_tokens_total,
  kvres_suspends_total, kvres_degraded_total{backend,session} (a session runs a weaker policy
  than it asked, ``kvres.policy.degrade``: counted once per session), kvres_plan_latency_ms
  (histogram, {backend}),
  kvres_tokens_total{backend,kind} (kind "prompt": tokens appended, "generated": tokens decoded),
  kvres_store_blocks_lost{node,event} (a cold store's blocks not kept since it started: event "drops",
  "spill_errors", "corrupt"; a gauge, present from the start), kvres_dropped_blocks_total{backend,session}
  (blocks a session found gone: recomputed from its log).

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
import os
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from kvres.policy.errors import KvresError

from .cluster_secrets import METRICS_LABEL_SECRET, cluster_secret

SESSION_IDS_ENV = "KVRES_METRICS_SESSION_IDS"
LABEL_DIGEST_BYTES = 8
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_process_secret: bytes | None = None

COUNTERS = ("evictions", "admissions", "spills", "spilled_bytes", "spill_dropped", "recalls", "recalled_tokens",
            "recall_us", "recall_prep_us",
            "recomputed_tokens", "suspends", "resumes", "rebuilds", "rollbacks", "inexact_recomputed_tokens",
            "degraded", "dropped_blocks")
STORE_EVENTS = ("drops", "spill_errors", "corrupt")  # a cold store's counts, as kvres_store_blocks_lost{event}


class MetricsConfigError(KvresError, ValueError):
    """A metrics setting in the environment kvres cannot read; names the variable and the value."""


def session_ids_opted_in(env: Mapping[str, str] | None = None) -> bool:
    raw = (os.environ if env is None else env).get(SESSION_IDS_ENV, "")
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise MetricsConfigError(
        f"environment variable {SESSION_IDS_ENV}={raw!r} is invalid: expected 1 (session ids in "
        "metric labels) or 0 (keyed hashes, the default)"
    )


def _new_label_secret() -> bytes:
    """The empty secret stands for plain ids (opted in)."""
    return b"" if session_ids_opted_in() else secrets.token_bytes(16)


def label_secret() -> bytes:
    """The cluster's label secret (the process's outside Ray); empty when ids are opted in."""
    global _process_secret
    import ray

    if ray.is_initialized():
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

    def count(self, name: str, backend: str, session: str, value: int = 1) -> None: ...

    def observe_plan_ms(self, backend: str, ms: float) -> None: ...

    def set_cold(self, node: str, tier: str, nbytes: int, blocks: int) -> None: ...

    def count_tokens(self, backend: str, kind: str, n: int) -> None: ...

    def set_store_events(self, node: str, counts: Mapping[str, int]) -> None: ...


NullMetrics = Metrics


class GaugeRefresher:
    """Gauge values and counter increments handed to Ray's metrics off the caller's path (one
    record costs about half a millisecond, too much for a suspend or a resume): ``record`` keeps the
    last value of a gauge series, ``add`` sums a counter's increments and ``observe`` queues a
    histogram's observations; a daemon thread, started
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
            counter.inc(value, tags=tags)

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
    def __init__(self) -> None:
        from ray.util import metrics

        self._refresher = GaugeRefresher(_refresh_period_s())
        self._label_secret: bytes | None = None  # read at the first session series

        self._resident = metrics.Gauge(
            "kvres_resident_tokens", "Resident KV tokens of a session", tag_keys=("backend", "session")
        )
        self._backend = metrics.Gauge(
            "kvres_backend_resident_tokens", "Resident KV tokens of a backend", tag_keys=("backend",)
        )
        self._cold_bytes = metrics.Gauge(
            "kvres_cold_bytes", "Bytes held by a cold-store tier", tag_keys=("node", "tier")
        )
        self._cold_blocks = metrics.Gauge(
            "kvres_cold_blocks", "Blocks held by a cold-store tier", tag_keys=("node", "tier")
        )
        self._counters: dict[str, Any] = {
            name: metrics.Counter(
                f"kvres_{name}_total", f"kvres {name.replace('_', ' ')}", tag_keys=("backend", "session")
            )
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

    def _session(self, session_id: str) -> str:
        if self._label_secret is None:
            self._label_secret = label_secret()
        return hashed_label(session_id, self._label_secret)

    def set_resident(self, backend: str, session: str, tokens: int) -> None:
        self._refresher.record(
            self._resident, tokens, {"backend": backend, "session": self._session(session)}, keep_zero=False
        )

    def set_backend_resident(self, backend: str, tokens: int) -> None:
        self._refresher.record(self._backend, tokens, {"backend": backend})

    def count(self, name: str, backend: str, session: str, value: int = 1) -> None:
        if value:
            self._refresher.add(self._counters[name], value, {"backend": backend, "session": self._session(session)})

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
