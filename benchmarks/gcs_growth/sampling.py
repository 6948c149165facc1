"""What the growth benchmark reads from a running ``kvres serve``: its processes' resident memory, and
the task events its GCS holds.

Primitives:
- ``process_rss(root) -> dict[int, tuple[str, int]]``: pid -> (name, resident bytes) of ``root`` and
  every process under it (an embedded Ray cluster's processes descend from the driver that started
  it: the GCS, the raylet, Ray's agents, every worker). A worker is named by the title Ray gives it,
  less the method it is in (``ray::BackendServer``, ``ray::ServeReplica:kvres:KvresOpenAI``), other
  processes by their program.
- ``gcs_session_dir(root) -> Path | None``: the session folder of the GCS under ``root``.
- ``gcs_task_events(session_dir) -> dict[str, int]``: the GCS task manager's counters from the debug
  state the GCS prints to ``logs/gcs_server.out`` (about once a minute): the task events reported to
  it and those it stores now (``stored``), the actor and normal tasks among them; empty before the
  first print.
- ``slope_per_minute(times_s, values) -> float``: the least-squares slope, per minute.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from kvres.cluster.standing import descendants

# the GCS task manager's lines in the debug state gcs_server prints to its .out log, as Ray 2.60 writes them
_COUNTERS = {
    "reported": re.compile(r"-Total num task events reported: (\d+)"),
    "status_dropped": re.compile(r"-Total num status task events dropped: (\d+)"),
    "stored": re.compile(r"-Current num of task events stored: (\d+)"),
    "actor_tasks": re.compile(r"-Total num of actor tasks: (\d+)"),
    "normal_tasks": re.compile(r"-Total num of normal tasks: (\d+)"),
}
_TAIL_BYTES = 256 << 10


def _argv(pid: int) -> list[str]:
    try:
        return [a for a in (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None  # a zombie has no VmRSS line


def process_name(argv: list[str]) -> str:
    if not argv:
        return "?"
    first = argv[0]
    if first.startswith("ray::"):  # a worker: Ray's title, "ray::BackendServer.stream" while in a call
        return first.split()[0].split(".", 1)[0]
    program = Path(first).name
    if program.startswith("python"):  # a Python process: its module, script or -c
        for i, arg in enumerate(argv[1:], start=1):
            if arg == "-c":
                return "python -c"
            if arg == "-m" and i + 1 < len(argv):
                return f"python -m {argv[i + 1]}"
            if not arg.startswith("-"):
                return f"python {Path(arg).name}"
    return program


def process_rss(root: int) -> dict[int, tuple[str, int]]:
    found: dict[int, tuple[str, int]] = {}
    for pid in sorted(descendants({root})):
        rss = _rss_bytes(pid)
        if rss is not None:
            found[pid] = (process_name(_argv(pid)), rss)
    return found


def gcs_session_dir(root: int) -> Path | None:
    for pid in descendants({root}):
        argv = _argv(pid)
        if argv and argv[0].endswith("gcs_server"):
            for arg in argv:
                for flag in ("--session-dir=", "--session_dir="):
                    if arg.startswith(flag):
                        return Path(arg[len(flag):])
    return None


def gcs_task_events(session_dir: Path | None) -> dict[str, int]:
    if session_dir is None:
        return {}
    try:
        with (session_dir / "logs" / "gcs_server.out").open("rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - _TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return {}
    block = text.rsplit("GcsTaskManager:", 1)
    if len(block) < 2:
        return {}
    found = {name: pattern.search(block[1]) for name, pattern in _COUNTERS.items()}
    return {name: int(match.group(1)) for name, match in found.items() if match}


def slope_per_minute(times_s: list[float], values: list[float]) -> float:
    if len(times_s) < 2:
        return float("nan")
    slope, _ = np.polyfit(np.asarray(times_s, dtype=np.float64), np.asarray(values, dtype=np.float64), 1)
    return float(slope) * 60.0
