"""The cluster a fault benchmark runs on, and the faults it injects.

Primitives:
- ``FaultCluster(model, disk_dir, tmpfs=False)``: a fresh local Ray cluster with kvres on it (one llama
  backend "bench", one cold store whose RAM tier is tiny, so parked and spilled blocks go to
  its disk tier in ``disk_dir``); ``manager``, ``backend``, ``store``, ``planner`` (handles),
  ``shutdown()``.
- ``pid_of(handle)``, ``sigkill(pid) -> float`` (the monotonic time of the kill),
  ``wait_restarted(handle, old_pid)``, ``wait_parked(store, session_id) -> keys``.
- ``block_files(cluster, session_id)``; ``damage(path, how, other=None)`` with ``how`` one of
  ``DAMAGES``: "corrupt" (a payload byte flipped), "truncated", "forged" (payload altered and the
  block re-encoded with right checksums under another key), "swapped" (two sessions' files
  exchanged).
- ``TmpfsDisk(size)``: a context manager mounting a tmpfs (root only) for a disk that can fill;
  ``fill(folder)`` fills it with a ballast file.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

N_SEQ_MAX = 8
KV_BUDGET = 2000
DAMAGES = ("corrupt", "truncated", "forged", "swapped")


class FaultCluster:
    def __init__(self, model: str, disk_dir: Path, tmpfs: bool = False) -> None:
        import ray

        from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

        config = KvresConfig(
            backends=[BackendConfig(name="bench", model_path=model, n_ctx=2048, n_seq_max=N_SEQ_MAX,
                                    kv_budget_tokens=KV_BUDGET, n_threads=1,
                                    max_room_wait_s=1.0)],  # append_past_budget waits that long, then is refused
            cold_store=ColdStoreConfig(ram_budget_bytes=4096, disk_budget_bytes=64 << 20, disk_dir=disk_dir),
        )
        if ray.is_initialized():
            ray.shutdown()
        self.manager = connect(namespace=f"kvres-bench-faults-{uuid.uuid4().hex[:6]}", config=config,
                               num_cpus=2, include_dashboard=False)
        self.disk_dir = disk_dir
        self.tmpfs = tmpfs  # disk_dir is a tmpfs of its own (that a scenario may fill)

    @property
    def backend(self) -> Any:
        return self.manager.backend_handle("bench")

    @property
    def store(self) -> Any:
        [store] = self.manager.cold_stores.values()
        return store

    @property
    def planner(self) -> Any:
        return self.manager.planner

    def store_folder(self) -> Path:
        [name] = self.manager.cold_stores
        return self.disk_dir / re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.manager.namespace}-{name}")

    def shutdown(self) -> None:
        import ray

        self.manager.shutdown()
        ray.shutdown()


def pid_of(handle: Any) -> int:
    import ray

    return int(ray.get(handle.pid.remote()))


def sigkill(pid: int) -> float:
    os.kill(pid, signal.SIGKILL)
    return time.monotonic()


def wait_restarted(handle: Any, old_pid: int, timeout_s: float = 180.0) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if int(ray.get(handle.pid.remote(), timeout=10)) != old_pid:
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"actor did not restart within {timeout_s} s")


def wait_parked(store: Any, session_id: str, timeout_s: float = 30.0) -> list[Any]:
    """The keys of the session's blocks once the store holds them (a suspend hands them over
    write-behind; one write brings them all)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            keys = list(ray.get(store.list_session.remote(session_id)))
        except ray.exceptions.RayActorError:
            keys = []  # restarting after an earlier kill: ask again
        if keys:
            return keys
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no block of {session_id!r} reached the cold store in {timeout_s} s")
        time.sleep(0.05)


def block_files(cluster: FaultCluster, session_id: str) -> list[Path]:
    return sorted((cluster.store_folder() / "blocks" / session_id).glob("*.kvb"))


def damage(path: Path, how: str, other: Path | None = None) -> None:
    data = path.read_bytes()
    if how == "corrupt":
        flipped = bytearray(data)
        flipped[-1 - len(data) // 4] ^= 0xFF
        path.write_bytes(bytes(flipped))
    elif how == "truncated":
        os.truncate(path, len(data) // 2)
    elif how == "forged":
        from kvres.coldstore import encode_block, new_secret
        from kvres.coldstore.codec import decode_head

        header, offset = decode_head(data)
        payload = bytearray(data[offset:])
        payload[len(payload) // 2] ^= 0x5A
        path.write_bytes(encode_block(replace(header.block, payload=bytes(payload)), new_secret()))
    elif how == "swapped":
        if other is None:
            raise ValueError("swapping needs the other file")
        path.write_bytes(other.read_bytes())
        other.write_bytes(data)
    else:
        raise ValueError(f"unknown damage {how!r}; one of {DAMAGES}")


class TmpfsDisk:
    """A tmpfs of ``size`` bytes mounted on a fresh private folder (``path``) while in use."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.path = Path(tempfile.mkdtemp(prefix="kvres-bench-faults-"))

    def __enter__(self) -> TmpfsDisk:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0700", "tmpfs", str(self.path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            self.path.rmdir()
            raise OSError(f"mount -t tmpfs failed ({done.stderr.strip() or done.returncode}); it needs root")
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        self.path.rmdir()


def fill(folder: Path) -> Path:
    """Write a ballast file into ``folder`` until its file system is full; returns the file."""
    ballast = folder / "ballast"
    chunk = b"\0" * (64 << 10)
    with open(ballast, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return ballast
