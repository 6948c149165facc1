"""Gap-keeping policies on a quantized K cache (llama.cpp cannot shift one): a scored and a
streaming ``rebase=False`` session run to 8x their budget on a q8_0/q8_0 backend, in process
through ``BackendHost`` (through a ``kvres.cluster`` session: tests/cluster/test_gaps_without_shift.py),
without ``BackendFullError`` and without a cell ever moving (each resident token sits at its own
token-log index)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvres.actors.config import SessionPolicy
from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.host.backend import BackendHost
from kvres.policy import KvresError
from tests.host.q8_backend import BUDGET, grow_to_8x_budget, q8_host

POLICIES = {
    "scored": SessionPolicy.scored(BUDGET, sink_tokens=4, recent_tokens=16, block_size=8,
                                   observation_window=8, rebase=False),
    "scored-no-recent": SessionPolicy.scored(BUDGET, sink_tokens=4, recent_tokens=0, block_size=8,
                                             observation_window=8, rebase=False),
    "streaming": SessionPolicy(kind="streaming", budget_tokens=BUDGET, sink_tokens=4, recent_tokens=16,
                               block_size=8, rebase=False),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[BackendHost, Path]:
    return q8_host(tmp_path_factory)


@pytest.fixture(scope="module")
def host(built: tuple[BackendHost, Path]) -> BackendHost:
    return built[0]


@pytest.mark.parametrize("name", list(POLICIES))
def test_gap_keeping_session_runs_to_8x_budget_on_a_q8_0_k_cache(host: BackendHost, name: str) -> None:
    executor = host.executor
    assert isinstance(executor, LlamaExecutor) and not executor.capabilities().position_shift
    sid = f"gaps-{name}"
    host.open_session(sid, POLICIES[name])
    try:
        st = grow_to_8x_budget(lambda t: host.append(sid, t), lambda k: host.generate(sid, k),
                   lambda: host.session_stats(sid))
        assert st["token_count"] >= 8 * BUDGET and st["counters"]["evictions"] > 0
        # nothing was shifted: every resident token is at its token-log index, past n_ctx
        resident = np.concatenate([np.arange(a, b) for a, b in st["resident_ranges"]])
        assert executor.cache_positions(sid)[resident].tolist() == resident.tolist()
        assert resident[-1] == st["token_count"] - 1 > executor.n_ctx
    finally:
        host.close(sid)


@pytest.mark.parametrize("kind", ["scored", "streaming"])
def test_a_strict_rebasing_policy_is_refused_at_open_on_a_q8_0_k_cache(host: BackendHost, kind: str) -> None:
    """(Without ``strict`` it degrades to keeping gaps: tests/host/test_degrade_sessions.py.)"""
    policy = POLICIES[kind].model_copy(update={"rebase": True, "strict": True})
    with pytest.raises(KvresError, match="needs position_shift"):
        host.open_session(f"rebase-{kind}", policy)
