"""Degrade gracefully: a residency policy an engine cannot run as asked becomes the weaker one it can.

Primitives:
- ``Gate``: one requirement the engine does not meet: ``capability`` (a ``Requirement``: a
  ``Capabilities`` field name, or ``"cold_store"``) and ``reason`` (one line for people).
- ``unmet_gates(residency, caps, cold_store) -> tuple[Gate, ...]``: what the engine (and the
  backend's cold store) lacks for the policy as asked, in the order ``degrade`` relaxes it.
- ``degrade(residency, caps, cold_store=True) -> Residency``: the policy that runs. Capability
  first (docs/policies.md, Degrading): no way to evict from the middle: no eviction (a no-op, as
  the design's T1 says); no score source for a scored policy: streaming (sinks + recent, the same
  window); no position shift: gaps kept (``rebase=False``); no cold store or no KV export: evicted
  blocks are dropped (``spill=False``). Each relaxation keeps every other field; the result's
  ``degraded`` says why (empty when the policy runs as asked).
- ``effective_residency(asked, caps, cold_store, strict=False, addressed=True) -> Residency``: what
  a session runs: ``asked`` degraded to what the engine can run, or exactly as asked for a
  ``strict`` policy (the host refuses it at open where the engine falls short) and on an engine
  kvres does not address (``addressed=False``: one that evicts by itself runs the policy or
  refuses it at open).

Pure: the host decides when to use it (``SessionPolicy(strict=True)`` refuses instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from .capabilities import Capabilities, CapabilityName
from .residency import NoEviction, Residency, Streaming

Requirement = CapabilityName | Literal["cold_store"]
_SCORE_INPUTS: Mapping[Requirement, str] = {"attention_capture": "attention probabilities",
                                            "key_access": "the resident keys as floats"}


@dataclass(frozen=True)
class Gate:
    capability: Requirement
    reason: str


def _shape(residency: Residency) -> dict[str, Any]:
    """The fields every residency policy shares (what a weaker policy inherits)."""
    return {f.name: getattr(residency, f.name) for f in fields(Residency) if f.init}


def unmet_gates(residency: Residency, caps: Capabilities, cold_store: bool = True) -> tuple[Gate, ...]:
    if not residency.evicts or residency.engine_eviction() is not None:
        return ()
    if not caps.remove_middle:
        return (Gate("remove_middle", "the engine cannot evict from the middle of a session: nothing is evicted"),)
    gates: list[Gate] = []
    scorer = residency.own_scorer()
    for need in residency.requirements():
        if scorer is not None and need in _SCORE_INPUTS and not getattr(caps, need):
            gates.append(Gate(need, f"the engine cannot give the {scorer.name} scorer {_SCORE_INPUTS[need]}: "
                                    "streaming (sinks + recent) instead"))
    if residency.rebase and not caps.position_shift:
        gates.append(Gate("position_shift", "the engine cannot shift cache positions: gaps are kept (rebase=False)"))
    if residency.spill and not (cold_store and caps.kv_export):
        what = "the engine cannot export KV" if cold_store else "the backend has no cold store"
        gates.append(Gate("kv_export" if cold_store else "cold_store",
                          f"{what}: evicted blocks are dropped (spill=False), recomputed from the log if needed"))
    return tuple(gates)


def degrade(residency: Residency, caps: Capabilities, cold_store: bool = True) -> Residency:
    gates = unmet_gates(residency, caps, cold_store)
    if not gates:
        return residency
    why = "; ".join(g.reason for g in gates)
    shape = _shape(residency)
    if gates[0].capability == "remove_middle":
        return NoEviction(**{**shape, "degraded": why})
    out: Residency = residency
    names: set[Requirement] = {g.capability for g in gates}
    if residency.own_scorer() is not None and names & set(_SCORE_INPUTS):
        out = Streaming(**shape)
    if "position_shift" in names:
        out = replace(out, rebase=False)
    if names & {"kv_export", "cold_store"}:
        out = replace(out, spill=False)
    return replace(out, degraded=why)


def effective_residency(asked: Residency, caps: Capabilities, cold_store: bool, *, strict: bool = False,
                        addressed: bool = True) -> Residency:
    """``addressed``: kvres addresses the engine's KV (an engine that evicts by itself runs a
    policy as asked, or refuses it at open: that is the wrong engine, not a missing gate)."""
    return asked if strict or not addressed else degrade(asked, caps, cold_store)
