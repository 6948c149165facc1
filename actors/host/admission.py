"""Whether a backend can run a session's policy, checked when the session opens.

Primitives:
- ``check_kv_policy(ctx, policy, residency)``: on an engine whose KV kvres addresses: no
  engine-evicted policy, a session budget within the backend's, the scorer's input and the
  position shift the policy needs among the engine's capabilities (``ValueError`` /
  ``CapabilityError`` naming the backend, its engine and what is missing).
- ``check_managed_policy(ctx, policy, residency)``: on an engine that evicts by itself: no policy
  that needs kvres to evict.
"""

from __future__ import annotations

from kvres.policy import CapabilityError
from kvres.policy.residency import Residency

from ..config import SessionPolicy
from .context import HostContext

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
    if residency.budget is not None and residency.budget > config.kv_budget_tokens:
        raise ValueError(
            f"session budget_tokens={residency.budget} exceeds backend {ctx.name!r} "
            f"kv_budget_tokens={config.kv_budget_tokens}"
        )
    caps = ctx.executor.capabilities()
    missing = [need for need in residency.requirements() if not getattr(caps, need)]
    for need in missing:
        if need in _SCORER_INPUT:
            raise ValueError(f"scorer {policy.scorer!r} " + _SCORER_INPUT[need].format(
                name=ctx.name, engine=config.engine, type_k=config.type_k))
    if missing:
        raise CapabilityError(
            f"policy kind {policy.kind!r} with rebase={policy.rebase} needs {' and '.join(missing)}, "
            f"which backend {ctx.name!r} ({config.engine}, type_k={config.type_k}) cannot do; use rebase=False"
        )


def check_managed_policy(ctx: HostContext, policy: SessionPolicy, residency: Residency) -> None:
    if residency.evicts:
        raise ValueError(
            f"backend {ctx.name!r} runs {ctx.config.engine}, whose KV kvres cannot address: policy kind "
            f"{policy.kind!r} is not possible there; use kind='engine' (let the engine evict) or 'none'"
        )
