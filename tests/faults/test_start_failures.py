"""A backend that cannot start says so (issue #49): bounded start attempts, then the engine's own
error from ``connect`` / ``add_backend``, from every call on its sessions, and in ``status()`` and
``kvres status``; the healthy backends beside it keep serving, and each test ends.

Two real ways llama.cpp fails to start a backend: a truncated GGUF (llama.cpp refuses it, kvres
raises ``ModelLoadError``) and a gemma3 GGUF with every block global, on which llama.cpp aborts the
process while loading it (``GGML_ASSERT(hparams.is_swa_any()) failed``), which Ray answers by
starting the actor again, without end before this change.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from kvres.actors.ray_actors.engine_output import last_words
from kvres.actors.ray_actors.ray_journal import RayJournal
from kvres.actors.ray_actors.start_attempts import START_ATTEMPTS
from kvres.cluster import BackendConfig, ColdStoreConfig, KvresConfig, connect
from kvres.cluster.cluster_view import ClusterView
from kvres.cluster.gcs_config import published_config
from kvres.cluster.session import ConnectError
from kvres.cluster.status_view import render_status
from kvres.policy.errors import BackendStartError
from tests.capacity.arch_models import ARCH_MODELS, write_arch_model
from tests.conftest import REPO_ROOT, shared_model_path

pytestmark = pytest.mark.timeout(420)  # each ends within its backends' bounded attempts

ABORT = r"GGML_ASSERT\(hparams\.is_swa_any\(\)\) failed"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster (one already running in this process, e.g. the fault suite's, is used)."""
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def aborting_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gemma3 GGUF whose blocks are all global: llama.cpp aborts the process loading it."""
    spec = dataclasses.replace(ARCH_MODELS["gemma3-array"], pattern=(False,) * 6)
    return write_arch_model(spec, tmp_path_factory.mktemp("aborting") / "gemma3-all-global.gguf")


def _config(tmp_path: Path, *backends: tuple[str, Path]) -> KvresConfig:
    return KvresConfig(
        backends=[BackendConfig(name=name, model_path=model, n_ctx=256, kv_budget_tokens=256, n_threads=1)
                  for name, model in backends],
        cold_store=ColdStoreConfig(ram_budget_bytes=1 << 20, disk_budget_bytes=4 << 20, disk_dir=tmp_path / "cold"),
    )


def _named_actors(namespace: str) -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace)


def test_the_engines_last_words_survive_its_abort(aborting_model: Path) -> None:
    """In a fresh process: llama.cpp aborts loading the model while stderr is captured; the file
    stays behind with its assertion, which ``last_words`` picks out of the backtrace after it."""
    script = f"""
from kvres.actors.ray_actors.engine_output import captured_stderr
import llama_cpp
with captured_stderr() as output:
    print(output.path, flush=True)
    llama_cpp.Llama({str(aborting_model)!r}, verbose=False)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0  # the process died: nothing of Python's was left to report it
    left = Path(done.stdout.strip().splitlines()[0])
    said = left.read_text()
    left.unlink()
    assert "GGML_ASSERT" not in done.stderr  # it went to the file
    assert last_words(said).endswith("GGML_ASSERT(hparams.is_swa_any()) failed")
    assert "/" not in last_words(said)  # the source file without its build folder
    assert last_words("") == "" and last_words("one\ntwo\n") == "two"


def test_a_backend_that_aborts_at_start_fails_connect_with_the_engines_words(
        ray_cluster: None, aborting_model: Path, tmp_path: Path) -> None:
    namespace = f"kvres-abort-{uuid.uuid4().hex[:6]}"
    config = _config(tmp_path, ("good", shared_model_path()), ("broken", aborting_model))
    with pytest.raises(ConnectError, match=rf"backend 'broken' could not start: its process died while starting: "
                                           rf".*{ABORT} \({START_ATTEMPTS} attempts") as info:
        connect(namespace=namespace, config=config)
    cause = info.value.__cause__
    assert isinstance(cause, BackendStartError)
    assert (cause.backend, cause.attempts) == ("broken", START_ATTEMPTS)
    deadline = time.monotonic() + 30
    while _named_actors(namespace) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _named_actors(namespace) == []  # nothing left running, nothing restarting


