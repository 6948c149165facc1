"""Safety of what a driver hands kvres and leaves behind: session ids validated at open,
``KVRES_CONFIG`` errors naming the variable, a failed ``connect()`` leaving nothing running,
cold stores in private folders with authenticated blocks that ``shutdown()`` removes, metric
labels without session ids."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import platformdirs
import pydantic
import pytest
import ray

from kvres.actors.cluster_secrets import cluster_secret, coldstore_secret_name
from kvres.actors.metrics import MetricsConfigError, hashed_label, session_ids_opted_in, session_label
from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect
from kvres.cluster.kvres_config import ConfigEnvError
from kvres.cluster.session import ConnectError
from kvres.coldstore import BlockKey, InvalidSessionIdError, new_secret
from tests.coldstore.helpers import forge, make_block, payload_of
from tests.conftest import shared_model_path

REPO = Path(__file__).resolve().parents[2]


# ---- session ids -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "shown"),
    [("../../etc/x", r"'\.\./\.\./etc/x'"), ("x" * 10_000, "10000 characters"), ("a\x00b", r"'a\\x00b'"),
     (".hidden", r"'\.hidden'"), ("a/b", "'a/b'"), ("", "empty")],
    ids=["traversal", "10k", "nul", "hidden", "slash", "empty"],
)
def test_bad_session_ids_are_refused_at_open_and_nothing_is_registered(manager, session_id, shown) -> None:
    before = ray.get(manager.planner.directory.remote())
    for backend in (None, "b0"):
        with pytest.raises(InvalidSessionIdError, match=shown) as info:
            manager.open_session(session_id=session_id, backend=backend)
        assert isinstance(info.value, ValueError)
    assert ray.get(manager.planner.directory.remote()) == before
    assert session_id not in ray.get(manager.backend_handle("b0").stats.remote())["sessions"]


# ---- KVRES_CONFIG ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [("[1,2]", "KVRES_CONFIG must be a JSON object .*or a path"),
     ("[]", "KVRES_CONFIG must be a JSON object"),
     ('{"backends": {}}', "KVRES_CONFIG: backends must be a non-empty list"),
     ('{"backends": []}', "KVRES_CONFIG: backends must be a non-empty list"),
     ('{"backends": [1]}', "KVRES_CONFIG: backends must be a non-empty list"),
     ('{"placement": "pack"}', "KVRES_CONFIG: placement must be an object"),
     ('{"backends": [{"n_ctx": 512,}]}', "KVRES_CONFIG is not valid JSON: Expecting property name"),
     ("42", "KVRES_CONFIG='42' is neither a JSON object nor a path"),
     ("/no/such/kvres.json", "KVRES_CONFIG='/no/such/kvres.json' is neither a JSON object nor a path")],
)
def test_kvres_config_errors_name_the_variable(value: str, message: str) -> None:
    with pytest.raises(ConfigEnvError, match=message) as info:
        KvresConfig.from_env({"KVRES_CONFIG": value})
    assert isinstance(info.value, ValueError)


def test_kvres_config_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "kvres.json"
    bad.write_text("{oops")
    with pytest.raises(ConfigEnvError, match=f"KVRES_CONFIG file '{bad}' is not valid JSON"):
        KvresConfig.from_env({"KVRES_CONFIG": str(bad)})
    bad.write_text('{"backends": [{"n_ctx": 4096}, {"name": "two", "n_ctx": 4096}]}')
    assert [b.n_ctx for b in KvresConfig.from_env({"KVRES_CONFIG": str(bad)}).backends] == [4096, 4096]
    assert len(KvresConfig.from_env({"KVRES_CONFIG": "{}"}).backends) == 1  # no backends: the default


# ---- a failed connect --------------------------------------------------------------------------


def _not_a_model(tmp_path: Path) -> Path:
    path = tmp_path / "not-a-model.gguf"
    path.write_bytes(b"this is no GGUF file" * 10)
    return path


def _named_actors(namespace: str) -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace)


def test_failed_connect_on_a_running_cluster_stops_what_it_created(manager, tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="model_path"):
        BackendConfig(model_path=tmp_path)  # a directory never gets as far as a backend
    config = KvresConfig(
        backends=[BackendConfig(name="good", model_path=shared_model_path(), n_ctx=256, kv_budget_tokens=256, n_threads=1),
                  BackendConfig(name="broken", model_path=_not_a_model(tmp_path), n_ctx=256, kv_budget_tokens=256, n_threads=1)],
        cold_store=ColdStoreConfig(ram_budget_bytes=1 << 20, disk_budget_bytes=1 << 20, disk_dir=tmp_path / "cold"),
    )
    namespace = f"kvres-failed-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ConnectError, match=r"backend 'broken' could not start: .*ModelLoadError: not a GGUF"):
        connect(namespace=namespace, config=config)
    deadline = time.time() + 30
    while _named_actors(namespace) and time.time() < deadline:
        time.sleep(0.2)
    assert _named_actors(namespace) == []
    assert list((tmp_path / "cold").iterdir()) == []  # the new store's folder went with it
    assert ray.get(manager.planner.directory.remote()) is not None  # the running kvres is untouched


def test_failed_embedded_connect_shuts_its_ray_down(tmp_path: Path) -> None:
    """In a fresh process: connect() starts an embedded Ray, a backend cannot start; afterwards
    Ray is shut down and no process it started is left."""
    script = f"""
