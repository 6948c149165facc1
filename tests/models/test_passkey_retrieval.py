"""Retrieval under eviction with the project's own passkey model, on the path users run
(docs/policies.md, T2: scorers): ``kvres.cluster`` sessions on a local Ray cluster with a
llama.cpp and an OpenVINO (state mode) backend on models/passkey.gguf.

Each answer is one session (``benchmarks.passkey.sessions``): open it with the policy, append the
prompt ids, generate as many tokens as the passkey has digits, close it. Blocks of 4 tokens, 4
sinks, recent window = the question + 2, SnapKV window = the question; streaming re-bases, scored
sessions keep position gaps and are compressed after prefill. The budget is ``ceil(fraction *
prompt)``. Fixed prompt sets (``fixed_task_set``, seed 0, 50 prompts of 300-394 tokens, needle in
the middle third):

- family 1 (one passkey) at 10% and 25% budgets, on both engines: SnapKV >= 95% / >= 98%,
  streaming <= 10%, OpenVINO within 4 points of llama.cpp in each of those cells, and no session
  holds more than its budget after the answer;
- family 2 (4 key/value needles, the question asks for one) at 25%, on both engines: SnapKV beats
  H2O (which does not know the question) by at least ``MULTI_MARGIN``;
- OpenVINO with a full cache: >= 95% on both sets;
- the answers come from the scores: the SnapKV cell at 10% run in-process on a ``BackendHost``
  (the real llama.cpp executor) with SnapKV's scores made constant falls back to recency and
  loses the needle (<= 10%), while the same run unpatched keeps it (>= 95%).

A missing ``models/passkey.gguf`` fails (never skips), naming the path.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from benchmarks.passkey import harness as h
from benchmarks.passkey import sessions as ps
from models import passkey_tasks as pt

GGUF = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
N_PROMPTS = 50
LENGTHS = (300, 394)
MIDDLE_THIRD = (1 / 3, 2 / 3)
CFG = h.EvalConfig()  # blocks of 4, sinks 4, recent = question + 2; streaming re-based
ENGINES = (ps.LLAMA, ps.OPENVINO)

# Measured through sessions on passkey.gguf sha256 9c8cb684... (llama.cpp and OpenVINO alike,
# 1 thread per backend): family 1: SnapKV 100% at 10% and 25%, streaming 0% at both; family 2 at
# 25%: full cache 98%, SnapKV 98%, H2O 0%: margin +0.98. Asserted with slack (floors of 95% / 98%,
# about half the family-2 margin): the answers are deterministic for one model on one CPU, but other
# CPUs' float rounding flips borderline prompts, and a retrain is only required to reproduce
# full-cache accuracy within 2 points. +0.5 still means SnapKV answers 25 more of the 50 prompts
# than H2O: the effect this test shows.
SNAPKV_FLOOR = {0.10: 0.95, 0.25: 0.98}
STREAMING_CEILING = 0.10
ENGINE_GAP = 0.04
MULTI_MARGIN = 0.5
FULL_FLOOR = 0.95
CONSTANT_CEILING = 0.10


@pytest.fixture(scope="module")
def gguf() -> Path:
    if not GGUF.is_file():
        pytest.fail(f"passkey model missing: {GGUF} (train it: python models/train_passkey.py)", pytrace=False)
    return GGUF


def _tasks(family: int) -> list[pt.PasskeyTask]:
    return pt.fixed_task_set(family, N_PROMPTS, seed=0, n_tokens=LENGTHS, depth=MIDDLE_THIRD)


@pytest.fixture(scope="module")
def manager(gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    import ray

    from kvres.cluster import ColdStoreConfig, KvresConfig, connect

    config = KvresConfig(
        backends=ps.backend_configs(gguf, ENGINES, threads=1),
        cold_store=ColdStoreConfig(ram_budget_bytes=8 << 20, disk_budget_bytes=32 << 20,
                                   disk_dir=tmp_path_factory.mktemp("passkey-coldstore")),
    )
    if ray.is_initialized():
        ray.shutdown()
    mgr = connect(namespace=f"kvres-passkey-{uuid.uuid4().hex[:8]}", config=config, num_cpus=2,
                  include_dashboard=False)
    yield mgr
    mgr.shutdown()
    ray.shutdown()


def _engine_records(manager, engine: str) -> list[h.Record]:
    single = ("full", "streaming", "snapkv") if engine == ps.OPENVINO else ("streaming", "snapkv")
    return (ps.evaluate(manager, engine, _tasks(1), single, tuple(SNAPKV_FLOOR), CFG)
            + ps.evaluate(manager, engine, _tasks(2), ("full", "snapkv", "h2o"), (0.25,), CFG))


@pytest.fixture(scope="module")
def records(manager) -> list[h.Record]:
    """Every cell, the two backends side by side (each runs its sessions one at a time)."""
    with ThreadPoolExecutor(len(ENGINES)) as pool:
        return [r for part in pool.map(lambda e: _engine_records(manager, e), ENGINES) for r in part]


def _acc(records: list[h.Record], engine: str, family: int, method: str, budget: float = 1.0) -> float:
    return h.accuracy(records, engine=engine, family=family, method=method, budget=budget)


def test_fixed_sets_are_what_the_thresholds_were_measured_on() -> None:
    for family in (1, 2):
        tasks = _tasks(family)
        assert len(tasks) == N_PROMPTS >= 50
        for t in tasks:
            assert LENGTHS[0] <= t.n_tokens <= LENGTHS[1]
            assert MIDDLE_THIRD[0] <= t.depth <= MIDDLE_THIRD[1]


@pytest.mark.parametrize("budget", sorted(SNAPKV_FLOOR))
def test_snapkv_keeps_the_passkey_where_streaming_loses_it(records, budget: float) -> None:
    got = {(e, m): _acc(records, e, 1, m, budget) for e in ENGINES for m in ("snapkv", "streaming")}
    over = [r for r in records if r.method != "full" and r.resident_tokens is not None
            and r.resident_tokens > r.budget_tokens]
    assert not over, f"{len(over)} sessions held more than their budget after the answer, e.g. {over[0]}"
    for engine in ENGINES:
        snap, stream = got[(engine, "snapkv")], got[(engine, "streaming")]
        assert snap >= SNAPKV_FLOOR[budget], (
            f"{engine} SnapKV at {budget:.0%}: {snap:.0%} < {SNAPKV_FLOOR[budget]:.0%} (streaming {stream:.0%})")
        assert stream <= STREAMING_CEILING, (
            f"{engine} streaming at {budget:.0%}: {stream:.0%} > {STREAMING_CEILING:.0%} (needles sit in the "
            "middle third)")
    for method in ("snapkv", "streaming"):
        llama, ov = got[(ps.LLAMA, method)], got[(ps.OPENVINO, method)]
        assert abs(ov - llama) <= ENGINE_GAP, (
            f"{method} at {budget:.0%}: OpenVINO {ov:.0%} vs llama.cpp {llama:.0%}, more than "
            f"{ENGINE_GAP:.0%} apart")


@pytest.mark.parametrize("engine", ENGINES)
def test_question_window_beats_h2o_on_several_needles(records, engine: str) -> None:
    full, snap, h2o = (_acc(records, engine, 2, m, b) for m, b in (("full", 1.0), ("snapkv", 0.25), ("h2o", 0.25)))
    assert full >= FULL_FLOOR, (
        f"{engine} answers {full:.0%} of the family-2 prompts with a full cache (< {FULL_FLOOR:.0%}): the "
        f"margin of SnapKV ({snap:.0%}) over H2O ({h2o:.0%}) at 25% cannot be measured on it"
    )
    assert snap - h2o >= MULTI_MARGIN, (
        f"{engine}: SnapKV {snap:.0%} - H2O {h2o:.0%} = {snap - h2o:+.0%} < {MULTI_MARGIN:.0%} at a 25% "
        f"budget (full cache {full:.0%})"
    )


@pytest.mark.parametrize("family", [1, 2])
def test_openvino_answers_with_a_full_cache(records, family: int) -> None:
    acc = _acc(records, ps.OPENVINO, family, "full")
    assert acc >= FULL_FLOOR, f"OpenVINO full-cache accuracy {acc:.0%} < {FULL_FLOOR:.0%} on {N_PROMPTS} family-{family} prompts"


def test_snapkv_answers_come_from_its_scores(gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scorer object is patched in this process, so the backend runs here (a BackendHost over
    the real llama.cpp executor), not behind Ray."""
    from kvres.actors.backend_setup.engine_registry import make_executor
    from kvres.actors.host.backend import BackendHost
    from kvres.policy import scorers

    config = ps.backend_configs(gguf, [ps.LLAMA], threads=1)[0]
    executor = make_executor(config, gguf)
    host = BackendHost(config, executor)
    tasks = _tasks(1)
    calls = {"n": 0}

    def accuracy() -> float:
        hits = 0
        for i, task in enumerate(tasks):
            policy = ps.policy_for("snapkv", task, 0.10, CFG)
            host.open_session(f"s{i}", policy)
            try:
                host.append(f"s{i}", task.prompt_ids)
                hits += host.generate(f"s{i}", len(task.answer_ids)) == task.answer_ids
            finally:
                host.close(f"s{i}")
        return hits / len(tasks)

    def constant(self: scorers.SnapKV, capture: scorers.Capture) -> np.ndarray:
        calls["n"] += 1
        return np.ones(capture.key_positions.shape[0])

    try:
        scored = accuracy()
        monkeypatch.setattr(scorers.SnapKV, "score", constant)
        flat = accuracy()
    finally:
        executor.close()
    assert calls["n"] >= len(tasks), f"SnapKV.score ran {calls['n']} times for {len(tasks)} sessions"
    assert scored >= SNAPKV_FLOOR[0.10], f"SnapKV at 10% in-process: {scored:.0%} < {SNAPKV_FLOOR[0.10]:.0%}"
    assert flat <= CONSTANT_CEILING, (
        f"SnapKV at 10% with constant scores still answered {flat:.0%} (> {CONSTANT_CEILING:.0%}): the "
        f"answers do not depend on the scores (with them: {scored:.0%})"
    )


