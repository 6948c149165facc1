"""The HTTP front inside each backend's own process (``kvres serve --front local``).

Primitives:
- ``FrontSpec``: what a hosted front serves (``config_json``, ``digests``, ``idle_s`` / ``ttl_s``,
  ``host``, ``port``); ``publish_front(namespace, spec)``, ``published_front(namespace) ->
  FrontSpec | None``, ``withdraw_front(namespace)``: kept in Ray's GCS, so a backend that Ray
  restarts (or starts again) hosts its front again by itself.
- ``HostedFront.start(server, name, namespace) -> HostedFront | None`` (in the backend's process,
  called by its shell): where a front is published, the backend's shell is made callable in
  process (``in_process.host_here``) and a ``direct_front.FrontServer`` serves the application
  there, on the published port (``SO_REUSEPORT``: every backend's front shares it); ``ready()``,
  ``stop()``.
- ``start_colocated_fronts(options, backends, host, port)`` (a connected driver): published, then
  every backend asked to host its front, waited for; ``remove_colocated_fronts(namespace) -> bool``.

Why: on the direct front a bound turn is still a Ray call to the backend and one Ray object per
chunk of tokens between two processes (docs/serving.md, "The same turns without HTTP, and without
Ray": the backend's host serves the engine-free fleet about as fast as llama-server, the hop and
the front halve it). Here a request for a session of the backend that received it makes no Ray
call to run; a session of another backend is still reached through Ray, as from any front. What
this gives up: a backend's death takes its front down with it until Ray restarts it (clients see
refused connections meanwhile), and the front's threads share the backend's GIL.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kvres.policy import KvresError

from ..in_process import host_here, leave_here
from .lifetime import SessionLifetime

if TYPE_CHECKING:
    from .app import ServeOptions
    from .direct_front import FrontServer

FRONT_KV_NAMESPACE = "kvres-colocated-front"
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class FrontSpec:
    config_json: str
    digests: tuple[str, ...]
    idle_s: float | None
    ttl_s: float | None
    host: str
    port: int

    @property
    def backends(self) -> list[str]:
        return [b["name"] for b in json.loads(self.config_json).get("backends", [])]


def publish_front(namespace: str, spec: FrontSpec) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(namespace, json.dumps(asdict(spec)), overwrite=True, namespace=FRONT_KV_NAMESPACE)


def published_front(namespace: str) -> FrontSpec | None:
    from ray.experimental import internal_kv

    data = internal_kv._internal_kv_get(namespace, namespace=FRONT_KV_NAMESPACE)
    if data is None:
        return None
    fields = json.loads(data)
    return FrontSpec(**{**fields, "digests": tuple(fields["digests"])})


def withdraw_front(namespace: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(namespace, namespace=FRONT_KV_NAMESPACE)


class HostedFront:
    def __init__(self, name: str, front: FrontServer) -> None:
        self.name = name
        self.front = front

    @classmethod
    def start(cls, server: Any, name: str, namespace: str) -> HostedFront | None:
        spec = published_front(namespace)
        if spec is None:
            return None
        from .direct_front import FrontServer

        host_here(name, server)
        try:
            front = FrontServer(namespace, spec.config_json, spec.digests,
                                SessionLifetime(idle_s=spec.idle_s, ttl_s=spec.ttl_s), spec.host, spec.port)
        except BaseException:
            leave_here(name)
            raise
        return cls(name, front)

    def ready(self) -> bool:
        return self.front.ready()

    def stop(self) -> None:
        try:
            self.front.stop()
        finally:
            leave_here(self.name)


def start_colocated_fronts(options: ServeOptions, backends: dict[str, Any], host: str, port: int) -> None:
    """``backends``: name -> the backend actor's handle. Each hosts a front on ``host:port``."""
    import ray

    from .direct_front import check_port_free

    assert options.config is not None, "the fronts serve the config the namespace runs"
    check_port_free(host, port)
    publish_front(options.namespace, FrontSpec(options.config.model_dump_json(), tuple(options.digests),
                                               options.lifetime.idle_s, options.lifetime.ttl_s, host, port))
    try:
        ray.get([handle.host_front.remote() for handle in backends.values()], timeout=READY_TIMEOUT_S)
    except Exception:
        remove_colocated_fronts(options.namespace)
        raise


def remove_colocated_fronts(namespace: str) -> bool:
    """The namespace's hosted fronts stopped (their port freed); False where none was published."""
    import ray

    from kvres.actors.ray_actors.backend_actor import backend_actor_name

    spec = published_front(namespace)
    if spec is None:
        return False
    withdraw_front(namespace)
    for name in spec.backends:
        with contextlib.suppress(Exception):
            ray.get(ray.get_actor(backend_actor_name(name), namespace=namespace).stop_front.remote(), timeout=60)
    return True


class FrontNotHostedError(KvresError):
    """A backend asked to host a front that is not published (names the namespace)."""
