"""Recall or recompute: bring a cold block back from its tier, or re-prefill its tokens.

Primitives:
- ``TierCost(name, bandwidth_gbps, latency_s)``: what reading from one cold tier costs
  (``bytes / bandwidth + latency``); ``TierCost.seconds(n_bytes)``.
- ``PrefillCost(tokens_per_s, fixed_s=0)``: what recomputing costs (``fixed + tokens / rate``).
- ``recall_or_recompute(block_bytes, n_tokens, tier, prefill) -> RecallDecision``: one block, with
  every term; ties go to recall (the exact stored KV beats a recomputation).
- ``RecallCosts(tiers, prefill)``: the costs of every tier; ``worth_reading(bytes, tokens, tier)``.

Costs come from measured probes (see ``kvres.actors.probes``), the same as T*. Pure: numpy/stdlib.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .errors import KvresError

GB = 1e9

Action = Literal["recall", "recompute"]


class RecallCostError(KvresError, ValueError):
    """A cost term that cannot be used (negative, zero where a rate is needed, not finite)."""


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise RecallCostError(f"{name} must be a finite number > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise RecallCostError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class TierCost:
    """Reading ``n`` bytes from a tier takes ``latency_s + n / (bandwidth_gbps * 1e9)`` seconds."""

    name: str
    bandwidth_gbps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        _positive(f"TierCost({self.name!r}).bandwidth_gbps", self.bandwidth_gbps)
        _non_negative(f"TierCost({self.name!r}).latency_s", self.latency_s)

    def seconds(self, n_bytes: float) -> float:
        _non_negative("n_bytes", n_bytes)
        return self.latency_s + n_bytes / (self.bandwidth_gbps * GB)


@dataclass(frozen=True)
class PrefillCost:
    """Recomputing ``n`` tokens takes ``fixed_s + n / tokens_per_s`` seconds (measured prefill rate)."""

    tokens_per_s: float
    fixed_s: float = 0.0

    def __post_init__(self) -> None:
        _positive("PrefillCost.tokens_per_s", self.tokens_per_s)
        _non_negative("PrefillCost.fixed_s", self.fixed_s)

    def seconds(self, n_tokens: int) -> float:
        if n_tokens < 0:
            raise RecallCostError(f"n_tokens must be >= 0, got {n_tokens}")
        return self.fixed_s + n_tokens / self.tokens_per_s


@dataclass(frozen=True)
class RecallDecision:
    action: Action
    block_bytes: int
    n_tokens: int
    tier: TierCost
    prefill: PrefillCost
    recall_s: float  # block_bytes / tier bandwidth + tier latency
    recompute_s: float  # n_tokens / prefill rate + prefill fixed cost

    @property
    def saving_s(self) -> float:
        """Time the chosen action saves over the other one (>= 0)."""
        return abs(self.recompute_s - self.recall_s)


def recall_or_recompute(block_bytes: int, n_tokens: int, tier: TierCost, prefill: PrefillCost) -> RecallDecision:
    """Recall when reading the block back is no slower than re-prefilling its tokens."""
    if block_bytes < 0:
        raise RecallCostError(f"block_bytes must be >= 0, got {block_bytes}")
    recall_s = tier.seconds(block_bytes)
    recompute_s = prefill.seconds(n_tokens)
    action: Action = "recall" if recall_s <= recompute_s else "recompute"
    return RecallDecision(action, block_bytes, n_tokens, tier, prefill, recall_s, recompute_s)


@dataclass(frozen=True)
class RecallCosts:
    """Measured costs per cold tier (by tier name) and of prefill: what a cold store needs to
    decide, block by block, whether reading a block back beats recomputing it."""

    tiers: Mapping[str, TierCost]
    prefill: PrefillCost

    def worth_reading(self, block_bytes: int, n_tokens: int, tier: str) -> bool:
        """True when reading from ``tier`` is no slower than recomputing (or its cost is unknown)."""
        cost = self.tiers.get(tier)
        if cost is None:
            return True
        return recall_or_recompute(block_bytes, n_tokens, cost, self.prefill).action == "recall"
