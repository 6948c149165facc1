"""Recall or recompute (DESIGN.md 4.6) with synthetic costs, both ways."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvres.policy.recall import PrefillCost, RecallCostError, TierCost, recall_mask, recall_or_recompute

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


@settings(max_examples=50, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(0, 10**8), st.integers(0, 4096)), min_size=1, max_size=40),
    bw=st.floats(0.01, 100.0),
    lat=st.floats(0.0, 0.05),
    rate=st.floats(10.0, 1e6),
)
def test_mask_matches_scalar_rule(sizes, bw, lat, rate) -> None:
    tier, prefill = TierCost("t", bw, lat), PrefillCost(rate)
    b = np.array([s[0] for s in sizes])
    n = np.array([s[1] for s in sizes])
    mask = recall_mask(b, n, tier, prefill)
    expected = [recall_or_recompute(int(x), int(y), tier, prefill).action == "recall" for x, y in sizes]
    assert mask.tolist() == expected
