"""``kvres top [--address ADDR] [--namespace NS] [--interval S] [--sessions N] [--once]``: a live view
of a running kvres cluster, one frame a second.

Primitives:
- ``render_top(report, sessions=20, now=None) -> str``: one frame from ``ClusterView.status()``: per
  backend its live and suspended sessions, resident / budget tokens, peak, the calls it holds
  (waiting or running); then the ``sessions`` sessions holding the most resident tokens; then the
  cold stores. Plain text, the same in a terminal and a log.
- ``run_top(args) -> int``: attaches (never creates an actor; the cluster named on stderr, as
  ``kvres status`` names it) and prints a frame every
  ``--interval`` seconds until interrupted: redrawn in place with rich (a dependency of kvres)
  where stdout is a terminal, else frames one after another; ``--once`` prints one frame and exits.
- ``register(subparsers)``: the ``top`` command (``kvres.cluster.cli`` registers it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import Any

from .status_view import format_table, human_bytes

DEFAULT_SESSIONS = 20


def render_top(report: Mapping[str, Any], sessions: int = DEFAULT_SESSIONS, now: float | None = None) -> str:
    backends = list(report.get("backends", []))
    stamp = time.strftime("%H:%M:%S", time.localtime(time.time() if now is None else now))
    rows = []
    everyone: list[tuple[int, str, str, str]] = []
    for b in backends:
        table = b.get("sessions", {})
        live = sum(1 for s in table.values() if s.get("state") == "live")
        budget, resident = int(b.get("kv_budget_tokens", 0)), int(b.get("resident_tokens", 0))
        rows.append([b.get("backend"), b.get("engine"), live, len(table) - live, f"{resident}/{budget}",
                     f"{100 * resident / budget:.0f}%" if budget else "-", b.get("peak_resident_tokens", 0),
                     b.get("calls_in_flight", "-")])
        everyone += [(int(s.get("resident_tokens", 0)), sid, str(b.get("backend")), str(s.get("state")))
                     for sid, s in table.items()]
    parts = [f"kvres top  {stamp}  namespace {report.get('namespace')!r}: {len(backends)} backend(s), "
             f"{len(everyone)} session(s)", "",
             format_table(["backend", "engine", "live", "suspended", "resident/budget", "used", "peak", "calls"],
                          rows) if rows else "(no backends)", ""]
    everyone.sort(key=lambda e: (-e[0], e[1]))
    shown = everyone[:max(sessions, 0)]
    if shown:
        more = f" (the {len(shown)} holding the most of {len(everyone)})" if len(everyone) > len(shown) else ""
        parts += [f"SESSIONS{more}", format_table(["session", "backend", "state", "resident"],
                                                  [[sid, b, state, n] for n, sid, b, state in shown]), ""]
    stores = sorted(report.get("cold_stores", {}).items())
    if stores:
        parts += ["COLD STORES", format_table(["store", "ram", "blocks", "disk", "blocks"], [
            [name, human_bytes(st.get("ram_bytes", 0)), st.get("ram_blocks", 0), human_bytes(st.get("disk_bytes", 0)),
             st.get("disk_blocks", 0)] for name, st in stores])]
    return "\n".join(parts).rstrip()


def _live_rich() -> Any:
    try:
        from rich.live import Live
        from rich.text import Text
    except ImportError:
        return None
    return Live, Text


def run_top(args: argparse.Namespace) -> int:
    from kvres.policy.errors import ArgumentError

    from .cluster_view import attach

    if args.interval <= 0 or args.sessions < 0:
        raise ArgumentError(f"--interval must be > 0 and --sessions >= 0, got {args.interval} and {args.sessions}")
    view = attach(args.address, args.namespace)
    print(f"kvres top: the Ray cluster at {view.address} ({view.how}), namespace {args.namespace!r}", file=sys.stderr)
    if args.once:
        print(render_top(view.status(), args.sessions))
        return 0
    rich = _live_rich() if sys.stdout.isatty() else None
    try:
        if rich is not None:
            live_cls, text_cls = rich
            with live_cls(text_cls(render_top(view.status(), args.sessions)), auto_refresh=False) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(text_cls(render_top(view.status(), args.sessions)), refresh=True)
        while True:
            print(render_top(view.status(), args.sessions), flush=True)
            print(flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def register(subparsers: Any) -> None:
    cmd = subparsers.add_parser("top", help="a live view of a running cluster: backends, sessions, calls")
    cmd.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS, else this machine's)")
    cmd.add_argument("--namespace", default="kvres", help="the namespace kvres runs in (default: kvres)")
    cmd.add_argument("--interval", type=float, default=1.0, help="seconds between frames (default: 1)")
    cmd.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS,
                     help=f"how many sessions to list, most resident first (default: {DEFAULT_SESSIONS})")
    cmd.add_argument("--once", action="store_true", help="print one frame and exit")
    cmd.set_defaults(run=run_top)
