"""The planner actor: one per cluster. It keeps the session directory (which backend holds which
session) and the cluster's load view, pushed by the backends, from which it answers admission and
placement in one call, without asking any backend.

Primitives:
- ``PlannerServer(namespace=None)``: with a namespace its directory is kept in Ray's GCS
  (``kvres.actors.host.journal.RayDirectory``), so a restarted planner starts with it; without, in memory.
  - load: ``report_load(LoadReport)`` (a backend's rate-limited push), ``seed(reports)`` (backends
    known from a configuration, empty until they report), ``load()`` (every backend's last
    report and pending placements, and cluster totals).
  - placement: ``place(session_id, model=None, placement=None, need=EngineNeed.ANY,
    demand_tokens=0, seeds=()) -> backend``: chooses from the load view
    (``kvres.policy.placement``) and registers the session there.
  - directory: ``register(session_id, backend)``, ``forget(session_id)``, ``where(session_id)``,
    ``directory()``.
  - ``plan(backend, BackendPlanInput) -> BackendPlan``: ``plan_backend`` for a caller without
    its own (backends plan in their own process, at every step, without a remote call).
  - ``stats()``: calls served and seconds spent serving them (inside the handlers), by kind, and
    the CPU seconds of the whole process (Ray's per-call work included).
- ``PlannerActor``: ``ray.remote(PlannerServer)``.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import ray

from kvres.actors.host.journal import Directory, MemoryDirectory, RayDirectory
from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, plan_backend
from kvres.policy.errors import SessionExistsError
from kvres.policy.placement import LoadReport, LoadView, PlacementPolicy
from kvres.policy.residency import EngineNeed

PLANNER_NAME = "kvres-planner"

F = TypeVar("F", bound=Callable[..., Any])


def _counted(method: F) -> F:
    """Counts the calls of ``method`` and the time spent in it."""

    @functools.wraps(method)
    def counted(self: PlannerServer, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._calls[method.__name__] += 1
            self._seconds[method.__name__] += time.perf_counter() - t0

    return cast(F, counted)


class PlannerServer:
    def __init__(self, namespace: str | None = None) -> None:
        self._durable: Directory = RayDirectory(namespace) if namespace is not None else MemoryDirectory()
        self._directory: dict[str, str] = self._durable.items()
        self._view = LoadView()
        self._calls: Counter[str] = Counter()
        self._seconds: defaultdict[str, float] = defaultdict(float)

    def __repr__(self) -> str:
        """Sessions per backend and calls served, for Ray's dashboard (its Repr column)."""
        per_backend = Counter(self._directory.values())
        spread = "".join(f", {b} {n}" for b, n in sorted(per_backend.items()))
        return (f"PlannerServer({len(self._directory)} sessions{spread}; "
                f"{self._calls['place']} placed, {self._calls['plan']} plans)")

    # -- load ------------------------------------------------------------------------------
    @_counted
    def report_load(self, report: LoadReport) -> None:
        self._view.report(report)

    @_counted
    def seed(self, reports: Sequence[LoadReport]) -> None:
        self._view.seed(reports)

    @_counted
    def load(self) -> dict[str, Any]:
        return {"backends": [b.as_dict() for b in self._view.loads()], "totals": self._view.totals()}

    # -- placement -------------------------------------------------------------------------
    @_counted
    def place(
        self,
        session_id: str,
        model: str | None = None,
        placement: PlacementPolicy | str | None = None,
        need: EngineNeed = EngineNeed.ANY,
        demand_tokens: int = 0,
        seeds: Sequence[LoadReport] = (),
    ) -> str:
        """The backend the session goes to, registered in the directory at once; ``seeds`` are
        the configuration's backends, for a planner that may not know them yet."""
        if session_id in self._directory:
            raise SessionExistsError(session_id)
        if seeds:
            self._view.seed(seeds)
        backend = self._view.place(session_id, time.time(), model, PlacementPolicy.of(placement),
                                   need, demand_tokens)
        self._durable.put(session_id, backend)
        self._directory[session_id] = backend
        return backend

    # -- directory -------------------------------------------------------------------------
    @_counted
    def register(self, session_id: str, backend: str) -> None:
        if self._directory.get(session_id) != backend:
            self._view.forget_session(session_id)  # placed elsewhere, now moved: not pending there
            self._durable.put(session_id, backend)
        self._directory[session_id] = backend

    @_counted
    def forget(self, session_id: str) -> None:
        if self._directory.pop(session_id, None) is not None:
            self._durable.delete(session_id)
        self._view.forget_session(session_id)

    @_counted
    def where(self, session_id: str) -> str | None:
        return self._directory.get(session_id)

    @_counted
    def directory(self) -> dict[str, str]:
        return dict(self._directory)

    # -- plans -----------------------------------------------------------------------------
    @_counted
    def plan(self, backend: str, inp: BackendPlanInput) -> BackendPlan:
        return plan_backend(inp)

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, Any]:
        return {"calls": dict(self._calls), "seconds": dict(self._seconds), "cpu_s": time.process_time()}


PlannerActor = ray.remote(PlannerServer)
