"""A standing cluster, with real processes: ``kvres start`` leaves a Ray head and kvres's actors
running; driver A opens sessions and exits, driver B takes them over by id and continues them with
the greedy tokens of an uninterrupted run; ``kvres stop`` removes kvres (``--ray``: the head too).
The head bounds Ray's task-event store and kvres's actors report no task events (read back from
its GCS).

Driver A is an ordinary driver in the namespace ``kvres start`` set up, and the owner of a second
namespace whose actors it creates itself: neither exit loses a token. The head gets its own ports
and temp folder and is stopped by its processes (never a machine-wide ``ray stop``), so the
embedded clusters of other tests are left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from kvres.cluster.ray_task_events import TASK_EVENT_STORE
from kvres.cluster.ray_upkeep import UPKEEP_CONFIG, UPKEEP_ENVIRONMENT
from kvres.cluster.standing import head_processes, stop_head
from kvres.policy import KvresError
from tests.cluster.conftest import free_port
from tests.cluster.task_event_probe import DRIVER as PROBE
from tests.cluster.task_event_probe import TASK_EVENT_KEYS, log_monitor_environment
from tests.conftest import REPO_ROOT, shared_model_path
from tests.examples.test_examples import _stop_ray_started_in

BIN = Path(sys.executable).parent
PROMPT = list(range(3, 103))
FIRST, NEXT = 8, 8

DRIVER_A = """
import json, sys
import ray
from kvres.cluster import connect

ray.init(log_to_driver=False)  # RAY_ADDRESS from the environment; connect() then uses this connection
result = {}
for namespace, session_id in json.loads(sys.argv[1]):
    owner = not any(i["namespace"] == namespace for i in ray.util.list_named_actors(all_namespaces=True))
    manager = connect(namespace=namespace)  # KVRES_CONFIG from the environment
    session = manager.open_session(session_id=session_id)
    session.append(json.loads(sys.argv[2]))
    result[namespace] = {"first": session.generate(int(sys.argv[3])), "owner": owner}
print(json.dumps(result))
"""

DRIVER_B = """
import json, sys
from kvres.cluster import connect

result = {}
for namespace, session_id in json.loads(sys.argv[1]):
    manager = connect(namespace=namespace)
    session = manager.session(session_id)
    count = session.stats()["token_count"]
    following = session.generate(int(sys.argv[4]))
    reference = manager.open_session(session_id="reference")  # the same tokens, never interrupted
    reference.append(json.loads(sys.argv[2]))
    uninterrupted = reference.generate(int(sys.argv[3]) + int(sys.argv[4]))
    reference.close()
    result[namespace] = {"token_count": count, "next": following, "reference": uninterrupted}
print(json.dumps(result))
"""


def _env(**extra: str) -> dict[str, str]:
    # a throwaway head bound to this test: no token authentication between its own processes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", **extra})
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO_ROOT)


def _kvres(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return _run([str(BIN / "kvres"), *args], env)


@pytest.fixture(scope="module")
def standing(tmp_path_factory: pytest.TempPathFactory):
    """``kvres start`` on free ports with its own temp folder; whatever happens, the head goes."""
    temp_dir = tempfile.mkdtemp(prefix="kvst")  # short: Ray's socket paths live under it
    cold = tmp_path_factory.mktemp("standing-cold")
    config = json.dumps({
        "backends": [{"name": "standing", "model_path": str(shared_model_path()), "n_ctx": 512,
                      "kv_budget_tokens": 512, "n_threads": 1}],
        "cold_store": {"disk_dir": str(cold)},
    })
    namespace = f"kvres-standing-{uuid.uuid4().hex[:6]}"
    env = _env(KVRES_CONFIG=config)
    port = free_port()
    started = _kvres(
        "start", "--port", str(port), "--node-ip-address", "127.0.0.1", "--namespace", namespace,
        "--config", config, "--num-cpus", "2", "--temp-dir", temp_dir,
        "--ray-arg=--include-dashboard=false",  # Ray's own part, a third of the head's start time here
        f"--ray-arg=--ray-client-server-port={free_port()}",
        f"--ray-arg=--dashboard-agent-listen-port={free_port()}", "--json", env=env,
    )
    try:
        assert started.returncode == 0, (started.stdout + started.stderr)[-3000:]
        info = json.loads(started.stdout.strip().splitlines()[-1])
        yield {**info, "port": port, "temp_dir": temp_dir, "cold": cold, "env": env}
    finally:
        with contextlib.suppress(KvresError):
            stop_head(f"127.0.0.1:{port}")
        _stop_ray_started_in(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _store_folders(cold: Path, namespace: str) -> list[Path]:
    return [p for p in cold.iterdir() if p.name.startswith(f"{namespace}-")]


def test_the_head_bounds_task_events_and_kvres_actors_report_none(standing) -> None:
    """Before the test that stops the cluster: a driver's session calls, then what the GCS holds."""
    env = _env(KVRES_CONFIG=standing["env"]["KVRES_CONFIG"], RAY_ADDRESS=standing["address"])
    calls = _run([sys.executable, "-c", DRIVER_A, json.dumps([[standing["namespace"], "events-1"]]),
                  json.dumps(PROMPT), str(FIRST)], env)
    assert calls.returncode == 0, calls.stderr[-3000:]
    probe = _run([sys.executable, "-c", PROBE, standing["address"]], env)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["witnessed"], seen  # the probe's own task reached the GCS: the session's calls did too
    assert seen["kvres_task_events"] == [], seen
    assert seen["system_config"] == {key: TASK_EVENT_STORE[key] for key in TASK_EVENT_KEYS}, seen
    assert seen["upkeep"] == UPKEEP_CONFIG, seen  # and Ray's upkeep kept small
    assert log_monitor_environment(standing["address"]).items() >= UPKEEP_ENVIRONMENT.items()


