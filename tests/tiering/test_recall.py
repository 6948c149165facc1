"""Recall or recompute (docs/policies.md, Recall or recompute) with synthetic costs, both ways."""

from __future__ import annotations

import pytest

from kvres.policy.recall import PrefillCost, RecallCostError, TierCost, recall_or_recompute

RAM = TierCost("ram", bandwidth_gbps=10.0, latency_s=20e-6)
SLOW_DISK = TierCost("disk", bandwidth_gbps=0.2, latency_s=15e-3)
PREFILL = PrefillCost(tokens_per_s=5_000.0, fixed_s=0.5e-3)


def test_ram_recall_beats_recompute() -> None:
    d = recall_or_recompute(block_bytes=64 * 640, n_tokens=64, tier=RAM, prefill=PREFILL)
    assert d.action == "recall"
    assert d.recall_s == pytest.approx(20e-6 + 64 * 640 / 10e9)
    assert d.recompute_s == pytest.approx(0.5e-3 + 64 / 5000)
    assert d.saving_s == pytest.approx(d.recompute_s - d.recall_s)


def test_slow_disk_recompute_beats_recall() -> None:
    d = recall_or_recompute(block_bytes=16 * 196_608, n_tokens=16, tier=SLOW_DISK, prefill=PREFILL)
    assert d.action == "recompute"
    assert d.recall_s > d.recompute_s


def test_tie_goes_to_recall() -> None:
    tier = TierCost("t", bandwidth_gbps=1.0, latency_s=0.0)
    d = recall_or_recompute(1_000_000, 1000, tier, PrefillCost(tokens_per_s=1e6))
    assert d.recall_s == d.recompute_s and d.action == "recall"


def test_bad_costs_named() -> None:
    with pytest.raises(RecallCostError, match="bandwidth_gbps"):
        TierCost("disk", bandwidth_gbps=0.0)
    with pytest.raises(RecallCostError, match="tokens_per_s"):
        PrefillCost(tokens_per_s=float("nan"))
    with pytest.raises(RecallCostError, match="block_bytes"):
        recall_or_recompute(-1, 1, RAM, PREFILL)
