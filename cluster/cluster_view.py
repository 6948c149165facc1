"""A read-only view of a standing kvres cluster: it finds kvres's named actors and creates nothing.

Primitives:
- ``attach(address=None, namespace="kvres") -> ClusterView``: joins the Ray cluster at ``address``
  (else ``RAY_ADDRESS``, else the one running on this machine: ``local_cluster()``) unless this
  process is already connected, and checks that kvres runs in ``namespace``.
- ``choose_local_cluster(running, recorded, recorded_answers=False) -> (address, why)``: the
  cluster on this machine a command without an address looks at: the one ``ray start`` recorded
  last where it runs, else the only one; none, or several and none recorded, is an error naming
  them. ``local_cluster()``: the same over this machine's Ray processes and Ray's folder.
- ``ClusterView(namespace)``: ``address`` (the GCS address of the cluster it looks at), ``how``
  (why that one), ``status()`` (the shape of ``SessionManager.status()``: backends in
  name order, the planner's load view, cold stores, the session directory; an actor that does not
  answer within ``ROW_TIMEOUT_S`` shows as a row with an ``error``, and so does a backend that is
  starting or could not start, with the engine's error: ``start_attempts``, read from Ray's GCS,
  since a backend that failed to start has no actor left to ask),
  ``session_stats(session_id)``, ``reprs()`` (every kvres actor's live ``repr``; an actor class
  without one reads as its class and process, never ``<... object at 0x...>``).
- ``NoClusterError``: no kvres actors in that namespace (or, without an address, no Ray cluster on
  this machine, or several).

Unlike ``connect``, attaching never starts an actor, so ``kvres status`` and ``kvres inspect``
cannot change the cluster they look at.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection
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
    """The actor's own repr; for a class that has none (Ray's ``<... object at 0x...>``), its class
    and process, so every row reads."""
    text = repr(actor)
    if re.fullmatch(r"<.* object at 0x[0-9a-fA-F]+>", text) is None:
        return text
    return f"{type(actor).__name__}(pid {os.getpid()})"


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
        self.address = str(ray.get_runtime_context().gcs_address)
        self.how = "this process's connection"  # how attach chose the cluster, said by kvres status
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


def choose_local_cluster(running: Collection[str], recorded: str | None, recorded_answers: bool = False
                         ) -> tuple[str, str]:
    """Which of the Ray clusters ``running`` on this machine (their GCS addresses) a command without
    an address looks at, and why: the one ``ray start`` (``kvres start``) recorded last in Ray's
    folder where it runs (``recorded_answers``: it accepts connections, whatever name it has in the
    list), else the only one. None, or several and none recorded, is a ``NoClusterError`` naming them."""
    found = sorted(set(running))
    if recorded and (recorded in found or recorded_answers):
        others = [a for a in found if a != recorded]
        more = f"; {len(others)} more run here ({', '.join(others)}): --address picks another" if others else ""
        return recorded, f"the last one `ray start` started here{more}"
    if len(found) == 1:
        return found[0], "the only Ray cluster on this machine"
    if not found:
        raise NoClusterError("no Ray cluster runs on this machine: start one (kvres start) or give its address "
                             "(--address or RAY_ADDRESS)")
    raise NoClusterError(f"{len(found)} Ray clusters run on this machine ({', '.join(found)}) and `ray start` "
                         "recorded none of them last: give the one to look at with --address (or RAY_ADDRESS)")


def local_cluster() -> tuple[str, str]:
    """``choose_local_cluster`` over this machine: the GCS addresses on its raylets' command lines and
    the one in Ray's folder (``RAY_TMPDIR``, else /tmp/ray: ``ray_current_cluster``), as Ray's own
    "auto" reads them, except that Ray takes any one of several."""
    from ray._private.services import find_gcs_addresses
    from ray._private.utils import read_ray_address

    recorded: str | None = read_ray_address(None)
    answers = False
    if recorded:
        try:
            check_reachable(recorded)
            answers = True
        except KvresError:
            recorded = None  # a stale record of a cluster gone
    return choose_local_cluster(find_gcs_addresses(), recorded, answers)  # type: ignore[no-untyped-call]


def attach(address: str | None = None, namespace: str = "kvres") -> ClusterView:
    how = "this process's connection"
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        how = "given"
        if address is None or address == "auto":
            address, how = local_cluster()
        if address not in ("auto", "local") and "://" not in address:
            check_reachable(address)  # seconds, not the minutes ray.init retries for
        follow_local_token()
        ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING)
    view = ClusterView(namespace)
    view.how = how
    return view
