"""``peak_resident_tokens`` counts KV that came in without a step (a resume, a hand-over)."""

from __future__ import annotations

from pathlib import Path

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.testing import LocalStorePort
from tests.conftest import shared_model_path

PROMPT = [3 + (i * 5) % 50 for i in range(22)]


def _host(name: str, stores: dict[str, ColdStoreServer]) -> BackendHost:
    model = shared_model_path()
    config = BackendConfig(name=name, model_path=model, n_ctx=256, n_seq_max=2, kv_budget_tokens=200, n_threads=1)
    return BackendHost(config, make_executor(config, model), store=LocalStorePort("node", stores))


def test_a_session_handed_over_reports_its_resident_tokens_as_its_peak(tmp_path: Path) -> None:
    stores = {"node": ColdStoreServer(1 << 20, tmp_path / "store", 1 << 24)}
    first, second = _host("first", stores), _host("second", stores)
    first.open_session("s")
    first.append("s", PROMPT)
    assert first.session_stats("s")["peak_resident_tokens"] == 22
    record = first.detach("s")
    second.resume("s", record)  # the KV comes in by import: no step runs on `second`
    stats = second.session_stats("s")
    assert stats["resident_tokens"] == 22
    assert stats["peak_resident_tokens"] == 22  # it read 0 here
    assert second.stats()["peak_resident_tokens"] == 22
