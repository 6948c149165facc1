"""The hot-set planner: which blocks stay resident under a token budget.

Primitives:
- ``StreamPolicy(enabled, sink_tokens, recent_tokens, rebase=True)``: StreamingLLM's sinks + recent
  window; ``rebase`` closes the gaps evictions leave (positions stay compact), ``False`` keeps
  them (each kept token keeps its distance to the query; better for retrieval, positions grow).
- ``PlanInput(blocks, budget_tokens, stream_policy, capabilities, scores=None)``.
- ``Plan``: the partition ``keep_hot`` / ``evict_cold`` plus diagnostics.
- ``plan_hot_set(PlanInput) -> Plan``: a pure, vectorised function.

Eviction order, most evictable first: score (lowest first, only when scores are given), then recency (oldest ``last_used`` first;
in streaming mode, lowest position first), then position. Blocks flagged PINNED, SINK or RECENT,
and in streaming mode the blocks holding the first ``sink_tokens`` and last ``recent_tokens``,
are protected: never evicted. If protected blocks alone exceed the budget, ``over_budget`` is set
and the diagnostics say why.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .blocks import PROTECTED_FLAGS, Block, BlockTable
from .capabilities import Capabilities
from .ranges import Range


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


def _validate(inp: PlanInput, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    if isinstance(inp.budget_tokens, bool) or not isinstance(inp.budget_tokens, (int, np.integer)):
        raise ValueError(f"budget_tokens must be an int, got {inp.budget_tokens!r}")
    if inp.budget_tokens < 0:
        raise ValueError(f"budget_tokens must be >= 0, got {inp.budget_tokens}")
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    clash = np.nonzero(s[1:] < e[:-1])[0]
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
        bad = int(np.nonzero(~np.isfinite(scores))[0][0])
        raise ValueError(f"scores must be finite, got {scores[bad]} for block {bad}")
    return scores


def _stream_protected(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], policy: StreamPolicy
) -> npt.NDArray[np.bool_]:
    """Blocks overlapping the first ``sink_tokens`` or the last ``recent_tokens`` resident tokens."""
    order = np.argsort(starts, kind="stable")
    lengths = (ends - starts)[order]
    before = np.cumsum(lengths) - lengths  # resident tokens ahead of each block
    after = lengths.sum() - before - lengths  # resident tokens behind each block
    protected_sorted: npt.NDArray[np.bool_] = (before < policy.sink_tokens) | (
        after < policy.recent_tokens
    )
    protected = np.empty_like(protected_sorted)
    protected[order] = protected_sorted
    return protected


def plan_hot_set(inp: PlanInput) -> Plan:
    source = inp.blocks
    table = source if isinstance(source, BlockTable) else BlockTable.from_blocks(source)
    n = len(table)
    starts, ends = table.starts, table.ends
    scores = _validate(inp, starts, ends)
    budget = int(inp.budget_tokens)
    lengths = ends - starts
    total = int(lengths.sum())
    protected = (table.flags & int(PROTECTED_FLAGS)) != 0
    everything = np.arange(n, dtype=np.int64)
    nothing = np.zeros(0, dtype=np.int64)
    diagnostics: list[str] = []
    caps = inp.capabilities
    streaming = inp.stream_policy.enabled

    def noop(reason: str) -> Plan:
        diagnostics.append(reason)
        return Plan(
            source, everything, nothing, budget_tokens=budget, total_tokens=total,
            hot_tokens=total, protected_tokens=int(lengths[protected].sum()),
            over_budget=total > budget, diagnostics=diagnostics,
        )

    if streaming:
        if not (caps.remove_middle and caps.position_shift):
            missing = [n for n in ("remove_middle", "position_shift") if not getattr(caps, n)]
            return noop(
                f"streaming policy needs {' and '.join(missing)}; backend lacks it: no-op plan"
            )
        protected |= _stream_protected(starts, ends, inp.stream_policy)
    protected_tokens = int(lengths[protected].sum())

    if total <= budget:
        return Plan(
            source, everything, nothing, budget_tokens=budget, total_tokens=total,
            hot_tokens=total, protected_tokens=protected_tokens, over_budget=False,
            diagnostics=diagnostics, rebase_positions=streaming and inp.stream_policy.rebase,
        )
    if not caps.remove_middle:
        return noop(
            f"{total} tokens exceed the budget of {budget} but the backend cannot remove "
            "ranges (remove_middle is false): no-op plan"
        )

    candidates = np.nonzero(~protected)[0]
    recency = starts if streaming else table.last_used
    keys: list[np.ndarray] = [starts[candidates], recency[candidates]]
    if scores is not None:
        keys.append(scores[candidates])
    order = candidates[np.lexsort(tuple(keys))]

    need = total - budget
    freed = np.cumsum(lengths[order])
    n_evict = int(np.searchsorted(freed, need, side="left")) + 1
    over_budget = False
    if n_evict > order.size:
        n_evict = order.size
        over_budget = True
        diagnostics.append(
            f"protected blocks hold {protected_tokens} tokens, over the budget of {budget}: "
            "they are kept and the plan is over budget"
        )
    evict_mask = np.zeros(n, dtype=bool)
    evict_mask[order[:n_evict]] = True
    keep_idx = np.nonzero(~evict_mask)[0]
    evict_idx = order[:n_evict]
    evict_idx = evict_idx[np.argsort(starts[evict_idx], kind="stable")]
    hot = int(lengths[keep_idx].sum())
    if scores is not None:
        diagnostics.append(f"scored eviction of {n_evict} blocks")
    return Plan(
        source, keep_idx.astype(np.int64), evict_idx.astype(np.int64),
        budget_tokens=budget, total_tokens=total, hot_tokens=hot,
        protected_tokens=protected_tokens, over_budget=over_budget,
        diagnostics=diagnostics, rebase_positions=streaming and inp.stream_policy.rebase,
    )

