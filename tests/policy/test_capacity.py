"""SWA-aware capacity: the worked example, dense == flat, budget inversion, GGUF metadata."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvres.policy.capacity import LayerKVProfile, profile_from_metadata, resolve_context_for_budget
from kvres.policy.kv_types import kv_type_row_bytes

GiB = 1024**3
SWA = LayerKVProfile(global_layers=7, windowed_layers=35, window=512, per_layer_kv_bytes=4096)


def test_worked_example_swa_vs_dense() -> None:
    swa = SWA.kv_bytes_for_context(131_072) / GiB
    dense = SWA.dense_kv_bytes_for_context(131_072) / GiB
    assert swa == pytest.approx(3.57, abs=0.01)  # "about 3.6 GiB"
    assert dense == pytest.approx(21.0, abs=1e-9)
    assert SWA.marginal_kv_bytes_per_token() == 7 * 4096


@given(st.integers(0, 10**7), st.integers(1, 80), st.integers(1, 10**5))
def test_dense_equals_flat(ctx: int, layers: int, per_layer: int) -> None:
    flat = layers * per_layer * ctx
    for profile in (LayerKVProfile(layers, 0, 0, per_layer), LayerKVProfile(1, layers - 1, 0, per_layer)):
        assert profile.kv_bytes_for_context(ctx) == flat
        assert profile.marginal_kv_bytes_per_token() == layers * per_layer
        assert resolve_context_for_budget(profile, flat) >= ctx


def test_resolve_inverts_kv_bytes_with_windowed_floor() -> None:
    budget = SWA.kv_bytes_for_context(131_072)
    assert resolve_context_for_budget(SWA, budget) == 131_072
    assert resolve_context_for_budget(SWA, budget - 1) == 131_071
    flat_guess = int(budget // (42 * 4096))  # what budget / flat bytes-per-token would say
    assert flat_guess < 25_000
    below_window = 42 * 4096 * 100
    assert resolve_context_for_budget(SWA, below_window) == 100
    assert resolve_context_for_budget(SWA, budget, max_context=8192) == 8192


@given(st.integers(0, 2 * GiB))
def test_resolved_context_is_the_largest_that_fits(budget: int) -> None:
    ctx = resolve_context_for_budget(SWA, budget)
    assert SWA.kv_bytes_for_context(ctx) <= budget < SWA.kv_bytes_for_context(ctx + 1)


def test_all_windowed_needs_a_bound() -> None:
    profile = LayerKVProfile(0, 4, 128, 100)
    with pytest.raises(ValueError, match="max_context"):
        resolve_context_for_budget(profile, 10**9)
    assert resolve_context_for_budget(profile, 10**9, max_context=4096) == 4096


def test_kv_type_row_bytes() -> None:
    assert kv_type_row_bytes("f16", 32) == 64
    assert kv_type_row_bytes("q8_0", 32) == 34
    assert kv_type_row_bytes("q4_0", 64) == 36
    with pytest.raises(ValueError, match="'q3_k'"):
        kv_type_row_bytes("q3_k", 32)


def _meta(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "general.architecture": "gemma3",
        "gemma3.block_count": 42,
        "gemma3.embedding_length": 3584,
        "gemma3.attention.head_count": 16,
        "gemma3.attention.head_count_kv": 8,
        "gemma3.attention.key_length": 128,
        "gemma3.attention.value_length": 128,
    }
    base.update(extra)
    return base


def test_metadata_scalar_stride_and_per_layer_array() -> None:
    stride = profile_from_metadata(_meta(**{
        "gemma3.attention.sliding_window": 1024, "gemma3.attention.sliding_window_pattern": 6,
    }))
    assert (stride.global_layers, stride.windowed_layers, stride.window) == (7, 35, 1024)
    assert stride.per_layer_kv_bytes == 2 * 8 * 128 * 2
    pattern = [i % 6 != 5 for i in range(42)]
    array = profile_from_metadata(_meta(**{
        "gemma3.attention.sliding_window": 1024, "gemma3.attention.sliding_window_pattern": pattern,
    }))
    assert (array.global_layers, array.windowed_layers) == (7, 35)
    odd = profile_from_metadata(_meta(**{
        "gemma3.block_count": 26, "gemma3.attention.sliding_window": 512,
        "gemma3.attention.sliding_window_pattern": 6,
    }))
    assert odd.global_layers == math.ceil(26 / 6)
    dense = profile_from_metadata(_meta(), type_k="q8_0", type_v="q4_0")
    assert dense.dense and dense.per_layer_kv_bytes == 8 * 34 * 4 + 8 * 18 * 4


def test_metadata_errors_name_the_key() -> None:
    meta = _meta()
    del meta["gemma3.block_count"]
    with pytest.raises(ValueError, match="gemma3.block_count"):
        profile_from_metadata(meta)
    with pytest.raises(ValueError, match="sliding_window_pattern has 3 entries"):
        profile_from_metadata(_meta(**{
            "gemma3.attention.sliding_window": 8, "gemma3.attention.sliding_window_pattern": [True] * 3,
        }))
