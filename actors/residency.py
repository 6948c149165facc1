"""The one place a ``SessionPolicy`` (plain configuration) becomes a residency policy object.

Primitives:
- ``residency_for(policy) -> Residency``: ``NoEviction``, ``Streaming``, ``Scored`` (with the scorer
  object the policy names) or ``EngineEvicts`` (``kvres.policy.residency``). Everything after this
  asks the object; nothing else compares policy kinds or scorer names.
"""

from __future__ import annotations

from typing import Any

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
