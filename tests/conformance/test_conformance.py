"""The conformance table, run against every executor (see conftest.py for the registry)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvres.actors.engines.executor import apply_plan
from kvres.policy import (
    Block,
    BlockFlag,
    PlanInput,
    Range,
    RangeError,
    UnknownSessionError,
    plan_hot_set,
    split_into_blocks,
)
from kvres.policy.scorers import SnapKV

from .scenarios import BLOCK, PROMPT_LEN, SCENARIOS, Scenario, prompt_tokens

NEXT_TOKEN = 5


def _open(executor: Any, session_id: str = "s", n: int = PROMPT_LEN) -> np.ndarray:
    executor.open_session(session_id)
    return executor.append(session_id, prompt_tokens(n))


def _blocks(executor: Any, session_id: str, pinned: tuple[int, ...] = ()) -> list[Block]:
    blocks = split_into_blocks(executor.resident_ranges(session_id), BLOCK)
    return [
        Block(b.range, flags=BlockFlag.PINNED if i in pinned else BlockFlag.NONE, last_used=i)
        for i, b in enumerate(blocks)
    ]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_retention_scenario(make_executor: Callable[[], Any], scenario: Scenario) -> None:
    executor = make_executor()
    _open(executor)
    caps = executor.capabilities().without(*scenario.withhold)
    plan = plan_hot_set(
        PlanInput(
            _blocks(executor, "s", scenario.pinned_blocks), scenario.budget,
            scenario.stream, caps, scenario.scores,
        )
    )
    apply_plan(executor, "s", plan)
    assert executor.resident_ranges("s") == scenario.expect_resident
    assert plan.over_budget == scenario.expect_over_budget
    if scenario.expect_diagnostic:
        assert any(scenario.expect_diagnostic in d for d in plan.diagnostics), plan.diagnostics
    assert executor.token_log("s") == prompt_tokens()
    logits = executor.append("s", [NEXT_TOKEN])
    assert logits.dtype == np.float32 and np.all(np.isfinite(logits))


def _uninterrupted_logits(make_executor: Callable[[], Any]) -> np.ndarray:
    reference = make_executor()
    _open(reference)
    return reference.append("s", [NEXT_TOKEN])


def test_export_evict_import_is_exact(make_executor: Callable[[], Any]) -> None:
    expected = _uninterrupted_logits(make_executor)
    executor = make_executor()
    _open(executor)
    rng = Range(48, 112)
    block = executor.export_range("s", rng)
    executor.evict_range("s", rng, rebase=False)
    assert executor.resident_ranges("s") == [Range(0, 48), Range(112, PROMPT_LEN)]
    executor.import_range("s", block)
    assert executor.resident_ranges("s") == [Range(0, PROMPT_LEN)]
    np.testing.assert_array_equal(executor.append("s", [NEXT_TOKEN]), expected)


def test_export_evict_rebase_import_restores_positions(make_executor: Callable[[], Any]) -> None:
    expected = _uninterrupted_logits(make_executor)
    executor = make_executor()
    _open(executor)
    rng = Range(64, 128)
    block = executor.export_range("s", rng)
    executor.evict_range("s", rng, rebase=True)
    executor.import_range("s", block)
    assert executor.resident_ranges("s") == [Range(0, PROMPT_LEN)]
    # the tail was shifted down and back up: only the K-shift's rounding may differ
    np.testing.assert_allclose(executor.append("s", [NEXT_TOKEN]), expected, atol=0.1)


def test_evict_then_admit_recomputes(make_executor: Callable[[], Any]) -> None:
    expected = _uninterrupted_logits(make_executor)
    executor = make_executor()
    _open(executor)
    executor.evict_range("s", Range(32, 96), rebase=False)
    executor.admit_range("s", Range(32, 96))
    assert executor.resident_ranges("s") == [Range(0, PROMPT_LEN)]
    np.testing.assert_allclose(executor.append("s", [NEXT_TOKEN]), expected, atol=1e-3)


def test_rebased_eviction_changes_positions_not_tokens(make_executor: Callable[[], Any]) -> None:
    executor = make_executor()
    _open(executor)
    before = executor.append("s", [NEXT_TOKEN])
    executor.evict_range("s", Range(16, 120), rebase=True)
    assert executor.resident_ranges("s") == [Range(0, 16), Range(120, PROMPT_LEN + 1)]
    assert executor.token_log("s") == prompt_tokens() + [NEXT_TOKEN]
    after = executor.append("s", [NEXT_TOKEN])
    assert after.shape == before.shape and np.all(np.isfinite(after))


def test_sessions_are_isolated(make_executor: Callable[[], Any]) -> None:
    alone = make_executor()
    alone.open_session("a")
    expected = alone.append("a", prompt_tokens(80, seed=1))
    shared = make_executor()
    shared.open_session("b")
    shared.append("b", prompt_tokens(120, seed=2))
    shared.open_session("a")
    got = shared.append("a", prompt_tokens(80, seed=1))
    # flash attention on CPU rounds in KV-cell order: interleaved cells move logits by ~1e-4
    np.testing.assert_allclose(got, expected, atol=1e-3)


def test_attention_scores_one_per_range(make_executor: Callable[[], Any]) -> None:
    executor = make_executor()
    if not executor.capabilities().attention_capture:
        pytest.fail("every executor in the table is expected to capture attention")
    _open(executor)
    ranges = [Range(0, 16), Range(16, 100), Range(100, 200)]
    scores = SnapKV(16).block_scores(executor.attention("s", 16), ranges)
    assert len(scores) == 3
    assert all(np.isfinite(s) and s >= 0 for s in scores)


def _state(executor: Any) -> tuple[list[Range], list[int]]:
    return executor.resident_ranges("s"), executor.token_log("s")


@pytest.mark.parametrize(
    "operation",
    [
        lambda e: e.evict_range("s", Range(150, 250)),
        lambda e: e.evict_range("s", Range(10, 20)),  # already evicted below
        lambda e: e.admit_range("s", Range(100, 120)),  # resident
        lambda e: e.admit_range("s", Range(190, 240)),  # outside the log
        lambda e: e.export_range("s", Range(12, 30)),  # partly evicted
        lambda e: e.evict_range("s", Range(0, 500)),
    ],
    ids=["evict-outside", "evict-evicted", "admit-resident", "admit-outside", "export-evicted",
         "scores-outside"],
)
def test_bad_ranges_raise_and_change_nothing(make_executor: Callable[[], Any], operation: Any) -> None:
    executor = make_executor()
    _open(executor)
    executor.evict_range("s", Range(8, 24))
    before = _state(executor)
    with pytest.raises(RangeError):
        operation(executor)
    assert _state(executor) == before
    assert np.all(np.isfinite(executor.append("s", [NEXT_TOKEN])))


def test_unknown_session(make_executor: Callable[[], Any]) -> None:
    executor = make_executor()
    with pytest.raises(UnknownSessionError, match="nope"):
        executor.append("nope", [1])
    with pytest.raises(UnknownSessionError):
        executor.resident_ranges("nope")


def test_import_into_overlapping_resident_range_is_refused(make_executor: Callable[[], Any]) -> None:
    executor = make_executor()
    _open(executor)
    block = executor.export_range("s", Range(40, 60))
    before = _state(executor)
    with pytest.raises(RangeError):
        executor.import_range("s", block)
    assert _state(executor) == before


def test_restored_session_gets_its_exact_layout_back(make_executor: Callable[[], Any]) -> None:
    """Suspend/resume: export every resident range of a re-based session, reopen it from its
    token log alone, import the blocks: same positions, same next-token logits."""
    executor = make_executor()
    _open(executor)
    executor.evict_range("s", Range(16, 96), rebase=True)
    expected_ranges = executor.resident_ranges("s")
    blocks = [executor.export_range("s", r) for r in expected_ranges]
    log = executor.token_log("s")
    reference = make_executor()
    _open(reference)
    reference.evict_range("s", Range(16, 96), rebase=True)
    expected = reference.append("s", [NEXT_TOKEN])
    executor.close_session("s")
    executor.open_session("s", log)
    assert executor.resident_ranges("s") == []
    for block in reversed(blocks):  # order must not matter
        executor.import_range("s", block)
    assert executor.resident_ranges("s") == expected_ranges
    np.testing.assert_array_equal(executor.append("s", [NEXT_TOKEN]), expected)