def test_add_backend_that_cannot_load_its_model_says_why_and_the_rest_keeps_serving(
        ray_cluster: None, tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(shared_model_path().read_bytes()[:300_000])
    namespace = f"kvres-trunc-{uuid.uuid4().hex[:6]}"
    manager = connect(namespace=namespace, config=_config(tmp_path, ("good", shared_model_path())))
    try:
        session = manager.open_session(backend="good")
        session.append("Once upon a time")
        before = session.generate(4)
        with pytest.raises(ConnectError, match=r"backend 'truncated' could not start: ModelLoadError: .*file bounds, "
                                               r"model is corrupted or incomplete\) \(1 attempt; it was not added\)"):
            manager.add_backend(BackendConfig(name="truncated", model_path=truncated, n_ctx=256, kv_budget_tokens=256,
                                              n_threads=1))
        assert manager.backends() == ["good"]
        published = published_config(namespace)
        assert published is not None and [b.name for b in published.backends] == ["good"]
        row = next(r for r in ClusterView(namespace).status()["backends"] if r["backend"] == "truncated")
        assert "could not start (1 attempt): ModelLoadError" in row["error"]  # `kvres status` says why
        assert len(session.generate(4)) == len(before)  # the healthy backend kept serving
        assert manager.open_session().backend == "good"
    finally:
        manager.shutdown()


def test_a_backend_whose_restart_aborts_is_failed_and_every_call_on_its_sessions_says_why(
        ray_cluster: None, aborting_model: Path, tmp_path: Path) -> None:
    """A standing backend dies and its model file has gone bad meanwhile: its restarts abort. It is
    failed after START_ATTEMPTS starts; its sessions' calls, the status views and placement say so
    and avoid it; its session's tokens stay in the journal, and a later connect() starts it again
    once its model is good."""
    fragile_model = tmp_path / "fragile.gguf"
    shutil.copyfile(shared_model_path(), fragile_model)
    namespace = f"kvres-restart-{uuid.uuid4().hex[:6]}"
    manager = connect(namespace=namespace, config=_config(tmp_path, ("good", shared_model_path()),
                                                          ("fragile", fragile_model)))
    latest = manager
    try:
        good = manager.open_session(backend="good")
        fragile = manager.open_session(backend="fragile")
        for s in (good, fragile):
            s.append("Once upon a time")
            s.generate(4)
        kept = fragile.tokens()

        shutil.copyfile(aborting_model, fragile_model)
        handle = manager.backend_handle("fragile")
        os.kill(int(ray.get(handle.pid.remote())), signal.SIGKILL)

        with pytest.raises(BackendStartError, match=ABORT) as info:
            fragile.generate(4)
        assert (info.value.backend, info.value.attempts) == ("fragile", START_ATTEMPTS)
        for call in (fragile.tokens, fragile.stats, lambda: manager.open_session(backend="fragile")):
            with pytest.raises(BackendStartError, match=rf"backend 'fragile' could not start .*{ABORT}"):
                call()  # at once: the backend is not waited for, nor started again
        assert "kvres-backend-fragile" not in _named_actors(namespace)

        rows = {r["backend"]: r for r in manager.status()["backends"]}
        assert "good" in rows and "error" not in rows["good"]
        assert "could not start" in rows["fragile"]["error"] and "GGML_ASSERT" in rows["fragile"]["error"]
        report = ClusterView(namespace).status()
        assert [r["backend"] for r in report["backends"]] == ["fragile", "good"]
        assert "GGML_ASSERT(hparams.is_swa_any()) failed" in report["backends"][0]["error"]
        assert "fragile: backend 'fragile' could not start" in render_status(report)
        assert manager.status()["load"]["failed"] == ["fragile"]

        assert len(good.generate(4)) == 4  # the healthy backend keeps serving
        assert {manager.open_session().backend for _ in range(3)} == {"good"}  # placement avoids it
        record = RayJournal(namespace).load(fragile.session_id)
        assert record is not None and list(record.token_log) == kept  # nothing of the session lost

        shutil.copyfile(shared_model_path(), fragile_model)  # the cause fixed: connect() starts it again
        latest = connect(namespace=namespace)
        assert latest.session(fragile.session_id).tokens() == kept
        assert "error" not in {r["backend"]: r for r in latest.status()["backends"]}["fragile"]
    finally:
        latest.shutdown()
