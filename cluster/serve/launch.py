"""``kvres serve``: the HTTP front started from the command line.

Primitives:
- ``add_serve_arguments(parser)``: ``--address``, ``--namespace``, ``--stop``, ``--model`` (a GGUF chat model
  with every choice made for it, ``kvres.cluster.model_setup``; ``--kv-memory`` sets its KV memory,
  ``--threads`` its engine's CPU threads)
  or ``--config``, ``--host``
  (127.0.0.1), ``--port`` (8000), ``--api-key-file``, ``--front`` (``local``: the application inside
  each backend's own process, ``colocated_front``; ``direct``: the application in kvres's own front
  actors, ``direct_front``; ``serve``: Ray Serve's proxy and replicas; ``default_front()``:
  ``KVRES_SERVE_FRONT``, else ``local``), ``--min-replicas``, ``--max-replicas``,
  ``--max-ongoing-requests``, ``--num-cpus`` (an embedded cluster's CPUs), ``--session-idle`` /
  ``--session-ttl`` (seconds without a call before an HTTP-opened session is parked / closed; 0:
  never; ``lifetime``), ``--detach``.
- ``run_serve(args) -> int``: a ``--model`` checked and its choices printed (on stderr) before
  anything starts, then the API keys (``--api-key-file``, else ``KVRES_API_KEYS`` /
  ``KVRES_API_KEY_FILE``; none: it listens on 127.0.0.1 only, with a warning), then Ray: the cluster
  at ``--address`` (or ``RAY_ADDRESS``), else an embedded one that ends with the command (its
  task-event store bounded: ``ray_task_events``); kvres's
  actors found or started there (``connect``), Serve's HTTP proxy on ``--host:--port`` and the
  application deployed (``kvres`` at ``/``), or the direct fronts listening there, and two lines printed: ``kvres serve: listening on
  http://HOST:PORT/v1 ...`` and the sessions' lifetime. Then it waits for Ctrl-C or SIGTERM and removes the application (and
  with an embedded cluster, kvres's actors and the cluster). ``--detach`` (a standing cluster only)
  returns at once and leaves the application running; ``--stop`` removes it (``stop_serve``).
- ``stop_serve(address, namespace, drop_state=False, missing_ok=False) -> str``: a detached
  application removed from a standing cluster, kvres's actors left running (``kvres serve
  --stop``, ``kvres stop --serve``; ``kvres stop`` does it first); ``remove_application(namespace,
  drop_state=False) -> bool``: the same inside a connected driver.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

from kvres.policy import KvresError

from .auth import bind_host, key_digests, load_key_entries
from .lifetime import DEFAULT_IDLE_S, DEFAULT_TTL_S, SessionLifetime, seconds_option

if TYPE_CHECKING:
    from ..session import SessionManager

APP_NAME = "kvres"
FRONTS = ("local", "direct", "serve")
DEFAULT_FRONT = "local"  # the one front that meets issue #46's turn bars (docs/serving.md, "The front")


class ServeStartError(KvresError, RuntimeError):
    """The HTTP front could not start (Serve's own error is quoted)."""


def default_front() -> str:
    """``KVRES_SERVE_FRONT`` where set (a ``ValueError`` names any other value than ``FRONTS``), else
    ``DEFAULT_FRONT``."""
    chosen = os.environ.get("KVRES_SERVE_FRONT") or DEFAULT_FRONT
    if chosen not in FRONTS:
        raise ValueError(f"KVRES_SERVE_FRONT must be one of {', '.join(FRONTS)}, got {chosen!r}")
    return chosen


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", default=None,
                        help="the Ray cluster to serve (default: RAY_ADDRESS, else an embedded one that ends with "
                             "the command)")
    parser.add_argument("--namespace", default="kvres", help="the namespace kvres runs in (default: kvres)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model", default=None, metavar="PATH.gguf",
                       help="serve this GGUF chat model: context, KV memory, layout and policy chosen for it and "
                            "printed at start (kvres.cluster.model_setup)")
    which.add_argument("--config", default=None,
                       help="a KvresConfig as a JSON object or a JSON file (default: the namespace's, else KVRES_*)")
    parser.add_argument("--kv-memory", default=None, metavar="SIZE",
                        help="with --model: the KV memory, e.g. 8GiB (default: half the free GPU or host memory "
                             "less the weights)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="with --model: the engine's CPU threads (default: the machine's cores, at most 4)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default 127.0.0.1; without an API key always 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="the HTTP port (default 8000)")
    parser.add_argument("--api-key-file", default=None,
                        help="a file with one API key per line, each optionally followed by tenant=LABEL "
                             "(default: KVRES_API_KEYS, KVRES_API_KEY_FILE)")
    parser.add_argument("--front", choices=FRONTS, default=None,
                        help="local: the application inside each backend's own process, no Ray call on a turn of "
                             "that backend's sessions; direct: the application in kvres's own front actors, no "
                             "proxy hop (--min-replicas of them share the port); serve: Ray Serve's proxy and "
                             "replicas (autoscaled between --min-replicas and --max-replicas); default: "
                             f"KVRES_SERVE_FRONT, else {DEFAULT_FRONT}")
    parser.add_argument("--min-replicas", type=int, default=1,
                        help="direct fronts, or Serve replicas at least (default 1; not local: one front per backend)")
    parser.add_argument("--max-replicas", type=int, default=2, help="Serve replicas at most (default 2; serve only)")
    parser.add_argument("--max-ongoing-requests", type=int, default=64,
                        help="requests one Serve replica runs at once (default 64; serve only)")
    parser.add_argument("--num-cpus", type=int, default=None, help="an embedded cluster's CPUs (default: all)")
    parser.add_argument("--session-idle", type=_seconds_arg, default=DEFAULT_IDLE_S, metavar="SECONDS",
                        help=f"an HTTP-opened session is parked (its KV to the cold store) after this long without "
                             f"a call (default {DEFAULT_IDLE_S:.0f}; 0: never)")
    parser.add_argument("--session-ttl", type=_seconds_arg, default=DEFAULT_TTL_S, metavar="SECONDS",
                        help=f"an HTTP-opened session is closed after this long without a call (default "
                             f"{DEFAULT_TTL_S:.0f}; 0: never)")
    parser.add_argument("--detach", action="store_true",
                        help="return once deployed and leave it running (needs a standing cluster: --address)")
    parser.add_argument("--stop", action="store_true",
                        help="remove the detached application of --namespace from the standing cluster (kvres's "
                             "actors and sessions keep running) and exit")


