"""What an earlier run of the cluster left behind: swept at connect, and named when a session of it
is asked for.

Primitives:
- ``sweep_previous_runs(namespace, stores, timeout_s=30.0) -> list[dict]``: every cold store of the
  namespace removes the folders beside its own that the namespace's stores of an earlier run, or
  of a node that died, left on its node (``MeteredColdStoreServer.sweep_previous``); what an
  earlier run left (its node is unknown to this cluster: the head restarted without GCS fault
  tolerance) is noted in Ray's GCS, with the sessions whose blocks were there.
- ``unknown_session(namespace, session_id) -> UnknownSessionError``: the error for a session id the
  directory does not hold: a ``ClusterRestartedError`` that says when the head restarted and what
  was lost, where a note says so, else a plain ``UnknownSessionError``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from kvres.actors.ray_actors.nodes import STORE_PREFIX
from kvres.policy import UnknownSessionError
from kvres.policy.errors import ClusterRestartedError

log = logging.getLogger("kvres.cluster")
RESTARTS_KV_NAMESPACE = "kvres-restarts"


def _prefix(namespace: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{namespace}-{STORE_PREFIX}")


def sweep_previous_runs(namespace: str, stores: Mapping[str, Any], timeout_s: float = 30.0) -> list[dict[str, Any]]:
    import ray
    from ray.experimental import internal_kv

    refs = [store.sweep_previous.remote(_prefix(namespace)) for store in stores.values()]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    swept: list[dict[str, Any]] = []
    for ref in ready:
        try:
            swept += ray.get(ref)
        except Exception as exc:  # a store that cannot sweep keeps serving: say so
            log.warning("a cold store could not sweep earlier runs' folders: %s", exc)
    if not swept:
        return []
    known = {str(n["NodeID"]) for n in ray.nodes()}  # type: ignore[no-untyped-call]
    earlier = [s for s in swept if s.get("node") not in known]
    for s in swept:
        log.warning("removed cold-store folder %s left by %s (blocks of %d sessions)", s["folder"],
                    "an earlier run of the cluster" if s in earlier else f"node {s.get('node')}, which died",
                    len(s["sessions"]))
    if earlier:
        old = internal_kv._internal_kv_get(namespace, namespace=RESTARTS_KV_NAMESPACE)
        note = json.loads(old) if old else {"sessions": [], "folders": []}
        note["at"] = time.time()
        note["sessions"] = sorted(set(note["sessions"]) | {sid for s in earlier for sid in s["sessions"]})
        note["folders"] = sorted(set(note["folders"]) | {s["folder"] for s in earlier})
        internal_kv._internal_kv_put(namespace, json.dumps(note), overwrite=True, namespace=RESTARTS_KV_NAMESPACE)
    return swept


def unknown_session(namespace: str, session_id: str) -> UnknownSessionError:
    from ray.experimental import internal_kv

    data = internal_kv._internal_kv_get(namespace, namespace=RESTARTS_KV_NAMESPACE)
    if not data:
        return UnknownSessionError(session_id)
    note = json.loads(data)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(note["at"]))
    held = session_id in note["sessions"]
    why = (f"the cluster's head was restarted without GCS fault tolerance (found at {when}); "
           + ("this session's blocks were left by the earlier run and removed: it is gone"
              if held else "sessions of the earlier run are gone")
           + " (start the head with `kvres start --gcs-redis HOST:PORT` or `--gcs-storage DIR` to keep them)")
    return ClusterRestartedError(session_id, why)
