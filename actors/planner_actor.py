"""The planner actor: one per cluster. It keeps the session directory (which backend holds which
session) and the cluster's load view, pushed by the backends, from which it answers admission and
placement in one call, without asking any backend.

Primitives:
- ``PlannerServer``:
  - load: ``report_load(LoadReport)`` (a backend's rate-limited push), ``seed(reports)`` (backends
    known from a configuration, empty until they report), ``load()`` (every backend's last
    report and pending placements, and cluster totals).
  - placement: ``place(session_id, model=None, placement=None, session_kind="none",
    demand_tokens=0, seeds=()) -> backend``: chooses from the load view
    (``kvres.policy.placement``) and registers the session there.
  - directory: ``register(session_id, backend)``, ``forget(session_id)``, ``where(session_id)``,
    ``directory()``.
  - ``plan(backend, BackendPlanInput) -> BackendPlan``: ``plan_backend`` for a caller without
    its own (backends plan in their own process, at every step, without a remote call).
  - ``stats()``: calls served, by kind.
- ``PlannerActor``: ``ray.remote(PlannerServer)``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import ray

from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, plan_backend
from kvres.policy.errors import SessionExistsError
from kvres.policy.placement import LoadReport, LoadView, PlacementPolicy

PLANNER_NAME = "kvres-planner"


class PlannerServer:
    def __init__(self) -> None:
        self._directory: dict[str, str] = {}
        self._view = LoadView()
        self._calls: Counter[str] = Counter()

    # -- load ------------------------------------------------------------------------------
    def report_load(self, report: LoadReport) -> None:
        self._calls["report_load"] += 1
        self._view.report(report)

    def seed(self, reports: Sequence[LoadReport]) -> None:
        self._calls["seed"] += 1
        self._view.seed(reports)

    def load(self) -> dict[str, Any]:
        self._calls["load"] += 1
        return {"backends": [b.as_dict() for b in self._view.loads()], "totals": self._view.totals()}

    # -- placement -------------------------------------------------------------------------
    def place(
        self,
        session_id: str,
        model: str | None = None,
        placement: PlacementPolicy | str | None = None,
        session_kind: str = "none",
        demand_tokens: int = 0,
        seeds: Sequence[LoadReport] = (),
    ) -> str:
        """The backend the session goes to, registered in the directory at once; ``seeds`` are
        the configuration's backends, for a planner that may not know them yet."""
        self._calls["place"] += 1
        if session_id in self._directory:
            raise SessionExistsError(session_id)
        if seeds:
            self._view.seed(seeds)
        backend = self._view.place(session_id, time.time(), model, PlacementPolicy.of(placement),
                                   session_kind, demand_tokens)
        self._directory[session_id] = backend
        return backend

    # -- directory -------------------------------------------------------------------------
    def register(self, session_id: str, backend: str) -> None:
        self._calls["register"] += 1
        if self._directory.get(session_id) != backend:
            self._view.forget_session(session_id)  # placed elsewhere, now moved: not pending there
        self._directory[session_id] = backend

    def forget(self, session_id: str) -> None:
        self._calls["forget"] += 1
        self._directory.pop(session_id, None)
        self._view.forget_session(session_id)

    def where(self, session_id: str) -> str | None:
        self._calls["where"] += 1
        return self._directory.get(session_id)

    def directory(self) -> dict[str, str]:
        self._calls["directory"] += 1
        return dict(self._directory)

    # -- plans -----------------------------------------------------------------------------
    def plan(self, backend: str, inp: BackendPlanInput) -> BackendPlan:
        self._calls["plan"] += 1
        return plan_backend(inp)

    def stats(self) -> dict[str, int]:
        return dict(self._calls)


PlannerActor = ray.remote(PlannerServer)
