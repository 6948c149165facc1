"""Scoring as published, at any prompt length, on BackendHost (no Ray) with real engines:

- H2O counts every query row of an append once, however long it is (a capture holds one
  micro-batch of rows on llama.cpp: the host has H2O take the rows before the next step's would
  not fit one capture with them);
- SnapKV on a prompt larger than the backend's free room is scored with the prompt's own last
  tokens as its observation window (a scoring pass decodes them after the resident tokens before
  each cut), so it keeps the needle as often as on a prompt that fits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.passkey import harness as h
from benchmarks.passkey import sessions as ps
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.host.backend import BackendHost
from models import passkey_tasks as pt

PASSKEY = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
CFG = h.EvalConfig()


def _executor(engine: str, model: Path) -> Any:
    if engine == "llama":
        from kvres.actors.engines.llama import LlamaExecutor

        return LlamaExecutor(model, n_ctx=4096, n_seq_max=2, n_threads=1)
    from kvres.actors.engines.openvino import openvino_executor

    return openvino_executor(model, mode="state")


@pytest.fixture(params=["llama", "openvino"], scope="module")
def stories_host(request: pytest.FixtureRequest, stories_model: Path) -> Iterator[BackendHost]:
    executor = _executor(request.param, stories_model)
    config = BackendConfig(name="h2o", engine=request.param, model_path=stories_model, n_ctx=4096,
                           kv_budget_tokens=4000, n_seq_max=2, n_threads=1)
    yield BackendHost(config, executor)
    close = getattr(executor, "close", None)
    if close is not None:
        close()


@pytest.mark.parametrize("budget", [3000, 600])
def test_h2o_accumulates_every_row_of_a_2000_token_append(stories_host: BackendHost, budget: int) -> None:
    sid = f"h2o-{budget}"
    stories_host.open_session(sid, SessionPolicy.scored(budget, "h2o", recent_tokens=32, spill=False))
    tokens = [3 + (7 * i + 1) % 500 for i in range(2000)]
    stories_host.append(sid, tokens)
    s = stories_host._ctx.sessions[sid]
    assert s.ranking is not None and s.ranking.rows_seen == 2000
    st = stories_host.session_stats(sid)
    assert st["resident_tokens"] <= min(budget, 2000)
    if budget >= 2000:  # nothing evicted: every row's attention (1 per layer and head) is still counted
        ex = stories_host.executor
        layers, heads = (ex.geometry.n_layers, ex._model.n_head) if hasattr(ex, "_model") else (5, 8)
        mass = s.ranking._accumulated.scores.sum()  # type: ignore[union-attr]
        assert mass == pytest.approx(2000 * layers * heads, rel=1e-3)
    more = stories_host.generate(sid, 8)  # and the rows of a generate after it
    assert len(more) == 8 and s.ranking.rows_seen in (2008, 2000 + 7)  # its last token is not decoded yet
    stories_host.close(sid)


@pytest.fixture(scope="module")
def passkey_hosts() -> Iterator[dict[str, BackendHost]]:
    from kvres.actors.engines.llama import LlamaExecutor

    hosts: dict[str, BackendHost] = {}
    for name, room in (("fits", 2000), ("3x", 128)):  # 128 free tokens: a 384-token prompt is 3x the room
        executor = LlamaExecutor(PASSKEY, n_ctx=2048, n_seq_max=2, n_threads=1)
        hosts[name] = BackendHost(BackendConfig(name=name, model_path=PASSKEY, kv_budget_tokens=room, n_ctx=2048,
                                                n_seq_max=2), executor)
    yield hosts
    for host in hosts.values():
        host.executor.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("family", [1, 2])
def test_snapkv_on_a_prompt_3x_the_free_room_keeps_the_needle(passkey_hosts: dict[str, BackendHost],
                                                              family: int) -> None:
    tasks = pt.fixed_task_set(family, 6, seed=5, n_tokens=384, depth=(1 / 3, 2 / 3))
    right: dict[str, list[bool]] = {}
    for name, host in passkey_hosts.items():
        for i, task in enumerate(tasks):
            policy = ps.policy_for("snapkv", task, 0.25, CFG)
            assert policy is not None and policy.budget_tokens is not None
            sid = f"snap-{family}-{i}"
            host.open_session(sid, policy)
            host.append(sid, task.prompt_ids)
            right.setdefault(name, []).append(host.generate(sid, len(task.answer_ids)) == task.answer_ids)
            st = host.session_stats(sid)
            assert st["resident_tokens"] <= policy.budget_tokens
            if name == "3x":
                assert st["peak_resident_tokens"] <= 128 and st["counters"]["evictions"] > 0
            host.close(sid)
    assert sum(right["3x"]) >= sum(right["fits"]) >= len(tasks) - 1
    assert np.mean(right["3x"]) >= 0.8
