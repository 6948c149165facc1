"""The planning path as it was before issue 18, kept verbatim as the baseline the benchmark
measures the new one against in the same run: ``plan_hot_set`` sorted every candidate (one
``lexsort`` over score, recency and position) and re-sorted the evicted blocks by position;
``plan_backend`` built every session's ``BlockTable`` and called ``plan_hot_set`` on it, and
rebuilt a session shrunk twice without its scores.

Primitives: ``legacy_plan_hot_set(PlanInput) -> Plan``, ``legacy_plan_backend(BackendPlanInput)
-> BackendPlan``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvres.policy.backend_planner import Action, BackendPlan, BackendPlanInput, SessionView
from kvres.policy.blocks import PROTECTED_FLAGS, BlockTable
from kvres.policy.capabilities import Capabilities
from kvres.policy.planner import Plan, PlanInput, StreamPolicy
from kvres.policy.ranges import Range


def _uniform(span: Range, block_size: int) -> BlockTable:
    """``span`` cut at multiples of ``block_size``; block i was last used at time i."""
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    first = span.start // block_size * block_size
    edges = np.arange(first, span.end + block_size, block_size, dtype=np.int64)
    edges = np.unique(np.clip(edges, span.start, span.end))
    starts, ends = edges[:-1], edges[1:]
    n = starts.shape[0]
    return BlockTable(
        starts, ends, np.zeros(n, dtype=np.int64),
        np.arange(n, dtype=np.int64),
    )


def _blocks(view: SessionView) -> BlockTable:
    tables = [_uniform(r, view.block_size) for r in sorted(view.resident_ranges)]
    if not tables:
        return _uniform(Range(0, 0), view.block_size)
    joined = {
        name: np.concatenate([getattr(t, name) for t in tables])
        for name in ("starts", "ends", "flags")
    }
    joined["last_used"] = np.arange(joined["starts"].shape[0], dtype=np.int64)
    return BlockTable(**joined)


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


def legacy_plan_hot_set(inp: PlanInput) -> Plan:
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



def _shrink(view: SessionView, target: int, caps: Capabilities) -> Plan:
    blocks = _blocks(view)
    scores = view.scores if view.scores is not None and len(view.scores) == len(blocks) else None
    return legacy_plan_hot_set(PlanInput(blocks, max(0, target), view.stream_policy, caps, scores))


def legacy_plan_backend(inp: BackendPlanInput) -> BackendPlan:
    if inp.budget_tokens < 0:
        raise ValueError(f"backend budget_tokens must be >= 0, got {inp.budget_tokens}")
    ids = [v.session_id for v in inp.sessions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"session ids must be unique, got {ids}")
    actions: list[Action] = []
    diagnostics: list[str] = []
    resident = {v.session_id: v.resident_tokens for v in inp.sessions}
    incoming = {v.session_id: v.incoming_tokens for v in inp.sessions}
    shrunk: dict[str, SessionView] = {}

    def evict(view: SessionView, target: int, why: str) -> None:
        plan = _shrink(view, target, inp.capabilities)
        diagnostics.extend(f"{view.session_id}: {d}" for d in plan.diagnostics)
        if plan.evict_index.size:
            ranges = tuple(plan.evict_ranges)
            actions.append(Action("evict", view.session_id, ranges, plan.rebase_positions))
            resident[view.session_id] = plan.hot_tokens
            kept = tuple(sorted(b.range for b in plan.keep_hot))
            shrunk[view.session_id] = SessionView(
                view.session_id, kept, view.last_used, view.active, view.incoming_tokens,
                view.budget_tokens, view.stream_policy, view.evictable, view.block_size,
                None,
            )
            diagnostics.append(f"{view.session_id}: evicted {len(ranges)} ranges ({why})")

    # (1) each session under its own budget, leaving room for what arrives next
    for view in inp.sessions:
        if view.budget_tokens is None or not view.evictable:
            continue
        if resident[view.session_id] + incoming[view.session_id] > view.budget_tokens:
            evict(view, view.budget_tokens - incoming[view.session_id], "session budget")

    def total() -> int:
        return sum(resident[i] + incoming[i] for i in resident)

    # (2) suspend idle sessions, least recently used first
    for view in sorted(inp.sessions, key=lambda v: v.last_used):
        if total() <= inp.budget_tokens:
            break
        if view.active or resident[view.session_id] == 0:
            continue
        actions = [a for a in actions if a.session_id != view.session_id]
        actions.append(Action("suspend", view.session_id))
        diagnostics.append(f"{view.session_id}: suspended (idle, backend over budget)")
        resident[view.session_id] = 0

    # (3) shrink active sessions that allow eviction, least recently used first
    for view in sorted(inp.sessions, key=lambda v: v.last_used):
        excess = total() - inp.budget_tokens
        if excess <= 0:
            break
        if not view.active or not view.evictable:
            continue
        current = shrunk.get(view.session_id, view)
        evict(current, resident[view.session_id] - excess, "backend budget")
        merged = [a for a in actions if a.session_id == view.session_id and a.kind == "evict"]
        if len(merged) > 1:
            ranges = tuple(sorted(r for a in merged for r in a.ranges))
            actions = [a for a in actions if not (a.session_id == view.session_id and a.kind == "evict")]
            actions.append(Action("evict", view.session_id, ranges, merged[0].rebase))

    over = total() > inp.budget_tokens
    if over:
        diagnostics.append(
            f"backend still needs {total()} tokens against a budget of {inp.budget_tokens}"
        )
    return BackendPlan(actions, dict(resident), inp.budget_tokens, over, diagnostics)
