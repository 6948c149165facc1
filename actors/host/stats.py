"""What a backend reports about itself and its sessions.

Primitives:
- ``session_stats(ctx, session_id) -> dict``: state, policy (as asked), the effective policy
  and, where the backend degraded it, why (``degraded``, else None), token count, resident ranges
  and tokens, peak, cold blocks per tier (refs of blocks a store dropped for its own budget are
  forgotten here), whether it is paused for tools, its tenant (what the tenant's sessions hold
  here, and its quota), counters.
- ``backend_stats(ctx, profile) -> dict``: context size, KV layout (None: a host given a config
  whose layout was not resolved, ``kvres.actors.backend_setup.kv_config``), budget, resident and free tokens (and bytes where the
  engine's KV profile gives them), peak, sessions and their states, tenants (``quotas.tenant_usage``),
  the calls waiting for room and what they waited (``room_queue``: ``RoomQueue.stats``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from kvres.policy.capacity import LayerKVProfile

from .context import HostContext
from .quotas import tenant_usage
from .retention import pinned_sessions


def session_stats(ctx: HostContext, session_id: str) -> dict[str, Any]:
    s = ctx.get(session_id, live=False)
    resident = ctx.executor.resident_ranges(session_id) if s.live else []
    refs = list(s.cold) + ([] if s.live else list(s.record.blocks))
    tiers = ctx.store.tiers_of(refs) if ctx.store is not None else [None] * len(refs)
    # blocks the store did not keep (dropped for its budget, a full disk) are gone: the session
    # forgets them, counts them, and recomputes what they held from its log when it needs it
    gone = {ref for ref, tier in zip(refs, tiers, strict=True) if tier is None}
    if gone:
        s.cold = [ref for ref in s.cold if ref not in gone]
        if not s.live:
            s.park(replace(s.record, blocks=[ref for ref in s.record.blocks if ref not in gone]), s.state)
        ctx.count(session_id, "dropped_blocks", len(gone))
    cold: dict[str, dict[str, int]] = {}
    for ref, tier in zip(refs, tiers, strict=True):
        if tier is None:
            continue
        entry = cold.setdefault(tier, {"blocks": 0, "bytes": 0})
        entry["blocks"] += 1
        entry["bytes"] += ref.nbytes
    resident_now = sum(len(r) for r in resident)
    return {
        "session_id": session_id,
        "backend": ctx.name,
        "state": s.state.value,
        "policy": s.policy.model_dump(),
        "effective_policy": s.residency.describe(),  # what runs: the policy, or what it degraded to
        "degraded": s.residency.degraded or None,  # why it runs weaker than asked (None: as asked)
        "token_count": len(ctx.token_log(session_id)),
        "resident_ranges": [(r.start, r.end) for r in resident],
        "resident_tokens": resident_now,
        "peak_resident_tokens": s.peak,
        "recompute_exact": s.exact,
        "pinned": session_id in pinned_sessions(ctx),  # its pin holds now (within max_pinned_tokens)
        "paused_for_tools": s.paused_for_tools(time.monotonic()),  # its tool results are on their way
        # its tenant's label, what the tenant's sessions hold here together, and its quota
        "tenant": None if s.policy.tenant is None else {"name": s.policy.tenant,
                                                         **tenant_usage(ctx)[s.policy.tenant]},
        "cold": cold,
        "counters": dict(s.counters),
    }


def backend_stats(ctx: HostContext, profile: LayerKVProfile | None) -> dict[str, Any]:
    """``profile``: the engine's KV bytes per token (docs/policies.md, T0), where it has one."""
    config = ctx.config
    live = {sid: s.resident for sid, s in ctx.sessions.items() if s.live}
    resident_bytes = None if profile is None else sum(profile.kv_bytes_for_context(t) for t in live.values())
    budget_bytes = config.kv_memory_bytes or (None if profile is None else profile.for_sessions(
        config.n_seq_max).kv_bytes_for_context(config.kv_budget_tokens))
    return {
        "backend": ctx.name,
        "engine": config.engine,
        "model": str(config.model_path),
        "fingerprint": ctx.fingerprint,
        "n_ctx": config.n_ctx,
        "kv_layout": config.kv_layout,
        "kv_budget_tokens": config.kv_budget_tokens,
        "resident_tokens": sum(live.values()),
        "peak_resident_tokens": ctx.peak_resident_tokens,
        "free_tokens": config.kv_budget_tokens - sum(live.values()),
        "kv_budget_bytes": budget_bytes,
        "resident_kv_bytes": resident_bytes,
        "free_kv_bytes": None if budget_bytes is None or resident_bytes is None else budget_bytes - resident_bytes,
        "sessions": {sid: {"state": s.state.value, "resident_tokens": live.get(sid, 0), "tenant": s.policy.tenant}
                     for sid, s in ctx.sessions.items()},
        "tenants": tenant_usage(ctx),
        "loop": ctx.jobs.profile.as_dict(),
        "room_queue": ctx.room.stats(),
    }
