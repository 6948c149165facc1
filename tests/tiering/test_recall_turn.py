"""A recall turn on a BackendHost (no Ray) with the real engines on the committed passkey model:
the question's attention ranks the cold blocks, the ones it keeps come back in one exchange, the
session never holds more than its budget, the answer is right, and the question is decoded once
(by the scoring pass; the serving context does not decode it again)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.passkey import harness as h
from benchmarks.passkey import sessions as ps
from kvres.actors.config import BackendConfig
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.policy.backend_planner import plan_backend
from kvres.testing import LocalStorePort
from models import passkey_tasks as pt

PASSKEY = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
TASKS = pt.fixed_task_set(1, 4, seed=0, n_tokens=(300, 394), depth=(1 / 3, 2 / 3))
CFG = h.EvalConfig()


@pytest.fixture(params=["llama", "openvino"], scope="module")
def host(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendHost]:
    port = LocalStorePort("n", {"n": ColdStoreServer(8 << 20, tmp_path_factory.mktemp("cold"), 32 << 20)})
    if request.param == "llama":
        from kvres.actors.engines.llama import LlamaExecutor

        executor: Any = LlamaExecutor(PASSKEY, n_ctx=2048, n_seq_max=2, n_threads=1)
        config = BackendConfig(name="b", model_path=PASSKEY, kv_budget_tokens=2000, n_ctx=2048, n_seq_max=2)
    else:
        from kvres.actors.engines.openvino import openvino_executor

        executor = openvino_executor(PASSKEY, mode="state")
        config = BackendConfig(name="b", engine="openvino", openvino_mode="state", model_path=PASSKEY,
                               kv_budget_tokens=2000, n_ctx=2048, n_seq_max=2)
    yield BackendHost(config, executor, plan_backend, port)
    if request.param == "llama":
        executor.close()


def _decodes(host: BackendHost) -> list[int]:
    """Counts the serving engine's decodes of new tokens (a counting wrapper, nothing replaced)."""
    calls = [0]
    ex = host.executor
    target = ex._ctx if hasattr(ex, "_ctx") else ex  # llama: its context; OpenVINO: its model runs
    name = "decode_many" if hasattr(ex, "_ctx") else "_run"
    inner = getattr(target, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return inner(*args, **kwargs)

    setattr(target, name, counted)
    return calls


@pytest.mark.parametrize("method, budget", [("streaming", 0.25), ("snapkv", 0.10)])
def test_a_recall_turn_stays_in_budget_and_answers(host: BackendHost, method: str, budget: float) -> None:
    decodes = _decodes(host)
    for i, task in enumerate(TASKS):
        policy = ps.policy_for(method, task, budget, CFG).model_copy(update={"spill": True})
        sid = f"{method}-{i}"
        host.open_session(sid, policy)
        q0 = task.question_span[0]
        host.append(sid, task.prompt_ids[:q0])
        before = decodes[0]
        host.append(sid, task.prompt_ids[q0:])
        assert decodes[0] == before, "the question was decoded again after its scoring pass"
        assert host.session_stats(sid)["resident_tokens"] <= policy.budget_tokens
        assert host.generate(sid, len(task.answer_ids)) == task.answer_ids
        stats = host.session_stats(sid)
        counters = stats["counters"]
        assert counters["recalls"] > 0 and counters["recall_us"] > 0
        if method == "streaming":  # (a scored session held its whole first turn before compressing it)
            assert stats["peak_resident_tokens"] <= policy.budget_tokens
        cold_blocks = sum(v["blocks"] for v in stats["cold"].values())
        assert cold_blocks == counters["spills"] - counters["recalls"]
        host.close(sid)


def _prepared(host: BackendHost, sid: str) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if host.session_stats(sid)["counters"]["recall_prep_us"] > 0:
            return True
        time.sleep(0.01)
    return False


def test_a_recall_prepared_while_the_backend_is_idle_gives_the_same_turn(host: BackendHost) -> None:
    """The idle backend reads a spilling session's cold blocks and merges them with its resident
    KV ahead of the next turn; that turn keeps, recalls and answers exactly as one that found
    nothing prepared. A call of the session in between makes the backend prepare again."""
    task = TASKS[0]
    q0 = task.question_span[0]
    policy = ps.policy_for("streaming", task, 0.25, CFG).model_copy(update={"spill": True})
    seen = {}
    idle = host._loop._on_idle
    for name, prepare in (("unprepared", False), ("prepared", True)):
        host._loop._on_idle = idle if prepare else None
        host.open_session(name, policy)
        host.append(name, task.prompt_ids[:q0])
        if prepare:
            assert _prepared(host, name)
        else:
            time.sleep(0.1)
            assert host.session_stats(name)["counters"]["recall_prep_us"] == 0
        if prepare:  # a call in between: prepared again for where the session is now
            first = host.session_stats(name)["counters"]["recall_prep_us"]
            host.append(name, task.prompt_ids[q0 : q0 + 1])
            deadline = time.monotonic() + 30
            while host.session_stats(name)["counters"]["recall_prep_us"] == first and time.monotonic() < deadline:
                time.sleep(0.01)
            assert host.session_stats(name)["counters"]["recall_prep_us"] > first
        else:
            host.append(name, task.prompt_ids[q0 : q0 + 1])
        host.append(name, task.prompt_ids[q0 + 1 :])
        resident = host.executor.resident_ranges(name)
        counters = host.session_stats(name)["counters"]
        seen[name] = (resident, counters["recalls"], counters["recalled_tokens"],
                      host.generate(name, len(task.answer_ids)))
        host.close(name)
    host._loop._on_idle = idle
    assert seen["prepared"] == seen["unprepared"]
    assert seen["prepared"][1] > 0 and seen["prepared"][3] == task.answer_ids


def test_the_idle_backend_reads_cold_blocks_without_holding_up_calls(host: BackendHost) -> None:
    """While the idle backend reads a session's cold blocks from the store, calls that come get
    through, a control call and one that needs an engine step alike: the store's answer (a Ray
    call, a disk read) holds up no one."""
    task = TASKS[1]
    q0 = task.question_span[0]
    policy = ps.policy_for("streaming", task, 0.25, CFG).model_copy(update={"spill": True})
    port = host._store
    assert port is not None
    inner = port.get_many
    entered, answered = threading.Event(), threading.Event()
    got_through: list[bool] = []

    def reading(keys: Any) -> Any:  # the real read, once the test's call has had its chance
        if not entered.is_set():
            entered.set()
            got_through.append(answered.wait(10))
        return inner(keys)

    port.get_many = reading  # type: ignore[method-assign]
    host.open_session("other")
    try:
        host.open_session("unlocked", policy)
        host.append("unlocked", task.prompt_ids[:q0])
        assert entered.wait(30), "the idle backend did not read the session's cold blocks"
        host.session_stats("unlocked")  # takes the host lock while the read is under way
        host.append("other", task.prompt_ids[:32])  # a step of the engine meanwhile
        answered.set()
        assert _prepared(host, "unlocked")
        assert got_through == [True]
    finally:
        del port.get_many
        answered.set()
        host.close("unlocked")
        host.close("other")
