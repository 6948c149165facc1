"""Cold-store folders an earlier run left on a node, found by the process that owned them.

Primitives:
- ``claim(folder, node_id)``: mark ``folder`` as owned by this process: ``<folder>.owner`` beside
  it (JSON: pid, the process's start time in clock ticks, node id, wall time).
- ``release(folder)``: the marker removed (the folder was removed by its store).
- ``sweep_siblings(folder, prefix) -> list[dict]``: remove every sibling folder whose name starts
  with ``prefix`` (the same namespace's stores) and whose owner process is gone (its pid runs no
  more, or runs a process started at another time: a reused pid), with its marker; each answer
  names the folder, the node and time of its owner's claim, and the sessions whose blocks it held.
  A folder without a marker, or with a live owner (another cluster's store on this machine), is
  left alone.

A head restarted without GCS fault tolerance starts new stores on a new node id: the old stores'
folders, named after the old node ids, would otherwise stay on disk for good (their blocks cannot
be read without the old run's secret). With GCS fault tolerance the old node's store is unreachable
as well (it was pinned to a node that is gone), and its folder goes the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

OWNER_SUFFIX = ".owner"


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None when no such process runs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _marker(folder: Path) -> Path:
    return folder.with_name(folder.name + OWNER_SUFFIX)


def release(folder: str | os.PathLike[str]) -> None:
    """The folder's marker removed (the store removed its folder)."""
    _marker(Path(folder)).unlink(missing_ok=True)


def claim(folder: str | os.PathLike[str], node_id: str) -> None:
    path = Path(folder)
    pid = os.getpid()
    owner = {"pid": pid, "ticks": _start_ticks(pid), "node": node_id, "at": time.time()}
    tmp = path.with_name(f".{path.name}{OWNER_SUFFIX}.{pid}.tmp")
    tmp.write_text(json.dumps(owner))
    os.replace(tmp, _marker(path))


def _owner_gone(owner: dict[str, Any]) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False  # not a marker this module wrote: leave it
    ticks = _start_ticks(pid)
    return ticks is None or ticks != owner.get("ticks")


def sweep_siblings(folder: str | os.PathLike[str], prefix: str) -> list[dict[str, Any]]:
    own = Path(folder)
    swept: list[dict[str, Any]] = []
    for marker in sorted(own.parent.glob(f"{prefix}*{OWNER_SUFFIX}")):
        other = marker.with_name(marker.name[: -len(OWNER_SUFFIX)])
        if other == own:
            continue
        try:
            owner = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(owner, dict) or not _owner_gone(owner):
            continue
        if not other.exists():  # its folder was removed already: only the marker is left
            marker.unlink(missing_ok=True)
            continue
        blocks = other / "blocks"
        sessions = sorted(p.name for p in blocks.iterdir() if p.is_dir()) if blocks.is_dir() else []
        shutil.rmtree(other, ignore_errors=True)
        marker.unlink(missing_ok=True)
        swept.append({"folder": other.name, "node": owner.get("node"), "claimed_at": owner.get("at"),
                      "sessions": sessions})
    return swept
