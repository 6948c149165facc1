"""Residency policies: what a session keeps resident, one small object per policy (the kvpress style).

Primitives:
- ``Residency``: the base, a frozen object built once when a session opens. ``kind`` is what a
  ``SessionPolicy`` calls it. Its fields are the window's shape (``sink_tokens``,
  ``recent_tokens``, ``block_size``, ``budget_tokens``: the resident budget the policy names,
  ``rebase``, ``spill``, ``observation_window``) and ``degraded`` (why it runs instead of a
  stronger policy the engine could not run, ``kvres.policy.degrade``; empty when it runs as
  asked); it says what it needs (``requirements``: ``Capabilities`` field names) and decides:
  ``evicts`` (kvres plans this session's evictions), ``keeps_every_token`` (nothing evicts from
  it, neither kvres nor the engine), ``planned_budget_tokens`` (the budget kvres plans it to) and
  ``enforced_budget_tokens`` (the budget kvres or the engine holds it to), ``compresses`` (it is
  cut to its budget by scores after a prefill, not planned chunk by chunk), ``chunk(remaining)``
  (the most an append prefills in one step), ``ahead(remaining)`` (what a generate plans room
  for), ``stream_policy()``, ``engine_eviction()`` (an ``EngineEviction``: what an engine that
  evicts by itself is told), ``describe()`` (one line for people).
- ``NoEviction``, ``Streaming``, ``Scored`` (SnapKV, H2O or KeyNorm), ``EngineEvicts`` (the engine
  evicts inside each request).
- ``PolicyKind`` and ``Aggregation``: the values ``SessionPolicy.kind`` and
  ``SessionPolicy.aggregation`` take; ``RESIDENCIES``: kind -> residency class, the one table of
  them; ``make_residency(kind, scorer=, aggregation=, **shape)``: the factory, the one place a
  kind or a scorer name (``kvres.policy.scorers.SCORERS``) becomes an object.
- ``EngineNeed``: which engines can run a session (``Residency.engine_need``, what placement asks).
- ``Ranking``: what ranks a session's blocks when it is cut or recalls (``Residency.ranking``): its
  ``scorer``, ``block_scores(source, ranges)`` and, for H2O, the running accumulator (every query
  row counted once: ``observe``, ``pending_rows``, ``rows_seen``); ``by_attention_window``: SnapKV,
  the ranking a recall's scoring pass can use.
- ``ScoreSource``: what a ranking reads from the engine (``attention``, ``keys``, ``log_length``,
  ``resident_tokens``).
- ``recall_scorer(caps)``: what ranks the blocks of a session that has no scorer of its own.

Pure: no engine, no I/O. The backend host asks these objects; no code compares policy kinds or
scorer names (``tests/policy/test_vocabulary.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from .capabilities import Capabilities, CapabilityName
from .planner import StreamPolicy
from .ranges import Range
from .scorers import KeyCapture, KeyNorm, Scorer, ScorerInput, ScorerName, SnapKV, scorer_for
from .scoring import AttentionCapture, H2OAccumulator, block_scores

PolicyKind = Literal["none", "streaming", "scored", "engine"]  # the keys of RESIDENCIES
Aggregation = Literal["SUM", "NORM_SUM"]  # how an engine that evicts by itself sums block scores
_SCORER_CAPABILITY: Mapping[ScorerInput, CapabilityName] = {"attention": "attention_capture", "keys": "key_access"}


class ScoreSource(Protocol):
    """The engine side of scoring one session."""

    def attention(self, window: int) -> AttentionCapture: ...

    def keys(self) -> KeyCapture: ...

    def log_length(self) -> int: ...

    def resident_tokens(self) -> int: ...


@dataclass
class Ranking:
    """Ranks a session's resident blocks. SnapKV reads the last ``window`` rows; KeyNorm the
    resident keys; H2O adds the rows processed since its last capture to what every key received
    (each row counted once, ``rows_seen`` of them) and ranks by the total. One capture holds a
    bounded number of rows (llama.cpp: one micro-batch), so the host has H2O ``observe`` the rows
    of a long call before more arrive than a capture holds (``pending_rows``)."""

    scorer: Scorer
    window: int
    rows_seen: int = 0  # query rows the H2O accumulator has added
    _accumulated: H2OAccumulator | None = None
    _scored_upto: int = 0  # the log length whose rows the accumulator has seen

    @property
    def by_attention_window(self) -> bool:
        return self.scorer.by_attention_window

    @property
    def accumulates(self) -> bool:
        """It must see every call's rows, even when nothing is cut (H2O)."""
        return self.scorer.accumulates

    def pending_rows(self, log_length: int) -> int:
        """Rows processed since the accumulator's last capture (0 for a ranking that does not
        accumulate)."""
        return max(0, log_length - self._scored_upto) if self.accumulates else 0

    def observe(self, source: ScoreSource) -> None:
        """Add the rows processed since the last capture to the accumulator (H2O), ranking
        nothing; a no-op for the other scorers."""
        if not self.accumulates:
            return
        log_len = source.log_length()
        new_rows = min(log_len - self._scored_upto, source.resident_tokens())
        if self._accumulated is None:
            self._accumulated = H2OAccumulator()
        if new_rows > 0:
            capture = source.attention(new_rows)
            self._accumulated.add(capture.probs, capture.key_positions)
            self.rows_seen += int(capture.query_positions.size)
        self._scored_upto = log_len

    def block_scores(self, source: ScoreSource, ranges: list[Range]) -> list[float]:
        if self.scorer.needs == "keys":
            return self.scorer.block_scores(source.keys(), ranges)
        if not self.accumulates:
            return self.scorer.block_scores(source.attention(self.window), ranges)
        self.observe(source)
        assert self._accumulated is not None
        totals = self._accumulated.scores
        return [float(x) for x in block_scores(totals, np.arange(totals.size), ranges)]

    def drop(self, ranges: Sequence[Range]) -> None:
        """Evicted keys take their accumulated attention with them."""
        if self._accumulated is not None:
            self._accumulated.drop(ranges)

    def reset(self) -> None:
        """The session went back to an earlier state: start counting rows again."""
        self._accumulated, self._scored_upto, self.rows_seen = None, 0, 0


