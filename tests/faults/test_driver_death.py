"""A stream whose driver dies keeps only what it handed out: the backend sees the death (Ray ends
the stream of a dead driver; the backend also watches an object the driver owned, its lease),
stops generating, and commits the tokens the driver took: exactly those, on llama.cpp and
OpenVINO, for a driver killed while it holds the stream. A real standing Ray cluster (``ray
start``), a driver process killed with SIGKILL mid-stream."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, shared_model_path
from tests.examples.test_examples import _env, ray_head  # noqa: F401  (the fixture)

ASKED = 15000
DRIVER = """
import json, os, sys
ASKED = 15000
from kvres.cluster import BackendConfig, KvresConfig, connect
config = KvresConfig(backends=[BackendConfig(name="d0", model_path=sys.argv[2], n_ctx=16384,
                                             kv_budget_tokens=16000, n_threads=1)])
manager = connect(address=sys.argv[1], namespace="driver-death", config=config)
if sys.argv[3] == "stream":
    s = manager.open_session(session_id="orphan", backend="d0")
    s.append(list(range(3, 23)))
    stream = s.stream(ASKED, ignore_eos=True)
    got = [next(stream) for _ in range(3)]
    print(json.dumps(got), flush=True)
    os.kill(os.getpid(), 9)
else:
    s = manager.session("orphan")
    print(json.dumps({"tokens": s.tokens(), "stats": s.stats()["counters"]}), flush=True)
    s.close()
    manager.shutdown()  # its cold store's folder goes with it
"""


def _driver(gcs: str, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", DRIVER, gcs, str(shared_model_path()), mode],
                          capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO_ROOT)


def test_a_stream_whose_driver_dies_commits_only_what_it_yielded(ray_head) -> None:  # noqa: F811
    gcs, _ = ray_head
    killed = _driver(gcs, "stream")
    assert killed.returncode == -9, killed.stderr[-3000:]
    handed_out = json.loads(killed.stdout.strip().splitlines()[-1])
    time.sleep(2)  # Ray tells the backend of the death within about a second
    after = _driver(gcs, "read")
    assert after.returncode == 0, after.stderr[-3000:]
    tokens = json.loads(after.stdout.strip().splitlines()[-1])["tokens"]
    assert tokens[:23] == list(range(3, 23)) + handed_out
    # the stream stopped once the backend learnt of the death: the tokens it had yielded until
    # then are committed (the driver had received the first of them), not the 15,000 asked for
    assert len(tokens) < 20 + ASKED // 2, len(tokens)
    import platformdirs

    stores = Path(platformdirs.user_cache_dir("kvres")) / "coldstore"
    assert not [p.name for p in stores.glob("driver-death-*") if p.is_dir()]  # the last driver shut kvres down


HOLDING = """
import json, os, sys, time
from kvres.actors.host.refusals import SessionBusyError
from kvres.cluster import BackendConfig, KvresConfig, connect
engine = sys.argv[3]
config = KvresConfig(backends=[BackendConfig(name="held", engine=engine, model_path=sys.argv[2], n_ctx=1024,
                                             kv_budget_tokens=1000, n_threads=1)])
manager = connect(address=sys.argv[1], namespace=f"driver-held-{engine}", config=config)
if sys.argv[4] == "stream":
    s = manager.open_session(session_id="held", backend="held")
    s.append(list(range(3, 23)))
    stream = s.stream(200, ignore_eos=True)
    got = [next(stream) for _ in range(3)]
    print(json.dumps(got), flush=True)
    time.sleep(1)  # it holds the stream a moment, as a driver stopped mid-loop does, then dies
    os.kill(os.getpid(), 9)
else:
    s = manager.session("held")
    deadline = time.monotonic() + 60
    while True:  # the backend ends the dead driver's stream as soon as Ray tells it of the death
        try:
            s.append([5])
            break
        except SessionBusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    print(json.dumps(s.tokens()), flush=True)
    s.close()
    manager.shutdown()
"""


@pytest.mark.parametrize("engine", ["llama", "openvino"])
def test_a_driver_killed_holding_a_stream_commits_exactly_what_it_took(ray_head, engine: str) -> None:  # noqa: F811
    gcs, _ = ray_head

    def driver(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", HOLDING, gcs, str(shared_model_path()), engine, mode],
                              capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO_ROOT)

    killed = driver("stream")
    assert killed.returncode == -9, killed.stderr[-3000:]
    handed_out = json.loads(killed.stdout.strip().splitlines()[-1])
    after = driver("read")
    assert after.returncode == 0, after.stderr[-3000:]
    assert json.loads(after.stdout.strip().splitlines()[-1]) == list(range(3, 23)) + handed_out + [5]
