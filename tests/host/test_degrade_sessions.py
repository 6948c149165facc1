"""Degrade, visibly, on a real engine: on a q8_0-K llama backend (llama.cpp cannot shift a quantized
K cache) ``SessionPolicy.streaming(...)`` and ``.scored(...)`` sessions open with their default
``rebase=True``, keep gaps instead, stay within budget and generate; a scored policy whose scorer
reads keys the cache cannot give runs as streaming; stats and ``kvres inspect`` name the effective
policy and the reason, logged and counted once per session; ``strict=True`` refuses at open. In
process through ``BackendHost`` (through a ``kvres.cluster`` session:
tests/cluster/test_degrade_sessions.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import SessionPolicy
from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.host.backend import BackendHost
from kvres.cluster.status_view import render_inspect
from kvres.policy import CapabilityError
from tests.host.q8_backend import BUDGET, grow_to_8x_budget, q8_config, q8_host

SHAPE = dict(sink_tokens=4, recent_tokens=16, block_size=8)
POLICIES = {
    "streaming": SessionPolicy.streaming(BUDGET, **SHAPE),  # type: ignore[arg-type]
    "scored": SessionPolicy.scored(BUDGET, observation_window=8, **SHAPE),  # type: ignore[arg-type]
    "scored-h2o": SessionPolicy.scored(BUDGET, "h2o", observation_window=8, **SHAPE),  # type: ignore[arg-type]
    "scored-keynorm": SessionPolicy.scored(BUDGET, "keynorm", **SHAPE),  # type: ignore[arg-type]
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[BackendHost, Path]:
    return q8_host(tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_model(built: tuple[BackendHost, Path]) -> Path:
    return built[1]


@pytest.fixture(scope="module")
def host(built: tuple[BackendHost, Path]) -> BackendHost:
    return built[0]


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_rebasing_policy_degrades_to_gaps_on_a_q8_0_k_cache(host: BackendHost, name: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    executor = host.executor
    assert isinstance(executor, LlamaExecutor) and not executor.capabilities().position_shift
    policy = POLICIES[name]
    assert policy.rebase  # the helpers' default
    sid = f"degraded-{name}"
    with caplog.at_level(logging.WARNING, logger="kvres.policy"):
        host.open_session(sid, policy)
        try:
            st = grow_to_8x_budget(lambda t: host.append(sid, t), lambda k: host.generate(sid, k),
                       lambda: host.session_stats(sid))
            assert st["token_count"] >= 8 * BUDGET and st["counters"]["evictions"] > 0
            resident = np.concatenate([np.arange(a, b) for a, b in st["resident_ranges"]])
            assert executor.cache_positions(sid)[resident].tolist() == resident.tolist()  # nothing moved
            assert st["policy"]["rebase"] is True  # what was asked stays in the stats
            assert "position gaps kept" in st["effective_policy"] and "gaps are kept" in st["degraded"]
            if name == "scored-keynorm":  # a q8_0 K row is no float vector: no score source
                assert st["effective_policy"].startswith("streaming") and "keynorm scorer" in st["degraded"]
            else:
                assert st["effective_policy"].startswith(name.split("-")[0])
            host.suspend(sid)
            host.resume(sid)  # the same session again: not reported twice
            assert len(host.generate(sid, 4)) == 4
            assert host.session_stats(sid)["counters"]["degraded"] == 1
            text = render_inspect(host.session_stats(sid))
            assert "degraded from:" in text and "because the engine cannot" in text and "gaps are kept" in text
        finally:
            host.close(sid)
    logged = [r for r in caplog.records if r.name == "kvres.policy" and sid in r.getMessage()]
    assert len(logged) == 1 and "gaps are kept" in logged[0].getMessage()


@pytest.mark.parametrize("kind", ["scored", "streaming"])
def test_strict_refuses_what_the_backend_cannot_run_as_asked(host: BackendHost, kind: str) -> None:
    policy = POLICIES[kind].model_copy(update={"strict": True})
    with pytest.raises(CapabilityError, match="needs position_shift.*strict=True"):
        host.open_session(f"strict-{kind}", policy)
    with pytest.raises(ValueError, match="scorer 'keynorm' needs the resident keys"):
        host.open_session("strict-keynorm", POLICIES["scored-keynorm"].model_copy(
            update={"strict": True, "rebase": False}))
    runs = POLICIES[kind].model_copy(update={"strict": True, "rebase": False})
    host.open_session(f"strict-gaps-{kind}", runs)  # asked for what the backend can do: it runs as asked
    st = host.session_stats(f"strict-gaps-{kind}")
    assert st["degraded"] is None and st["counters"]["degraded"] == 0
    host.close(f"strict-gaps-{kind}")


def test_no_cold_store_drops_evicted_blocks(tiny_model: Path) -> None:
    cfg = q8_config(tiny_model, "no-store").model_copy(update={"type_k": "f16", "type_v": "f16"})
    bare = BackendHost(cfg, make_executor(cfg, tiny_model))
    bare.open_session("s", POLICIES["streaming"])
    grow_to_8x_budget(lambda t: bare.append("s", t), lambda k: bare.generate("s", k), lambda: bare.session_stats("s"))
    st = bare.session_stats("s")
    assert "evicted blocks dropped" in st["effective_policy"] and "no cold store" in st["degraded"]
    assert "positions re-based" in st["effective_policy"]  # f16 shifts: only the spill degrades
    with pytest.raises(CapabilityError, match="spill=True needs a cold store"):
        bare.open_session("strict", POLICIES["streaming"].model_copy(update={"strict": True}))
