"""The hot-set planner: which blocks stay resident under a token budget.

Primitives:
- ``StreamPolicy(enabled, sink_tokens, recent_tokens, rebase=True)``: StreamingLLM's sinks + recent
  window; ``rebase`` closes the gaps evictions leave (positions stay compact), ``False`` keeps
  them (each kept token keeps its distance to the query; better for retrieval, positions grow).
- ``PlanInput(blocks, budget_tokens, stream_policy, capabilities, scores=None)``.
- ``Plan``: the partition ``keep_hot`` / ``evict_cold`` plus diagnostics.
- ``plan_hot_set(PlanInput) -> Plan``: a pure, vectorised function.
- ``missing_capabilities(policy, capabilities) -> tuple[str, ...]``: what a streaming (or scored)
  policy needs and the backend lacks: ``remove_middle`` always, ``position_shift`` only when the
  policy re-bases (a plan that keeps gaps moves no cell).
- ``plan_streaming(ranges, block_size, budget_tokens, policy, scores=None, capabilities=None)
  -> StreamingPlan``: the same plan for a streaming session without flags, straight from its
  resident ranges (with ``capabilities``, under the same gate and tail rule). Without
  scores it takes time proportional to the ranges, the protected blocks and the evicted blocks,
  not to the session's length: a session that grew by one block since its last plan costs one
  block's work. With scores it walks every block in plain Python (for small sessions).
- ``trusted_range(start, end)``: a ``Range`` built without its checks, for blocks cut from ranges.

``plan_hot_set`` finds the evicted prefix by partial selection (a weighted quickselect), not by
sorting every candidate; the property tests hold both fast paths to a plain sort.

Eviction order, most evictable first: score (lowest first, only when scores are given), then recency (oldest ``last_used`` first;
in streaming mode, lowest position first), then position. Blocks flagged PINNED, SINK or RECENT,
and in streaming mode the blocks holding the first ``sink_tokens`` and last ``recent_tokens``,
are protected: never evicted. If protected blocks alone exceed the budget, ``over_budget`` is set
and the diagnostics say why.

Without ``position_shift`` the block holding the newest resident token is protected too: the next
token goes right after the last cell (llama.cpp decodes a sequence only at its last position + 1),
and appending after a trailing gap would need the new cells moved up to their position.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from .blocks import PROTECTED_FLAGS, Block, BlockTable
from .capabilities import Capabilities
from .ranges import IntArray, Range


@dataclass(frozen=True)
class StreamPolicy:
    enabled: bool = False
    sink_tokens: int = 4
    recent_tokens: int = 256
    rebase: bool = True

    def __post_init__(self) -> None:
        if self.sink_tokens < 0:
            raise ValueError(f"StreamPolicy.sink_tokens must be >= 0, got {self.sink_tokens}")
        if self.recent_tokens < 0:
            raise ValueError(f"StreamPolicy.recent_tokens must be >= 0, got {self.recent_tokens}")


@dataclass(frozen=True)
class PlanInput:
    blocks: Sequence[Block] | BlockTable
    budget_tokens: int
    stream_policy: StreamPolicy = field(default_factory=StreamPolicy)
    capabilities: Capabilities = field(default_factory=Capabilities)
    scores: Sequence[float] | np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Plan:
    """The planner's answer. ``keep_index`` / ``evict_index`` index the input blocks; the
    ``keep_hot`` / ``evict_cold`` block lists are built from them on first use."""

    source: Sequence[Block] | BlockTable = field(repr=False)
    keep_index: npt.NDArray[np.int64]
    evict_index: npt.NDArray[np.int64]
    budget_tokens: int
    total_tokens: int
    hot_tokens: int
    protected_tokens: int
    over_budget: bool
    diagnostics: list[str]
    rebase_positions: bool = False

    @property
    def is_noop(self) -> bool:
        return self.evict_index.size == 0

    @functools.cached_property
    def keep_hot(self) -> list[Block]:
        return [self.source[int(i)] for i in self.keep_index]

    @functools.cached_property
    def evict_cold(self) -> list[Block]:
        return [self.source[int(i)] for i in self.evict_index]

    @property
    def evict_ranges(self) -> list[Range]:
        """Evicted ranges in position order (what an executor is told to drop)."""
        return sorted(b.range for b in self.evict_cold)


def _position_order(starts: IntArray) -> IntArray | None:
    """The permutation that sorts blocks by start; ``None`` when they already are (tables built
    from ranges are), which spares two sorts per plan."""
    if starts.shape[0] < 2 or bool(np.all(starts[1:] >= starts[:-1])):
        return None
    return np.argsort(starts, kind="stable")


def _validate(
    inp: PlanInput, starts: IntArray, ends: IntArray, order: IntArray | None
) -> npt.NDArray[np.float64] | None:
    if isinstance(inp.budget_tokens, bool) or not isinstance(inp.budget_tokens, (int, np.integer)):
        raise ValueError(f"budget_tokens must be an int, got {inp.budget_tokens!r}")
    if inp.budget_tokens < 0:
        raise ValueError(f"budget_tokens must be >= 0, got {inp.budget_tokens}")
    s, e = (starts, ends) if order is None else (starts[order], ends[order])
    clash = (s[1:] < e[:-1]).nonzero()[0]
    if clash.size:
        i = int(clash[0])
        raise ValueError(
            f"block ranges overlap: [{s[i]}, {e[i]}) and [{s[i + 1]}, {e[i + 1]})"
        )
    if inp.scores is None:
        return None
    scores = np.asarray(inp.scores, dtype=np.float64).reshape(-1)
    if scores.shape[0] != len(inp.blocks):
        raise ValueError(
            f"scores has {scores.shape[0]} entries but there are {len(inp.blocks)} blocks"
        )
    if not np.all(np.isfinite(scores)):
        bad = int(np.flatnonzero(~np.isfinite(scores))[0])
        raise ValueError(f"scores must be finite, got {scores[bad]} for block {bad}")
    return scores


def _stream_protected(
    lengths: IntArray, total: int, policy: StreamPolicy, order: IntArray | None
) -> npt.NDArray[np.bool_]:
    """Blocks overlapping the first ``sink_tokens`` or the last ``recent_tokens`` resident tokens."""
    if order is not None:
        lengths = lengths[order]
    before = np.cumsum(lengths) - lengths  # resident tokens ahead of each block
    after = total - before - lengths  # resident tokens behind each block
    protected: npt.NDArray[np.bool_] = (before < policy.sink_tokens) | (after < policy.recent_tokens)
    if order is None:
        return protected
    unsorted = np.empty_like(protected)
    unsorted[order] = protected
    return unsorted


def _in_order(pool: IntArray, keys: Sequence[npt.NDArray[Any]]) -> bool:
    """Whether ``pool`` (in position order) is already sorted by ``keys``, primary first; the
    last key is the position, which ``pool`` follows by construction."""
    if pool.shape[0] < 2 or len(keys) < 2:
        return True
    tied = np.ones(pool.shape[0] - 1, dtype=bool)
    for key in keys[:-1]:
        values = key[pool]
        step = values[1:] - values[:-1]
        if bool(np.any(tied & (step < 0))):
            return False
        tied &= step == 0
    return True


_SORT_BELOW = 256  # pools this small are simply sorted


def _cheapest_prefix(
    pool: IntArray, keys: Sequence[npt.NDArray[Any]], lengths: IntArray, need: int
) -> IntArray:
    """The shortest prefix, in the lexicographic order of ``keys`` (primary first, the last one the
    position), of the blocks in ``pool`` (given in position order) whose tokens cover ``need``.
    The caller has checked that the whole pool covers it; the blocks come back in no order.

    Sorting every candidate is what a plan over many scored blocks spent most of its time on. This
    is a weighted quickselect instead: partition around the key value the token count points at,
    keep the side that holds the boundary, and sort only small leftovers. A pool already in key
    order (any streaming plan without scores) costs one cumulative sum."""
    chosen: list[IntArray] = []
    while True:
        small = pool.shape[0] <= _SORT_BELOW
        in_order = len(keys) < 2 or (not small and _in_order(pool, keys))
        if in_order or small:
            if not in_order:
                pool = pool[np.lexsort(tuple(key[pool] for key in reversed(keys)))]
            freed = np.cumsum(lengths[pool])
            chosen.append(pool[: int(np.searchsorted(freed, need, side="left")) + 1])
            return np.concatenate(chosen) if len(chosen) > 1 else chosen[0]
        key = keys[0][pool]
        weights = lengths[pool]
        k = min(pool.shape[0], max(1, -(-need * pool.shape[0] // int(weights.sum()))))
        pivot = np.partition(key, k - 1)[k - 1]
        below = key < pivot
        below_tokens = int(weights[below].sum())
        if below_tokens >= need:  # the boundary lies below the pivot
            pool = pool[below]
            continue
        chosen.append(pool[below])
        need -= below_tokens
        tie = key == pivot
        tie_tokens = int(weights[tie].sum())
        if tie_tokens >= need:  # the boundary lies among the ties: the next key decides
            pool, keys = pool[tie], keys[1:]
            continue
        chosen.append(pool[tie])
        need -= tie_tokens
        pool = pool[key > pivot]


def missing_capabilities(policy: StreamPolicy, capabilities: Capabilities) -> tuple[str, ...]:
    """What a streaming (or scored) ``policy`` needs and ``capabilities`` lack: ``remove_middle``
    always, ``position_shift`` only with ``rebase`` (closing gaps moves cells; keeping them moves
    none). Empty for a non-streaming policy."""
    if not policy.enabled:
        return ()
    needs = ("remove_middle", "position_shift") if policy.rebase else ("remove_middle",)
    return tuple(name for name in needs if not getattr(capabilities, name))


def _missing_reason(missing: tuple[str, ...]) -> str:
    why = " with rebase=True" if "position_shift" in missing else ""
    return f"streaming policy{why} needs {' and '.join(missing)}; backend lacks it: no-op plan"


def plan_hot_set(inp: PlanInput) -> Plan:
    source = inp.blocks
    table = source if isinstance(source, BlockTable) else BlockTable.from_blocks(source)
    n = len(table)
    starts, ends = table.starts, table.ends
    order = _position_order(starts)
    scores = _validate(inp, starts, ends, order)
    budget = int(inp.budget_tokens)
    lengths = ends - starts
    total = int(lengths.sum())
    protected = (table.flags & int(PROTECTED_FLAGS)) != 0
    diagnostics: list[str] = []
    caps = inp.capabilities
    streaming = inp.stream_policy.enabled

    def keep_all() -> tuple[IntArray, IntArray]:
        return np.arange(n, dtype=np.int64), np.zeros(0, dtype=np.int64)

    def noop(reason: str) -> Plan:
        diagnostics.append(reason)
        return Plan(
            source, *keep_all(), budget_tokens=budget, total_tokens=total,
            hot_tokens=total, protected_tokens=int(lengths[protected].sum()),
            over_budget=total > budget, diagnostics=diagnostics,
        )

    if streaming:
        missing = missing_capabilities(inp.stream_policy, caps)
        if missing:
            return noop(_missing_reason(missing))
        protected |= _stream_protected(lengths, total, inp.stream_policy, order)
    if n and caps.remove_middle and not caps.position_shift:  # the next token must follow the last cell
        protected[int(np.argmax(starts))] = True
    protected_tokens = int(lengths[protected].sum())

    if total <= budget:
        return Plan(
            source, *keep_all(), budget_tokens=budget, total_tokens=total,
            hot_tokens=total, protected_tokens=protected_tokens, over_budget=False,
            diagnostics=diagnostics, rebase_positions=streaming and inp.stream_policy.rebase,
        )
    if not caps.remove_middle:
        return noop(
            f"{total} tokens exceed the budget of {budget} but the backend cannot remove "
            "ranges (remove_middle is false): no-op plan"
        )

    # candidates in position order; eviction order: score, then recency, then position
    candidates = (~protected).nonzero()[0] if order is None else order[~protected[order]]
    keys: list[npt.NDArray[Any]] = [] if scores is None else [scores]
    keys += [starts] if streaming else [table.last_used, starts]
    need = total - budget
    over_budget = protected_tokens > budget  # even every candidate cannot cover the excess
    if over_budget:
        evicted = candidates
        diagnostics.append(
            _over_budget(protected_tokens, budget))
    else:
        evicted = _cheapest_prefix(candidates, keys, lengths, need)
    evict_mask = np.zeros(n, dtype=bool)
    evict_mask[evicted] = True
    keep_idx = (~evict_mask).nonzero()[0]
    evict_idx = evict_mask.nonzero()[0] if order is None else order[evict_mask[order]]
    if scores is not None:
        diagnostics.append(f"scored eviction of {evicted.shape[0]} blocks")
    return Plan(
        source, keep_idx.astype(np.int64, copy=False), evict_idx.astype(np.int64, copy=False),
        budget_tokens=budget, total_tokens=total, hot_tokens=total - int(lengths[evicted].sum()),
        protected_tokens=protected_tokens, over_budget=over_budget,
        diagnostics=diagnostics, rebase_positions=streaming and inp.stream_policy.rebase,
    )


def trusted_range(start: int, end: int) -> Range:
    """A ``Range`` cut from valid ranges (a block of one): its checks skipped, which is a third
    of what planning a session that loses many blocks costs."""
    rng = object.__new__(Range)
    rng.__dict__.update(start=start, end=end)
    return rng


@dataclass(frozen=True)
class StreamingPlan:
    """``plan_streaming``'s answer: evicted blocks and what stays, both in position order."""

    evict_ranges: tuple[Range, ...]
    kept_ranges: tuple[Range, ...]
    total_tokens: int
    hot_tokens: int
    protected_tokens: int
    over_budget: bool
    diagnostics: tuple[str, ...] = ()
    kept_scores: tuple[float, ...] | None = None  # with scores: those of the kept blocks, in order


