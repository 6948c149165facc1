"""The ``kvres`` command line.

Primitives:
- ``kvres demo [--model PATH] [--prompts N] [--prompt-tokens N] [--budget N] [--threads N]``: a
  local Ray cluster; no eviction, streaming, SnapKV and H2O compared on the same prompts at one
  resident budget, then a session suspended, resumed and migrated (``kvres.cluster.demo``).
- ``kvres status [--address ADDR] [--namespace NS] [--json]``: backends (with their peak and the
  calls they hold), sessions, cold tiers and each kvres actor's repr (static facts), of a running
  cluster, as tables (``--json``: the ``SessionManager.status()`` dictionary).
- ``kvres inspect SESSION [--address ADDR] [--namespace NS] [--json]``: one session: policy,
  resident ranges drawn over its token log, cold blocks per tier, counters.
- ``kvres top [--address ADDR] [--namespace NS] [--interval S] [--sessions N] [--once]``: the same
  cluster live, a frame a second: backends (resident, peak, calls held), the busiest sessions,
  cold stores (``kvres.cluster.top``).
- ``kvres grafana [--install] [--dir DIR] [--address ADDR] [--temp-dir DIR]``: where the shipped Grafana dashboard is; ``--install``
  copies it where the Grafana that Ray provisions picks its dashboards up.
- ``kvres start [--port P] [--address ADDR] [--namespace NS] [--config JSON|PATH | --model PATH.gguf]
  [--gcs-redis HOST:PORT | --gcs-storage DIR] [--json] ...``: a standing cluster: a Ray head on
  this machine (started unless one answers on the port; its other ports chosen free) with kvres's
  actors (``--model``: one backend chosen for that chat model, as ``kvres serve --model``), left
  running when the command exits; says each phase as it starts (on stderr), then prints the address drivers use and
  a ready ``ray job submit`` line (``kvres.cluster.standing``).
- ``kvres stop [--address ADDR] [--namespace NS] [--keep-blocks] [--ray] [--serve]``: the
  namespace's detached ``kvres serve`` application removed first (where one runs), then kvres's
  actors of the namespace stopped (``SessionManager.shutdown``), and with ``--ray`` the Ray head on
  this machine; ``--serve``: only the application (as ``kvres serve --stop``).
- ``kvres serve [--model PATH.gguf | --config JSON|PATH] [--address ADDR] [--host H] [--port P]
  [--api-key-file F] ...``: the OpenAI-compatible HTTP front on Ray Serve
  (``kvres.cluster.serve.launch``; docs/serving.md); ``--model``: every choice made for that model
  and printed (``kvres.cluster.model_setup``).
- ``kvres chat [--model PATH.gguf] [--system TEXT] [--address ADDR] ...``: a terminal chat on one
  session (``chat.py``).
- ``main(argv=None) -> int`` (``python -m kvres.cluster.cli``: ``__main__``).

``status`` and ``inspect`` attach to a standing cluster (``--address``, else ``RAY_ADDRESS``, else
the one ``ray start`` last started on this machine, else the only one: several is an error naming
them), name it and why on stderr, and never create an actor. Errors arrive as one line on stderr, exit 1; a
``--model`` that cannot be served (no such file, not a GGUF, no chat template) exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvres.policy import KvresError


def _standing(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS, else this machine's)")
    parser.add_argument("--namespace", default="kvres", help="the namespace kvres runs in (default: kvres)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    return run_demo(args)


def _status(args: argparse.Namespace) -> int:
    from ..cluster_view import attach
    from ..status_view import render_status

    view = attach(args.address, args.namespace)
    print(f"kvres status: the Ray cluster at {view.address} ({view.how}), namespace {args.namespace!r}",
          file=sys.stderr)
    report = view.status()
    print(json.dumps(report, indent=2, default=str) if args.json else render_status(report, view.reprs()))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from ..cluster_view import attach
    from ..status_view import render_inspect

    view = attach(args.address, args.namespace)
    print(f"kvres inspect: the Ray cluster at {view.address} ({view.how}), namespace {args.namespace!r}",
          file=sys.stderr)
    stats = view.session_stats(args.session)
    print(json.dumps(stats, indent=2, default=str) if args.json else render_inspect(stats))
    return 0


def _grafana(args: argparse.Namespace) -> int:
    from ..grafana_dashboard import install_dashboard, ray_dashboards_dir, session_dashboards_dir

    folder = args.dir or (session_dashboards_dir(args.address) if args.address else ray_dashboards_dir(args.temp_dir))
    if args.install:
        print(f"installed {install_dashboard(folder)}")
    else:
        from importlib import resources

        print(resources.files("kvres.cluster").joinpath("grafana", "kvres.json"))
        print(f"(Ray's Grafana loads dashboards from {folder})", file=sys.stderr)
    return 0


def _start(args: argparse.Namespace) -> int:
    from ..standing import config_from_option, start_standing

    config = config_from_option(args.config) if args.config else None
    if args.model:
        from ..capacity_report import parse_bytes
        from ..model_setup import chat_setup

        setup = chat_setup(args.model, None if args.kv_memory is None else parse_bytes(args.kv_memory),
                           n_threads=args.threads)
        config = setup.config
        print(setup.summary("kvres start"), file=sys.stderr, flush=True)
    elif args.kv_memory is not None:
        raise ValueError("--kv-memory goes with --model (with --config, set kv_memory_bytes in its backends)")
    elif args.threads is not None:
        raise ValueError("--threads goes with --model (with --config, set n_threads in its backends)")
    cluster = start_standing(
        namespace=args.namespace, config=config, port=args.port, address=args.address,
        node_ip_address=args.node_ip_address, num_cpus=args.num_cpus, dashboard_port=args.dashboard_port,
        temp_dir=args.temp_dir, ray_args=args.ray_arg, gcs_redis=args.gcs_redis, gcs_storage_path=args.gcs_storage,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(json.dumps(cluster.as_dict()) if args.json else cluster.instructions())
    return 0


def _stop(args: argparse.Namespace) -> int:
    from ..serve.launch import stop_serve
    from ..standing import check_stop_options, stop_standing

    if args.serve:
        if args.ray or args.keep_blocks:
            raise ValueError("--serve stops only the HTTP front: kvres's actors and the Ray head keep running, so "
                             "--ray and --keep-blocks do not apply")
        print(stop_serve(args.address, args.namespace))
        return 0
    check_stop_options(args.keep_blocks, args.ray)
    # the HTTP front first: left running over stopped backends it would answer 503 to every request
    front = stop_serve(args.address, args.namespace, drop_state=not args.keep_blocks, missing_ok=True)
    if front:
        print(front)
    report = stop_standing(args.address, args.namespace, keep_blocks=args.keep_blocks, stop_ray=args.ray)
    print(report.summary())
    return 0


def _serve(args: argparse.Namespace) -> int:
    from ..serve.launch import run_serve

    return run_serve(args)


def _standing_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..reachability import DEFAULT_PORT

    start = sub.add_parser("start", help="a standing cluster: a Ray head and kvres's actors that outlive drivers")
    start.add_argument("--port", type=int, default=DEFAULT_PORT,
                       help=f"the Ray head's GCS port on this machine (default: {DEFAULT_PORT})")
    start.add_argument("--address", default=None,
                       help="a running Ray cluster to put kvres on instead (never starts a head)")
    start.add_argument("--namespace", default="kvres", help="the namespace kvres runs in (default: kvres)")
    which = start.add_mutually_exclusive_group()
    which.add_argument("--config", default=None,
                       help="a KvresConfig as a JSON object or a JSON file (default: KVRES_CONFIG and KVRES_*)")
    which.add_argument("--model", default=None, metavar="PATH.gguf",
                       help="one backend for this GGUF chat model, chosen as kvres serve --model chooses")
    start.add_argument("--kv-memory", default=None, metavar="SIZE", help="with --model: its KV memory, e.g. 8GiB")
    start.add_argument("--threads", type=int, default=None, metavar="N",
                       help="with --model: the engine's CPU threads (default: the machine's cores, at most 4)")
    start.add_argument("--node-ip-address", default=None, help="ray start --node-ip-address")
    start.add_argument("--num-cpus", type=int, default=None, help="ray start --num-cpus")
    start.add_argument("--dashboard-port", type=int, default=None,
                       help="ray start --dashboard-port (default 8265, or a free port when another process holds it)")
    start.add_argument("--temp-dir", default=None, help="ray start --temp-dir (default: Ray's, /tmp/ray)")
    start.add_argument("--ray-arg", action="append", default=[], metavar="ARG",
                       help="one more argument for `ray start`, e.g. --ray-arg=--metrics-export-port=8080")
    start.add_argument("--gcs-redis", default=None, metavar="HOST:PORT",
                       help="GCS fault tolerance: the head keeps its tables in this Redis, so a restarted head "
                            "finds every session (docs/operators.md, Failures)")
    start.add_argument("--gcs-storage", default=None, metavar="DIR",
                       help="GCS fault tolerance with Ray's embedded RocksDB storage in DIR")
    start.add_argument("--json", action="store_true", help="print the address and what was started as JSON")
    start.set_defaults(run=_start)
    stop = sub.add_parser("stop", help="stop kvres's actors (and with --ray the Ray head on this machine)")
    stop.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS, else this machine's)")
    stop.add_argument("--namespace", default="kvres", help="the namespace kvres runs in (default: kvres)")
    stop.add_argument("--keep-blocks", action="store_true",
                      help="keep the namespace's cold blocks for a later start of the same namespace")
    stop.add_argument("--ray", action="store_true", help="then stop the Ray head (it must run on this machine)")
    stop.add_argument("--serve", action="store_true",
                      help="stop only the namespace's kvres serve application (as kvres serve --stop)")
    stop.set_defaults(run=_stop)
    from ..serve.launch import add_serve_arguments

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP API on Ray Serve, sessions kept server-side")
    add_serve_arguments(serve)
    serve.set_defaults(run=_serve)


def build_parser() -> argparse.ArgumentParser:
    from ..demo import add_demo_arguments

    parser = argparse.ArgumentParser(prog="kvres", description="KV-cache residency manager on Ray")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compare eviction policies and move a session, on a local Ray cluster")
    add_demo_arguments(demo)
    demo.set_defaults(run=_demo)
    status = sub.add_parser("status", help="backends, sessions and cold tiers of a running cluster")
    _standing(status)
    status.set_defaults(run=_status)
    inspect = sub.add_parser("inspect", help="one session: resident ranges, cold blocks, counters")
    inspect.add_argument("session", help="the session id")
    _standing(inspect)
    inspect.set_defaults(run=_inspect)
    grafana = sub.add_parser("grafana", help="the Grafana dashboard kvres ships")
    grafana.add_argument("--install", action="store_true", help="copy it into Ray's Grafana dashboards folder")
    grafana.add_argument("--dir", default=None, help="the folder to install into (default: Ray's latest session's)")
    grafana.add_argument("--address", default=None,
                         help="a running head on this machine: its own session's folder, "
                              "whatever --temp-dir it was started with")
    grafana.add_argument("--temp-dir", default=None, help="the head's --temp-dir (default: Ray's, /tmp/ray)")
    grafana.set_defaults(run=_grafana)
    _standing_commands(sub)
    from ..capacity_report import register as register_capacity  # kvres capacity MODEL.gguf
    from ..top import register as register_top  # kvres top
    from .chat import register as register_chat  # kvres chat

    register_capacity(sub)
    register_top(sub)
    register_chat(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..model_setup import ModelChoiceError

    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ModelChoiceError as exc:  # a --model that cannot be served: a usage error, as argparse's
        print(f"kvres {args.command}: {exc}", file=sys.stderr)
        return 2
    except (KvresError, ValueError, ConnectionError) as exc:  # typed errors, pydantic's, no cluster
        print(f"kvres {args.command}: {exc}", file=sys.stderr)
        return 1

