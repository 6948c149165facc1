"""The planner actor: one per cluster; runs kvres.policy for every backend and keeps the session
directory (which backend holds which session).

Primitives:
- ``PlannerServer``: ``plan(backend, BackendPlanInput) -> BackendPlan``, ``register(session_id, backend)``, ``forget(session_id)``,
  ``where(session_id)``, ``directory()``.
- ``PlannerActor``: ``ray.remote(PlannerServer)``.
"""

from __future__ import annotations

import ray

from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, plan_backend

PLANNER_NAME = "kvres-planner"


class PlannerServer:
    def __init__(self) -> None:
        self._directory: dict[str, str] = {}

    def plan(self, backend: str, inp: BackendPlanInput) -> BackendPlan:
        """The plan for one backend (the backend records its latency, round trip included)."""
        return plan_backend(inp)

    def register(self, session_id: str, backend: str) -> None:
        self._directory[session_id] = backend

    def forget(self, session_id: str) -> None:
        self._directory.pop(session_id, None)

    def where(self, session_id: str) -> str | None:
        return self._directory.get(session_id)

    def directory(self) -> dict[str, str]:
        return dict(self._directory)


PlannerActor = ray.remote(PlannerServer)
