"""The one place a ``SessionPolicy`` (plain configuration) becomes a residency policy object.

Primitives:
- ``residency_for(policy) -> Residency``: ``NoEviction``, ``Streaming``, ``Scored`` (with the scorer
  object the policy names) or ``EngineEvicts`` (``kvres.policy.residency``). Everything after this
  asks the object; nothing else compares policy kinds or scorer names.
- ``effective_residency(policy, caps, cold_store, addressed=True) -> Residency``: what a session runs on an engine
  with ``caps`` (and a cold store or not): the policy degraded to what the engine can run
  (``kvres.policy.degrade``), or, for a ``strict`` policy, exactly as asked (the host refuses it at
  open where the engine falls short).
"""

from __future__ import annotations

from typing import Any

from kvres.policy.capabilities import Capabilities
from kvres.policy.degrade import degrade
from kvres.policy.residency import EngineEvicts, NoEviction, Residency, Scored, Streaming
from kvres.policy.scorers import scorer_for

from .config import SessionPolicy


def residency_for(policy: SessionPolicy) -> Residency:
    shape: dict[str, Any] = dict(
        sink_tokens=policy.sink_tokens, recent_tokens=policy.recent_tokens, block_size=policy.block_size,
        budget_tokens=policy.budget_tokens, rebase=policy.rebase, spill=policy.spill,
        observation_window=policy.observation_window,
    )
    if policy.kind == "streaming":
        return Streaming(**shape)
    if policy.kind == "scored":
        return Scored(**shape, scorer=scorer_for(policy.scorer, policy.observation_window))
    if policy.kind == "engine":
        return EngineEvicts(**shape, aggregation=policy.aggregation)
    return NoEviction(**shape)


def effective_residency(policy: SessionPolicy, caps: Capabilities, cold_store: bool, addressed: bool = True
                        ) -> Residency:
    """``addressed``: kvres addresses the engine's KV (an engine that evicts by itself runs a
    policy as asked, or refuses it at open: that is the wrong engine, not a missing gate)."""
    asked = residency_for(policy)
    return asked if policy.strict or not addressed else degrade(asked, caps, cold_store)
