"""Resident memory of every process of the soak's cluster, over time, and its trend.

Primitives:
- ``rss_bytes(pid) -> int | None``: ``VmRSS`` of ``/proc/<pid>/status`` (None: gone, or a zombie).
- ``RssSampler(processes, clock, every_s=5.0)``: a thread that reads, every ``every_s``, the
  resident memory of each process ``processes()`` names, with its label
  (``benchmarks.chat_fleet.proc_cpu.label_of``: ``gcs_server``, ``raylet``,
  ``ray::BackendServer``, ``ray::ServeReplica:kvres:KvresOpenAI``, ``ray::ProxyActor``, ...);
  ``samples``: ``(t, pid, label, bytes)``; ``start()``, ``stop()``.
- ``slope(points) -> float``: the least-squares slope of ``(t, value)`` points (value per second).
- ``rss_trend(samples, warmup_s) -> dict``: per label, and for all of them summed, after
  ``warmup_s``: the resident MiB at the first and the last sample, ``growth_pct`` between them,
  ``slope_mib_per_min`` and ``processes`` (how many pids had the label: a killed actor's new
  process is another pid, whose memory starts afresh); and per process that lived through the
  whole span (``steady``) the same figures, so a kill's restart does not read as a fall.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.chat_fleet.proc_cpu import label_of

MiB = float(1 << 20)
Sample = tuple[float, int, str, int]


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None  # a zombie has no VmRSS line


class RssSampler:
    def __init__(self, processes: Callable[[], Sequence[int]], clock: Callable[[], float], every_s: float = 5.0) -> None:
        self.processes, self.clock, self.every_s = processes, clock, every_s
        self.samples: list[Sample] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-rss", daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def sample(self) -> None:
        t = self.clock()
        try:
            pids = list(self.processes())
        except Exception:  # /proc read while processes come and go: the next round reads again
            self.errors += 1
            return
        for pid in pids:
            rss = rss_bytes(pid)
            if rss is None:
                continue
            # read each time: a worker starts as default_worker.py, idles as ray::IDLE, then takes an actor's name
            self.samples.append((t, pid, label_of(pid), rss))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every_s)


def slope(points: Sequence[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    t = [p[0] for p in points]
    v = [p[1] for p in points]
    mt, mv = sum(t) / len(t), sum(v) / len(v)
    var = sum((x - mt) ** 2 for x in t)
    return 0.0 if var == 0 else sum((x - mt) * (y - mv) for x, y in zip(t, v, strict=True)) / var


def _figures(series: Sequence[tuple[float, float]]) -> dict[str, Any]:
    first, last = series[0][1] / MiB, series[-1][1] / MiB
    return {"first_mib": round(first, 1), "last_mib": round(last, 1),
            "growth_pct": round(100.0 * (last - first) / first, 2) if first else 0.0,
            "slope_mib_per_min": round(slope(series) * 60.0 / MiB, 3), "samples": len(series)}


def rss_trend(samples: Sequence[Sample], warmup_s: float) -> dict[str, Any]:
    after = [s for s in samples if s[0] >= warmup_s]
    if not after:
        return {"warmup_s": warmup_s, "labels": {}, "total": None, "steady": {}}
    by_label: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    total: dict[float, int] = defaultdict(int)
    pids: dict[str, set[int]] = defaultdict(set)
    by_pid: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for t, pid, label, rss in after:
        by_label[label][t] += rss
        total[t] += rss
        pids[label].add(pid)
        by_pid[(pid, label)].append((t, float(rss)))
    span = (min(total), max(total))
    labels = {label: {**_figures(sorted((t, float(v)) for t, v in series.items())), "processes": len(pids[label])}
              for label, series in sorted(by_label.items())}
    steady = {f"{label} ({pid})": _figures(points) for (pid, label), points in sorted(by_pid.items())
              if points[0][0] == span[0] and points[-1][0] == span[1]}
    return {"warmup_s": warmup_s, "labels": labels, "total": _figures(sorted((t, float(v)) for t, v in total.items())),
            "steady": steady}
