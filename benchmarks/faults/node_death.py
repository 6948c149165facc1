"""A worker node dies under kvres: the sessions it held, and those whose blocks it held, go on.

Primitives:
- ``TwoNodes(model)``: a ``ray.cluster_utils.Cluster`` of a head and one worker node on this
  machine, with kvres on it: backend "h0" pinned to the head, "w0" to the worker
  (``BackendConfig.node_id``); ``manager``, ``kill_worker() -> float`` (the node removed, no grace,
  its actors' processes killed with it; returns the monotonic time), ``shutdown()``.
- ``node_death(model, prompt=200, tokens=20) -> dict``: the scenario. Sessions on "w0": one live,
  one suspended (its KV parked in the worker's cold store), one left for a ``migrate`` after the
  death, one streamed after it; one on "h0" whose spilled blocks sit in the worker's store (it ran
  on "w0", then migrated). Each has an uninterrupted twin on "h0" (the spilled one's twin ran on
  "w0" and migrated too: spilled blocks die with their store, so it is the run that lost the same
  blocks, and it is called after the death too). After the worker dies, each is
  called again (the streamed one through ``stream``); the answer says how many sessions were
  lost, how many continued with their twin's greedy tokens, the spilled blocks it found gone, the seconds from the death to the
  last session's answer, where three new sessions were placed, the errors met (type names),
  the status rows of the lost backend and of the load view, and the backend the planner's
  directory names for each victim (``directory``, by role) and its ``Session.backend``
  (``handles``); with a cluster of its own, the
  store folders of the namespace left on disk after ``shutdown()`` (``folders_left``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

POLICY_BUDGET = 160


class TwoNodes:
    def __init__(self, model: str) -> None:
        import ray
        from ray.cluster_utils import Cluster

        from kvres.cluster import BackendConfig, KvresConfig, connect

        if ray.is_initialized():
            ray.shutdown()
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        self.worker = self.cluster.add_node(num_cpus=1)
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, log_to_driver=False)
        head = self.cluster.head_node.node_id
        config = KvresConfig(backends=[
            BackendConfig(name="h0", model_path=model, n_ctx=4096, n_seq_max=16, kv_budget_tokens=4000,
                          n_threads=1, node_id=head),
            BackendConfig(name="w0", model_path=model, n_ctx=2048, n_seq_max=8, kv_budget_tokens=2000,
                          n_threads=1, node_id=self.worker.node_id),
        ])
        self.manager = connect(namespace=f"kvres-nd-{uuid.uuid4().hex[:6]}", config=config)

    def kill_worker(self) -> float:
        """The node goes as a machine does: its Ray processes and every worker process they
        started (its actors) die at once; ``remove_node`` alone leaves the actors' processes to
        notice their raylet's death, and they answer direct calls meanwhile."""
        from ray._private import ray_constants

        from kvres.cluster.standing import descendants

        raylet = self.worker.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
        doomed = descendants({raylet}) - {raylet}
        self.cluster.remove_node(self.worker, allow_graceful=False)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return time.monotonic()

    def shutdown(self) -> None:
        import ray

        try:
            self.manager.shutdown()
        finally:
            ray.shutdown()
            self.cluster.shutdown()


def _error(exc: BaseException) -> str:
    return type(exc).__name__


