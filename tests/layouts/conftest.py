"""A local Ray cluster with llama backends on stories260K: the unified KV layout and the split one
(a stream per session; "split8" has 8 sessions, and so a spare stream), and "auto", whose layout
kvres chooses from its sizes (split), shared by the package."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import shared_model_path


@pytest.fixture(scope="package")
def manager(tmp_path_factory: pytest.TempPathFactory):
    import ray

    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    model = shared_model_path()
    config = KvresConfig(
        backends=[
            BackendConfig(name="unified", model_path=model, n_ctx=1024, n_seq_max=4, kv_budget_tokens=1000,
                          n_threads=1),
            BackendConfig(name="split", model_path=model, n_ctx=1024, n_seq_max=4, kv_budget_tokens=1000,
                          n_threads=1, kv_layout="split"),  # 256 cells a session
            BackendConfig(name="split8", model_path=model, n_ctx=2048, n_seq_max=8, kv_budget_tokens=2000,
                          n_threads=1, kv_layout="split"),  # 8 sessions: a spare stream to move them through
            BackendConfig(name="auto", model_path=model, n_ctx=2048, n_seq_max=4, kv_budget_tokens=512,
                          n_threads=1),  # the layout left to kvres: 4 sessions of 512 tokens, split
        ],
        cold_store=ColdStoreConfig(ram_budget_bytes=8 << 20, disk_budget_bytes=64 << 20,
                                   disk_dir=tmp_path_factory.mktemp("coldstore")),
    )
    if ray.is_initialized():
        ray.shutdown()
    mgr = connect(namespace=f"kvres-layouts-{uuid.uuid4().hex[:8]}", config=config, num_cpus=2,
                  include_dashboard=False)
    yield mgr
    mgr.shutdown()
    ray.shutdown()