def _two_turns(manager, task: pt.PasskeyTask, policy) -> bool:
    """Turn 1 appends the context without the question, turn 2 the question; then the answer."""
    q0 = task.question_span[0]
    session = manager.open_session(policy=policy, backend=ps.backend_name(ps.LLAMA))
    try:
        session.append(task.prompt_ids[:q0])
        session.append(task.prompt_ids[q0:])
        return bool(session.generate(len(task.answer_ids)) == task.answer_ids)
    finally:
        session.close()


@pytest.mark.parametrize(("method", "budget", "spill", "floor", "ceiling"), [
    ("streaming", 0.25, True, 0.9, 1.0),
    ("streaming", 0.25, False, 0.0, 0.1),
    ("snapkv", 0.10, True, 0.9, 1.0),
])
def test_spilled_kv_comes_back_for_the_question(manager, method, budget, spill, floor, ceiling) -> None:
    """Two turns through Session: what turn 1 evicted to the cold store is recalled by exact
    import when the question arrives (scored by the question's attention); dropped KV is gone."""
    tasks = _tasks(1)
    hits = [
        _two_turns(manager, t, ps.policy_for(method, t, budget, CFG).model_copy(update={"spill": spill}))
        for t in tasks
    ]
    acc = sum(hits) / len(hits)
    assert floor <= acc <= ceiling, f"{method} at {budget:.0%} spill={spill}: {acc:.0%} on {len(tasks)} prompts"
