"""The cluster's BackendHost (plain class, no Ray) serving sessions on the OpenVINO executor.

The same calls the Ray backend actor makes with engine="openvino": budgets kept by the planner,
generation, suspend / resume through the cold store.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.engines.openvino import openvino_executor
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.policy.backend_planner import plan_backend
from kvres.testing import LocalStorePort


def _host(stories_model: Path, tmp_path: Path, mode: str) -> BackendHost:
    stores = {"node-a": ColdStoreServer(1 << 22, tmp_path / "a", 1 << 24)}
    port = LocalStorePort("node-a", stores)
    config = BackendConfig(name="b-ov", engine="openvino", openvino_mode=mode, kv_budget_tokens=512,
                           n_ctx=1024, n_seq_max=4)
    return BackendHost(config, openvino_executor(stories_model, mode=mode), plan_backend, port)


@pytest.mark.parametrize("mode", ["state", "recompute"])
def test_streaming_session_on_openvino(stories_model: Path, tmp_path: Path, mode: str) -> None:
    h = _host(stories_model, tmp_path, mode)
    h.open_session("s", SessionPolicy.streaming(128, sink_tokens=4, recent_tokens=32))
    for i in range(4):
        h.append("s", [1] + [3 + (j * 7 + i) % 400 for j in range(63)])
        assert h.session_stats("s")["resident_tokens"] <= 128
    assert len(h.generate("s", 40)) == 40
    stats = h.session_stats("s")
    assert stats["resident_tokens"] <= 128 and stats["counters"]["evictions"] > 0
    assert stats["resident_ranges"][0][0] == 0  # the sinks stay
    assert stats["counters"]["recalls"] > 0  # each new append brought spilled blocks back to be ranked


@pytest.mark.parametrize("mode", ["state", "recompute"])
def test_suspend_resume_gives_the_same_continuation(stories_model: Path, tmp_path: Path, mode: str) -> None:
    a, b = _host(stories_model, tmp_path / "a", mode), _host(stories_model, tmp_path / "b", mode)
    prompt = [1] + [3 + (j * 11) % 400 for j in range(199)]
    for h in (a, b):
        h.open_session("s", SessionPolicy.streaming(128, recent_tokens=32))
        h.append("s", prompt)
    expected = a.generate("s", 20)
    b.suspend("s")
    b.resume("s")
    assert b.generate("s", 20) == expected
