"""What a session runs as on a backend whose KV tier spills (T*'s "f16 + spill" made real).

Primitives:
- ``session_policy_for_tier(decision, policy, resident_budget_tokens) -> SessionPolicy``: the
  policy a session is opened with. On a backend whose T* decision spills, a session asked for with
  no eviction policy (kind "none", the default, with ``spill=True``) becomes a spilling streaming
  session bounded by the backend's resident budget: its resident window stays in the engine at the
  chosen KV type, the rest of it goes to the cold store and comes back by recall when a later turn
  attends to it. Every other case returns the asked-for policy unchanged.
- ``SPILL_SINK_TOKENS``, ``SPILL_BLOCK_TOKENS``, ``SPILL_OBSERVATION_WINDOW``, ``SPILL_MAX_RECENT``;
  ``spill_recent_tokens(budget)``: the window's shape, unless the asked-for policy set a field.

Why streaming and not scored SnapKV: recall ranks resident and cold blocks together by the new
turn's attention (``host.spill_recall.Recall``), so what a turn needs comes back whichever policy evicted
it, and streaming evicts without an attention pass. Measured through ``BackendHost`` on
models/passkey.gguf, two turns (context, then the question), 50 middle-third prompts of 384 tokens
per family, a resident budget of 96 tokens (25%): streaming 100% / 92% (families 1 / 2; the full
cache answers 100% / 90%), scored SnapKV 100% / 94% at 5x the time (an attention pass after every
prefill chunk). Blocks of 8: 16-token blocks recall a needle with too much filler around it (96% /
72%), 4-token ones gain one prompt (100% / 94%) for twice the blocks. The recent window is a
quarter of the budget: a 64-token window in a 100-token budget leaves too little room for recalled
blocks (0% / 5%); 8 to 32 tokens answer alike.

A session that asked for eviction itself (streaming, scored, engine) or for nothing to leave the
engine (kind "none" with ``spill=False``) keeps its policy. The re-basing follows the tier: a
quantized K cache cannot shift positions (``TierDecision.position_shift``), so positions keep
their gaps there.
"""

from __future__ import annotations

from kvres.actors.config import SessionPolicy
from kvres.policy.tiering import TierDecision, TieringError

SPILL_SINK_TOKENS = 4
SPILL_BLOCK_TOKENS = 8
SPILL_OBSERVATION_WINDOW = 16
SPILL_MAX_RECENT = 64


def spill_recent_tokens(budget_tokens: int) -> int:
    """The protected recent window of a spilling session: a quarter of its budget, at most 64."""
    return min(SPILL_MAX_RECENT, budget_tokens // 4)


def session_policy_for_tier(
    decision: TierDecision | None, policy: SessionPolicy | None, resident_budget_tokens: int
) -> SessionPolicy:
    """The policy a session opens with on a backend that chose ``decision`` (None: no T* choice).

    ``resident_budget_tokens`` is the backend's resident budget (its ``kv_budget_tokens``, which
    the decision set). Fields of the window the asked-for policy set explicitly are kept."""
    asked = policy if policy is not None else SessionPolicy()
    if decision is None or not decision.spills or not asked.residency.keeps_every_token or not asked.spill:
        return asked
    fields = asked.model_fields_set

    def kept(name: str, default: int) -> int:
        return int(getattr(asked, name)) if name in fields else default

    sink = kept("sink_tokens", SPILL_SINK_TOKENS)
    recent = kept("recent_tokens", spill_recent_tokens(resident_budget_tokens))
    block = kept("block_size", SPILL_BLOCK_TOKENS)
    window = kept("observation_window", SPILL_OBSERVATION_WINDOW)
    rebase = asked.rebase if "rebase" in fields else decision.position_shift
    if resident_budget_tokens < sink + recent + block:
        raise TieringError(
            f"resident budget of {resident_budget_tokens} tokens at KV tier {decision.chosen.name} is too small "
            f"for a spilling session: it needs at least sink_tokens ({sink}) + recent_tokens ({recent}) + one "
            f"block ({block}) = {sink + recent + block}"
        )
    return SessionPolicy(kind="streaming", budget_tokens=resident_budget_tokens, sink_tokens=sink,
                         recent_tokens=recent, block_size=block, observation_window=window, rebase=rebase,
                         spill=True, spill_cap_bytes=asked.spill_cap_bytes)
