"""Cold-store traffic of a backend on the real engines: an operation moves all of its blocks in one
store call, and a closed session leaves no block behind in any store."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.policy.backend_planner import plan_backend
from kvres.testing import LocalStorePort
from tests.conftest import shared_model_path

ENGINES = {
    "llama": {"engine": "llama"},
    "openvino-state": {"engine": "openvino", "openvino_mode": "state"},
    "openvino-recompute": {"engine": "openvino", "openvino_mode": "recompute"},
}
PROMPT = list(range(3, 303))


def _host(engine: str, tmp_path: Path) -> tuple[BackendHost, LocalStorePort, dict[str, ColdStoreServer]]:
    model = shared_model_path()
    config = BackendConfig(name=f"b-{engine}", model_path=model, n_ctx=1024, kv_budget_tokens=1000,
                           n_threads=1, **ENGINES[engine])
    stores = {"node-a": ColdStoreServer(1 << 20, tmp_path / "a", 64 << 20),
              "node-b": ColdStoreServer(1 << 20, tmp_path / "b", 64 << 20)}
    port = LocalStorePort("node-a", stores)
    return BackendHost(config, make_executor(config, model), plan_backend, port), port, stores


def _blocks_held(stores: dict[str, ColdStoreServer], session_id: str) -> int:
    return sum(len(s.list_session(session_id)) for s in stores.values())


@pytest.mark.parametrize("engine", list(ENGINES))
def test_suspend_and_resume_make_one_store_call_each(engine: str, tmp_path: Path) -> None:
    host, port, stores = _host(engine, tmp_path)
    reference, _, _ = _host(engine, tmp_path / "ref")
    policy = SessionPolicy.streaming(160, recent_tokens=32, block_size=8)
    for h in (host, reference):
        h.open_session("s", policy)
        h.append("s", PROMPT)
    resident = host.executor.resident_ranges("s")
    assert len(resident) >= 2  # sinks and the rest: several blocks to move
    spilled = _blocks_held(stores, "s")
    assert spilled > 10  # the eviction parked many blocks

    port.calls.clear()
    record = host.suspend("s")
    assert dict(port.calls) == {"put_many": 1}
    assert len(record.blocks) == len(resident)

    port.calls.clear()
    assert host.resume("s") == 0  # every block imported, nothing recomputed
    assert dict(port.calls) == {"pop_many": 1}
    assert _blocks_held(stores, "s") == spilled  # the suspended blocks were taken back
    assert host.generate("s", 8) == reference.generate("s", 8)

    host.close("s")
    assert _blocks_held(stores, "s") == 0


@pytest.mark.parametrize("engine", list(ENGINES))
def test_closing_a_suspended_or_migrated_session_leaves_no_block(engine: str, tmp_path: Path) -> None:
    host, port, stores = _host(engine, tmp_path)
    policy = SessionPolicy.streaming(160, recent_tokens=32, block_size=8)
    for sid in ("suspended", "moved"):
        host.open_session(sid, policy)
        host.append(sid, PROMPT)
    host.suspend("suspended")
    assert _blocks_held(stores, "suspended") > 0
    host.close("suspended")
    assert _blocks_held(stores, "suspended") == 0

    # a session that moved to a backend on another node keeps its cold refs into node-a
    other = BackendHost(host.config.model_copy(update={"name": "other"}),
                        make_executor(host.config, shared_model_path()), plan_backend,
                        LocalStorePort("node-b", stores))
    other.resume("moved", host.detach("moved"))
    other.generate("moved", 50)  # more evictions, parked on node-b (a generate recalls nothing)
    assert stores["node-a"].list_session("moved") and stores["node-b"].list_session("moved")
    other.close("moved")
    assert _blocks_held(stores, "moved") == 0
