"""The soak's cluster: a standing kvres cluster (``kvres start``) with ``kvres serve`` on it, and
the processes a fault kills.

Primitives:
- ``soak_config(model, disk_dir, ...) -> KvresConfig``: one llama backend "soak" (``n_seq_max``
  slots, fewer than the sessions the traffic keeps), sessions of a streaming policy that spills
  (``budget_tokens``: what a session keeps resident; the rest goes to the cold store), a cold store
  whose RAM tier is small (spilled and parked blocks reach its disk tier in ``disk_dir``).
- ``SoakCluster(config, folder, replicas=2, front=None)``: ``start()`` runs ``kvres start`` (a Ray
  head on a free port with its own temp folder and the dashboard, whose state API names the actors'
  pids; tried twice: on a loaded machine the head can time out starting) and ``kvres serve --address
  ... --front FRONT --detach`` on a free port of 127.0.0.1 (``front``: kvres serve's default where
  None, ``launch.default_front``; "local": the front inside the backend's process; "direct":
  ``replicas`` front actors; "serve": Serve's replicas and HTTP proxy), both as a user runs them,
  and waits until the API answers; ``base_url``,
  ``model_id``, ``healthy()``; ``stop()`` (``kvres stop --ray``: kvres's actors, then the head's
  processes; its temp folder removed).
- ``FAULTS``: the six kinds of fault: "backend", "coldstore", "planner" (kvres's actors),
  "replica", "proxy" (Serve's; of the direct front, which is both in one process: the first front
  and the last), "state" (the serve state actor); ``faults_of(front)``: those a front has (the
  local front has no process of its own: a backend's fault is its front's).
- ``SoakCluster.pid_of(kind) -> int``: the process of one live actor of that kind, from Ray's state
  API (``ray.util.state.list_actors``); ``kill(kind) -> (pid, monotonic time)``: SIGKILL of it.
- ``SoakCluster.processes() -> list[int]``: every process of the head (``head_processes``: the GCS,
  the raylet, the dashboard and its agents, every worker: kvres's actors, Serve's controller, proxy
  and replicas).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.peers import free_port
from kvres.cluster.serve.direct_front import front_actor_name
from kvres.cluster.serve.launch import default_front

FAULTS = ("backend", "coldstore", "planner", "replica", "state", "proxy")
FRONT_FAULTS = ("replica", "proxy")
BACKEND = "soak"
START_TIMEOUT_S = 600.0


def faults_of(front: str) -> tuple[str, ...]:
    """The kinds of fault the soak makes on ``front`` (``launch.FRONTS``)."""
    return tuple(k for k in FAULTS if k not in FRONT_FAULTS) if front == "local" else FAULTS


def soak_config(model: Path, disk_dir: Path, slots: int = 8, kv_budget_tokens: int = 2048, n_ctx: int = 4096,
                session_budget_tokens: int = 192, threads: int = 1, cold_ram_bytes: int = 1 << 20) -> Any:
    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, SessionPolicy

    return KvresConfig(
        backends=[BackendConfig(name=BACKEND, model_path=model, n_ctx=n_ctx, n_seq_max=slots,
                                kv_budget_tokens=kv_budget_tokens, n_threads=threads)],
        cold_store=ColdStoreConfig(ram_budget_bytes=cold_ram_bytes, disk_budget_bytes=256 << 20, disk_dir=disk_dir),
        default_policy=SessionPolicy.streaming(budget_tokens=session_budget_tokens, spill=True),
    )


def _kvres() -> str:
    return str(Path(sys.executable).parent / "kvres")


def _run(command: list[str], timeout_s: float) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "KVRES_CONFIG")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:2])} failed (exit {done.returncode}): "
                           f"{(done.stderr + done.stdout)[-3000:]}")
    return done.stdout


class SoakCluster:
    def __init__(self, config: Any, folder: Path, replicas: int = 2, num_cpus: int = 2,
                 front: str | None = None) -> None:
        self.config, self.folder, self.replicas, self.num_cpus = config, folder, replicas, num_cpus
        self.front = front or default_front()
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.http_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.http_port}"
        self.namespace = f"kvres-soak-{uuid.uuid4().hex[:6]}"
        self.temp_dir = tempfile.mkdtemp(prefix="kvsoak-")  # short: Ray's socket paths must fit 107 bytes
        self.model_id = ""
        self.started = False

    def start(self, attempts: int = 2) -> SoakCluster:
        """Started; ``kvres start`` once more where its Ray head timed out starting (on a loaded
        machine the raylet can miss its deadline), on other ports, after stopping what it left."""
        from kvres.cluster.standing import stop_head

        self.started = True
        for attempt in range(attempts):
            try:
                _run([_kvres(), "start", f"--port={self.port}", f"--namespace={self.namespace}",
                      f"--config={self.config.model_dump_json()}", f"--num-cpus={self.num_cpus}",
                      f"--temp-dir={self.temp_dir}"], START_TIMEOUT_S)
                break
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                with contextlib.suppress(Exception):
                    stop_head(self.address)
                if attempt + 1 == attempts:
                    raise
                print(f"soak: kvres start failed, once more: {str(exc)[-300:]}", flush=True)
                self.port = free_port()
                self.address = f"127.0.0.1:{self.port}"
        _run([_kvres(), "serve", f"--address={self.address}", f"--namespace={self.namespace}",
              f"--port={self.http_port}", f"--front={self.front}", f"--min-replicas={self.replicas}",
              f"--max-replicas={self.replicas}", "--detach"], START_TIMEOUT_S)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvres serve answers no /v1/models at {self.base_url} after {START_TIMEOUT_S:.0f} s")
            time.sleep(1.0)
        return self

    def healthy(self, timeout_s: float = 10.0) -> bool:
        """The API answers (``/v1/models``: through the proxy to a replica)."""
        import httpx

        try:
            r = httpx.get(f"{self.base_url}/v1/models", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        if r.status_code != 200:
            return False
        self.model_id = self.model_id or str(r.json()["data"][0]["id"])
        return True

    # -- the actors and their processes ---------------------------------------------------------
    def _actors(self) -> list[Any]:
        from ray.util.state import list_actors

        from kvres.cluster.ray_auth import follow_local_token

        follow_local_token()  # the head speaks Ray's token authentication where this machine has a token
        return list(list_actors(address=self.address, filters=[("state", "=", "ALIVE")], limit=10_000,
                                raise_on_missing_output=False))

    def _is(self, kind: str, actor: Any) -> bool:
        name, cls, namespace = actor.name or "", actor.class_name or "", actor.ray_namespace or ""
        if kind == "backend":
            return name == f"kvres-backend-{BACKEND}" and namespace == self.namespace
        if kind == "coldstore":
            return name.startswith("kvres-coldstore-") and namespace == self.namespace
        if kind == "planner":
            return name == "kvres-planner" and namespace == self.namespace
        if kind == "state":
            return name == "kvres-serve-state" and namespace == self.namespace
        if kind in FRONT_FAULTS and kind not in faults_of(self.front):
            raise ValueError(f"the {self.front} front has no {kind} of its own; its faults are {faults_of(self.front)}")
        # the direct front is proxy and replica in one process: a "replica" fault kills the first
        # front, a "proxy" fault the last (the same one where there is one)
        if kind == "replica":
            return cls.startswith("ServeReplica:kvres:") or (
                cls == "FrontServer" and name == front_actor_name(0) and namespace == self.namespace)
        if kind == "proxy":
            return cls == "ProxyActor" or (
                cls == "FrontServer" and name == front_actor_name(self.replicas - 1) and namespace == self.namespace)
        raise ValueError(f"unknown fault {kind!r}; one of {FAULTS}")

    def pid_of(self, kind: str, timeout_s: float = 120.0) -> int:
        """The pid of a live actor of ``kind`` (waiting while none is alive: one restarting)."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while True:
            try:
                pids = sorted(int(a.pid) for a in self._actors() if self._is(kind, a) and a.pid)
                if pids:
                    return pids[0]
            except Exception as exc:  # the state API itself may time out on a loaded machine: asked again
                last = exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"no live {kind} actor found within {timeout_s:.0f} s"
                                   + (f" (last error: {type(last).__name__}: {last})" if last else ""))
            time.sleep(1.0)

    def kill(self, kind: str) -> tuple[int, float]:
        pid = self.pid_of(kind)
        os.kill(pid, signal.SIGKILL)
        return pid, time.monotonic()

    def processes(self) -> list[int]:
        from kvres.cluster.standing import head_processes

        return head_processes(self.port)

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        try:
            _run([_kvres(), "stop", f"--address={self.address}", f"--namespace={self.namespace}", "--ray"], 300.0)
        except Exception as exc:  # the head's processes go anyway, below
            print(f"kvres stop: {exc}", flush=True)
            from kvres.cluster.standing import stop_head

            with contextlib.suppress(Exception):
                stop_head(self.address)
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # the head's logs and sockets

    def __enter__(self) -> SoakCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