def node_death(model: str, prompt: int = 200, tokens: int = 20, nodes: TwoNodes | None = None, kill: bool = True) -> dict[str, Any]:
    from kvres.cluster import SessionPolicy

    from .cluster import wait_parked

    own = nodes is None
    nodes = nodes or TwoNodes(model)
    m = nodes.manager
    words = list(range(3, 3 + prompt))
    streaming = SessionPolicy.streaming(POLICY_BUDGET, recent_tokens=32)
    errors: list[str] = []
    try:
        roles = {"live": None, "suspended": None, "migrated": None, "streamed": None, "spilled": streaming}
        pairs = {}
        for role, policy in roles.items():
            victim = m.open_session(policy=policy, backend="w0")
            twin = m.open_session(policy=policy, backend="w0" if role == "spilled" else "h0")
            for s in (victim, twin):
                s.append(words)
                s.generate(4)
            pairs[role] = (victim, twin)
        victim, _ = pairs["suspended"]
        victim.suspend()
        worker_store = next(h for n, h in m.cold_stores.items() if nodes.worker.node_id.startswith(n.rsplit("-", 1)[1]))
        wait_parked(worker_store, victim.session_id)
        # the spilled one and its twin both ran on the worker, then moved to the head (their
        # spilled blocks stay in the worker's store, and die with it: no run can recall them
        # after the death, so the twin is called after it too)
        spilled, twin = pairs["spilled"]
        for s in (spilled, twin):
            s.migrate("h0")
        spilled_refs = sum(v["blocks"] for v in spilled.stats()["cold"].values())

        died = nodes.kill_worker() if kill else time.monotonic()
        identical = 0
        lost = 0
        spilled_dropped = 0
        differ: list[str] = []
        for role, (victim, twin) in pairs.items():
            try:
                if role == "migrated":
                    victim.migrate("h0")
                if role == "streamed":
                    got = list(victim.stream(tokens, ignore_eos=True))
                else:
                    if role == "spilled":
                        victim.append([5, 6, 7])
                        victim.stats()
                    got = list(victim.generate(tokens, ignore_eos=True))
                if role == "spilled":
                    twin.append([5, 6, 7])
                    want = list(twin.generate(tokens, ignore_eos=True))
                    spilled_dropped = victim.stats()["counters"].get("dropped_blocks", 0)
                elif role == "streamed":
                    want = list(twin.stream(tokens, ignore_eos=True))
                else:
                    want = list(twin.generate(tokens, ignore_eos=True))
                same = got == want and victim.tokens() == twin.tokens()
                identical += same
                if not same:
                    differ.append(f"{role}: {got} != {want}")
            except Exception as exc:
                lost += 1
                errors.append(f"{role}: {_error(exc)}: {exc}")
        recover_s = time.monotonic() - died

        placed = []
        for _ in range(3):
            try:
                s = m.open_session()
                placed.append(s.backend)
                s.close()
            except Exception as exc:
                errors.append(f"placement: {_error(exc)}: {exc}")
        try:
            m.open_session(backend="w0")
            pinned_error = "none"
        except Exception as exc:
            pinned_error = f"{_error(exc)}: {exc}"
        status = m.status()
        closed = 0
        for victim, twin in pairs.values():
            for s in (victim, twin):
                try:
                    s.close()
                    closed += 1
                except Exception as exc:
                    errors.append(f"close: {_error(exc)}: {exc}")
        result: dict[str, Any] = {
            "scenario": "node death", "sessions": len(pairs), "sessions_lost": lost, "identical": identical,
            "recover_s": recover_s, "placed": placed, "open_on_lost": pinned_error, "closed": closed,
            "errors": errors, "differ": differ, "spilled_blocks_before": spilled_refs,
            "spilled_blocks_dropped": spilled_dropped,
            "lost_row": next((r for r in status["backends"] if r.get("backend") == "w0"), None),
            "view_backends": [r["backend"] for r in status["load"]["backends"]],
            "view_lost": status["load"].get("lost", {}),
            "session_backends": sorted(set(status["sessions"].values())),
            "directory": {role: status["sessions"].get(victim.session_id) for role, (victim, _) in pairs.items()},
            "handles": {role: victim.backend for role, (victim, _) in pairs.items()},
        }
    finally:
        if own:
            nodes.shutdown()
    if own:  # every store folder of the namespace removed, the dead node's included
        import platformdirs

        stores = Path(platformdirs.user_cache_dir("kvres")) / "coldstore"
        result["folders_left"] = sorted(p.name for p in stores.glob(f"{m.namespace}-*"))
    return result
