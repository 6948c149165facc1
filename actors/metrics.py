"""kvres metrics for the Ray dashboard and Prometheus (``ray.util.metrics``, prefix ``kvres_``).

Primitives:
- ``Metrics``: the recording interface the actors call; ``NullMetrics`` records nothing (plain
  classes used without Ray); ``RayMetrics`` records into Ray's metrics agent.
- ``GaugeRefresher``: sets gauge series again, every ``period_s``, from a daemon thread.
- Names: kvres_resident_tokens{backend,session}, kvres_backend_resident_tokens{backend},
  kvres_cold_bytes{node,tier}, kvres_cold_blocks{node,tier}, kvres_evictions_total{backend,session},
  kvres_admissions_total, kvres_spills_total, kvres_recomputed_tokens_total,
  kvres_suspends_total, kvres_plan_latency_ms (histogram, {backend}),
  kvres_tokens_total{backend,kind} (kind "prompt": tokens appended, "generated": tokens decoded).

Ray drops a gauge series from its metrics endpoint about two report intervals after it was last set
(``metrics_report_interval_ms``, 10 s by default), so a backend at rest would vanish from Prometheus
and Grafana. ``RayMetrics`` therefore sets its gauges again every half interval: per-backend and
per-tier series always, a session's resident tokens while they are not zero (a closed or suspended
session's series then ages out instead of piling up).
"""

from __future__ import annotations

import threading
import time
from typing import Any

COUNTERS = ("evictions", "admissions", "spills", "spilled_bytes", "recalls", "recalled_tokens", "recall_us",
            "recomputed_tokens", "suspends", "resumes")


class Metrics:
    def set_resident(self, backend: str, session: str, tokens: int) -> None: ...

    def set_backend_resident(self, backend: str, tokens: int) -> None: ...

    def count(self, name: str, backend: str, session: str, value: int = 1) -> None: ...

    def observe_plan_ms(self, backend: str, ms: float) -> None: ...

    def set_cold(self, node: str, tier: str, nbytes: int, blocks: int) -> None: ...

    def count_tokens(self, backend: str, kind: str, n: int) -> None: ...


NullMetrics = Metrics


class GaugeRefresher:
    """The last value of every gauge series it was given, set again every ``period_s`` seconds by a
    daemon thread started on first use; ``keep_zero=False`` series are forgotten at zero."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._series: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[Any, dict[str, str], float]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def record(self, gauge: Any, value: float, tags: dict[str, str], keep_zero: bool = True) -> None:
        key = (id(gauge), tuple(sorted(tags.items())))
        with self._lock:  # a refresh cannot set an older value after this one
            gauge.set(value, tags=tags)
            if value or keep_zero:
                self._series[key] = (gauge, tags, value)
            else:
                self._series.pop(key, None)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvres-gauges", daemon=True)
                self._thread.start()

    def refresh(self) -> None:
        with self._lock:
            for gauge, tags, value in self._series.values():
                gauge.set(value, tags=tags)

    def _run(self) -> None:
        while True:
            time.sleep(self.period_s)
            try:
                self.refresh()
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
        self._tokens = metrics.Counter(
            "kvres_tokens_total", "Tokens a backend prefilled (kind=prompt) or generated (kind=generated)",
            tag_keys=("backend", "kind"),
        )

    def set_resident(self, backend: str, session: str, tokens: int) -> None:
        self._refresher.record(self._resident, tokens, {"backend": backend, "session": session}, keep_zero=False)

    def set_backend_resident(self, backend: str, tokens: int) -> None:
        self._refresher.record(self._backend, tokens, {"backend": backend})

    def count(self, name: str, backend: str, session: str, value: int = 1) -> None:
        if value:
            self._counters[name].inc(value, tags={"backend": backend, "session": session})

    def observe_plan_ms(self, backend: str, ms: float) -> None:
        self._plan.observe(ms, tags={"backend": backend})

    def set_cold(self, node: str, tier: str, nbytes: int, blocks: int) -> None:
        self._refresher.record(self._cold_bytes, nbytes, {"node": node, "tier": tier})
        self._refresher.record(self._cold_blocks, blocks, {"node": node, "tier": tier})

    def count_tokens(self, backend: str, kind: str, n: int) -> None:
        if n:
            self._tokens.inc(n, tags={"backend": backend, "kind": kind})
