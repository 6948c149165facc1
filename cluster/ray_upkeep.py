"""What Ray's own processes spend beside the engine in the clusters kvres starts, kept small.

Primitives:
- ``UPKEEP_CONFIG``: the Ray system configuration kvres adds to the clusters it starts
  (``event_stats: False``: Ray's C++ processes stop timing every handler of their event loops).
- ``UPKEEP_ENVIRONMENT``: the environment variables it adds to the processes those clusters start
  (``RAY_LOG_MONITOR_MANY_FILES_THRESHOLD=0``: the log monitor lists the log folder every half
  second, as Ray does past 1,000 log files, not ten times a second).
- ``upkeep_environment(env) -> dict``: ``env`` with ``UPKEEP_ENVIRONMENT`` under what it sets.
- ``started_with_upkeep()``: a context manager around an embedded cluster's ``ray.init``: the
  process's environment holds ``UPKEEP_ENVIRONMENT`` (a variable already set keeps its value)
  while Ray starts its processes, and is as it was after.

Why: on a machine whose cores the engine's threads fill, every millisecond another process runs
stalls the engine's next step (its threads advance in lockstep). An idle ``kvres serve`` cluster's
Ray processes took ~57 ms of CPU a second on 2 cores (2026-12-07; docs/notes.md), of which these
two settings remove ~9 (the log monitor ~3, the GCS, the raylet and each worker's event loop the
rest). What they turn off: the per-handler timings in Ray's debug state dumps
(``debug_state.txt``), and a new worker's log file is found within half a second instead of a
tenth (kvres's drivers do not read worker logs: ``log_to_driver=False``). A ``--system-config``
given to ``kvres start --ray-arg`` or a ``_system_config`` given to ``connect()`` wins, as does a
variable already in the environment.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final

UPKEEP_CONFIG: Final[Mapping[str, Any]] = MappingProxyType({"event_stats": False})
UPKEEP_ENVIRONMENT: Final[Mapping[str, str]] = MappingProxyType({"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"})


def upkeep_environment(env: Mapping[str, str]) -> dict[str, str]:
    return {**UPKEEP_ENVIRONMENT, **env}


@contextlib.contextmanager
def started_with_upkeep() -> Iterator[None]:
    added = [name for name in UPKEEP_ENVIRONMENT if name not in os.environ]
    os.environ.update({name: UPKEEP_ENVIRONMENT[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)
