"""A detached ``kvres serve`` on a standing cluster, stopped as an operator would, with real processes.

``kvres status`` without an address finds the cluster ``ray start`` recorded in Ray's folder and
names it; every kvres actor's repr reads, the front's state actor's included.

``kvres serve --stop`` removes only the HTTP application (its port closes; kvres's actors and the
sessions stay, a second ``--stop`` says there is none); ``kvres stop`` under a detached front removes
the front first, then kvres's actors, so nothing is left answering 503 over stopped backends. A
front inside the backend's process (``--front local``) is detached and stopped the same way.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import uuid

import httpx
import pytest

from kvres.actors.default_model import CHAT_MODEL
from kvres.cluster.standing import stop_head
from kvres.policy import KvresError
from tests.cluster.conftest import free_port
from tests.cluster.test_standing_cluster import BIN, _env, _kvres
from tests.conftest import REPO_ROOT
from tests.examples.test_examples import _stop_ray_started_in


@pytest.fixture(scope="module")
def standing(tmp_path_factory: pytest.TempPathFactory):
    temp_dir = tempfile.mkdtemp(prefix="kvsl")  # short: Ray's socket paths live under it
    cold = tmp_path_factory.mktemp("serve-lifecycle-cold")
    config = json.dumps({
        "backends": [{"name": "b0", "model_path": str(CHAT_MODEL), "n_ctx": 512, "kv_budget_tokens": 512,
                      "n_threads": 1}],
        "cold_store": {"disk_dir": str(cold)},
    })
    namespace = f"kvres-serve-life-{uuid.uuid4().hex[:6]}"
    port = free_port()
    started = _kvres(
        "start", "--port", str(port), "--node-ip-address", "127.0.0.1", "--namespace", namespace,
        "--config", config, "--num-cpus", "2", "--temp-dir", f"{temp_dir}/ray", "--ray-arg=--include-dashboard=false",
        f"--ray-arg=--ray-client-server-port={free_port()}", f"--ray-arg=--dashboard-agent-listen-port={free_port()}",
        "--json", env=_env(),
    )
    try:
        assert started.returncode == 0, (started.stdout + started.stderr)[-3000:]
        info = json.loads(started.stdout.strip().splitlines()[-1])
        yield {"address": info["address"], "namespace": namespace, "port": port, "ray_tmpdir": temp_dir}
    finally:
        with contextlib.suppress(KvresError):
            stop_head(f"127.0.0.1:{port}")
        _stop_ray_started_in(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _deploy(standing: dict, http_port: int) -> str:
    out = _kvres("serve", "--address", standing["address"], "--namespace", standing["namespace"], "--port",
                 str(http_port), "--min-replicas", "1", "--max-replicas", "1", "--detach", env=_env())
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    base = f"http://127.0.0.1:{http_port}"
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    return base


def _gone(base: str) -> bool:
    try:
        httpx.get(f"{base}/health", timeout=5)
    except httpx.TransportError:  # nothing listens on the port any more
        return True
    return False


def _where(standing: dict) -> list[str]:
    return ["--address", standing["address"], "--namespace", standing["namespace"]]


def test_kvres_chat_and_serve_model_on_a_standing_cluster(standing) -> None:
    """``kvres chat --address`` runs on the cluster's backend of the model and leaves kvres running;
    ``kvres serve --model`` against a namespace that runs other backends says what to do instead."""
    chat = subprocess.run([str(BIN / "kvres"), "chat", *_where(standing), "--model", str(CHAT_MODEL), "--max-tokens",
                           "8"], input="hello\n", capture_output=True, text=True, timeout=180, env=_env(), cwd=REPO_ROOT)
    assert chat.returncode == 0, chat.stderr[-3000:]
    lines = chat.stdout.splitlines()
    assert lines[0] == "> hello" and len(lines) > 1 and lines[1].strip(), chat.stdout
    assert _kvres("status", "--json", *_where(standing), env=_env()).returncode == 0  # left running
    refused = _kvres("serve", *_where(standing), "--model", str(CHAT_MODEL), "--detach", env=_env())
    assert refused.returncode == 1 and "already runs kvres with other backends" in refused.stderr, refused.stderr
    assert "kvres start --model" in refused.stderr and "Traceback" not in refused.stderr


def test_a_front_inside_the_backend_detached_then_stopped(standing) -> None:
    """``kvres serve --front local --detach``: the backend's own process answers on the port (its
    ``/health`` counts the calls it answered in process); ``--stop`` closes the port and leaves the
    backend and its sessions running."""
    http_port = free_port()
    out = _kvres("serve", *_where(standing), "--port", str(http_port), "--front", "local", "--detach", env=_env())
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    base = f"http://127.0.0.1:{http_port}"
    turn = httpx.post(f"{base}/v1/chat/completions", json={
        "model": "b0", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0},
        headers={"X-Session-Id": "local-kept"}, timeout=120)
    assert turn.status_code == 200, turn.text
    health = httpx.get(f"{base}/health", timeout=30).json()
    assert health["status"] == "ok" and health["front"]["in_process"]["b0"] > 0, health
    removed = _kvres("serve", "--stop", *_where(standing), env=_env())
    assert removed.returncode == 0 and "application 'kvres'" in removed.stdout, removed.stderr[-3000:]
    assert _gone(base)
    report = json.loads(_kvres("status", "--json", *_where(standing), env=_env()).stdout)
    assert "local-kept" in report["sessions"], report  # the backend runs on, with the front's session
    again = _kvres("serve", "--stop", *_where(standing), env=_env())
    assert again.returncode == 1 and "no kvres serve application" in again.stderr, again.stderr


def test_serve_stop_removes_only_the_application_and_kvres_stop_removes_the_front_first(standing) -> None:
    http_port = free_port()
    base = _deploy(standing, http_port)
    turn = httpx.post(f"{base}/v1/chat/completions", json={
        "model": "b0", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0},
        headers={"X-Session-Id": "kept"}, timeout=120)
    assert turn.status_code == 200, turn.text
    # no address: the cluster `ray start` recorded in Ray's folder, named; every actor's repr readable
    status = _kvres("status", "--namespace", standing["namespace"], env=_env(RAY_TMPDIR=standing["ray_tmpdir"]))
    assert status.returncode == 0, status.stderr[-3000:]
    assert f"kvres status: the Ray cluster at {standing['address']} (the last one `ray start` started here" \
        in status.stderr, status.stderr
    actors = status.stdout.split("ACTORS", 1)[1]
    assert "kvres-serve-state" in actors and " object at 0x" not in actors, actors

    removed = _kvres("serve", "--stop", *_where(standing), env=_env())
    assert removed.returncode == 0, removed.stderr[-3000:]
    assert "application 'kvres'" in removed.stdout and "kvres actors and sessions keep running" in removed.stdout
    assert _gone(base)
    status = _kvres("status", "--json", *_where(standing), env=_env())
    assert status.returncode == 0, status.stderr[-3000:]
    report = json.loads(status.stdout)  # kvres itself still runs, with the front's session
    assert [row["backend"] for row in report["backends"]] == ["b0"] and "kept" in report["sessions"], report
    again = _kvres("stop", "--serve", *_where(standing), env=_env())
    assert again.returncode == 1 and "no kvres serve application" in again.stderr, again.stderr

    base = _deploy(standing, http_port)  # the port is free again: Serve went with its last application
    stopped = _kvres("stop", *_where(standing), env=_env())
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    first, second = stopped.stdout.strip().splitlines()
    assert "application 'kvres'" in first and "removed" in first, stopped.stdout
    assert f"kvres actors in namespace {standing['namespace']!r}" in second, stopped.stdout
    assert _gone(base)  # no front left answering 503 over stopped backends
    left = _kvres("status", *_where(standing), env=_env())
    assert left.returncode == 1 and "kvres-serve-state" not in left.stderr, left.stderr  # its state actor too