def recall_scorer(caps: Capabilities, window: int) -> Scorer | None:
    """What ranks blocks on a recall turn of a session without a scorer of its own: SnapKV by a
    scoring pass where the engine captures attention, KeyNorm where it reads its keys, else none."""
    if caps.attention_capture:
        return SnapKV(window=window)
    if caps.key_access:
        return KeyNorm()
    return None


class EngineNeed(Enum):
    """Which engines can run a session: any, those whose KV kvres addresses (kvres evicts), or
    those that evict by themselves."""

    ANY = "any"
    KVRES_ADDRESSED = "kvres-addressed"
    ENGINE_MANAGED = "engine-managed"


@dataclass(frozen=True)
class EngineEviction:
    """What an engine that evicts by itself is told: the protected window (``stream``), the
    session's budget and how block scores are summed."""

    stream: StreamPolicy
    budget_tokens: int
    aggregation: Aggregation


@dataclass(frozen=True)
class Residency:
    kind: ClassVar[PolicyKind] = "none"  # what a SessionPolicy calls it
    keeps_every_token: ClassVar[bool] = False  # nothing evicts from it (neither kvres nor the engine)
    sink_tokens: int = 4
    recent_tokens: int = 64
    block_size: int = 16
    budget_tokens: int | None = None
    rebase: bool = True
    spill: bool = True
    observation_window: int = 16
    degraded: str = ""  # why this runs instead of the policy asked (``kvres.policy.degrade``); "" as asked
    evicts: bool = field(default=False, init=False)  # kvres plans this session's evictions
    compresses: bool = field(default=False, init=False)  # cut to budget by scores after a prefill

    @classmethod
    def configured(cls, shape: Mapping[str, Any], scorer: ScorerName, aggregation: Aggregation) -> Residency:
        """This kind of policy with the window ``shape`` (``Residency``'s fields), and the scorer or
        the aggregation where the kind uses them (``make_residency``)."""
        return cls(**shape)

    @property
    def planned_budget_tokens(self) -> int | None:
        """The session's own resident budget, where kvres plans its evictions to it, else None."""
        return self.budget_tokens if self.evicts else None

    @property
    def engine_need(self) -> EngineNeed:
        return EngineNeed.KVRES_ADDRESSED if self.evicts else EngineNeed.ANY

    @property
    def enforced_budget_tokens(self) -> int | None:
        """The most the session keeps resident where its policy bounds it (kvres's eviction or
        the engine's), else None."""
        return self.budget_tokens if self.evicts else None

    @property
    def spills(self) -> bool:
        """Evicted blocks go to the cold store (and come back by recall)."""
        return self.evicts and self.spill

    def stream_policy(self) -> StreamPolicy:
        return StreamPolicy(self.evicts, self.sink_tokens, self.recent_tokens, self.rebase)

    def chunk(self, remaining: int) -> int:
        """The most an append prefills in one step."""
        return remaining

    def ahead(self, remaining: int) -> int:
        """What a generate with ``remaining`` tokens to go plans room for at once."""
        return self.chunk(remaining)

    def own_scorer(self) -> Scorer | None:
        """The scorer the policy names (kind "scored"), else None."""
        return None

    def ranking(self, caps: Capabilities) -> Ranking | None:
        """What ranks this session's blocks on this engine: its own scorer, else the recall
        scorer the engine allows."""
        scorer = self.own_scorer() or recall_scorer(caps, self.observation_window)
        return None if scorer is None else Ranking(scorer, self.observation_window)

    def requirements(self) -> tuple[CapabilityName, ...]:
        """Capabilities (``Capabilities`` field names) the engine must have: evicting from the
        middle, and closing the gaps where ``rebase`` (keeping them moves no cell)."""
        if not self.evicts:
            return ()
        return ("remove_middle", "position_shift") if self.rebase else ("remove_middle",)

    def engine_eviction(self) -> EngineEviction | None:
        """What an engine that evicts by itself is told (None: kvres evicts, or nothing does)."""
        return None

    def describe(self) -> str:
        """One line for people (``kvres inspect``)."""
        parked = "spilled to the cold store" if self.spill else "dropped"
        positions = "positions re-based" if self.rebase else "position gaps kept"
        return (f"{self.kind}, budget {self.budget_tokens} tokens, sinks {self.sink_tokens}, recent "
                f"{self.recent_tokens}, blocks of {self.block_size}, evicted blocks {parked}, {positions}")


