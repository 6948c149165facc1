"""Fault injection on real kvres actors: local Ray clusters whose actors a test kills with SIGKILL
(by the pid they report), whose cold-store files it damages, whose disk it fills.

Fixtures and helpers:
- ``faulty``: kvres on a local Ray cluster (llama backend "f0", OpenVINO backend "fov", a cold
  store with an 8 MiB RAM tier: blocks stay in RAM, so a killed store loses them).
- ``tight``: a second kvres on the same Ray cluster (its own namespace: planner, cold store,
  llama backend "t0") whose cold store has a tiny RAM tier and its disk tier on a tmpfs of
  ``TIGHT_DISK_BYTES`` mounted here (root is needed; without it the fixture fails and says why):
  every parked or spilled block goes to disk, and the disk can be filled for real.
- ``kill(handle)``; ``wait_restarted(handle, old_pid)`` and ``wait_parked(store, session_id)``
  (the fault benchmark's, ``benchmarks/faults/cluster.py``): a
  suspend hands its blocks to the store write-behind, so a test that kills the backend (whose
  stage holds them meanwhile) or damages the files waits for them to land first;
  ``store_folder(manager)``: the disk tier's folder of the manager's one cold store;
  ``logged(*needles)``: lines of the actors' logs (Ray's worker-*.err files) holding every needle.

The suite: test_actor_deaths (each actor killed between calls, mid-call, while sessions are
suspended), test_store_faults (the cold store killed during resume; corrupt, truncated, swapped and
forged block files), test_atomic_calls (a call that fails mid-append commits nothing, a full disk,
a repeated request id), test_inexact_recompute (a re-based streaming session rebuilt after a
death reports its divergence), test_folder_sweep (store folders an earlier
run left are removed), test_start_failures (a backend that cannot start: bounded attempts, the
engine's error from connect, add_backend, its sessions' calls and the status views; its own
local cluster, no fixture of this file); a worker node's death is tests/multinode/test_node_death.py, a head
restart tests/restarts/test_head_restart.py. 16 threads on 8 sequence slots, where sessions suspended to make
room come back by themselves on their next call, is
tests/host/test_concurrency.py::test_budget_holds_at_every_step_with_16_sessions_on_8_slots.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from benchmarks.faults.cluster import pid_of, sigkill, wait_parked, wait_restarted
from tests.conftest import shared_model_path

__all__ = ["kill", "only_store", "wait_parked", "wait_restarted"]

TIGHT_DISK_BYTES = 2 << 20  # the tmpfs under the tight cluster's disk tier


@pytest.fixture(scope="package")
def faulty(tmp_path_factory: pytest.TempPathFactory):
    import ray

    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    model = shared_model_path()
    config = KvresConfig(
        backends=[
            BackendConfig(name="f0", model_path=model, n_ctx=2048, n_seq_max=4, kv_budget_tokens=2000, n_threads=1,
                          kv_layout="unified",  # its sessions grow past 512 tokens and evict
                          max_room_wait_s=1.0),  # a call refused for room here is refused after 1 s of waiting
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


@pytest.fixture(scope="package")
def tight(faulty, tmp_path_factory: pytest.TempPathFactory):
    """Needs ``faulty`` for the Ray cluster it joins (as a second namespace)."""
    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    disk = tmp_path_factory.mktemp("tight-disk")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TIGHT_DISK_BYTES},mode=0700", "tmpfs", str(disk)],
        capture_output=True, text=True,
    )
    if mounted.returncode != 0:
        pytest.fail(
            f"the disk-full and damaged-file cases need a real small disk: `mount -t tmpfs` at {disk} failed "
            f"(exit {mounted.returncode}: {mounted.stderr.strip() or mounted.stdout.strip()}); it needs root or "
            f"CAP_SYS_ADMIN (this process runs as uid {os.getuid()})",
            pytrace=False,
        )
    try:
        model = shared_model_path()
        config = KvresConfig(
            backends=[BackendConfig(name="t0", model_path=model, n_ctx=2048, n_seq_max=8, kv_budget_tokens=2000,
                                    n_threads=1)],
            cold_store=ColdStoreConfig(ram_budget_bytes=4096, disk_budget_bytes=TIGHT_DISK_BYTES, disk_dir=disk),
        )
        mgr = connect(namespace=f"kvres-tight-{uuid.uuid4().hex[:8]}", config=config)
        try:
            yield mgr
        finally:
            mgr.shutdown()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def kill(handle: Any) -> int:
    """SIGKILL the worker process behind ``handle``; returns its pid."""
    pid = pid_of(handle)
    sigkill(pid)
    return pid


def only_store(manager: Any) -> Any:
    [store] = manager.cold_stores.values()
    return store


def store_folder(manager: Any) -> Path:
    """The disk tier's folder of the manager's one cold store (as ``SessionManager`` names it)."""
    [name] = manager.cold_stores
    folder = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{manager.namespace}-{name}")
    return Path(manager.config.cold_store.disk_dir) / folder


def logged(*needles: str, timeout_s: float = 20.0) -> list[str]:
    """Lines of the Ray workers' logs on this node that contain every one of ``needles`` (waits
    up to ``timeout_s`` for the first; an actor's log lines reach its file as it writes them)."""
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())  # the local cluster's log folder
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [line for path in logs.glob("worker-*.err")
                 for line in path.read_text(errors="replace").splitlines()
                 if all(n in line for n in needles)]
        if lines or time.monotonic() >= deadline:
            return lines
        time.sleep(0.2)
