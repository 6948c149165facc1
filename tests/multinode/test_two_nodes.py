"""Two raylets on one machine (ray.cluster_utils.Cluster): a cold store per node, and a session
that migrates from a backend on one node to a backend on the other."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import shared_model_path

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
