"""What the operator scripts share: Debian packages on demand, and a live kvres cluster with traffic.

Primitives:
- ``ensure_binary(binary, package) -> str``: the binary's path, installing the Debian package with
  ``apt-get`` first when it is missing (``apt-get update`` once before).
- ``free_port() -> int``.
- ``start_cluster(namespace, metrics_port, **ray_init) -> SessionManager``: a local Ray cluster with
  kvres on the project's passkey model: ``backend-0`` (room for everything) and ``small`` (four
  sequence slots, 320 tokens, so sessions get suspended to make room).
- ``drive(manager) -> dict``: traffic that moves every number the Grafana dashboard shows: a
  streaming session grown past its budget (evictions, spills), suspended and resumed (recalls), two
  sessions on ``small`` (one suspended to make room), generated tokens. The sessions stay open;
  returns them by role with how many tokens were generated.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "passkey.gguf"
PROMPT = [3 + (i * 7) % 120 for i in range(200)]  # token ids inside the passkey vocabulary


def ensure_binary(binary: str, package: str) -> str:
    found = shutil.which(binary)
    if found:
        return found
    print(f"installing the Debian package {package!r} (for {binary!r}) with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", package], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    found = shutil.which(binary)
    if not found:
        raise SystemExit(f"{package!r} installed, but no {binary!r} on PATH")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster(namespace: str, metrics_port: int, **ray_init: Any) -> Any:
    os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")  # noqa: SIM112 (Ray's own name)
    from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

    config = KvresConfig(
        backends=[
            BackendConfig(name="backend-0", model_path=MODEL, n_ctx=2048, n_seq_max=6, kv_budget_tokens=2000,
                          n_threads=1),
            BackendConfig(name="small", model_path=MODEL, n_ctx=1024, n_seq_max=4, kv_budget_tokens=320,
                          n_threads=1),
        ],
        cold_store=ColdStoreConfig(ram_budget_bytes=256 << 10, disk_budget_bytes=64 << 20),
    )
    return connect(namespace=namespace, config=config, _metrics_export_port=metrics_port, **ray_init)


def drive(manager: Any) -> dict[str, Any]:
    from kvres.cluster import SessionPolicy

    streaming = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32), backend="backend-0",
                                     session_id="ops-streaming")
    streaming.append(PROMPT)
    generated = len(streaming.generate(96))
    streaming.suspend()
    streaming.resume()
    generated += len(streaming.generate(32))
    scored = manager.open_session(policy=SessionPolicy.scored(128, scorer="snapkv", recent_tokens=32),
                                  backend="backend-0", session_id="ops-snapkv")
    scored.append(PROMPT)
    generated += len(scored.generate(48))
    idle = manager.open_session(backend="small", session_id="ops-idle")
    idle.append(PROMPT[:180])
    busy = manager.open_session(backend="small", policy=SessionPolicy.streaming(200, recent_tokens=32),
                                session_id="ops-busy")
    busy.append(PROMPT[:150])
    return {"sessions": [streaming, scored, idle, busy], "generated_tokens": generated,
            "prompt_tokens": 2 * len(PROMPT) + 180 + 150}
