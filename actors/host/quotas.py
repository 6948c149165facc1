"""Per-tenant quotas: what the sessions of one tenant label may hold on a backend together.

Primitives:
- ``quota_of(ctx, tenant) -> TenantQuota | None``: the backend's quota for ``tenant``
  (``BackendConfig.tenant_quotas``; None for no label or no quota).
- ``resident_overruns(ctx, incoming, newcomer_tokens=0, newcomer_tenant=None) -> dict``: the
  tenants whose live sessions would hold more than their ``resident_tokens`` quota with the tokens
  coming (``incoming`` per live session, ``newcomer_tokens`` for a session being opened, resumed or
  forked): tenant -> (what they would hold, the quota).
- ``keep_cold_quota(ctx, tenant) -> int``: the tenant's oldest cold data dropped until what its
  sessions keep in the cold store is within its ``cold_bytes``: spilled blocks first (the least
  recently used session's oldest first: recall cannot bring them back), then the parked states of
  its least recently used suspended sessions (a resume recomputes them from the token log).
  Counted per session in ``quota_drops``; returns the blocks dropped.
- ``tenant_usage(ctx) -> dict``: per tenant with sessions here or a quota: sessions, resident
  tokens, cold bytes and the quota (``stats()["tenants"]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..config import TenantQuota
from .context import HostContext
from .store_ports import ColdRef


def quota_of(ctx: HostContext, tenant: str | None) -> TenantQuota | None:
    return None if tenant is None else ctx.config.tenant_quotas.get(tenant)


def resident_overruns(ctx: HostContext, incoming: Mapping[str, int], newcomer_tokens: int = 0,
                      newcomer_tenant: str | None = None) -> dict[str, tuple[int, int]]:
    coming: dict[str, int] = {}
    for sid, n in incoming.items():
        s = ctx.sessions.get(sid)
        tenant = None if s is None else s.policy.tenant
        if tenant is not None:
            coming[tenant] = coming.get(tenant, 0) + n
    if newcomer_tenant is not None:
        coming[newcomer_tenant] = coming.get(newcomer_tenant, 0) + newcomer_tokens
    over: dict[str, tuple[int, int]] = {}
    for tenant, n in coming.items():
        quota = quota_of(ctx, tenant)
        if quota is None or quota.resident_tokens is None:
            continue
        held = sum(s.resident for s in ctx.sessions.values() if s.live and s.policy.tenant == tenant)
        if held + n > quota.resident_tokens:
            over[tenant] = (held + n, quota.resident_tokens)
    return over


def keep_cold_quota(ctx: HostContext, tenant: str | None) -> int:
    quota = quota_of(ctx, tenant)
    if quota is None or quota.cold_bytes is None or ctx.store is None:
        return 0
    mine = sorted(((sid, s) for sid, s in ctx.sessions.items() if s.policy.tenant == tenant),
                  key=lambda item: item[1].last_used)
    over = sum(s.cold_bytes for _, s in mine) - quota.cold_bytes
    if over <= 0:
        return 0
    dropped: dict[str, list[ColdRef]] = {}
    for sid, s in mine:  # spilled blocks first: only a recall would read them
        while s.cold and over > 0:
            ref = s.cold.pop(0)
            over -= ref.nbytes
            dropped.setdefault(sid, []).append(ref)
    for sid, s in mine:  # then whole parked states: their resumes recompute them from the log
        if over <= 0:
            break
        if s.live or not s.record.blocks:
            continue
        refs = list(s.record.blocks)
        s.park(replace(s.record, blocks=[]), s.state)
        over -= sum(ref.nbytes for ref in refs)
        dropped.setdefault(sid, []).extend(refs)
    for sid, refs in dropped.items():
        ctx.store.release(refs)
        ctx.count(sid, "quota_drops", len(refs))
        ctx.dirty.add(sid)  # its record no longer names them
    return sum(len(refs) for refs in dropped.values())


def tenant_usage(ctx: HostContext) -> dict[str, dict[str, Any]]:
    usage: dict[str, dict[str, Any]] = {
        tenant: {"sessions": 0, "resident_tokens": 0, "cold_bytes": 0} for tenant in ctx.config.tenant_quotas}
    for s in ctx.sessions.values():
        tenant = s.policy.tenant
        if tenant is None:
            continue
        entry = usage.setdefault(tenant, {"sessions": 0, "resident_tokens": 0, "cold_bytes": 0})
        entry["sessions"] += 1
        entry["resident_tokens"] += s.resident
        entry["cold_bytes"] += s.cold_bytes
    for tenant, entry in usage.items():
        quota = quota_of(ctx, tenant)
        entry["resident_quota"] = None if quota is None else quota.resident_tokens
        entry["cold_quota"] = None if quota is None else quota.cold_bytes
    return usage
