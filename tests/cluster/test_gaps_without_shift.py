"""A gap-keeping scored session on a quantized K cache (llama.cpp cannot shift one) through a
``kvres.cluster`` session: it runs to 8x its budget on a q8_0/q8_0 backend without
``BackendFullError``, its last tokens resident. (In process through ``BackendHost``, and why:
tests/host/test_gaps_without_shift.py.)"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kvres.actors.default_model import write_tiny_model
from tests.host.q8_backend import BUDGET, grow_to_8x_budget, q8_config
from tests.host.test_gaps_without_shift import POLICIES


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-hd32.gguf")


def test_scored_gap_keeping_session_through_the_cluster(manager, tiny_model: Path, tmp_path: Path) -> None:
    """The same through ``connect`` / ``Session`` on the package's Ray cluster (its own namespace
    with one q8_0 backend)."""
    from kvres.cluster import ColdStoreConfig, KvresConfig, connect

    config = KvresConfig(
        backends=[q8_config(tiny_model, "q8-cluster")],
        cold_store=ColdStoreConfig(ram_budget_bytes=8 << 20, disk_budget_bytes=16 << 20, disk_dir=tmp_path),
    )
    mgr = connect(namespace=f"kvres-q8-{uuid.uuid4().hex[:6]}", config=config)
    try:
        session = mgr.open_session(policy=POLICIES["scored"])
        st = grow_to_8x_budget(session.append, session.generate, session.stats)
        assert st["token_count"] >= 8 * BUDGET and st["counters"]["evictions"] > 0
        assert st["resident_ranges"][-1][1] == st["token_count"]
        session.close()
    finally:
        mgr.shutdown()
