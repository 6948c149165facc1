"""Degrade, visibly, through a ``kvres.cluster`` session on a q8_0-K llama backend (llama.cpp cannot
shift a quantized K cache): streaming and scored sessions keep gaps instead of re-basing, stay
within budget, say so in their stats and count it once; ``strict=True`` refuses at open. (In
process through ``BackendHost``: tests/host/test_degrade_sessions.py.)"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kvres.actors.default_model import write_tiny_model
from kvres.policy import CapabilityError
from tests.host.q8_backend import BUDGET, grow_to_8x_budget, q8_config
from tests.host.test_degrade_sessions import POLICIES


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-hd32.gguf")


def test_degraded_sessions_through_the_cluster(manager, tiny_model: Path, tmp_path: Path) -> None:
    """The same through ``connect`` / ``Session`` (its own namespace with one q8_0 backend)."""
    from kvres.cluster import ColdStoreConfig, KvresConfig, connect

    config = KvresConfig(
        backends=[q8_config(tiny_model, "q8-degrade")],
        cold_store=ColdStoreConfig(ram_budget_bytes=8 << 20, disk_budget_bytes=16 << 20, disk_dir=tmp_path),
    )
    mgr = connect(namespace=f"kvres-degrade-{uuid.uuid4().hex[:6]}", config=config)
    try:
        for name in ("streaming", "scored"):
            session = mgr.open_session(policy=POLICIES[name])
            st = grow_to_8x_budget(session.append, session.generate, session.stats)
            assert st["token_count"] >= 8 * BUDGET and st["counters"]["evictions"] > 0
            assert st["resident_ranges"][-1][1] == st["token_count"]
            assert st["effective_policy"].startswith(name) and "gaps are kept" in st["degraded"]
            assert st["counters"]["degraded"] == 1
            session.close()
        with pytest.raises(CapabilityError, match="needs position_shift"):
            mgr.open_session(policy=POLICIES["scored"].model_copy(update={"strict": True}))
    finally:
        mgr.shutdown()
