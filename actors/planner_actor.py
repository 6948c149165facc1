"""The planner actor: one per cluster; runs kvres.policy for every backend and keeps the session
directory (which backend holds which session).

Primitives:
- ``PlannerServer``: ``plan(backend, BackendPlanInput) -> BackendPlan`` (latency recorded in
  ``kvres_plan_latency_ms``), ``register(session_id, backend)``, ``forget(session_id)``,
  ``where(session_id)``, ``directory()``.
- ``PlannerActor``: ``ray.remote(PlannerServer)``.
"""

from __future__ import annotations

import time

import ray

from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, plan_backend

from .metrics import Metrics, NullMetrics, RayMetrics

PLANNER_NAME = "kvres-planner"


class PlannerServer:
    def __init__(self, use_ray_metrics: bool = False) -> None:
        self._metrics: Metrics = RayMetrics() if use_ray_metrics else NullMetrics()
        self._directory: dict[str, str] = {}

    def plan(self, backend: str, inp: BackendPlanInput) -> BackendPlan:
        t0 = time.perf_counter()
        plan = plan_backend(inp)
        self._metrics.observe_plan_ms(backend, (time.perf_counter() - t0) * 1e3)
        return plan

    def register(self, session_id: str, backend: str) -> None:
        self._directory[session_id] = backend

    def forget(self, session_id: str) -> None:
        self._directory.pop(session_id, None)

    def where(self, session_id: str) -> str | None:
        return self._directory.get(session_id)

    def directory(self) -> dict[str, str]:
        return dict(self._directory)


PlannerActor = ray.remote(PlannerServer)
