"""SWA-aware capacity: the worked example, dense == flat, budget inversion, GGUF metadata laid out as
llama.cpp lays it out, llama.cpp's cache cells, memory budgets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvres.policy.capacity import CapacityError, LayerKVProfile, MemoryBudget, resolve_context_for_budget
from kvres.policy.kv_layout import (
    CacheCells,
    ModelKVLayout,
    layout_from_metadata,
    profile_from_metadata,
    swa_pattern,
)
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
    # llama.cpp's set_swa_pattern(6) over 26 blocks: 5, 11, 17, 23 are global (floor, not ceil)
    odd = profile_from_metadata(_meta(**{
        "gemma3.block_count": 26, "gemma3.attention.sliding_window": 512,
        "gemma3.attention.sliding_window_pattern": 6,
    }))
    assert odd.global_layers == 4
    dense = profile_from_metadata(_meta(), type_k="q8_0", type_v="q4_0")
    assert dense.dense and dense.per_layer_kv_bytes == 8 * 34 * 4 + 8 * 18 * 4


def _shaped(arch: str, blocks: int, kv_heads: int = 16, window: int = 1024, **extra: object) -> dict[str, object]:
    meta: dict[str, object] = {
        "general.architecture": arch, f"{arch}.block_count": blocks, f"{arch}.embedding_length": 5376,
        f"{arch}.attention.head_count": 32, f"{arch}.attention.head_count_kv": kv_heads,
        f"{arch}.attention.key_length": 128, f"{arch}.attention.value_length": 128,
        f"{arch}.attention.sliding_window": window,
    }
    meta.update({f"{arch}.{k}": v for k, v in extra.items()})
    return meta


def test_gemma3_27b_without_a_pattern_key() -> None:
    """62 blocks, 16 KV heads of 128, window 1024, no pattern key: llama.cpp's gemma3 stride 6."""
    layout = layout_from_metadata(_shaped("gemma3", 62))
    assert (layout.global_layers, layout.windowed_layers, layout.window) == (10, 52, 1024)
    assert layout.source == "gemma3 built-in stride 6"
    profile = layout.profile()
    ctx = 131_072
    assert profile.kv_bytes_for_context(ctx) / GiB == pytest.approx(10.41, abs=0.01)  # not 0.48 GiB
    assert profile.dense_kv_bytes_for_context(ctx) / GiB == pytest.approx(62.0)
    assert resolve_context_for_budget(profile, profile.kv_bytes_for_context(ctx)) == ctx


def test_built_in_patterns_of_other_archs() -> None:
    assert layout_from_metadata(_shaped("gemma2", 42, kv_heads=8, window=4096)).global_layers == 21
    # dense first: cohere2moe / smallthinker make blocks 0, 4, 8, ... global
    cm = layout_from_metadata(_shaped("cohere2moe", 26))
    assert [not x.windowed for x in cm.layers] == [i % 4 == 0 for i in range(26)] and cm.global_layers == 7
    # olmo2 windows only when the file has a window; exaone4 only in its 64-block model
    assert layout_from_metadata(_shaped("olmo2", 16, window=0)).windowed_layers == 0
    assert layout_from_metadata(_shaped("exaone4", 30)).windowed_layers == 0
    assert layout_from_metadata(_shaped("exaone4", 64)).global_layers == 16
    # llama4: chunked attention of 8192 tokens whatever the file says, off with an explicit 0
    l4 = layout_from_metadata(_shaped("llama4", 48, window=1))
    assert (l4.window, l4.chunked, l4.global_layers) == (8192, True, 12)
    assert layout_from_metadata(_shaped("llama4", 48, window=0)).windowed_layers == 0
    # gemma3n: only the first 20 blocks own KV; the other 10 reuse it
    g3n = layout_from_metadata(_shaped("gemma3n", 30, window=512))
    assert (len(g3n.layers), g3n.shared_layers, g3n.global_layers) == (20, 10, 4)
    # an arch llama.cpp does not window ignores a window key, but reads a per-layer array
    assert layout_from_metadata(_shaped("qwen2", 28)).windowed_layers == 0
    arr = layout_from_metadata(_shaped("gemma4", 6, **{"attention.sliding_window_pattern": [True, True, False] * 2}))
    assert arr.global_layers == 2 and arr.source == "pattern array"


def test_swa_pattern_matches_llama_cpp() -> None:
    assert swa_pattern(6, 3) == (True, True, False, True, True, False)
    assert swa_pattern(6, 3, dense_first=True) == (False, True, True, False, True, True)
    assert swa_pattern(3, 0) == (True, True, True)  # 0: every layer windowed
    assert swa_pattern(3, 1) == (False, False, False)