import json, os, time, ray
from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect

def descendants():
    children = {{}}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, ppid = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(pid))
    found, todo = [], [os.getpid()]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found

config = KvresConfig(backends=[BackendConfig(name="broken", model_path={str(_not_a_model(tmp_path))!r}, n_ctx=256, kv_budget_tokens=256)],
                     cold_store=ColdStoreConfig(disk_dir={str(tmp_path / "cold")!r}))
try:
    connect(namespace="embedded", config=config, num_cpus=1, include_dashboard=False)
except Exception as exc:
    error = f"{{type(exc).__name__}}: {{exc}}"
deadline = time.time() + 20
while descendants() and time.time() < deadline:
    time.sleep(0.2)
left = []
for pid in descendants():
    try:
        left.append(open(f"/proc/{{pid}}/comm").read().strip())
    except OSError:
        pass
print(json.dumps({{"error": error, "initialized": ray.is_initialized(), "left": left}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"].startswith("ConnectError: backend 'broken' could not start"), result
    assert result["initialized"] is False and result["left"] == [], result
    assert list((tmp_path / "cold").iterdir()) == []


# ---- cold stores: private folder, secret in memory only, shutdown removes the blocks -----------


def _store_folder(namespace: str, store: str) -> Path:
    return Path(platformdirs.user_cache_dir("kvres")) / "coldstore" / f"{namespace}-{store}"


def test_shutdown_removes_the_namespaces_blocks_unless_kept(manager) -> None:
    """Default folders in the user's private cache; blocks kept by shutdown(keep_blocks=True) (of a
    session the kept journal still holds) are found and authenticated by the next connect of the
    namespace, a forged one is refused, and
    shutdown() removes them all with the folder. The secret is never in the folder."""
    import shutil

    config = KvresConfig(
        backends=[BackendConfig(name="tiny", model_path=shared_model_path(), n_ctx=256, kv_budget_tokens=256, n_threads=1)],
        cold_store=ColdStoreConfig(ram_budget_bytes=0, disk_budget_bytes=4 << 20),  # blocks go to disk
    )
    namespace = f"kvres-keep-{uuid.uuid4().hex[:6]}"
    block = make_block(payload_of(8192, seed=7), session_id="kept")
    key = BlockKey.of(block)
    first = connect(namespace=namespace, config=config)
    folders = {name: _store_folder(namespace, name) for name in first.cold_stores}
    try:
        (name, store), = first.cold_stores.items()
        assert stat.S_IMODE(folders[name].stat().st_mode) == 0o700
        first.open_session(session_id="kept", backend="tiny")  # a session the journal holds: no orphan
        ray.get(store.put.remote(block))
        first.shutdown(keep_blocks=True)
        assert _wait_gone(namespace)
        files = [p for p in folders[name].rglob("*.kvb")]
        assert len(files) == 1
        secret = cluster_secret(coldstore_secret_name(namespace), new_secret)
        assert all(secret not in p.read_bytes() for p in folders[name].rglob("*") if p.is_file())

        second = connect(namespace=namespace, config=config)
        store = second.cold_stores[name]
        got = ray.get(store.get.remote(key))  # authenticated with the namespace's secret from the GCS
        assert got is not None and bytes(got.payload) == bytes(block.payload)
        files[0].write_bytes(forge(files[0].read_bytes(), flip_payload_at=100))  # checksums right
        assert ray.get(store.get_many.remote([key])) == [None]
        assert ray.get(store.stats.remote())["corrupt"] == 1
        ray.get(store.put.remote(block))
        second.shutdown()
        assert not folders[name].exists() and _wait_gone(namespace)
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)


def _wait_gone(namespace: str) -> bool:
    deadline = time.time() + 30
    while _named_actors(namespace) and time.time() < deadline:
        time.sleep(0.2)
    return not _named_actors(namespace)


def test_the_cluster_stores_blocks_in_a_private_folder(manager) -> None:
    stores = list(manager.cold_stores)
    for name in stores:
        folder = Path(manager.config.cold_store.disk_dir) / f"{manager.namespace}-{name}"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE((folder / "blocks").stat().st_mode) == 0o700


# ---- metric labels -----------------------------------------------------------------------------


def test_metric_labels_are_keyed_hashes_unless_opted_in(manager) -> None:
    label = session_label("chat-1")
    assert label.startswith("h-") and len(label) == 18 and "chat-1" not in label
    assert session_label("chat-1") == label != session_label("chat-2")
    assert hashed_label("chat-1", b"k" * 16) != hashed_label("chat-1", b"j" * 16)
    assert hashed_label("chat-1", b"") == "chat-1"  # the opted-in form
    assert session_ids_opted_in({"KVRES_METRICS_SESSION_IDS": "1"}) is True
    assert session_ids_opted_in({"KVRES_METRICS_SESSION_IDS": "0"}) is False
    assert session_ids_opted_in({}) is False
    with pytest.raises(MetricsConfigError, match="KVRES_METRICS_SESSION_IDS='maybe'"):
        session_ids_opted_in({"KVRES_METRICS_SESSION_IDS": "maybe"})


# ---- orphans -----------------------------------------------------------------------------------


def test_a_connect_collects_the_blocks_of_sessions_the_journal_does_not_hold(manager, tmp_path: Path) -> None:
    """Blocks left by a session no journal holds (a crash between a park and its commit, a close
    while the store was down) are dropped when a driver connects; a journaled session's stay."""
    import os as _os
    import signal

    config = KvresConfig(
        backends=[BackendConfig(name="orph", model_path=shared_model_path(), n_ctx=256, kv_budget_tokens=256,
                                n_threads=1)],
        cold_store=ColdStoreConfig(ram_budget_bytes=0, disk_budget_bytes=4 << 20, disk_dir=tmp_path),
    )
    namespace = f"kvres-orphans-{uuid.uuid4().hex[:6]}"
    first = connect(namespace=namespace, config=config)
    try:
        session = first.open_session(backend="orph")
        session.append([1, *range(10, 60)])
        session.suspend()
        (store,) = first.cold_stores.values()
        orphan = make_block(payload_of(4096, seed=3), session_id="gone-session")
        ray.get(store.put.remote(orphan))
        time.sleep(0.5)  # the suspend's write-behind has reached the store
        pid = ray.get(store.pid.remote())
        _os.kill(pid, signal.SIGKILL)  # its restart forgets when blocks were put: all are idle now
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if ray.get(store.pid.remote(), timeout=5) != pid:
                    break
            except Exception:
                time.sleep(0.2)
        connect(namespace=namespace, config=config)  # a second driver's manager on the same cluster
        deadline = time.time() + 30
        while "gone-session" in ray.get(store.session_ids.remote()) and time.time() < deadline:
            time.sleep(0.2)
        assert ray.get(store.session_ids.remote()) == [session.session_id]
        assert session.resume() == 0  # its parked blocks survived the collection
    finally:
        first.shutdown()
