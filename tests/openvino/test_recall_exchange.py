"""The OpenVINO (state mode) recall mechanism on the committed passkey model: a batched exchange
that matches range-by-range eviction and import exactly, cold blocks scored without importing
them, the scored turn taken by the next append; recompute mode keeps the one-range-at-a-time
path (no scoring of blocks it has not imported)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.engines.openvino import openvino_executor
from kvres.actors.engines.openvino.base_executor import OpenVINOExecutor
from kvres.actors.engines.openvino.state_mode import StateExecutor
from kvres.coldstore.block import KVBlock
from kvres.policy import CapabilityError
from kvres.policy.ranges import Range

PASSKEY = Path(__file__).resolve().parents[2] / "models" / "passkey.gguf"
TOKENS = [int(t) for t in np.random.default_rng(0).integers(3, 120, 300)]
TURN = [int(t) for t in np.random.default_rng(1).integers(3, 120, 8)]
SPILLED = [Range(40, 80), Range(100, 104), Range(160, 200)]


@pytest.fixture(scope="module")
def ex() -> Iterator[StateExecutor]:
    executor = openvino_executor(PASSKEY, mode="state")
    assert isinstance(executor, StateExecutor)
    yield executor


def _spilled(ex: OpenVINOExecutor, sid: str, rebase: bool) -> dict[Range, KVBlock]:
    ex.open_session(sid)
    ex.append(sid, TOKENS)
    blocks = {}
    for rng in sorted(SPILLED, reverse=True):
        blocks[rng] = ex.export_range(sid, rng)
        ex.evict_range(sid, rng, rebase=rebase)
    return blocks


@pytest.mark.parametrize("rebase", [False, True])
def test_exchange_matches_range_by_range_eviction_and_import(ex: StateExecutor, rebase: bool) -> None:
    one, many = _spilled(ex, "one", rebase), _spilled(ex, "many", rebase)
    try:
        exported = ex.export_range("one", Range(240, 260))
        ex.evict_range("one", Range(240, 260), rebase=rebase)
        kept = [Range(40, 80), Range(160, 200)]
        if rebase:  # range by range, an import re-opens the gap of the block left cold: compare layouts
            out = ex.exchange("many", [Range(240, 260)], [many[r] for r in kept], rebase=True)
            held = ex.cache_positions("many")[ex.cache_positions("many") >= 0]
            assert held.tolist() == list(range(held.size))  # compacted, like its neighbours
        else:
            for rng in kept:
                ex.import_range("one", one[rng])
            out = ex.exchange("many", [Range(240, 260)], [many[r] for r in kept], rebase=False)
            assert (ex.cache_positions("many") == ex.cache_positions("one")).all()
            assert np.array_equal(ex.append("one", TURN), ex.append("many", TURN))
        assert out[0].payload == exported.payload and out[0].positions == exported.positions
    finally:
        ex.close_session("one")
        ex.close_session("many")


def test_recall_attention_scores_cold_blocks_as_if_resident(ex: StateExecutor) -> None:
    blocks = _spilled(ex, "spilled", rebase=False)
    ex.open_session("whole")
    try:
        ex.append("whole", TOKENS + TURN)
        before = ex.cache_positions("spilled").copy()
        capture = ex.recall_attention("spilled", list(blocks.values()), TURN, len(TURN), rebase=False)
        reference = ex.attention("whole", len(TURN))
        assert (ex.cache_positions("spilled") == before).all()
        assert capture.key_positions.tolist() == list(range(len(TOKENS) + len(TURN)))
        assert capture.probs.shape == reference.probs.shape
        assert np.abs(capture.probs - reference.probs).max() < 1e-4
    finally:
        ex.close_session("spilled")
        ex.close_session("whole")


@pytest.mark.parametrize("rebase", [False, True])
def test_the_scored_turn_is_taken_by_the_next_append(ex: StateExecutor, rebase: bool) -> None:
    taken, decoded = _spilled(ex, "taken", rebase), _spilled(ex, "decoded", rebase)
    try:
        ex.recall_attention("taken", list(taken.values()), TURN, 4, rebase)
        ex.exchange("taken", [], list(taken.values()), rebase)
        ex.exchange("decoded", [], list(decoded.values()), rebase)
        assert ex._sessions["taken"].prefill is not None
        a, b = ex.append("taken", TURN), ex.append("decoded", TURN)
        assert ex._sessions["taken"].prefill is None
        assert (ex.cache_positions("taken") == ex.cache_positions("decoded")).all()
        assert np.abs(a - b).max() < 1e-3
        nxt = [int(np.argmax(a))]
        assert np.abs(ex.append("taken", nxt) - ex.append("decoded", nxt)).max() < 1e-3
    finally:
        ex.close_session("taken")
        ex.close_session("decoded")


def test_recompute_mode_does_not_score_blocks_it_has_not_imported() -> None:
    ex = openvino_executor(PASSKEY, mode="recompute")
    blocks = _spilled(ex, "s", rebase=False)
    with pytest.raises(CapabilityError):
        ex.recall_attention("s", list(blocks.values()), TURN, 4, rebase=False)

