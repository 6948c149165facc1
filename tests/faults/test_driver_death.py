"""A stream whose driver dies keeps only what it handed out: the backend sees the death through an
object the driver owned (its lease), stops generating, and commits the tokens it yielded. A real
standing Ray cluster (``ray start``), a driver process killed with SIGKILL mid-stream."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

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