def _seconds_arg(text: str) -> float | None:
    try:
        return seconds_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _stop_on_sigterm() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _front_of(namespace: str) -> bool:
    """Whether this cluster runs the application ``kvres`` for ``namespace`` (connected as a driver):
    Serve has it, and its replicas made the namespace's state actor."""
    import ray
    from ray import serve

    from .colocated_front import published_front
    from .direct_front import direct_fronts
    from .state_actor import state_actor_name

    if direct_fronts(namespace) or published_front(namespace) is not None:
        return True
    if APP_NAME not in serve.status().applications:
        return False
    try:
        ray.get_actor(state_actor_name(), namespace=namespace)
    except ValueError:
        return False
    return True


def remove_application(namespace: str, drop_state: bool = False) -> bool:
    """In a connected driver: the namespace's application removed (and Serve itself where it runs
    no other, so its HTTP port is free again); ``drop_state``: its state actor too, with the stored
    responses. False where there was none."""
    from ray import serve

    from .colocated_front import remove_colocated_fronts
    from .direct_front import remove_direct_fronts
    from .state_actor import ServeState

    if not _front_of(namespace):
        return False
    if not remove_direct_fronts(namespace) and not remove_colocated_fronts(namespace):
        serve.delete(APP_NAME)
        if not serve.status().applications:
            serve.shutdown()  # type: ignore[no-untyped-call]
    if drop_state:
        ServeState(namespace).destroy()
    return True


def stop_serve(address: str | None, namespace: str, drop_state: bool = False, missing_ok: bool = False) -> str:
    """``kvres serve --stop`` / ``kvres stop --serve`` (and the first step of ``kvres stop``): the
    detached application of ``namespace`` removed from the standing cluster at ``address`` (else
    ``RAY_ADDRESS``, else the one on this machine); kvres's actors stay. One line saying what was
    done; without such an application a ``KvresError`` naming the cluster, or with ``missing_ok`` ""."""
    import ray

    from ..standing import _driver

    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    with _driver(target, namespace):
        where = str(ray.get_runtime_context().gcs_address)
        if remove_application(namespace, drop_state):
            return (f"kvres serve: application {APP_NAME!r} of namespace {namespace!r} at {where} removed "
                    f"(its HTTP front is gone{'' if drop_state else '; kvres actors and sessions keep running'})")
    if missing_ok:
        return ""
    raise KvresError(f"kvres serve --stop: no kvres serve application of namespace {namespace!r} runs at {where}")


