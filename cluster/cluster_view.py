"""A read-only view of a standing kvres cluster: it finds kvres's named actors and creates nothing.

Primitives:
- ``attach(address=None, namespace="kvres") -> ClusterView``: joins the Ray cluster at ``address``
  (else ``RAY_ADDRESS``, else the one running on this machine) unless this process is already
  connected, and checks that kvres runs in ``namespace``.
- ``ClusterView(namespace)``: ``status()`` (the shape of ``SessionManager.status()``: backends in
  name order, the planner's load view, cold stores, the session directory; an actor that does not
  answer within ``ROW_TIMEOUT_S`` shows as a row with an ``error``, and so does a backend that is
  starting or could not start, with the engine's error: ``start_attempts``, read from Ray's GCS,
  since a backend that failed to start has no actor left to ask),
  ``session_stats(session_id)``, ``reprs()`` (every kvres actor's live ``repr``).
- ``NoClusterError``: no kvres actors in that namespace.

Unlike ``connect``, attaching never starts an actor, so ``kvres status`` and ``kvres inspect``
cannot change the cluster they look at.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from kvres.actors.ray_actors.planner_actor import PLANNER_NAME
from kvres.actors.ray_actors.start_attempts import failed_backends, start_state
from kvres.policy import KvresError, UnknownSessionError

from .ray_auth import follow_local_token
from .reachability import check_reachable

BACKEND_PREFIX = "kvres-backend-"
COLDSTORE_PREFIX = "kvres-coldstore-"
ROW_TIMEOUT_S = 10.0


class NoClusterError(KvresError):
    """No kvres actors in the namespace asked for."""


def _repr_of(actor: Any) -> str:
    return repr(actor)


def _answer(ref: Any, timeout_s: float = ROW_TIMEOUT_S, **names: str) -> dict[str, Any]:
    """An actor's stats, or a row saying why not (down, restarting, or its node gone) within
    ``timeout_s``: one actor never holds the whole status back."""
    try:
        return dict(ray.get(ref, timeout=timeout_s))
    except ray.exceptions.GetTimeoutError:
        return {**names, "error": f"no answer within {timeout_s:.0f} s (restarting, or its node is gone)"}
    except ray.exceptions.RayError as exc:
        return {**names, "error": f"{type(exc).__name__}: actor down"}


class ClusterView:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        names = sorted(
            info["name"] for info in ray.util.list_named_actors(all_namespaces=True)
            if info["namespace"] == namespace and info["name"].startswith("kvres-")
        )
        if PLANNER_NAME not in names:
            spaces = sorted({i["namespace"] for i in ray.util.list_named_actors(all_namespaces=True)
                             if i["name"] == PLANNER_NAME})
            raise NoClusterError(f"no kvres actors in namespace {namespace!r}; kvres runs in {spaces}")
        self.actors: dict[str, Any] = {n: ray.get_actor(n, namespace=namespace) for n in names}

    def _named(self, prefix: str) -> dict[str, Any]:
        return {n: h for n, h in self.actors.items() if n.startswith(prefix)}

    def status(self) -> dict[str, Any]:
        backends = self._named(BACKEND_PREFIX)
        stores = self._named(COLDSTORE_PREFIX)
        planner = self.actors[PLANNER_NAME]
        load = planner.load.remote()
        starts = {n: state for n in backends if (state := start_state(self.namespace, n[len(BACKEND_PREFIX):]))}
        stats = {n: h.stats.remote() for n, h in backends.items() if n not in starts}
        store_stats = {n: h.stats.remote() for n, h in stores.items()}
        rows = {n[len(BACKEND_PREFIX):]: _answer(ref, backend=n[len(BACKEND_PREFIX):]) for n, ref in stats.items()}
        rows |= {n[len(BACKEND_PREFIX):]: {"backend": n[len(BACKEND_PREFIX):], "error": state}
                 for n, state in starts.items()}
        rows |= {name: {"backend": name, "error": str(failure)}
                 for name, failure in failed_backends(self.namespace).items() if name not in rows}
        return {
            "namespace": self.namespace,
            "backends": [rows[name] for name in sorted(rows)],
            "load": ray.get(load),
            "cold_stores": {n: _answer(ref) for n, ref in store_stats.items()},
            "sessions": ray.get(planner.directory.remote()),
        }

    def session_stats(self, session_id: str) -> dict[str, Any]:
        backend: str | None = ray.get(self.actors[PLANNER_NAME].where.remote(session_id))
        if backend is None:
            raise UnknownSessionError(session_id)
        handle = self.actors.get(BACKEND_PREFIX + backend)
        if handle is None:
            raise KvresError(f"session {session_id!r} is on backend {backend!r}, which is not running")
        return dict(ray.get(handle.session_stats.remote(session_id)))

    def reprs(self) -> dict[str, str]:
        """Each actor's ``repr`` now (Ray's dashboard shows the one taken when the actor started)."""
        names = list(self.actors)
        return dict(zip(names, ray.get([self.actors[n].__ray_call__.remote(_repr_of) for n in names]),
                        strict=True))


def attach(address: str | None = None, namespace: str = "kvres") -> ClusterView:
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        if address and address not in ("auto", "local") and "://" not in address:
            check_reachable(address)  # seconds, not the minutes ray.init retries for
        follow_local_token()
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", namespace=namespace,
                 log_to_driver=False, logging_level=logging.WARNING)
    return ClusterView(namespace)