def test_per_layer_heads_swa_head_sizes_shared_kv_and_mla() -> None:
    meta = _shaped("gemma4", 8, kv_heads=[4, 4, 2, 4, 4, 2, 4, 2], **{
        "attention.sliding_window_pattern": [True, True, False, True, True, False, True, False],
        "attention.key_length_swa": 64, "attention.value_length_swa": 64, "attention.shared_kv_layers": 2})
    layout = layout_from_metadata(meta)
    assert [(x.k_width, x.windowed) for x in layout.layers] == [
        (256, True), (256, True), (256, False), (256, True), (256, True), (256, False)]
    assert layout.shared_layers == 2 and layout.head_dims == (64, 64)
    profile = layout.profile()
    assert profile.global_bytes_per_token == 2 * 2 * 256 * 2 and profile.windowed_bytes_per_token == 4 * 2 * 256 * 2
    mla = layout_from_metadata({**_shaped("deepseek2", 4, window=0), "deepseek2.attention.kv_lora_rank": 512,
                                "deepseek2.rope.dimension_count": 64})
    assert {(x.k_width, x.v_width) for x in mla.layers} == {(576, 0)}
    assert mla.profile().per_layer_kv_bytes == 576 * 2
    hybrid = layout_from_metadata(_shaped("granitehybrid", 6, kv_heads=[0, 0, 8, 0, 0, 8], window=0))
    assert (len(hybrid.layers), hybrid.recurrent_layers) == (2, 4)
    with pytest.raises(CapacityError, match="recurrent"):
        layout_from_metadata(_shaped("mamba2", 4))


def test_llama_cache_cells() -> None:
    """The SWA cache keeps every sequence's window plus a micro-batch, padded to 256 cells."""
    one = CacheCells(n_seq_max=1, n_ubatch=512, swa_full=False)
    assert one.context_cells(4000) == 4096 and one.windowed_cells(128) == 768
    assert CacheCells(n_seq_max=3, swa_full=False).windowed_cells(128) == 1024
    streams = CacheCells(n_seq_max=3, kv_unified=False, swa_full=False)
    assert streams.context_cells(4096) == 3 * 1536 and streams.windowed_cells(128) == 3 * 768
    assert CacheCells().windowed_cells(128) is None  # llama.cpp's default: full-size SWA cache
    layout = ModelKVLayout.uniform(1, 5, 128, 2, 64, 64)
    small = layout.profile("f16", "f16", one)
    assert small.window_cap == 768
    assert small.kv_bytes_for_context(4096) == (4096 * 1 + 768 * 5) * 512
    full = layout.profile("f16", "f16", CacheCells())
    assert full.dense and full.kv_bytes_for_context(4096) == 4096 * 6 * 512
    assert layout.profile().kv_bytes_for_context(4096) == (4096 + 128 * 5) * 512


def test_heterogeneous_layers_and_sessions() -> None:
    profile = LayerKVProfile(2, 4, 100, 1000.0, windowed_layer_kv_bytes=250.0)
    assert profile.kv_bytes_for_context(50) == 50 * (2000 + 1000)
    assert profile.kv_bytes_for_context(1000) == 1000 * 2000 + 100 * 1000
    assert resolve_context_for_budget(profile, profile.kv_bytes_for_context(1000)) == 1000
    three = profile.for_sessions(3)  # each session keeps its own window
    assert three.kv_bytes_for_context(1000) == 1000 * 2000 + 300 * 1000
    assert three.kv_bytes_for_context(1000) >= sum(profile.kv_bytes_for_context(t) for t in (400, 300, 300))


def test_memory_budget() -> None:
    gib = float(GiB)
    assert MemoryBudget(16 * gib, used_bytes=4 * gib, reserve_bytes=gib, fraction=0.5).bytes == 5.5 * gib
    assert MemoryBudget(16 * gib, target_bytes=2 * gib).bytes == 2 * gib
    assert MemoryBudget(gib, used_bytes=2 * gib).bytes == 0.0
    assert MemoryBudget(None, target_bytes=3.0).bytes == 3.0
    with pytest.raises(CapacityError, match="fraction"):
        MemoryBudget(gib, fraction=1.5)
    with pytest.raises(CapacityError, match="free_bytes or target_bytes"):
        MemoryBudget(None)


def test_metadata_errors_name_the_key() -> None:
    meta = _meta()
    del meta["gemma3.block_count"]
    with pytest.raises(ValueError, match="gemma3.block_count"):
        profile_from_metadata(meta)
    with pytest.raises(ValueError, match="sliding_window_pattern has 3 entries"):
        profile_from_metadata(_meta(**{
            "gemma3.attention.sliding_window": 8, "gemma3.attention.sliding_window_pattern": [True] * 3,
        }))
