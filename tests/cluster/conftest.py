"""A local Ray cluster with kvres on the real llama engine (stories260K), shared by a module."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.conftest import free_port, shared_model_path

TENANT_RESIDENT_QUOTA = 70  # b0's quota for tenant "acme" (tests/cluster/test_retention.py)


@pytest.fixture(scope="package")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="package")
def manager(metrics_port: int, tmp_path_factory: pytest.TempPathFactory):
    import ray

    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, TenantQuota, connect

    os.environ["RAY_metrics_report_interval_ms"] = "500"  # noqa: SIM112 (Ray reads this exact name)
    os.environ["KVRES_METRICS_PER_SESSION"] = "1"  # test_sessions / test_cli read per-session series
    model = shared_model_path()
    config = KvresConfig(
        backends=[
            BackendConfig(name="b0", model_path=model, n_ctx=2048, n_seq_max=6, kv_budget_tokens=2000, n_threads=1,
                          tenant_quotas={"acme": TenantQuota(resident_tokens=TENANT_RESIDENT_QUOTA)}),
            BackendConfig(name="b1", model_path=model, n_ctx=2048, n_seq_max=6, kv_budget_tokens=2000, n_threads=1),
            BackendConfig(name="small", model_path=model, n_ctx=1024, n_seq_max=4, kv_budget_tokens=320, n_threads=1),
            BackendConfig(name="ov", engine="openvino", model_path=model, n_ctx=2048, kv_budget_tokens=2000,
                          n_threads=1),
            BackendConfig(name="genai", engine="openvino-genai", model_path=model, n_ctx=2048,
                          kv_budget_tokens=2000, n_threads=1),
            BackendConfig(name="ov-recompute", engine="openvino", openvino_mode="recompute",
                          model_path=model, n_ctx=2048, kv_budget_tokens=2000, n_threads=1),
        ],
        cold_store=ColdStoreConfig(ram_budget_bytes=8 << 20, disk_budget_bytes=64 << 20,
                                   disk_dir=tmp_path_factory.mktemp("coldstore")),
    )
    if ray.is_initialized():
        ray.shutdown()
    mgr = connect(namespace=f"kvres-test-{uuid.uuid4().hex[:8]}", config=config, num_cpus=2,
                  include_dashboard=False, _metrics_export_port=metrics_port)
    yield mgr
    mgr.shutdown()
    ray.shutdown()
