"""A full disk loses no session and drops no block silently: blocks the cold store could not
write are counted by the store (``drops``, ``spill_errors``), reported to their sessions
(``dropped_blocks``), and what they held is recomputed from the token log on resume, identically.
The real llama.cpp engine; the disk tier's writes fail with ENOSPC (what a full file system
returns)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig
from kvres.actors.generation import GenerationRequest
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.testing import LocalStorePort
from tests.conftest import shared_model_path

PROMPT = list(range(3, 123))


def _enospc(fd: int, buffers: object, offset: int) -> int:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_suspends_on_a_full_disk_are_reported_and_recomputed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = shared_model_path()
    config = BackendConfig(name="full", model_path=model, n_ctx=2048, n_seq_max=8, kv_budget_tokens=2000,
                           n_threads=1)
    store = ColdStoreServer(4 << 10, tmp_path / "cold", 64 << 20)  # 4 KiB of RAM: blocks go to disk
    host = BackendHost(config, make_executor(config, model), store=LocalStorePort("n", {"n": store}))
    twin = BackendHost(config.model_copy(update={"name": "twin"}), make_executor(config, model))
    for h in (host, twin):
        h.open_session("s")
        h.append("s", PROMPT)
    monkeypatch.setattr(os, "pwritev", _enospc)
    host.suspend("s")  # returns: the write fails later, in the store
    monkeypatch.undo()
    stats = host.session_stats("s")
    assert stats["counters"]["dropped_blocks"] == 1 and stats["cold"] == {}
    counters = store.stats()
    assert counters["drops"] >= 1 and counters["spill_errors"] >= 1
    assert host.resume("s") == len(PROMPT)  # recomputed from the log
    request = GenerationRequest(max_tokens=24, ignore_eos=True)
    assert host.generate("s", request) == twin.generate("s", request)