def run_serve(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    if args.stop:
        print(stop_serve(args.address, args.namespace))
        return 0

    from ..config_agreement import ConfigConflictError
    from ..ray_task_events import started_cluster_config
    from ..ray_upkeep import started_with_upkeep
    from ..session import connect
    from .app import ServeOptions, build

    args.front = args.front or default_front()
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    if args.detach and not address:
        raise ValueError("--detach needs a standing cluster (--address or RAY_ADDRESS): an embedded one ends "
                         "with this command")
    config = None
    if args.kv_memory is not None and not args.model:
        raise ValueError("--kv-memory goes with --model (with --config, set kv_memory_bytes in its backends)")
    if args.threads is not None and not args.model:
        raise ValueError("--threads goes with --model (with --config, set n_threads in its backends)")
    if args.model:
        from ..capacity_report import parse_bytes
        from ..model_setup import chat_setup

        setup = chat_setup(args.model, None if args.kv_memory is None else parse_bytes(args.kv_memory),
                           n_threads=args.threads)
        config = setup.config
        print(setup.summary("kvres serve"), file=sys.stderr, flush=True)
    elif args.config:
        from ..standing import config_from_option

        config = config_from_option(args.config)
    keys = load_key_entries(args.api_key_file)
    host = bind_host(args.host, bool(keys))
    lifetime = SessionLifetime(idle_s=args.session_idle, ttl_s=args.session_ttl)
    if args.front in ("direct", "local"):
        from .direct_front import check_port_free

        check_port_free(host, args.port)  # before Ray starts: a taken port fails at once
    options = ServeOptions(namespace=args.namespace, digests=key_digests(keys), min_replicas=args.min_replicas,
                           max_replicas=args.max_replicas, max_ongoing_requests=args.max_ongoing_requests,
                           lifetime=lifetime)
    if address:
        from ..ray_auth import follow_local_token

        follow_local_token()
        ray.init(address=address, namespace=args.namespace, log_to_driver=False)
    else:
        with started_with_upkeep():
            ray.init(address="local", namespace=args.namespace, log_to_driver=False, include_dashboard=False,
                     num_cpus=args.num_cpus, _system_config=started_cluster_config())
    stop = _stop_on_sigterm()  # after ray.init, which installs handlers of its own
    manager = None
    try:
        try:
            manager = connect(address=address, namespace=args.namespace, config=config)
        except ConfigConflictError as exc:
            if not args.model:
                raise
            raise ConfigConflictError(
                f"namespace {args.namespace!r} already runs kvres with other backends than --model's: serve them "
                f"with kvres serve --address {address} (no --model), or give another --namespace, or start the "
                f"namespace for this model (kvres stop, then kvres start --model {args.model})") from exc
        options = ServeOptions(**{**options.__dict__, "config": manager.config})
        try:
            if args.front == "direct":
                from .direct_front import start_direct_fronts

                # held until the command ends: a non-detached actor lives while a handle to it does
                fronts = start_direct_fronts(options, host, args.port, detached=args.detach)  # noqa: F841
            elif args.front == "local":
                from .colocated_front import start_colocated_fronts

                start_colocated_fronts(options, {b.name: manager.backend_handle(b.name) for b in manager.config.backends},
                                       host, args.port)
            else:
                serve.start(http_options={"host": host, "port": args.port})
                serve.run(build(options), name=APP_NAME, route_prefix="/", blocking=False)
        except Exception as exc:
            raise ServeStartError(f"the HTTP front could not start on {host}:{args.port}: "
                                  f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                                  ) from exc
        models = ", ".join(b.name for b in manager.config.backends)
        print(f"kvres serve: listening on http://{host}:{args.port}/v1 (namespace {args.namespace!r}, "
              f"backends {models}; API key {'required' if keys else 'not required'})", flush=True)
        print(f"kvres serve: {lifetime.describe()}", flush=True)
        if args.detach:
            return 0
        stop.wait()
        print("kvres serve: stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        if not args.detach:
            _teardown(manager, embedded=address is None)
        ray.shutdown()


def _teardown(manager: SessionManager | None, embedded: bool) -> None:
    """The application removed; with an embedded cluster also Serve, the state actor and kvres's actors."""
    from ray import serve

    from .colocated_front import remove_colocated_fronts
    from .direct_front import remove_direct_fronts
    from .state_actor import ServeState

    with contextlib.suppress(Exception):
        if manager is not None:
            remove_direct_fronts(manager.namespace)
            remove_colocated_fronts(manager.namespace)
    with contextlib.suppress(Exception):
        serve.delete(APP_NAME)
    if not embedded:
        return
    with contextlib.suppress(Exception):
        serve.shutdown()  # type: ignore[no-untyped-call]
    if manager is not None:
        with contextlib.suppress(Exception):
            ServeState(manager.namespace).destroy()
        with contextlib.suppress(Exception):
            manager.shutdown()
