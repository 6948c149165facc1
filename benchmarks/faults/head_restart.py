"""The Ray head of a standing kvres cluster restarts: with GCS fault tolerance every session goes
on; without it the user is told, and nothing is left on disk.

Primitives:
- ``Redis()``: Debian's ``redis-server`` on a free localhost port, no persistence to disk (a
  context manager; ``address``). ``redis_server()``: its path, or None.
- ``StandingHead(model, tmp, fault_tolerance)``: a head started by ``kvres start`` (the command
  line, with ``--gcs-redis`` or ``--gcs-storage``) on a free port with its own temp dir (``fault_tolerance``: "redis", "rocksdb"
  or None), kvres's actors on it (one unpinned backend "b0", cold blocks under ``tmp``);
  ``restart() -> float`` (the head's processes stopped, ``stop_head``, then started again the same
  way, with the same Redis or RocksDB folder; returns the seconds that took), ``connect()`` (this
  process as a driver, its ``SessionManager``), ``disconnect()``, ``stop()``.
- ``head_restart(model, fault_tolerance, tmp, prompt=120, tokens=16) -> dict``: the scenario:
  sessions, one live and one suspended, each with a twin that is closed before the restart (its
  greedy tokens kept); after the restart each session is asked for the same tokens. The answer:
  sessions, sessions_lost, identical, recover_s (the restart's start to the last answer), the
  errors met, and the store folders left on disk after the next start.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def redis_server() -> str | None:
    return shutil.which("redis-server") or (("/usr/bin/redis-server") if Path("/usr/bin/redis-server").exists() else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    def __init__(self) -> None:
        binary = redis_server()
        if binary is None:
            raise RuntimeError("no redis-server: install it (apt-get install -y redis-server)")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.proc.kill()
                    raise
                time.sleep(0.1)

    def __enter__(self) -> Redis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class StandingHead:
    def __init__(self, model: str, tmp: Path, fault_tolerance: str | None, redis: str | None = None) -> None:
        from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig

        self.tmp = tmp
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.namespace = f"kvres-hr-{uuid.uuid4().hex[:6]}"
        self.temp_dir = tempfile.mkdtemp(prefix="kvhr-")  # short: Ray's socket paths must fit 107 bytes
        self.disk_dir = tmp / "blocks"
        self.options: dict[str, Any] = {}
        if fault_tolerance == "redis":
            self.options["gcs_redis"] = redis
        elif fault_tolerance == "rocksdb":
            self.options["gcs_storage_path"] = str(tmp / "gcs")
        self.config = KvresConfig(
            backends=[BackendConfig(name="b0", model_path=model, n_ctx=2048, n_seq_max=8, kv_budget_tokens=2000,
                                    n_threads=1)],
            cold_store=ColdStoreConfig(ram_budget_bytes=4096, disk_budget_bytes=64 << 20, disk_dir=self.disk_dir),
        )
        self.start()

    def start(self) -> None:
        """``kvres start`` as a user runs it (its ``--gcs-redis`` / ``--gcs-storage`` options)."""
        import sys

        command = [str(Path(sys.executable).parent / "kvres"), "start", f"--port={self.port}",
                   f"--namespace={self.namespace}", f"--config={self.config.model_dump_json()}", "--num-cpus=2",
                   f"--temp-dir={self.temp_dir}", "--ray-arg=--include-dashboard=false"]
        if "gcs_redis" in self.options:
            command.append(f"--gcs-redis={self.options['gcs_redis']}")
        if "gcs_storage_path" in self.options:
            command.append(f"--gcs-storage={self.options['gcs_storage_path']}")
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kvres start failed (exit {done.returncode}): {(done.stderr or done.stdout)[-2000:]}")

    def connect(self) -> Any:
        import ray

        from kvres.cluster import connect

        if ray.is_initialized():
            ray.shutdown()
        return connect(address=self.address, namespace=self.namespace)

    def disconnect(self) -> None:
        import ray

        ray.shutdown()

    def stop_ray(self) -> None:
        from kvres.cluster.standing import stop_head

        stop_head(self.address)

    def restart(self) -> float:
        t0 = time.monotonic()
        self.disconnect()
        self.stop_ray()
        self.start()
        return time.monotonic() - t0

    def stop(self) -> None:
        import contextlib

        self.disconnect()
        with contextlib.suppress(Exception):
            self.stop_ray()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _folders(disk_dir: Path) -> list[str]:
    return sorted(p.name for p in disk_dir.iterdir() if p.is_dir()) if disk_dir.exists() else []


def head_restart(model: str, fault_tolerance: str | None, tmp: Path, prompt: int = 120,
                 tokens: int = 16) -> dict[str, Any]:
    from kvres.cluster import SessionPolicy  # noqa: F401  (the default policy: recompute is exact)

    from .cluster import wait_parked

    with Redis() if fault_tolerance == "redis" else _Nothing() as redis:
        head = StandingHead(model, tmp, fault_tolerance, getattr(redis, "address", None))
        errors: list[str] = []
        try:
            m = head.connect()
            words = list(range(3, 3 + prompt))
            want: dict[str, list[int]] = {}
            ids = []
            for role in ("live", "suspended"):
                s, twin = m.open_session(), m.open_session()
                for x in (s, twin):
                    x.append(words)
                    x.generate(4)
                want[s.session_id] = list(twin.generate(tokens, ignore_eos=True))
                twin.close()
                if role == "suspended":
                    s.suspend()
                    [store] = m.cold_stores.values()
                    wait_parked(store, s.session_id)
                ids.append(s.session_id)
            before = _folders(head.disk_dir)
            restart_s = head.restart()
            t0 = time.monotonic() - restart_s
            m = head.connect()
            identical = lost = 0
            for sid in ids:
                try:
                    got = list(m.session(sid).generate(tokens, ignore_eos=True))
                    identical += got == want[sid]
                except Exception as exc:
                    lost += 1
                    errors.append(f"{sid}: {type(exc).__name__}: {exc}")
            recover_s = time.monotonic() - t0
            after = _folders(head.disk_dir)
            for sid in ids:
                if not lost:
                    m.session(sid).close()
            return {"scenario": f"head restart ({fault_tolerance or 'no'} GCS FT)", "sessions": len(ids),
                    "sessions_lost": lost, "identical": identical, "recover_s": recover_s,
                    "restart_s": restart_s, "errors": errors, "folders_before": before, "folders_after": after}
        finally:
            head.stop()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":  # a quick look: python -m benchmarks.faults.head_restart [redis|rocksdb|none]
    import json
    import sys

    from .__main__ import SHARED_MODEL

    kind = sys.argv[1] if len(sys.argv) > 1 else "redis"
    with tempfile.TemporaryDirectory() as d:
        print(json.dumps(head_restart(str(SHARED_MODEL), None if kind == "none" else kind, Path(d)), indent=1))
    os._exit(0)
