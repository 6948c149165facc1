"""The HTTP front inside each backend's own process (``kvres serve --front local``).

Primitives:
- ``FrontSpec``: what a hosted front serves (``config_json``, ``digests``, ``idle_s`` / ``ttl_s``,
  ``host``, ``port``); ``publish_front(namespace, spec)``, ``published_front(namespace) ->
  FrontSpec | None``, ``withdraw_front(namespace)``: kept in Ray's GCS as what every backend of the
  namespace hosts (``kvres.actors.ray_actors.hosted``, entry ``host``), so a backend that Ray
  restarts (or starts again) hosts its front again by itself.
- ``host(server, name, namespace, spec) -> HostedFront`` (in the backend's process, called by its
  shell's ``host_front``): the backend's shell made callable in process (``in_process.host_here``)
  and a ``direct_front.FrontServer`` serving the application there, on the published port
  (``SO_REUSEPORT``: every backend's front shares it); ``HostedFront.ready()``, ``stop()``.
- ``start_colocated_fronts(options, backends, host, port)`` (a connected driver): published, then
  every backend asked to host its front, waited for (``NoBackendHereError`` first where no backend
  runs on the driver's node: nothing would listen at the address it prints);
  ``remove_colocated_fronts(namespace) -> bool``.

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

from kvres.actors.ray_actors.hosted import publish_hosted, published_hosted, withdraw_hosted
from kvres.policy import KvresError

from ..in_process import host_here, leave_here
from .lifetime import SessionLifetime

if TYPE_CHECKING:
    from .app import ServeOptions
    from .direct_front import FrontServer

ENTRY = "kvres.cluster.serve.colocated_front:host"
READY_TIMEOUT_S = 120.0


class NoBackendHereError(KvresError, RuntimeError):
    """No backend of the namespace runs on the node of ``kvres serve --front local``."""


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

    @classmethod
    def parse(cls, text: str) -> FrontSpec:
        fields = json.loads(text)
        return cls(**{**fields, "digests": tuple(fields["digests"])})


def publish_front(namespace: str, spec: FrontSpec) -> None:
    publish_hosted(namespace, ENTRY, json.dumps(asdict(spec)))


def published_front(namespace: str) -> FrontSpec | None:
    published = published_hosted(namespace)
    if published is None or published[0] != ENTRY:
        return None
    return FrontSpec.parse(published[1])


def withdraw_front(namespace: str) -> None:
    withdraw_hosted(namespace)


class HostedFront:
    def __init__(self, name: str, front: FrontServer) -> None:
        self.name = name
        self.front = front

    def ready(self) -> bool:
        return self.front.ready()

    def stop(self) -> None:
        try:
            self.front.stop()
        finally:
            leave_here(self.name)


def host(server: Any, name: str, namespace: str, spec_text: str) -> HostedFront:
    from .direct_front import FrontServer

    spec = FrontSpec.parse(spec_text)
    host_here(name, server)
    try:
        front = FrontServer(namespace, spec.config_json, spec.digests,
                            SessionLifetime(idle_s=spec.idle_s, ttl_s=spec.ttl_s), spec.host, spec.port)
    except BaseException:
        leave_here(name)
        raise
    return HostedFront(name, front)


def start_colocated_fronts(options: ServeOptions, backends: dict[str, Any], host: str, port: int) -> None:
    """``backends``: name -> the backend actor's handle. Each hosts a front on ``host:port``."""
    import ray

    from .direct_front import check_port_free

    assert options.config is not None, "the fronts serve the config the namespace runs"
    check_port_free(host, port)
    here = ray.get_runtime_context().get_node_id()
    nodes = dict(zip(backends, ray.get([handle.ping.remote() for handle in backends.values()],
                                       timeout=READY_TIMEOUT_S), strict=True))
    if here not in nodes.values():
        # each front listens on its backend's node: none would listen where this command said it does
        raise NoBackendHereError(
            f"--front local listens in the backends' own processes, and none of them ({', '.join(sorted(nodes))}) "
            f"runs on this node ({here[:12]}): run kvres serve on a backend's node, or use --front direct")
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
