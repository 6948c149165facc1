"""A q8_0/q8_0 llama backend host on the tiny model (llama.cpp cannot shift a quantized K cache),
shared by the tests of gap-keeping and degrading policies.

Primitives: ``BUDGET``, ``TOKENS`` (word tokens of the tiny model), ``q8_config(model, name)``,
``q8_host(tmp_path_factory) -> (host, model)``, ``grow_to_8x_budget(append, generate, stats)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig
from kvres.actors.default_model import write_tiny_model
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.testing import LocalStorePort

BUDGET = 96
TOKENS = [259 + (7 * i + 3) % 60 for i in range(1000)]


def q8_config(model: Path, name: str = "q8") -> BackendConfig:
    # n_ctx well below 8x the budget: kept gaps push positions past the context size
    return BackendConfig(name=name, model_path=model, n_ctx=256, kv_budget_tokens=200, n_seq_max=2,
                         n_threads=1, type_k="q8_0", type_v="q8_0")


def q8_host(tmp_path_factory: pytest.TempPathFactory) -> tuple[BackendHost, Path]:
    model = write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-hd32.gguf")
    cfg = q8_config(model)
    store = ColdStoreServer(64 << 20, tmp_path_factory.mktemp("cold"), 256 << 20)
    return BackendHost(cfg, make_executor(cfg, model), store=LocalStorePort("n", {"n": store})), model


def grow_to_8x_budget(append: Callable[[list[int]], Any], generate: Callable[[int], list[int]],
                      stats: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Alternate 40-token turns and 8-token generations until 8x the budget."""
    n = 0
    st: dict[str, Any] = {}
    while n < 8 * BUDGET:
        append(TOKENS[n : n + 40])
        n += 40 + len(generate(8))
        st = stats()
        assert st["resident_tokens"] <= BUDGET
    return st