@dataclass(frozen=True)
class NoEviction(Residency):
    """Everything stays resident (spilled or suspended only as a whole)."""

    keeps_every_token: ClassVar[bool] = True

    def describe(self) -> str:
        return "none (keep every token resident)"


@dataclass(frozen=True)
class Streaming(Residency):
    """Sinks + the recent window, evicted step by step; an append prefills in chunks of at most
    half the evictable room, so the window never overflows within a step."""

    kind: ClassVar[PolicyKind] = "streaming"
    evicts: bool = field(default=True, init=False)

    def chunk(self, remaining: int) -> int:
        if self.budget_tokens is None:
            return remaining
        room = self.budget_tokens - self.sink_tokens - self.recent_tokens
        return min(remaining, max(1, room // 2))


@dataclass(frozen=True)
class Scored(Residency):
    """Compress after prefill: prefilled whole (in chunks as large as the free room), then cut to
    the budget by the scorer."""

    kind: ClassVar[PolicyKind] = "scored"
    scorer: Scorer = field(default_factory=SnapKV)
    evicts: bool = field(default=True, init=False)
    compresses: bool = field(default=True, init=False)

    @classmethod
    def configured(cls, shape: Mapping[str, Any], scorer: ScorerName, aggregation: Aggregation) -> Residency:
        made = cls(**shape)
        return replace(made, scorer=scorer_for(scorer, made.observation_window))

    def ahead(self, remaining: int) -> int:
        return 1

    def own_scorer(self) -> Scorer | None:
        return self.scorer

    def describe(self) -> str:
        return super().describe().replace(self.kind, f"scored by {self.scorer.name}", 1)

    def requirements(self) -> tuple[CapabilityName, ...]:
        return (_SCORER_CAPABILITY[self.scorer.needs], *super().requirements())


@dataclass(frozen=True)
class EngineEvicts(Residency):
    """The engine evicts inside each request (OpenVINO GenAI's CacheEvictionConfig)."""

    kind: ClassVar[PolicyKind] = "engine"
    aggregation: Aggregation = "NORM_SUM"

    @classmethod
    def configured(cls, shape: Mapping[str, Any], scorer: ScorerName, aggregation: Aggregation) -> Residency:
        return cls(**shape, aggregation=aggregation)

    @property
    def engine_need(self) -> EngineNeed:
        return EngineNeed.ENGINE_MANAGED

    @property
    def enforced_budget_tokens(self) -> int | None:
        return self.budget_tokens

    def ranking(self, caps: Capabilities) -> Ranking | None:
        return None

    def engine_eviction(self) -> EngineEviction | None:
        return EngineEviction(StreamPolicy(True, self.sink_tokens, self.recent_tokens), self.budget_tokens or 0,
                              self.aggregation)

    def describe(self) -> str:
        return (f"engine-managed ({self.aggregation}), budget {self.budget_tokens} tokens, sinks "
                f"{self.sink_tokens}, recent {self.recent_tokens}")


RESIDENCIES: Mapping[str, type[Residency]] = {cls.kind: cls for cls in (NoEviction, Streaming, Scored, EngineEvicts)}


def make_residency(kind: str, *, scorer: ScorerName = "snapkv", aggregation: Aggregation = "NORM_SUM",
                   **shape: Any) -> Residency:
    """The residency object a policy of ``kind`` stands for: ``shape`` the window's fields
    (``Residency``'s), ``scorer`` (kind "scored") and ``aggregation`` (kind "engine") where the kind
    uses them. ``SessionPolicy.residency`` calls it."""
    residency = RESIDENCIES.get(kind)
    if residency is None:
        raise ValueError(f"unknown policy kind {kind!r}; known: {', '.join(RESIDENCIES)}")
    return residency.configured(shape, scorer, aggregation)


__all__ = [
    "RESIDENCIES", "Aggregation", "EngineEviction", "EngineEvicts", "EngineNeed", "NoEviction", "PolicyKind", "Ranking",
    "Residency", "Scored", "ScoreSource", "Streaming", "make_residency", "recall_scorer",
]
