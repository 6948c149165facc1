"""A real ``kvres serve`` for the package: an embedded Ray cluster, kvres's actors and Serve's HTTP
proxy on a free port of 127.0.0.1, two replicas, started as a subprocess with an API key, stopped at
the end.

The model is the project's default one (``default_model_path()``, the trained chat model) when it has
a chat template; else a small random-weight llama written with ``benchmarks.realistic_model`` and
its ``CHAT_TEMPLATE``; ``KVRES_SERVE_TEST_MODEL`` names another.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO_ROOT, free_port

START_TIMEOUT_S = 240.0


TENANT = "acme"  # the label of the server's second key
TENANT_QUOTA = 400  # the resident tokens its sessions may hold together on b0


def served_model_path(folder: Path) -> Path:
    from kvres.actors.chat_source import read_chat_template
    from kvres.actors.default_model import default_model_path

    if os.environ.get("KVRES_SERVE_TEST_MODEL"):  # another GGUF with a chat template, to check against
        return Path(os.environ["KVRES_SERVE_TEST_MODEL"])
    default = default_model_path()
    if read_chat_template(default) is not None:
        return default
    from benchmarks.realistic_model import CHAT_TEMPLATE, ModelShape, write_realistic_model

    shape = ModelShape(n_layer=2, n_embd=64, n_head=2, n_head_kv=1, n_ff=128, n_vocab=2000, context_length=4096)
    return write_realistic_model(folder / "chat-small.gguf", shape, chat_template=CHAT_TEMPLATE)


@dataclass
class Server:
    base: str
    key: str
    model: str
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)
    tenant_key: str = ""  # a second key, of tenant TENANT (whose resident quota is TENANT_QUOTA)

    @property
    def v1(self) -> str:
        return f"{self.base}/v1"

    def headers(self, **more: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", **more}

    def client(self, **options: object):  # an openai.OpenAI
        import openai

        return openai.OpenAI(base_url=self.v1, api_key=self.key, max_retries=0, timeout=120, **options)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers=self.headers(), timeout=120)

    def log(self) -> str:
        return "".join(self.output[-200:])


def _read_output(process: subprocess.Popen[str], sink: list[str], ready: threading.Event) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        sink.append(line)
        if line.startswith("kvres serve: listening on"):
            ready.set()
    ready.set()


def served_front() -> str:
    """The front ``kvres serve`` runs here without ``--front`` (``KVRES_SERVE_FRONT``, else its default)."""
    from kvres.cluster.serve.launch import default_front

    return default_front()


def start_server(folder: Path, port: int, key: str | None, extra_env: dict[str, str] | None = None,
                 tenant_key: str | None = None, config: dict[str, Any] | None = None, replicas: int = 2,
                 backends: list[dict[str, object]] | None = None, args: list[str] | None = None) -> Server:
    """``config``: the KvresConfig to serve (its ``model_path`` fields unset: the served model);
    by default one backend ``b0`` with a quota for ``TENANT``, or ``backends`` in its place (each of
    the served model when it names none); ``args``: more ``kvres serve`` arguments."""
    model = served_model_path(folder)
    config = config or {
        "backends": backends or [{"name": "b0", "n_ctx": 2048, "n_seq_max": 8, "kv_budget_tokens": 2000,
                                  "n_threads": 1, "tenant_quotas": {TENANT: {"resident_tokens": TENANT_QUOTA}}}],
    }
    backends = [{"model_path": str(model), **backend} for backend in config["backends"]]
    config = {"cold_store": {"ram_budget_bytes": 16 << 20, "disk_budget_bytes": 64 << 20,
                             "disk_dir": str(folder / "coldstore")}, **config, "backends": backends}
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "KVRES_CONFIG", "KVRES_API_KEY_FILE")}
    keys = (key or "") + (f", {tenant_key} tenant={TENANT}" if key and tenant_key else "")
    env.update({"KVRES_API_KEYS": keys, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})})
    command = [sys.executable, "-m", "kvres.cluster.cli", "serve", "--config", json.dumps(config), "--port", str(port),
               "--num-cpus", "2", "--min-replicas", str(replicas), "--max-replicas", str(replicas), "--namespace", f"kvres-serve-test-{secrets.token_hex(4)}",
               *(args or [])]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", key or "", model.name.removesuffix(".gguf"), process,
                    tenant_key=tenant_key or "")
    ready = threading.Event()
    threading.Thread(target=_read_output, args=(process, server.output, ready), daemon=True).start()
    if not ready.wait(START_TIMEOUT_S) or process.poll() is not None:
        stop_server(server)
        pytest.fail(f"kvres serve did not start within {START_TIMEOUT_S:.0f} s:\n{server.log()}", pytrace=False)
    return server


def stop_server(server: Server) -> None:
    process = server.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the group this test started, nothing else
            process.wait(timeout=30)


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve")
    srv = start_server(folder, free_port(), key=f"test-key-{secrets.token_hex(16)}",
                       tenant_key=f"tenant-key-{secrets.token_hex(16)}")
    wait_healthy(srv)
    yield srv
    stop_server(srv)


def wait_healthy(srv: Server, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:  # the proxy answers once the application is up; a replica may still be warming
        try:
            if httpx.get(f"{srv.base}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_server(srv)
            pytest.fail(f"kvres serve answers no /health:\n{srv.log()}", pytrace=False)
        time.sleep(0.5)
