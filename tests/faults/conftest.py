"""A local Ray cluster whose kvres actors a test kills with SIGKILL (by the pid they report)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Any

import pytest

from tests.conftest import shared_model_path


@pytest.fixture(scope="package")
def faulty(tmp_path_factory: pytest.TempPathFactory):
    import ray

    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    model = shared_model_path()
    config = KvresConfig(
        backends=[
            BackendConfig(name="f0", model_path=model, n_ctx=2048, n_seq_max=4, kv_budget_tokens=2000, n_threads=1),
            BackendConfig(name="fov", engine="openvino", model_path=model, n_ctx=2048, kv_budget_tokens=2000,
                          n_threads=1),
        ],
        cold_store=ColdStoreConfig(ram_budget_bytes=8 << 20, disk_budget_bytes=64 << 20,
                                   disk_dir=tmp_path_factory.mktemp("faults-coldstore")),
    )
    if ray.is_initialized():
        ray.shutdown()
    mgr = connect(namespace=f"kvres-faults-{uuid.uuid4().hex[:8]}", config=config, num_cpus=2,
                  include_dashboard=False)
    yield mgr
    mgr.shutdown()
    ray.shutdown()


def kill(handle: Any) -> int:
    """SIGKILL the worker process behind ``handle``; returns its pid."""
    import ray

    pid = int(ray.get(handle.pid.remote()))
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_restarted(handle: Any, old_pid: int, timeout_s: float = 120.0) -> None:
    """Wait until the actor answers from a new process (Ray restarted it)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if int(ray.get(handle.pid.remote(), timeout=10)) != old_pid:
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError(f"actor did not restart within {timeout_s} s")