def test_sessions_outlive_every_driver_and_kvres_stop_removes_everything(standing) -> None:
    namespace, owned = standing["namespace"], f"{standing['namespace']}-owned"
    assert standing["started_head"] and standing["created_actors"] and standing["backends"] == ["standing"]
    again = _kvres("start", "--port", str(standing["port"]), "--node-ip-address", "127.0.0.1",
                   "--namespace", namespace, "--json", env=standing["env"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1]) == {  # found running, nothing started twice
        **{k: standing[k] for k in ("address", "namespace", "backends", "dashboard_url", "token_auth")},
        "started_head": False, "created_actors": False, "ports": None,  # no head started: no ports chosen
    }
    env = _env(KVRES_CONFIG=standing["env"]["KVRES_CONFIG"], RAY_ADDRESS=standing["address"])
    pairs = json.dumps([[namespace, "chat-1"], [owned, "chat-2"]])

    a = _run([sys.executable, "-c", DRIVER_A, pairs, json.dumps(PROMPT), str(FIRST)], env)
    assert a.returncode == 0, a.stderr[-3000:]
    first = json.loads(a.stdout.strip().splitlines()[-1])
    assert first[namespace]["owner"] is False and first[owned]["owner"] is True  # A created `owned`'s actors

    b = _run([sys.executable, "-c", DRIVER_B, pairs, json.dumps(PROMPT), str(FIRST), str(NEXT)], env)
    assert b.returncode == 0, b.stderr[-3000:]
    taken_over = json.loads(b.stdout.strip().splitlines()[-1])
    for ns in (namespace, owned):
        seen = taken_over[ns]
        assert seen["token_count"] == len(PROMPT) + FIRST, ns
        assert first[ns]["first"] == seen["reference"][:FIRST], ns
        assert seen["next"] == seen["reference"][FIRST:], ns  # as if no driver had ever left

    assert _store_folders(standing["cold"], owned)
    stopped = _kvres("stop", "--namespace", owned, env=env)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert f"kvres actors in namespace {owned!r}" in stopped.stdout and "cold blocks removed" in stopped.stdout
    assert _store_folders(standing["cold"], owned) == []
    twice = _kvres("stop", "--namespace", owned, env=env)
    assert twice.returncode == 1 and f"no kvres actors in namespace {owned!r}" in twice.stderr

    everything = _kvres("stop", "--address", standing["address"], "--namespace", namespace, "--ray", env=_env())
    assert everything.returncode == 0, everything.stderr[-3000:]
    assert "Ray head stopped" in everything.stdout
    assert _store_folders(standing["cold"], namespace) == []
    assert head_processes(standing["port"]) == []  # every process of the head, workers included
