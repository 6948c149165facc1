"""What an operator meets, run as docs/operators.md says: ``kvres start`` (from a shell whose PATH
does not hold the venv, as when ``.venv/bin/kvres start`` is typed), a Ray job submitted with the
``ray job submit`` line it prints, two drivers whose configurations disagree with the cluster's,
and ``kvres stop`` leaving no kvres actor behind."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import free_port
from tests.conftest import REPO_ROOT
from tests.examples.test_examples import _stop_ray_started_in

BIN = Path(sys.executable).parent
CONFIG = {"backends": [{"name": "op0", "n_ctx": 1024, "kv_budget_tokens": 512, "n_threads": 1}]}


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != BIN)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "KVRES_CONFIG", "VIRTUAL_ENV")}
    env.update({"RAY_AUTH_MODE": "disabled", "PATH": path})
    return env


@pytest.fixture(scope="module")
def standing() -> Iterator[tuple[str, str]]:
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="kvop")  # short: Ray's socket paths live under it
    out = subprocess.run(
        [str(BIN / "kvres"), "start", "--port", str(port), "--num-cpus", "2", "--temp-dir", temp_dir,
         "--config", json.dumps(CONFIG)],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO_ROOT,
    )
    try:
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        assert "starting a Ray head" in out.stderr and "loading their models" in out.stderr  # progress
        yield f"127.0.0.1:{port}", out.stdout
    finally:
        subprocess.run([str(BIN / "kvres"), "stop", "--address", f"127.0.0.1:{port}"], capture_output=True,
                       timeout=120, env=_env(), cwd=REPO_ROOT)
        _stop_ray_started_in(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_the_printed_ray_job_line_runs_the_example_job(standing: tuple[str, str]) -> None:
    _, printed = standing
    line = next(x.strip() for x in printed.splitlines() if " job submit " in x)
    assert line.endswith("-- python examples/ray_job.py") and "--working-dir ." in line
    for _ in range(10):  # the head's job agent may still be starting: Ray says so, and to try again
        out = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=400, env=_env(),
                             cwd=REPO_ROOT)
        if "No available agent to submit job" not in out.stderr:
            break
        time.sleep(3)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    result = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("KVRES_JOB_RESULT "))
                        .removeprefix("KVRES_JOB_RESULT "))
    assert result["backends"] == ["op0"]  # the job read the cluster's published configuration
    assert result["token_count"] == result["prompt_tokens"] + 64


DRIVERS = r"""
import json, sys
from kvres.cluster import BackendConfig, KvresConfig, connect
from kvres.cluster.config_agreement import ConfigConflictError

address = sys.argv[1]
refused = []
for config in (KvresConfig(backends=[BackendConfig(name="op0", n_ctx=2048, kv_budget_tokens=512, n_threads=1)]),
               KvresConfig(backends=[BackendConfig(name="st0", n_ctx=1024, kv_budget_tokens=512, n_threads=1)])):
    try:
        connect(address=address, config=config)
    except ConfigConflictError as exc:
        refused.append(str(exc))
    import ray
    ray.shutdown()
manager = connect(address=address)  # the cluster's configuration
earlier = connect(address=address)  # a driver that connected before the backend was added
pending = manager.planner_client.directory()
manager.add_backend(BackendConfig(name="op1", n_ctx=1024, kv_budget_tokens=512, n_threads=1))
with earlier.open_session(backend="op1") as s:
    s.append([3, 4, 5])
    reached = s.backend
ray.shutdown()
later = connect(address=address)
print("RESULT " + json.dumps({"refused": refused, "pending": pending, "backends": later.backends(),
                              "reached": reached}))
"""


def test_drivers_that_disagree_with_the_cluster_are_refused_and_leave_nothing(standing: tuple[str, str]) -> None:
    address, _ = standing
    out = subprocess.run([sys.executable, "-c", DRIVERS, address], capture_output=True, text=True, timeout=300,
                         env=_env(), cwd=REPO_ROOT)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    result = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT ")).removeprefix("RESULT "))
    first, second = result["refused"]
    assert "backend 'op0' differs: n_ctx=2048 (the cluster's: 1024)" in first
    assert "backend 'st0' is not one of the cluster's ['op0']" in second
    assert result["pending"] == {}  # nothing opened, nothing pending
    assert result["backends"] == ["op0", "op1"]  # added on purpose: published for every later driver
    assert result["reached"] == "op1"  # and reachable from drivers that connected before


def test_kvres_grafana_follows_the_heads_temp_dir(standing: tuple[str, str]) -> None:
    address, _ = standing
    out = subprocess.run([str(BIN / "kvres"), "grafana", "--address", address], capture_output=True, text=True,
                         timeout=120, env=_env(), cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    folder = out.stderr.strip().rsplit("from ", 1)[1].rstrip(")")
    assert Path(folder).parent.parent.parent.parent.name.startswith("kvop")  # the head's own --temp-dir
    assert Path(folder).parts[-4].startswith("session_") and Path(folder).parts[-3:] == ("metrics", "grafana",
                                                                                         "dashboards")


def test_kvres_stop_leaves_no_kvres_actor(standing: tuple[str, str]) -> None:
    address, _ = standing
    out = subprocess.run([str(BIN / "kvres"), "stop", "--address", address], capture_output=True, text=True,
                         timeout=180, env=_env(), cwd=REPO_ROOT)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "kvres-backend-op0" in out.stdout and "kvres-backend-op1" in out.stdout  # says what it stopped
    assert "kvres-planner" in out.stdout
    status = subprocess.run([str(BIN / "kvres"), "status", "--json", "--address", address], capture_output=True,
                            text=True, timeout=120, env=_env(), cwd=REPO_ROOT)
    assert status.returncode == 1 and "no kvres actors" in status.stderr
