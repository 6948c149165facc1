"""What kvres leaves in Ray's task-event store: nothing per call of its own actors, and a small bound
on what other tasks leave there in the clusters kvres starts.

Primitives:
- ``TASK_EVENT_STORE``: the Ray system configuration that bounds the GCS's task-event store of every
  cluster kvres starts (see its docstring for why and how much).
- ``actor_task_events() -> dict``: the option kvres's actors are created with
  (``enable_task_events=False``: their calls report no task events).
- ``started_cluster_config(given=None) -> dict``: the ``_system_config`` of a cluster kvres starts
  with ``ray.init`` (an embedded one): ``TASK_EVENT_STORE`` and ``ray_upkeep.UPKEEP_CONFIG`` under
  what the caller gave.
- ``ray_start_arguments(ray_args) -> list[str]``: ``ray start --head``'s arguments with
  ``--system-config`` holding the same, merged with one given among ``ray_args``.
- ``SystemConfigError``: a ``--system-config`` given that is not a JSON object (a ``KvresError``).

``KVRES_RAY_TASK_EVENTS=1`` in the environment of the process that starts the cluster and creates
the actors (``kvres start``, ``kvres serve``, a driver's ``connect()``) keeps Ray's own defaults for
both (docs/operators.md, Ray's task events).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from kvres.actors.settings import read_settings
from kvres.policy import KvresError

from .ray_upkeep import UPKEEP_CONFIG

TASK_EVENT_STORE: Final[Mapping[str, int]] = MappingProxyType({
    "task_events_max_num_task_in_gcs": 10_000,
    "task_events_max_dropped_task_attempts_tracked_per_job_in_gcs": 10_000,
    "task_events_max_num_profile_events_per_task": 16,
})
"""Ray's GCS keeps the events of every task and actor call (for the dashboard's task view, ``ray list
tasks``, ``ray.timeline``) up to ``task_events_max_num_task_in_gcs`` calls, 100,000 by default, and
past that remembers the id of every call it dropped, up to
``task_events_max_dropped_task_attempts_tracked_per_job_in_gcs`` per job, 1,000,000 by default. A
chat turn through ``kvres serve`` left about 7 task events of kvres's actors there, some 3.5 KB of
the GCS's memory each, so under steady traffic the GCS grew with every turn until the first cap
(about 330 MiB more) and then the second (benchmarks.gcs_growth; docs/operators.md). kvres's
actors report none now (``actor_task_events``); these caps bound what the remaining tasks (a
driver's, a Ray job's, Ray's libraries') can keep in a cluster kvres starts to about 35 MiB.

``task_events_max_num_profile_events_per_task`` (1,000 by default) bounds the profile events (the
timeline's spans, such as a driver's ``submit_task``) the GCS merges into one task's record: with
actors killed and restarted they kept growing. In a 10-minute soak with a fault every half
minute, profile events merged into existing records were 92% of ``gcs_server``'s growth after
warm-up (jemalloc's heap profile of the GCS), which grew +1.3 to +1.4 MiB/min, 10-12% in 5 minutes.
16 keeps the few spans an ordinary call records."""


class SystemConfigError(KvresError, ValueError):
    """A ``--system-config`` for ``ray start`` that is not a JSON object; names the value."""


def _ray_defaults() -> bool:
    return read_settings().ray_task_events


def actor_task_events() -> dict[str, bool]:
    """``.options(**actor_task_events())`` for every actor kvres creates: its calls (several per chat
    turn) report no task events, which also spares each call the reporting's CPU (with
    ``KVRES_RAY_TASK_EVENTS=1`` they do, Ray's default). The actor itself stays in Ray's actor
    table and dashboard."""
    return {"enable_task_events": _ray_defaults()}


def started_cluster_config(given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``ray.init(address="local", _system_config=...)`` of a cluster kvres starts: the task-event
    store's bound and Ray's upkeep kept small (``ray_upkeep.UPKEEP_CONFIG``); what the caller gave
    wins over both."""
    bound = {} if _ray_defaults() else dict(TASK_EVENT_STORE)
    return {**UPKEEP_CONFIG, **bound, **(given or {})}


def ray_start_arguments(ray_args: Sequence[str]) -> list[str]:
    """``ray_args`` (extra arguments of ``ray start --head``) with one ``--system-config`` holding
    ``started_cluster_config`` over the one given there, as ``--system-config=JSON`` or
    ``--system-config JSON``; a given one that is not a JSON object raises ``SystemConfigError``."""
    rest: list[str] = []
    given: dict[str, Any] = {}
    args = list(ray_args)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--system-config" and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif arg.startswith("--system-config="):
            value, i = arg.split("=", 1)[1], i + 1
        else:
            rest.append(arg)
            i += 1
            continue
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise SystemConfigError(f"--system-config must be a JSON object, got {value!r:.200}")
        given.update(parsed)
    config = started_cluster_config(given)
    return [*rest, f"--system-config={json.dumps(config, separators=(',', ':'))}"] if config else rest