def _cut(start: int, end: int, bs: int) -> list[Range]:
    """``[start, end)`` cut at multiples of ``bs``."""
    edges = [start, *range((start // bs + 1) * bs, end, bs), end]
    return [trusted_range(a, b) for a, b in zip(edges, edges[1:], strict=False)]


def _over_budget(protected: int, budget: int) -> str:
    return (f"protected blocks hold {protected} tokens, over the budget of {budget}: "
            "they are kept and the plan is over budget")


def plan_streaming(
    ranges: Sequence[Range],
    block_size: int,
    budget_tokens: int,
    policy: StreamPolicy,
    scores: Sequence[float] | None = None,
    capabilities: Capabilities | None = None,
) -> StreamingPlan:
    """What ``plan_hot_set`` decides for the blocks of ``ranges`` (each cut at multiples of
    ``block_size``) in streaming mode, without flags, on a backend with ``capabilities`` (``None``:
    one that can remove and re-base ranges): the sinks and the recent window are protected and the
    middle goes lowest score first (with ``scores``, one per block), else lowest position first.
    Without scores only the protected ends and the evicted blocks are walked; with them every
    block is, in plain Python, which beats numpy's per-call overhead up to a few hundred blocks."""
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, (int, np.integer)):
        raise ValueError(f"budget_tokens must be an int, got {budget_tokens!r}")
    if budget_tokens < 0:
        raise ValueError(f"budget_tokens must be >= 0, got {budget_tokens}")
    live = [r for r in ranges if r.end > r.start]
    for a, b in zip(live, live[1:], strict=False):
        if b.start < a.end:
            raise ValueError(f"ranges must be sorted and disjoint: {a} then {b}")
    if capabilities is not None:
        policy = replace(policy, enabled=True)
        missing = missing_capabilities(policy, capabilities)
        if missing:
            checked = None if scores is None else _checked_scores(live, block_size, scores)
            total = sum(r.end - r.start for r in live)
            return StreamingPlan((), tuple(live), total, total, 0, total > budget_tokens,
                                 (_missing_reason(missing),), checked)
        if not capabilities.position_shift and policy.recent_tokens < 1:
            policy = replace(policy, recent_tokens=1)  # the next token must follow the last cell
    if scores is not None:
        return _plan_streaming_scored(live, block_size, int(budget_tokens), policy, scores)
    total = sum(r.end - r.start for r in live)
    bs = block_size

    # the recent window, walked from the back: it starts at block ``back_start``
    back_start, back_tokens, after = None, 0, 0
    for r in reversed(live):
        end = r.end
        while end > r.start and after < policy.recent_tokens:
            start = max(r.start, (end - 1) // bs * bs)
            back_start, back_tokens, after, end = start, back_tokens + end - start, after + end - start, start
        if after >= policy.recent_tokens:
            break

    # the sinks (whole blocks), then the middle from the front until the excess is covered
    need = total - int(budget_tokens)
    front_tokens = freed = 0
    evicted: list[Range] = []
    for r in live:
        start, stop = r.start, r.end if back_start is None else min(r.end, back_start)
        while start < stop and front_tokens < policy.sink_tokens:
            end = min(r.end, (start // bs + 1) * bs)
            front_tokens, start = front_tokens + end - start, end
        if start >= stop:
            if stop < r.end:
                break  # reached the recent window
            continue  # this range was all sinks
        if freed >= need:
            break
        end = min(stop, -(-(start + need - freed) // bs) * bs)  # the first block edge covering the rest
        evicted += _cut(start, end, bs)
        freed += end - start
        if freed >= need or stop < r.end:
            break
    protected = front_tokens + back_tokens
    over = freed < need
    diagnostics: tuple[str, ...] = ()
    if over:
        diagnostics = (_over_budget(protected, int(budget_tokens)),)
    if not evicted:
        return StreamingPlan((), tuple(live), total, total, protected, over, diagnostics)
    first, last = evicted[0].start, evicted[-1].end
    kept = [Range(r.start, min(r.end, first)) for r in live if r.start < first]
    kept += [Range(max(r.start, last), r.end) for r in live if r.end > last]
    return StreamingPlan(tuple(evicted), tuple(kept), total, total - freed, protected, over, diagnostics)


def _checked_scores(live: list[Range], bs: int, scores: Sequence[float]) -> tuple[float, ...]:
    """``scores`` as floats, one per block of ``live`` cut at multiples of ``bs``, all finite."""
    values = tuple(float(x) for x in scores)
    n_blocks = sum((r.end - 1) // bs - r.start // bs + 1 for r in live)
    if len(values) != n_blocks:
        raise ValueError(f"scores has {len(values)} entries but there are {n_blocks} blocks")
    if not all(map(math.isfinite, values)):
        bad = next(i for i, v in enumerate(values) if not math.isfinite(v))
        raise ValueError(f"scores must be finite, got {values[bad]} for block {bad}")
    return values


def _plan_streaming_scored(
    live: list[Range], bs: int, budget: int, policy: StreamPolicy, scores: Sequence[float]
) -> StreamingPlan:
    starts: list[int] = []
    ends: list[int] = []
    owner: list[int] = []  # which range each block was cut from
    for k, r in enumerate(live):
        cut = [c * bs for c in range(r.start // bs + 1, (r.end - 1) // bs + 1)]
        starts += [r.start, *cut]
        ends += [*cut, r.end]
        owner += [k] * (len(cut) + 1)
    values = list(_checked_scores(live, bs, scores))
    total = sum(r.end - r.start for r in live)
    # protected: a prefix holding the sinks and a suffix holding the recent window
    lo = before = 0
    while lo < len(starts) and before < policy.sink_tokens:
        before += ends[lo] - starts[lo]
        lo += 1
    hi, after = len(starts), 0
    while hi > lo and after < policy.recent_tokens:
        hi -= 1
        after += ends[hi] - starts[hi]
    protected = before + after
    if total <= budget:
        return StreamingPlan((), tuple(live), total, total, protected, False, (), tuple(values))
    if protected > budget:
        chosen = list(range(lo, hi))
        diagnostics = [_over_budget(protected, budget)]
    else:
        chosen, freed, need, diagnostics = [], 0, total - budget, []
        for i in sorted(range(lo, hi), key=values.__getitem__):  # stable: ties by position
            chosen.append(i)
            freed += ends[i] - starts[i]
            if freed >= need:
                break
        chosen.sort()
    diagnostics.append(f"scored eviction of {len(chosen)} blocks")
    kept: list[Range] = []  # each range minus its evicted blocks
    nxt = 0
    for k, r in enumerate(live):
        cursor = r.start
        while nxt < len(chosen) and owner[chosen[nxt]] == k:
            i = chosen[nxt]
            if starts[i] > cursor:
                kept.append(trusted_range(cursor, starts[i]))
            cursor, nxt = ends[i], nxt + 1
        if cursor < r.end:
            kept.append(trusted_range(cursor, r.end))
    gone = set(chosen)
    freed = sum(ends[i] - starts[i] for i in chosen)
    return StreamingPlan(
        tuple(trusted_range(starts[i], ends[i]) for i in chosen), tuple(kept), total, total - freed,
        protected, protected > budget, tuple(diagnostics),
        tuple(v for i, v in enumerate(values) if i not in gone),
    )
