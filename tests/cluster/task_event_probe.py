"""What a Ray cluster's GCS says about task events, read by a connected driver: the system
configuration the cluster was started with, and the task events it holds of kvres's actors.

``read_task_events()`` first runs a task of its own and waits until the GCS holds its events (they
are reported about once a second), so every call made before it has been reported too: an empty
list of kvres's events then means none were sent. ``most_profile_events``: the most profile events
(timeline spans) the GCS holds for one task; ``upkeep``: the system configuration's values of
``ray_upkeep.UPKEEP_CONFIG``'s keys. ``DRIVER`` runs it in a driver of its own
(``python -c DRIVER ADDRESS``) and prints the result as JSON on its last line;
``gcs_address_under(pid)`` finds the address of an embedded cluster a process started.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from kvres.cluster.ray_upkeep import UPKEEP_CONFIG

KVRES_ACTOR_CLASSES = frozenset({"BackendServer", "PlannerServer", "ColdStoreServer", "MeteredColdStoreServer",
                                 "ServeStateActor"})
TASK_EVENT_KEYS = ("task_events_max_num_task_in_gcs", "task_events_max_dropped_task_attempts_tracked_per_job_in_gcs",
                   "task_events_max_num_profile_events_per_task")


def _actor_class(task_name: str) -> str:
    """``BackendServer.generate`` or ``kvres-backend-b0:BackendServer.__init__`` -> ``BackendServer``."""
    return task_name.rsplit(":", 1)[-1].split(".", 1)[0]


def read_task_events(timeout_s: float = 120.0) -> dict[str, Any]:
    import ray
    from ray._private.state import state

    @ray.remote(num_cpus=0)
    def witness() -> int:
        return 1

    marker = f"kvres-witness-{uuid.uuid4().hex[:8]}"
    ray.get(witness.options(name=marker).remote())
    deadline = time.monotonic() + timeout_s
    while True:
        events = state._get_all_task_events()
        names = [event.task_info.name for event in events]
        if marker in names or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    system_config = state.get_system_config()
    return {
        "witnessed": marker in names,
        "task_events": len(names),
        "most_profile_events": max((len(e.profile_events.events) for e in events), default=0),
        "kvres_task_events": sorted(n for n in names if _actor_class(n) in KVRES_ACTOR_CLASSES),
        "system_config": {key: system_config.get(key) for key in TASK_EVENT_KEYS},
        "upkeep": {key: system_config.get(key) for key in UPKEEP_CONFIG},
    }


def gcs_address_under(pid: int) -> str | None:
    """HOST:PORT of the GCS of the cluster ``ray.init`` started under ``pid``, as its raylet has it
    (the GCS itself may have been given port 0 and chosen one)."""
    from kvres.cluster.standing import descendants

    for child in descendants({pid}):
        try:
            argv = (Path("/proc") / str(child) / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and argv[0].endswith("raylet"):
            found = [a.split("=", 1)[1] for a in argv if a.startswith("--gcs-address=")]
            if found:
                return found[0]
    return None


DRIVER = """
import json, sys
import ray
from kvres.cluster.ray_auth import follow_local_token
from tests.cluster.task_event_probe import read_task_events

follow_local_token()
ray.init(address=sys.argv[1], log_to_driver=False)
print(json.dumps(read_task_events()))
"""


def log_monitor_environment(gcs_address: str) -> dict[str, str]:
    """The environment of the log monitor of the cluster whose GCS is at ``gcs_address`` (this
    machine's, matched by its port), read from /proc; ``AssertionError`` if there is none."""
    port = gcs_address.rsplit(":", 1)[-1]
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if any(a.endswith("log_monitor.py") for a in argv) and any(
                    a.startswith("--gcs-address=") and a.endswith(f":{port}") for a in argv):
                pairs = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
                return dict(p.split("=", 1) for p in pairs if "=" in p)
        except OSError:
            continue
    raise AssertionError(f"no log monitor of the cluster at {gcs_address} runs here")
