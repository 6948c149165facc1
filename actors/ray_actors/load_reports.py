"""A backend's load, pushed to the planner so placement never has to ask every backend.

Primitives:
- ``LoadReporter(config, model, node_id, namespace)``: ``changed(host)`` builds a
  ``kvres.policy.placement.LoadReport`` from the host's counters and hands it to one long-lived
  reporter thread, which pushes it to the planner actor (fire and forget) when the
  ``ReportLimiter`` says so; a report held back for the rate limit goes out by itself a moment
  later, so a backend that turns quiet right after a change is not reported stale. The call that
  changed the load neither submits a Ray call nor starts a thread.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from kvres.actors.backend_setup.engine_registry import engine_spec
from kvres.actors.config import BackendConfig
from kvres.policy.placement import LoadReport, ReportLimiter

logger = logging.getLogger("kvres.placement")


class _Loaded(Protocol):
    def load(self) -> tuple[int, int, int]: ...


class LoadReporter:
    def __init__(self, config: BackendConfig, model: str, node_id: str, namespace: str) -> None:
        import ray

        self._config = config
        self._model = model
        self._engine_evicts = engine_spec(config.engine).engine_evicts
        self._node = node_id
        self._namespace = namespace
        self._limiter = ReportLimiter()
        self._wake = threading.Condition()
        self._offered: LoadReport | None = None  # the newest report not yet seen by the thread
        self._thread: threading.Thread | None = None
        self._planner: Any = None
        self._labels: dict[str, str] = {}
        try:
            raw: dict[str, Any] = dict(ray.get_runtime_context().get_node_labels())
            self._labels = {str(k): ",".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in raw.items()}
        except Exception:  # older Ray, or outside a worker: no labels
            pass

    def _report(self, host: _Loaded) -> LoadReport:
        resident, live, suspended = host.load()
        return LoadReport(
            backend=self._config.name, budget_tokens=self._config.kv_budget_tokens,
            resident_tokens=resident, live_sessions=live, suspended_sessions=suspended,
            n_seq_max=self._config.n_seq_max, model=self._model, engine=self._config.engine,
            engine_evicts=self._engine_evicts,
            node=self._node, labels=self._labels, at=time.time(),
        )

    def changed(self, host: _Loaded) -> None:
        report = self._report(host)
        with self._wake:
            self._offered = report
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"kvres-load-{self._config.name}",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._offered is None:
                    due = self._limiter.held_due()
                    wait = None if due is None else due - time.monotonic()
                    if wait is not None and wait <= 0:
                        break
                    self._wake.wait(wait)
                report, self._offered = self._offered, None
            now = time.monotonic()
            if report is not None and self._limiter.offer(report, now):
                self._push(report)
            elif (held := self._limiter.held(now)) is not None:
                self._push(held)

    def _push(self, report: LoadReport) -> None:
        import ray

        from .planner_actor import PLANNER_NAME

        try:
            if self._planner is None:
                self._planner = ray.get_actor(PLANNER_NAME, namespace=self._namespace)
            self._planner.report_load.remote(report)
        except Exception as exc:  # placement falls back to the last report it has
            self._planner = None
            logger.warning("backend %s could not report its load: %s", self._config.name, exc)
