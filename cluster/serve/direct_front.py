"""The HTTP front without Ray Serve: the same application, served by uvicorn in kvres's own actors.

Primitives:
- ``FrontServer(namespace, config_json, digests, lifetime, host, port)``: builds the replica's
  ``Service`` and the FastAPI application (``app.make_fastapi``: the same routes, keys, tenants and
  metrics as under Serve) and serves it with uvicorn from a thread, on a socket opened with
  ``SO_REUSEPORT`` so that several fronts share one port (the kernel spreads the connections among
  them); ``ready()`` (once uvicorn listens; raises what stopped it), ``stop()``.
- ``FrontActor``: the Ray actor class (restarted by Ray when its process dies; it binds again).
- ``front_actor_name(index)``; ``start_direct_fronts(options, host, port, detached) -> [handle]``:
  ``options.min_replicas`` fronts (a port another process holds: ``PortTakenError``);
  ``remove_direct_fronts(namespace) -> bool`` (in a connected driver).

Why: Ray Serve's proxy takes each request over HTTP and hands it to a replica as a Ray call, and each
event of a streamed answer goes back to the proxy as a Ray object: on the 2-core machine ~20 ms of
proxy and ~35 ms of replica CPU per bound chat turn (docs/serving.md), more than llama-server spends
on the whole turn. Here the request ends in the process that runs it. What Serve gave that this
does not: autoscaling between ``min_replicas`` and ``max_replicas`` (the fronts are
``min_replicas``) and its queue of requests past ``max_ongoing_requests``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import threading
from typing import TYPE_CHECKING, Any

import ray

from kvres.policy import KvresError

from ..kvres_config import KvresConfig
from ..ray_task_events import actor_task_events
from .lifetime import SessionLifetime

if TYPE_CHECKING:
    from .app import ServeOptions

READY_TIMEOUT_S = 120.0
FRONT_PREFIX = "kvres-front-"


class PortTakenError(KvresError, OSError):
    """The HTTP port is held by another process; names the address."""


def front_actor_name(index: int) -> str:
    return f"{FRONT_PREFIX}{index}"


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def check_port_free(host: str, port: int) -> None:
    """Before the fronts bind with ``SO_REUSEPORT`` (which would share a port another front holds):
    the port taken by anything is a ``PortTakenError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortTakenError(f"the HTTP port {host}:{port} is taken by another process") from None
            raise


class FrontServer:
    def __init__(self, namespace: str, config_json: str, digests: tuple[str, ...], lifetime: SessionLifetime,
                 host: str, port: int) -> None:
        import uvicorn

        from .app import make_fastapi
        from .service import Service

        self.service = Service(namespace, KvresConfig.model_validate_json(config_json), digests, lifetime=lifetime)
        self._where = f"http://{host}:{port}, namespace {namespace}"
        self._socket = _listening_socket(host, port)
        self._server = uvicorn.Server(uvicorn.Config(
            make_fastapi(self.service), log_level="warning", access_log=False, lifespan="off",
            timeout_keep_alive=5))
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="kvres-front", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:  # what Ray's actor table and dashboard show
        return f"FrontServer({self._where})"

    def _serve(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._socket]))
        except BaseException as exc:  # ready() reports it
            self._error = exc

    def ready(self) -> bool:
        while not self._server.started:
            if not self._thread.is_alive():
                raise KvresError(f"the HTTP front stopped while starting: {self._error!r}")
            self._thread.join(timeout=0.05)
        return True

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        with contextlib.suppress(Exception):
            self._socket.close()
        self.service.close()


FrontActor: Any = ray.remote(FrontServer)  # its handles are untyped, as Ray calls them by name


def start_direct_fronts(options: ServeOptions, host: str, port: int, detached: bool) -> list[Any]:
    """``options.min_replicas`` fronts of ``options.namespace`` listening on ``host:port``, waited for."""
    assert options.config is not None, "the fronts serve the config the namespace runs"
    check_port_free(host, port)
    extra: dict[str, Any] = {"lifetime": "detached"} if detached else {}
    fronts = [FrontActor.options(
        name=front_actor_name(i), namespace=options.namespace, max_restarts=-1, num_cpus=0, max_concurrency=4,
        **extra, **actor_task_events(),
    ).remote(options.namespace, options.config.model_dump_json(), options.digests, options.lifetime, host, port)
        for i in range(options.min_replicas)]
    try:
        ray.get([front.ready.remote() for front in fronts], timeout=READY_TIMEOUT_S)
    except Exception:
        for front in fronts:
            with contextlib.suppress(Exception):
                ray.kill(front)
        raise
    return fronts


def direct_fronts(namespace: str) -> list[Any]:
    found = []
    for index in range(1024):
        try:
            found.append(ray.get_actor(front_actor_name(index), namespace=namespace))
        except ValueError:
            break
    return found


def remove_direct_fronts(namespace: str) -> bool:
    """The namespace's fronts stopped (their port freed) and gone; False where none ran."""
    fronts = direct_fronts(namespace)
    for front in fronts:
        with contextlib.suppress(Exception):
            ray.get(front.stop.remote(), timeout=60)
        with contextlib.suppress(Exception):
            ray.kill(front, no_restart=True)
    return bool(fronts)
