"""The planner actor: one per cluster. It keeps the session directory (which backend holds which
session) and the cluster's load view, pushed by the backends, from which it answers admission and
placement in one call, without asking any backend.

Primitives:
- ``PlannerServer(namespace=None)``: with a namespace its directory is kept in Ray's GCS
  (``kvres.actors.ray_actors.ray_journal.RayDirectory``), so a restarted planner starts with it; without, in memory.
  - load: ``report_load(LoadReport)`` (a backend's rate-limited push), ``seed(reports)`` (backends
    known from a configuration, empty until they report), ``load()`` (every backend's last
    report and pending placements, and cluster totals).
  - placement: ``place(session_id, model=None, placement=None, need=EngineNeed.ANY,
    demand_tokens=0, seeds=()) -> backend``: chooses from the load view
    (``kvres.policy.placement``) and registers the session there; ``rehome(session_id, lost,
    model, need, demand_tokens) -> backend``: the same for a session whose backend ``lost``
    died with its node (``lost`` is dropped from the view).
  - dead nodes: a backend whose last report (or seed) names a node Ray reports dead is dropped
    from the view (``lost()`` lists them with their node) and its reports and seeds are ignored
    until one comes from a live node (an unpinned backend Ray re-created elsewhere), so placement
    never picks it.
  - failed starts: ``start_failed(backend)`` (a backend that could not start, ``start_attempts``)
    drops it from the view, and its seeds are ignored until it reports (started anew); a planner
    that restarts reads them from Ray's GCS. ``load()["failed"]`` names them.
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

from kvres.actors.host.journal import Directory, MemoryDirectory
from kvres.policy.backend_planner import BackendPlan, BackendPlanInput, plan_backend
from kvres.policy.errors import SessionExistsError
from kvres.policy.placement import LoadReport, LoadView, PlacementPolicy
from kvres.policy.residency import EngineNeed

from .nodes import node_dead
from .ray_journal import RayDirectory
from .start_attempts import failed_backends

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
        self._lost: dict[str, str] = {}  # backend -> the dead node it was on
        self._failed: set[str] = set() if namespace is None else set(failed_backends(namespace))
        self._calls: Counter[str] = Counter()
        self._seconds: defaultdict[str, float] = defaultdict(float)

    def __repr__(self) -> str:
        """Sessions per backend and calls served, for Ray's dashboard (its Repr column)."""
        per_backend = Counter(self._directory.values())
        spread = "".join(f", {b} {n}" for b, n in sorted(per_backend.items()))
        return (f"PlannerServer({len(self._directory)} sessions{spread}; "
                f"{self._calls['place']} placed, {self._calls['plan']} plans)")

    # -- load ------------------------------------------------------------------------------
    def _on_dead_node(self, report: LoadReport) -> bool:
        return bool(report.node) and node_dead(report.node, unknown=False)  # a node Ray reports dead

    def _drop_dead(self) -> None:
        """Drop the backends whose node died from the view (asks the GCS at most every 0.5 s)."""
        for load in self._view.loads():
            if self._on_dead_node(load.report):
                self._view.forget_backend(load.name)
                self._lost[load.name] = load.report.node

    def _live(self, reports: Sequence[LoadReport]) -> list[LoadReport]:
        live = []
        for r in reports:
            if r.backend in self._failed and not r.measured:
                continue  # a seed of a backend that could not start
            if self._on_dead_node(r):
                self._lost[r.backend] = r.node
            else:
                self._lost.pop(r.backend, None)
                live.append(r)
        return live

    @_counted
    def report_load(self, report: LoadReport) -> None:
        self._failed.discard(report.backend)  # it reports: started (anew)
        if self._live([report]):
            self._view.report(report)

    @_counted
    def start_failed(self, backend: str) -> None:
        self._failed.add(backend)
        self._view.forget_backend(backend)

    @_counted
    def seed(self, reports: Sequence[LoadReport]) -> None:
        self._view.seed(self._live(reports))

    @_counted
    def load(self) -> dict[str, Any]:
        self._drop_dead()
        return {"backends": [b.as_dict() for b in self._view.loads()], "totals": self._view.totals(),
                "lost": dict(self._lost), "failed": sorted(self._failed)}

    @_counted
    def lost(self) -> dict[str, str]:
        """Backends dropped because their node died: backend -> node id."""
        self._drop_dead()
        return dict(self._lost)

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
            self._view.seed(self._live(seeds))
        self._drop_dead()
        backend = self._view.place(session_id, time.time(), model, PlacementPolicy.of(placement),
                                   need, demand_tokens)
        self._durable.put(session_id, backend)
        self._directory[session_id] = backend
        return backend

    @_counted
    def rehome(self, session_id: str, lost: str, model: str | None, need: EngineNeed = EngineNeed.ANY,
               demand_tokens: int = 0, seeds: Sequence[LoadReport] = ()) -> str:
        """A live backend of ``model`` for a session whose backend ``lost`` died with its node
        (``lost`` leaves the view), registered there. A repeat finds it registered and answers
        the same backend."""
        current = self._directory.get(session_id)
        if current is not None and current != lost:
            return current
        self._view.seed(self._live(seeds))
        self._drop_dead()
        if lost not in self._lost:
            self._view.forget_backend(lost)
            self._lost[lost] = ""
        backend = self._view.place(session_id, time.time(), model, PlacementPolicy(), need, demand_tokens)
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
