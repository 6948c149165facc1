"""Gap-keeping policies on a quantized K cache (llama.cpp cannot shift one): a scored and a
streaming ``rebase=False`` session run to 8x their budget on a q8_0/q8_0 backend, in process
through ``BackendHost`` (through a ``kvres.cluster`` session: tests/cluster/test_gaps_without_shift.py),
without ``BackendFullError`` and without a cell ever moving (each resident token sits at its own
token-log index)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.default_model import write_tiny_model
from kvres.actors.engines.llama import LlamaExecutor
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.policy import KvresError
from kvres.testing import LocalStorePort

BUDGET = 96
TOKENS = [259 + (7 * i + 3) % 60 for i in range(1000)]  # word tokens of the tiny model
POLICIES = {
    "scored": SessionPolicy.scored(BUDGET, sink_tokens=4, recent_tokens=16, block_size=8,
                                   observation_window=8, rebase=False),
    "scored-no-recent": SessionPolicy.scored(BUDGET, sink_tokens=4, recent_tokens=0, block_size=8,
                                             observation_window=8, rebase=False),
    "streaming": SessionPolicy(kind="streaming", budget_tokens=BUDGET, sink_tokens=4, recent_tokens=16,
                               block_size=8, rebase=False),
}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-hd32.gguf")


def q8_config(model: Path, name: str = "q8") -> BackendConfig:
    # n_ctx well below 8x the budget: kept gaps push positions past the context size
    return BackendConfig(name=name, model_path=model, n_ctx=256, kv_budget_tokens=200, n_seq_max=2,
                         n_threads=1, type_k="q8_0", type_v="q8_0")


@pytest.fixture(scope="module")
def host(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> BackendHost:
    cfg = q8_config(tiny_model)
    store = ColdStoreServer(64 << 20, tmp_path_factory.mktemp("cold"), 256 << 20)
    return BackendHost(cfg, make_executor(cfg, tiny_model), store=LocalStorePort("n", {"n": store}))


def grow_to_8x_budget(append, generate, stats) -> dict:
    """Alternate 40-token turns and 8-token generations until 8x the budget."""
    n = 0
    while n < 8 * BUDGET:
        append(TOKENS[n : n + 40])
        n += 40 + len(generate(8))
        st = stats()
        assert st["resident_tokens"] <= BUDGET
    return st


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
