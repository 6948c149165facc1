"""Residency policy objects: built once per session from its ``SessionPolicy``, they decide what
the host used to decide by comparing policy kinds and scorer names."""

from __future__ import annotations

import numpy as np
import pytest

from kvres.actors.config import SessionPolicy
from kvres.policy import Capabilities, Range
from kvres.policy.residency import EngineEvicts, EngineNeed, NoEviction, Scored, Streaming
from kvres.policy.scorers import H2O, KeyCapture, KeyNorm, SnapKV
from kvres.policy.scoring import AttentionCapture

FULL = Capabilities(remove_middle=True, position_shift=True, kv_export=True, attention_capture=True,
                    key_access=True)
NO_SCORES = Capabilities(remove_middle=True, position_shift=False)


def test_each_policy_kind_becomes_its_object() -> None:
    assert isinstance(SessionPolicy().residency, NoEviction)
    assert isinstance(SessionPolicy.streaming(128).residency, Streaming)
    scored = SessionPolicy.scored(128, "h2o").residency
    assert isinstance(scored, Scored) and isinstance(scored.scorer, H2O)
    assert isinstance(SessionPolicy.engine_evicts(128).residency, EngineEvicts)


def test_what_each_policy_decides() -> None:
    streaming = SessionPolicy.streaming(132, sink_tokens=4, recent_tokens=64).residency
    assert streaming.evicts and not streaming.compresses and streaming.planned_budget_tokens == 132
    assert streaming.chunk(1000) == (132 - 4 - 64) // 2 and streaming.ahead(1000) == 32
    scored = SessionPolicy.scored(128).residency
    assert scored.compresses and scored.chunk(1000) == 1000 and scored.ahead(1000) == 1
    none = SessionPolicy().residency
    assert not none.evicts and none.planned_budget_tokens is None and none.chunk(1000) == 1000
    engine = SessionPolicy.engine_evicts(128).residency
    assert engine.planned_budget_tokens is None and engine.enforced_budget_tokens == 128
    assert engine.engine_eviction() is not None and streaming.engine_eviction() is None
    assert [p.engine_need for p in (none, streaming, scored, engine)] == [
        EngineNeed.ANY, EngineNeed.KVRES_ADDRESSED, EngineNeed.KVRES_ADDRESSED, EngineNeed.ENGINE_MANAGED]


def test_requirements_name_the_capabilities() -> None:
    assert SessionPolicy().residency.requirements() == ()
    assert SessionPolicy.streaming(128).residency.requirements() == ("remove_middle", "position_shift")
    gaps = SessionPolicy(kind="streaming", budget_tokens=128, rebase=False).residency
    assert gaps.requirements() == ("remove_middle",)
    assert SessionPolicy.scored(128, "keynorm").residency.requirements()[0] == "key_access"
    assert SessionPolicy.scored(128).residency.requirements()[0] == "attention_capture"


def test_the_ranking_follows_the_scorer_and_the_engine() -> None:
    scored = SessionPolicy.scored(128, "keynorm").residency
    ranking = scored.ranking(NO_SCORES)
    assert ranking is not None and isinstance(ranking.scorer, KeyNorm)  # its own scorer, whatever the engine
    streaming = SessionPolicy.streaming(128).residency
    recall = streaming.ranking(FULL)
    assert recall is not None and isinstance(recall.scorer, SnapKV) and recall.by_attention_window
    assert streaming.ranking(NO_SCORES) is None  # nothing could rank its blocks
    assert SessionPolicy.engine_evicts(128).residency.ranking(FULL) is None


class _Source:
    """Attention over ``n`` keys from rows whose count the ranking asks for."""

    def __init__(self, n: int) -> None:
        self.n, self.log, self.asked = n, n, []

    def attention(self, window: int) -> AttentionCapture:
        self.asked.append(window)
        probs = np.full((1, 1, window, self.n), 1.0 / self.n, dtype=np.float32)
        return AttentionCapture(probs, np.arange(self.n), np.arange(self.n - window, self.n))

    def keys(self) -> KeyCapture:
        raise AssertionError("not asked")

    def log_length(self) -> int:
        return self.log

    def resident_tokens(self) -> int:
        return self.n


def test_h2o_counts_every_row_once_and_forgets_on_reset() -> None:
    ranking = SessionPolicy.scored(128, "h2o").residency.ranking(FULL)
    assert ranking is not None and ranking.accumulates
    source = _Source(8)
    first = ranking.block_scores(source, [Range(0, 4), Range(4, 8)])
    source.log += 2
    second = ranking.block_scores(source, [Range(0, 4), Range(4, 8)])
    assert source.asked == [8, 2]  # the rows since the last capture only
    assert second[0] > first[0]
    ranking.reset()
    ranking.block_scores(source, [Range(0, 8)])
    assert source.asked[-1] == 8


@pytest.mark.parametrize("scorer", ["snapkv", "h2o", "keynorm"])
def test_a_scored_policy_keeps_the_scorer_it_names(scorer: str) -> None:
    residency = SessionPolicy.scored(128, scorer).residency  # type: ignore[arg-type]
    assert isinstance(residency, Scored)
    assert type(residency.scorer).__name__.lower() == scorer
