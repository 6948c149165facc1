"""Whether a backend can run a session's policy, checked when the session opens.

Primitives:
- ``check_kv_policy(ctx, policy, residency)``: on an engine whose KV kvres addresses: no
  engine-evicted policy and a session budget within the backend's. ``residency`` is what the
  session runs (``HostContext.new_session``): a policy the engine cannot run as asked was degraded
  there (``kvres.policy.degrade``), except a ``strict`` one, refused here when the scorer's input,
  the position shift, or the cold store and KV export its spill needs are missing (``ValueError``
  / ``CapabilityError`` naming the backend, its engine and what is missing).
- ``report_degraded(ctx, session_id, s)``: a session that runs weaker than asked is logged (WARNING
  on "kvres.policy") and counted (``degraded``, the ``kvres_degraded_total`` metric) once.
- ``check_managed_policy(ctx, policy, residency)``: on an engine that evicts by itself: no policy
  that needs kvres to evict.
"""

from __future__ import annotations

import logging

from kvres.policy import CapabilityError
from kvres.policy.degrade import unmet_gates
from kvres.policy.residency import Residency

from ..config import SessionPolicy
from .context import HostContext
from .sessions import HostSession

log = logging.getLogger("kvres.policy")

_SCORER_INPUT = {
    "attention_capture": "needs attention probabilities, which backend {name!r} ({engine}) cannot capture; "
                         "use scorer='keynorm'",
    "key_access": "needs the resident keys, which backend {name!r} ({engine}, type_k={type_k}) cannot read "
                  "as floats",
}


def check_kv_policy(ctx: HostContext, policy: SessionPolicy, residency: Residency) -> None:
    config = ctx.config
    if residency.engine_eviction() is not None:
        raise ValueError(
            f"policy kind {policy.kind!r} needs an engine that evicts by itself (engine='openvino-genai'); "
            f"backend {ctx.name!r} runs {config.engine!r}"
        )
    if residency.planned_budget_tokens is not None and residency.planned_budget_tokens > config.kv_budget_tokens:
        raise ValueError(
            f"session budget_tokens={residency.planned_budget_tokens} exceeds backend {ctx.name!r} "
            f"kv_budget_tokens={config.kv_budget_tokens}"
        )
    gates = unmet_gates(residency, ctx.executor.capabilities(), ctx.store is not None)
    if not gates:
        return  # the policy runs as asked, or was degraded to what the engine can run
    where = f"backend {ctx.name!r} ({config.engine}, type_k={config.type_k})"
    missing = [g.capability for g in gates]
    for need in missing:
        if need in _SCORER_INPUT:
            raise ValueError(f"scorer {policy.scorer!r} " + _SCORER_INPUT[need].format(
                name=ctx.name, engine=config.engine, type_k=config.type_k) + " (strict=True: not degraded)")
    if "remove_middle" in missing:
        raise CapabilityError(f"policy kind {policy.kind!r} needs remove_middle, which {where} cannot do; "
                              "use kind='none' (strict=True: not degraded)")
    if "position_shift" in missing:
        raise CapabilityError(
            f"policy kind {policy.kind!r} with rebase={policy.rebase} needs position_shift, "
            f"which {where} cannot do; use rebase=False (strict=True: not degraded)"
        )
    lack = gates[0].reason.split(":")[0]
    raise CapabilityError(f"policy kind {policy.kind!r} with spill=True needs a cold store and KV export, and "
                          f"{lack} ({where}); use spill=False (strict=True: not degraded)")


def check_managed_policy(ctx: HostContext, policy: SessionPolicy, residency: Residency) -> None:
    if residency.evicts:
        raise ValueError(
            f"backend {ctx.name!r} runs {ctx.config.engine}, whose KV kvres cannot address: policy kind "
            f"{policy.kind!r} is not possible there; use kind='engine' (let the engine evict) or 'none'"
        )


def report_degraded(ctx: HostContext, session_id: str, s: HostSession) -> None:
    r = s.residency
    if not r.degraded or s.counters.get("degraded", 0):
        return
    s.counters["degraded"] = 1
    ctx.metrics.count("degraded", ctx.name, session_id)
    log.warning("session %r on backend %r (%s, type_k=%s) runs [%s] instead of the policy asked [%s]: %s",
                session_id, ctx.name, ctx.config.engine, ctx.config.type_k, r.describe(),
                s.policy.residency.describe(), r.degraded)
