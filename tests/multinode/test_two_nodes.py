"""Two raylets on one machine (ray.cluster_utils.Cluster): a cold store per node, a session that
migrates from a backend on one node to a backend on the other, and ``kvres serve``'s front inside the
backends refused on a node with none."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid

import pytest

from tests.conftest import REPO_ROOT, free_port, shared_model_path

PROMPT = list(range(3, 203))


@pytest.fixture(scope="module")
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_cold_store_per_node_and_cross_node_migration(two_nodes) -> None:
    import ray

    from kvres.cluster import BackendConfig, KvresConfig, SessionPolicy, connect

    ray.init(address=two_nodes.address, log_to_driver=False)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2
    model = shared_model_path()
    config = KvresConfig(backends=[
        BackendConfig(name=f"n{i}", model_path=model, n_ctx=1024, kv_budget_tokens=1000, n_threads=1,
                      node_id=node)
        for i, node in enumerate(nodes)
    ])
    manager = connect(namespace=f"kvres-2n-{uuid.uuid4().hex[:6]}", config=config)
    try:
        placed = {}
        for name, handle in manager.cold_stores.items():
            placed[name] = ray.get(
                handle.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id())
            )
        assert sorted(placed.values()) == sorted(nodes)  # one cold store on each node
        backend_nodes = {s["backend"]: s["node_id"] for s in manager.status()["backends"]}
        assert backend_nodes == {"n0": nodes[0], "n1": nodes[1]}

        policy = SessionPolicy.streaming(160, recent_tokens=32)
        ref = manager.open_session(policy=policy, backend="n0")
        moving = manager.open_session(policy=policy, backend="n0")
        for s in (ref, moving):
            s.append(PROMPT)
        expected = ref.generate(40)
        moving.migrate("n1")
        assert moving.backend == "n1"
        assert moving.stats()["resident_tokens"] > 0
        assert moving.generate(40) == expected
    finally:
        manager.shutdown()


def test_a_local_front_refuses_to_start_where_no_backend_runs_on_its_node(two_nodes) -> None:
    """``kvres serve`` (its default front listens in the backends' processes) on a node without a
    backend: it fails naming the backends and what to do, rather than print an address nothing
    listens on."""
    import ray

    from kvres.cluster import BackendConfig, KvresConfig

    if not ray.is_initialized():
        ray.init(address=two_nodes.address, log_to_driver=False)
    here = ray.get_runtime_context().get_node_id()
    elsewhere = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)
    config = KvresConfig(backends=[BackendConfig(name="far", model_path=shared_model_path(), n_ctx=512,
                                                 kv_budget_tokens=400, n_threads=1, node_id=elsewhere)])
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KVRES_SERVE_FRONT"}
    out = subprocess.run([sys.executable, "-m", "kvres.cluster.cli", "serve", "--address", two_nodes.address,
                          "--namespace", f"kvres-far-{uuid.uuid4().hex[:6]}", "--config", config.model_dump_json(),
                          "--port", str(port)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0, out.stdout[-2000:]
    assert "none of them (far) runs on this node" in out.stderr and "--front direct" in out.stderr, out.stderr[-2000:]
    assert "listening on" not in out.stdout
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # nothing was left listening there
