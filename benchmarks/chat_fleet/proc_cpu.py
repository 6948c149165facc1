"""CPU seconds of a process tree, read from /proc (Linux).

Primitives:
- ``ProcStat(pid, ppid, start_ticks, cpu_s, children_cpu_s)``: one ``/proc/<pid>/stat``: the
  process's own user + system seconds (every thread's) and those of its children it has reaped.
- ``parse_stat(text, ticks_per_s) -> ProcStat``: the fields after the last ``)`` (a command name may
  hold spaces and parentheses).
- ``read_stat(pid) -> ProcStat | None`` (None: gone); ``tree_pids(root) -> list[int]``: ``root`` and
  every descendant alive, by parent id; ``label_of(pid) -> str``: what a process is (``label``).
- ``snapshot(root) -> Snapshot``: every process of the tree: its label, parent and CPU seconds.
- ``cpu_between(before, after) -> dict[label, LabelCpu]``: the seconds each kind of process used
  between two snapshots, and how many processes of that label there were.

A process that ends between two snapshots leaves its seconds in its parent's reaped-children count:
the time it had used at the first snapshot is taken off its nearest ancestor still alive (or
counted nowhere if none is), so every second is counted once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    start_ticks: int  # since boot: with the pid, which process this is (pids are reused)
    cpu_s: float
    children_cpu_s: float

    @property
    def total_s(self) -> float:
        return self.cpu_s + self.children_cpu_s


@dataclass(frozen=True)
class Entry:
    label: str
    ppid: int
    total_s: float


@dataclass(frozen=True)
class LabelCpu:
    cpu_s: float
    processes: int


# (pid, start ticks) -> what the process was and had used
Snapshot = dict[tuple[int, int], Entry]


def parse_stat(text: str, ticks_per_s: float) -> ProcStat:
    head, _, rest = text.rpartition(")")
    if not head:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    pid = int(head.split("(", 1)[0])
    fields = rest.split()  # fields[0] is field 3 (state)
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return ProcStat(pid=pid, ppid=int(fields[1]), start_ticks=int(fields[19]),
                    cpu_s=(utime + stime) / ticks_per_s, children_cpu_s=(cutime + cstime) / ticks_per_s)


def _ticks_per_s() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def read_stat(pid: int) -> ProcStat | None:
    try:
        return parse_stat((PROC / str(pid) / "stat").read_text(), _ticks_per_s())
    except (OSError, ValueError, IndexError):
        return None


def _all_stats() -> dict[int, ProcStat]:
    ticks = _ticks_per_s()
    stats = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = parse_stat((entry / "stat").read_text(), ticks)
            except (OSError, ValueError, IndexError):
                continue  # ended while listed
    return stats


def _descendants(root: int, stats: dict[int, ProcStat]) -> list[int]:
    children: dict[int, list[int]] = {}
    for s in stats.values():
        children.setdefault(s.ppid, []).append(s.pid)
    found, todo = [], [root] if root in stats else []
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def tree_pids(root: int) -> list[int]:
    return _descendants(root, _all_stats())


def label(argv: list[str], comm: str) -> str:
    """A Ray worker by its title without the method it runs (``ray::BackendActor``), a Python by
    its script or module, anything else by its executable's name."""
    if not argv:
        return comm
    first = argv[0]
    if first.startswith("ray::"):
        return first.split()[0].split(".")[0]
    name = os.path.basename(first.split()[0])
    if name.startswith("python"):
        rest = [a for a in argv[1:] if not a.startswith("-") or a in ("-m", "-c")]
        if rest[:1] == ["-m"] and len(rest) > 1:
            return f"python -m {rest[1]}"
        if rest[:1] == ["-c"]:
            return "python -c"
        if rest:
            return os.path.basename(rest[0])
    return name


def label_of(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
        comm = (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"
    return label([a for a in raw.decode(errors="replace").split("\0") if a], comm)


def snapshot(root: int) -> Snapshot:
    stats = _all_stats()
    return {(pid, stats[pid].start_ticks): Entry(label_of(pid), stats[pid].ppid, stats[pid].total_s)
            for pid in _descendants(root, stats)}


def cpu_between(before: Snapshot, after: Snapshot) -> dict[str, LabelCpu]:
    seconds: dict[str, float] = {}
    count: dict[str, int] = {}
    for key, entry in after.items():
        old = before.get(key)
        seconds[entry.label] = seconds.get(entry.label, 0.0) + entry.total_s - (old.total_s if old else 0.0)
        count[entry.label] = count.get(entry.label, 0) + 1
    by_pid = {pid: (pid, start) for pid, start in after}
    parents = {pid: e.ppid for (pid, _), e in before.items()}
    for key, entry in before.items():
        if key in after:
            continue
        ancestor = entry.ppid  # the ended process's seconds so far now sit in an ancestor's reaped count
        while ancestor in parents and ancestor not in by_pid:
            ancestor = parents[ancestor]
        if ancestor in by_pid:
            holder = after[by_pid[ancestor]].label
            seconds[holder] = seconds.get(holder, 0.0) - entry.total_s
    return {name: LabelCpu(seconds[name], count.get(name, 0)) for name in sorted(seconds)}
