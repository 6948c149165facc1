"""Recall or recompute: bring a cold block back from its tier, or re-prefill its tokens.

Primitives:
- ``TierCost(name, bandwidth_gbps, latency_s)``: what reading from one cold tier costs
  (``bytes / bandwidth + latency``); ``TierCost.seconds(n_bytes)``.
- ``PrefillCost(tokens_per_s, fixed_s=0)``: what recomputing costs (``fixed + tokens / rate``).
- ``recall_or_recompute(block_bytes, n_tokens, tier, prefill) -> RecallDecision``: one block, with
  every term; ties go to recall (the exact stored KV beats a recomputation).
- ``RecallCosts(tiers, prefill)``: the costs of every tier; ``worth_reading(bytes, tokens, tier)``.
- ``BlockSpans(spans, positions)``: blocks to import as columns (``BlockSpans.of(pairs)``).
- ``exchange_layout(positions, evict, imports, rebase) -> Layout``: where every token of a session
  sits after evicting ``evict`` and importing blocks (``(range, exported positions)``) in one step:
  re-based sessions are compacted (resident tokens in log order at 0, 1, 2, ...: the recalled ones
  re-based like their neighbours), gap-keeping ones put blocks back at their exported positions.
- ``union_ranges(ranges) -> list[Range]``: ``merge_ranges`` in numpy (many small blocks).
- ``plan_recall(resident, cold, turn, key_scores, key_positions, policy, block_size, budget,
  capabilities, room) -> RecallChoice``: a recall turn's whole choice: resident and cold blocks
  and the turn scored together by the turn's attention, cut by ``plan_hot_set``, then
  ``choose_recalls``.
- ``choose_recalls(resident, cold, cold_scores, evicted, room) -> RecallChoice``: after a plan over
  a session's resident and cold blocks together, the cold blocks it keeps whole (imported) and the
  resident parts it drops (evicted), the lowest-scoring imports left cold when they need more than
  ``room`` tokens.

Costs come from measured probes (see ``kvres.actors.sizing.probes``), the same as T*. Pure: numpy/stdlib.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal

import numpy as np
import numpy.typing as npt

from .blocks import BlockFlag, BlockTable
from .capabilities import Capabilities
from .errors import KvresError, RangeError
from .planner import PlanInput, StreamPolicy, plan_hot_set
from .positions import PositionMap
from .ranges import IntArray, Range
from .scoring import span_scores

GB = 1e9

Action = Literal["recall", "recompute"]


class RecallCostError(KvresError, ValueError):
    """A cost term that cannot be used (negative, zero where a rate is needed, not finite)."""


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise RecallCostError(f"{name} must be a finite number > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise RecallCostError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class TierCost:
    """Reading ``n`` bytes from a tier takes ``latency_s + n / (bandwidth_gbps * 1e9)`` seconds."""

    name: str
    bandwidth_gbps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        _positive(f"TierCost({self.name!r}).bandwidth_gbps", self.bandwidth_gbps)
        _non_negative(f"TierCost({self.name!r}).latency_s", self.latency_s)

    def seconds(self, n_bytes: float) -> float:
        _non_negative("n_bytes", n_bytes)
        return self.latency_s + n_bytes / (self.bandwidth_gbps * GB)


@dataclass(frozen=True)
class PrefillCost:
    """Recomputing ``n`` tokens takes ``fixed_s + n / tokens_per_s`` seconds (measured prefill rate)."""

    tokens_per_s: float
    fixed_s: float = 0.0

    def __post_init__(self) -> None:
        _positive("PrefillCost.tokens_per_s", self.tokens_per_s)
        _non_negative("PrefillCost.fixed_s", self.fixed_s)

    def seconds(self, n_tokens: int) -> float:
        if n_tokens < 0:
            raise RecallCostError(f"n_tokens must be >= 0, got {n_tokens}")
        return self.fixed_s + n_tokens / self.tokens_per_s


@dataclass(frozen=True)
class RecallDecision:
    action: Action
    block_bytes: int
    n_tokens: int
    tier: TierCost
    prefill: PrefillCost
    recall_s: float  # block_bytes / tier bandwidth + tier latency
    recompute_s: float  # n_tokens / prefill rate + prefill fixed cost

    @property
    def saving_s(self) -> float:
        """Time the chosen action saves over the other one (>= 0)."""
        return abs(self.recompute_s - self.recall_s)


def recall_or_recompute(block_bytes: int, n_tokens: int, tier: TierCost, prefill: PrefillCost) -> RecallDecision:
    """Recall when reading the block back is no slower than re-prefilling its tokens."""
    if block_bytes < 0:
        raise RecallCostError(f"block_bytes must be >= 0, got {block_bytes}")
    recall_s = tier.seconds(block_bytes)
    recompute_s = prefill.seconds(n_tokens)
    action: Action = "recall" if recall_s <= recompute_s else "recompute"
    return RecallDecision(action, block_bytes, n_tokens, tier, prefill, recall_s, recompute_s)


@dataclass(frozen=True)
class RecallCosts:
    """Measured costs per cold tier (by tier name) and of prefill: what a cold store needs to
    decide, block by block, whether reading a block back beats recomputing it."""

    tiers: Mapping[str, TierCost]
    prefill: PrefillCost

    def worth_reading(self, block_bytes: int, n_tokens: int, tier: str) -> bool:
        """True when reading from ``tier`` is no slower than recomputing (or its cost is unknown)."""
        cost = self.tiers.get(tier)
        if cost is None:
            return True
        return recall_or_recompute(block_bytes, n_tokens, cost, self.prefill).action == "recall"


@dataclass(frozen=True)
class Layout:
    """A session's residency after a batched exchange: per log index, resident or not and the
    cache position (-1 where not resident); ``next_pos`` is where the next appended token goes."""

    resident: npt.NDArray[np.bool_]
    positions: IntArray
    next_pos: int


@dataclass(frozen=True)
class BlockSpans:
    """Blocks to import as columns: ``spans`` (rows of start, end) and ``positions`` (every
    block's exported positions, one after the other)."""

    spans: IntArray
    positions: IntArray

    @classmethod
    def of(cls, imports: Sequence[tuple[Range, Sequence[int]]]) -> BlockSpans:
        spans = np.array([(r.start, r.end) for r, _ in imports], dtype=np.int64).reshape(-1, 2)
        counts = [len(p) for _, p in imports]
        bad = np.nonzero(np.asarray(counts, dtype=np.int64) != spans[:, 1] - spans[:, 0])[0]
        if bad.size:
            rng = imports[int(bad[0])][0]
            raise RangeError(f"block for {rng} carries {counts[int(bad[0])]} positions for {len(rng)} tokens")
        return cls(spans, np.fromiter(chain.from_iterable(p for _, p in imports), dtype=np.int64, count=sum(counts)))


def exchange_layout(
    current: PositionMap,
    evict: Sequence[Range],
    imports: Sequence[tuple[Range, Sequence[int]]] | BlockSpans,
    rebase: bool,
) -> Layout:
    """The layout after evicting ``evict`` (resident ranges) and importing ``imports`` (evicted
    ranges with the positions their blocks were exported at). ``rebase``: every resident token
    goes to its rank in log order (gaps closed, as re-based eviction leaves them); otherwise the
    kept tokens stay put and each block goes back to its exported positions, which must still
    increase with the log index (``RangeError`` when they collide)."""
    mask = current.resident_mask()
    pos = current.all_positions()
    for rng in evict:
        current.check_resident(rng)
        mask[rng.start : rng.end] = False
    blocks = imports if isinstance(imports, BlockSpans) else BlockSpans.of(imports)
    if blocks.spans.size:
        starts, lens = blocks.spans[:, 0], blocks.spans[:, 1] - blocks.spans[:, 0]
        bad = np.nonzero((lens <= 0) | (blocks.spans[:, 1] > mask.shape[0]))[0]
        if bad.size:
            raise RangeError(f"block for [{int(starts[bad[0]])}, {int(blocks.spans[bad[0], 1])}) does not fit "
                             f"the {mask.shape[0]}-token log")
        index = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
        if mask[index].any() or np.bincount(index, minlength=1).max() > 1:
            raise RangeError("an imported range overlaps a resident token or another imported range")
        mask[index] = True
        pos[index] = blocks.positions
    held = np.nonzero(mask)[0]
    if rebase:
        out = np.full(mask.shape[0], -1, dtype=np.int64)
        out[held] = np.arange(held.shape[0], dtype=np.int64)
        return Layout(mask, out, int(held.shape[0]))
    out = np.where(mask, pos, -1)
    kept = out[held]
    if kept.size and (kept[0] < 0 or np.any(np.diff(kept) <= 0)):
        raise RangeError("imported blocks' exported positions collide with the resident tokens' positions")
    next_pos = max(current.next_pos, int(kept[-1]) + 1 if kept.size else 0)
    return Layout(mask, out, next_pos)


def union_ranges(ranges: Sequence[Range]) -> list[Range]:
    """The sorted union of ``ranges``, touching ones coalesced (``merge_ranges`` for many ranges)."""
    if not ranges:
        return []
    starts = np.fromiter((r.start for r in ranges), dtype=np.int64, count=len(ranges))
    ends = np.fromiter((r.end for r in ranges), dtype=np.int64, count=len(ranges))
    live = ends > starts
    order = np.argsort(starts[live], kind="stable")
    starts, ends = starts[live][order], ends[live][order]
    if not starts.size:
        return []
    reach = np.maximum.accumulate(ends)
    new = np.ones(starts.shape[0], dtype=bool)
    new[1:] = starts[1:] > reach[:-1]
    first = np.nonzero(new)[0]
    last = np.append(first[1:], starts.shape[0]) - 1
    return [Range(int(a), int(b)) for a, b in zip(starts[first], reach[last], strict=True)]


@dataclass(frozen=True)
class RecallChoice:
    imports: tuple[int, ...]  # indices into the cold blocks: brought back
    evict: tuple[Range, ...]  # resident ranges dropped for them


def choose_recalls(
    resident: Sequence[Range],
    cold: Sequence[Range] | IntArray,
    cold_scores: Sequence[float],
    evicted: Sequence[Range] | IntArray,
    room: int,
) -> RecallChoice:
    """Carry a plan made over resident and cold blocks together (``evicted``: what it drops) back
    to the two sets: a cold block comes back only if the plan kept all of it; the resident parts
    it dropped are evicted. Imports that add more than ``room`` tokens net (the backend's free
    room) stay cold, the lowest-scoring first."""
    if len(cold_scores) != len(cold):
        raise ValueError(f"{len(cold_scores)} scores for {len(cold)} cold blocks")
    spans = _spans(cold)
    cut = _spans(evicted)
    length = max([int(spans[:, 1].max()) if len(cold) else 0, int(cut[:, 1].max()) if cut.size else 0]
                 + [r.end for r in resident])
    dropped = _mask(cut, length)
    held = _mask(_spans(resident), length)
    evict = _ranges(held & dropped)
    hits = np.concatenate([[0], np.cumsum(dropped)])
    keep = hits[spans[:, 1]] == hits[spans[:, 0]]  # no token of the block dropped
    imports = np.nonzero(keep)[0]
    added = int((spans[imports, 1] - spans[imports, 0]).sum())
    freed = int((held & dropped).sum())
    if added - freed > room:
        scores = np.asarray(cold_scores, dtype=np.float64)
        by_score = imports[np.lexsort((spans[imports, 0], scores[imports]))]
        sizes = spans[by_score, 1] - spans[by_score, 0]
        over = added - freed - room
        drop = int(np.searchsorted(np.cumsum(sizes), over)) + 1  # the fewest lowest-scoring ones that make it fit
        imports = np.sort(by_score[drop:])
    return RecallChoice(tuple(int(i) for i in imports), tuple(evict))


def _spans(ranges: Sequence[Range] | IntArray) -> IntArray:
    if isinstance(ranges, np.ndarray):
        return ranges.astype(np.int64, copy=False).reshape(-1, 2)
    return np.array([(r.start, r.end) for r in ranges], dtype=np.int64).reshape(-1, 2)


def plan_recall(
    resident: Sequence[Range],
    cold: IntArray,
    turn: Range,
    key_scores: npt.ArrayLike,
    key_positions: npt.ArrayLike,
    policy: StreamPolicy,
    block_size: int,
    budget_tokens: int,
    capabilities: Capabilities,
    room: int,
) -> RecallChoice:
    """A recall turn's choice: the resident tokens, the cold blocks (``cold``: rows of start, end)
    and the turn are cut into blocks of ``block_size`` as if all were resident, scored by the
    turn's attention (``key_scores`` per key at ``key_positions``, summed per block), and cut to
    ``budget_tokens`` by the hot-set planner (sinks and the recent window, which holds the turn,
    protected; without ``position_shift`` also the token before the turn, which the turn must
    follow); ``choose_recalls`` carries that back (``room``: the backend's free tokens)."""
    cold = _spans(cold)
    length = max([turn.end, int(cold[:, 1].max()) if cold.size else 0] + [r.end for r in resident])
    union = _mask(np.concatenate([_spans(resident), cold, [[turn.start, turn.end]]]), length)
    table = BlockTable.from_ranges(_ranges(union), block_size)
    if not capabilities.position_shift and turn.start > 0:
        # the turn is decoded right after the session's last cell: without a K-shift nothing can
        # be placed after a gap, so the token before the turn stays (the recent window may hold
        # only the turn)
        before = int(np.searchsorted(table.starts, turn.start - 1, side="right")) - 1
        table.flags[before] |= int(BlockFlag.PINNED)
    plan = plan_hot_set(PlanInput(table, budget_tokens, policy, capabilities,
                                  span_scores(key_scores, key_positions, table.starts, table.ends)))
    dropped = np.stack([table.starts[plan.evict_index], table.ends[plan.evict_index]], axis=1)
    cold_scores = span_scores(key_scores, key_positions, cold[:, 0], cold[:, 1])
    return choose_recalls(resident, cold, cold_scores.tolist(), dropped, room)


def _mask(spans: IntArray, length: int) -> npt.NDArray[np.bool_]:
    """Tokens covered by any of ``spans`` (rows of start, end) in a log of ``length`` tokens."""
    edges = np.zeros(length + 1, dtype=np.int64)
    np.add.at(edges, spans[:, 0], 1)
    np.add.at(edges, spans[:, 1], -1)
    return np.cumsum(edges[:-1]) > 0


def _ranges(mask: npt.NDArray[np.bool_]) -> list[Range]:
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return [Range(int(a), int(b)) for a, b in zip(np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0], strict=True)]
