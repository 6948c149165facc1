"""The ``kvres`` command line.

Primitives:
- ``kvres demo [--model PATH] [--prompts N] [--prompt-tokens N] [--budget N] [--threads N]``: a
  local Ray cluster; no eviction, streaming, SnapKV and H2O compared on the same prompts at one
  resident budget, then a session suspended, resumed and migrated (``kvres.cluster.demo``).
- ``kvres status [--address ADDR] [--namespace NS] [--json]``: backends, sessions, cold tiers and
  each kvres actor's repr now, of a running cluster, as tables (``--json``: the
  ``SessionManager.status()`` dictionary).
- ``kvres inspect SESSION [--address ADDR] [--namespace NS] [--json]``: one session: policy,
  resident ranges drawn over its token log, cold blocks per tier, counters.
- ``kvres grafana [--install] [--dir DIR]``: where the shipped Grafana dashboard is; ``--install``
  copies it where the Grafana that Ray provisions picks its dashboards up.
- ``main(argv=None) -> int``.

``status`` and ``inspect`` attach to a standing cluster (``--address``, else ``RAY_ADDRESS``, else
the one on this machine) and never create an actor. Errors arrive as one line on stderr, exit 1.
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
    from .demo import run_demo

    return run_demo(args)


def _status(args: argparse.Namespace) -> int:
    from .cluster_view import attach
    from .status_view import render_status

    view = attach(args.address, args.namespace)
    report = view.status()
    print(json.dumps(report, indent=2, default=str) if args.json else render_status(report, view.reprs()))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from .cluster_view import attach
    from .status_view import render_inspect

    stats = attach(args.address, args.namespace).session_stats(args.session)
    print(json.dumps(stats, indent=2, default=str) if args.json else render_inspect(stats))
    return 0


def _grafana(args: argparse.Namespace) -> int:
    from .grafana_dashboard import install_dashboard, ray_dashboards_dir

    if args.install:
        print(f"installed {install_dashboard(args.dir)}")
    else:
        from importlib import resources

        print(resources.files("kvres.cluster").joinpath("grafana", "kvres.json"))
        print(f"(Ray's Grafana loads dashboards from {args.dir or ray_dashboards_dir()})", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .demo import add_demo_arguments

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
    grafana.set_defaults(run=_grafana)
    from .capacity_report import register as register_capacity  # kvres capacity MODEL.gguf

    register_capacity(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (KvresError, ValueError, ConnectionError) as exc:  # typed errors, pydantic's, no cluster
        print(f"kvres {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
