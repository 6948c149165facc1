"""T*: the pure tier choice against the formulas and reference figures of docs/policies.md, T*."""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvres.actors.sizing.tier_env import log_tier_decision
from kvres.policy.capacity import LayerKVProfile
from kvres.policy.kv_layout import profile_from_metadata
from kvres.policy.tiering import (
    KV_TIER_LADDER,
    MIB,
    V_LADDER,
    KVTier,
    TieringError,
    active_weight_bytes,
    choose_tier,
    drop_fraction,
    effective_bandwidth,
    fit_engage_cost,
    fits,
    head_dims_from_metadata,
    metadata_profile_factory,
    t_resident_s,
    tier_can_shift,
    tier_kv_bytes,
    tier_ladder,
    tier_supported,
    tstar_bytes,
)
from tests.hypothesis_profiles import examples

from .refs import (
    C_ENGAGE_S,
    QWEN14B,
    QWEN14B_Q8_ACTIVE,
    QWEN_CTX,
    SMALL,
    SMALL_WEIGHTS,
    SWA,
    VRAM_GBPS,
    qwen14b_q8_tensors,
    weights_for_tstar,
)

SLOW_HOST = {"pcie_gbps": 6.7, "host_ram_gbps": 11.5}  # RTX 3090 host: PCIe binds
FAST_HOST = {"pcie_gbps": 51.2, "host_ram_gbps": 9.3}  # RTX 6000 host: host RAM binds


def _choose(layout=QWEN14B, n_ctx=QWEN_CTX, budget=0.0, weights=SMALL_WEIGHTS, host=None, **kw):
    return choose_tier(
        layout.profile,
        n_ctx,
        budget,
        weights_active_bytes=weights,
        vram_gbps=VRAM_GBPS,
        c_engage_s=C_ENGAGE_S,
        **(host or SLOW_HOST),
        **kw,
    )


# --- ladder and bytes -------------------------------------------------------------------------


def test_ladders() -> None:
    assert [t.name for t in KV_TIER_LADDER] == ["f16/f16", "q8_0/q8_0", "q4_0/q4_0"]
    assert V_LADDER == ("f16", "q8_0", "q4_0")
    assert tier_ladder() == KV_TIER_LADDER
    assert [t.name for t in tier_ladder("q8_0")] == ["q8_0/f16", "q8_0/q8_0", "q8_0/q4_0"]
    with pytest.raises(TieringError, match="'q3'"):
        tier_ladder("q3")
    with pytest.raises(TieringError, match="type_v='x'"):
        KVTier("f16", "x")


def test_kv_bytes_per_tier_from_heads() -> None:
    f16 = tier_kv_bytes(QWEN14B.profile, KV_TIER_LADDER[0], QWEN_CTX)
    assert f16 == 12_288 * MIB  # 192 KiB per token at f16
    assert tier_kv_bytes(QWEN14B.profile, KV_TIER_LADDER[1], QWEN_CTX) == 6_528 * MIB  # 34 bytes per 32
    assert tier_kv_bytes(QWEN14B.profile, KV_TIER_LADDER[2], QWEN_CTX) == 3_456 * MIB  # 18 bytes per 32
    # one layer, one token, 8 KV heads of 128: K as q8_0 (32 blocks of 34 bytes) + V as f16
    assert QWEN14B.profile("q8_0", "f16").per_layer_kv_bytes == 1_088 + 2_048


def test_kv_bytes_windowed_layers_cap_at_window() -> None:
    ctx = 131_072
    swa = tier_kv_bytes(SWA.profile, KV_TIER_LADDER[0], ctx)
    assert swa == 3_831_496_704  # 7 global layers x 131,072 tokens + 35 windowed x 512, 4 KiB each
    assert swa < 21 * 1024**3 / 5  # against 21 GiB billed dense
    # the same from GGUF-style metadata, through the capacity module
    meta = {
        "general.architecture": "gemma2",
        "gemma2.block_count": 42,
        "gemma2.embedding_length": 3584,
        "gemma2.attention.head_count": 16,
        "gemma2.attention.head_count_kv": 8,
        "gemma2.attention.key_length": 128,
        "gemma2.attention.value_length": 128,
        "gemma2.attention.sliding_window": 512,
        "gemma2.attention.sliding_window_pattern": [i % 6 != 5 for i in range(42)],
    }
    factory = metadata_profile_factory(meta)
    assert factory("f16", "f16") == profile_from_metadata(meta)
    assert tier_kv_bytes(factory, KV_TIER_LADDER[0], ctx) == swa
    assert head_dims_from_metadata(meta) == (128, 128)


def test_tier_supported_needs_whole_blocks_per_head() -> None:
    assert tier_supported(KVTier("q8_0", "q4_0"), 128, 128)
    assert not tier_supported(KVTier("q8_0", "q8_0"), 8, 8)  # stories260K: head_dim 8
    assert not tier_supported(KVTier("f16", "q4_0"), 128, 8)
    assert tier_supported(KVTier("f16", "f16"), 8, 8)


# --- the formulas -------------------------------------------------------------------------------


def test_bw_eff_reference_hosts() -> None:
    assert effective_bandwidth(11.5, 6.7) == (6.7, "pcie")
    assert effective_bandwidth(9.3, 51.2) == (9.3, "host_ram")
    assert effective_bandwidth(11.5, None) == (11.5, "none")
    with pytest.raises(TieringError, match="pcie_gbps"):
        effective_bandwidth(11.5, 0.0)


def test_t_resident_and_drop_model() -> None:
    t = t_resident_s(10e9, 2e9, 1000.0)
    assert t == pytest.approx(12e-3)
    assert drop_fraction(0, C_ENGAGE_S, 6.7, t) == 0.0
    assert drop_fraction(6.7e6, 1e-3, 6.7, t) == pytest.approx((1e-3 + 1e-3) / 12e-3)
    # drop(T*) is the target, wherever the cliff cap does not bind
    tstar = tstar_bytes(0.2, t, C_ENGAGE_S, 6.7)
    assert drop_fraction(tstar, C_ENGAGE_S, 6.7, t) == pytest.approx(0.2)


def test_tstar_cap_and_fit_rule() -> None:
    assert tstar_bytes(0.99, 10.0, 0.0, 50.0) == 800 * MIB
    assert tstar_bytes(0.99, 10.0, 0.0, 50.0, max_spill_bytes=5 * MIB) == 5 * MIB
    assert fits(100.0, 90.0, 10.0) and not fits(100.0, 90.0, 9.0)
    assert fits(90.0, 90.0, -1e9) and not fits(91.0, 90.0, -1e9)  # T* <= 0: no spill, budget intact


def test_short_context_never_spills_and_quantizes() -> None:
    n_ctx = 4096
    f16 = tier_kv_bytes(SMALL.profile, KV_TIER_LADDER[0], n_ctx)
    d = _choose(SMALL, n_ctx, budget=0.98 * f16)  # f16 spills just 2%
    assert d is not None
    assert d.tstar_bytes <= 0
    assert d.chosen.name == "q8_0/q8_0" and not d.spills and not d.floor_fallback
    assert d.resident_budget_tokens == n_ctx


def test_long_context_same_model_spills_instead() -> None:
    n_ctx = 131_072
    f16 = tier_kv_bytes(SMALL.profile, KV_TIER_LADDER[0], n_ctx)
    d = _choose(SMALL, n_ctx, budget=f16 - 2 * MIB)
    assert d is not None and d.tstar_bytes > 2 * MIB
    assert d.chosen.name == "f16/f16" and d.chosen_spill_bytes == 2 * MIB
    assert d.resident_budget_tokens < n_ctx
    assert 0 < d.predicted_drop <= d.target_drop


def test_reference_1630_mib_spill_chooses_q8_with_the_real_weights_read() -> None:
    """Qwen2.5-14B Q8_0 at 65,536 tokens on the slow link: W_active is what a decode step reads
    (14.87 GB: every Q8_0 matrix and the output head, not the input embedding table), so
    t_resident = (14.87 GB + 12.9 GB of f16 KV) / 936 GB/s = 29.7 ms and T*(0.20) = 32.8 MiB. The
    seed's 14 MiB implies a 15 ms t_resident; either way T* is far below the 1,630 MiB spill, so
    q8_0/q8_0 is chosen, as measured (35.3 tok/s against 10.8 spilling f16)."""
    f16 = tier_kv_bytes(QWEN14B.profile, KV_TIER_LADDER[0], QWEN_CTX)
    assert round(QWEN14B_Q8_ACTIVE / 1e9, 2) == 14.87
    d = _choose(QWEN14B, QWEN_CTX, budget=f16 - 1630 * MIB, weights=QWEN14B_Q8_ACTIVE)
    assert d is not None
    assert d.binding_link == "pcie" and d.bw_eff_gbps == 6.7
    assert d.top_tier_spill_bytes == 1630 * MIB
    assert d.t_resident_s == pytest.approx((QWEN14B_Q8_ACTIVE + f16) / 936e9)
    assert d.tstar_bytes / MIB == pytest.approx(32.8, abs=0.05)
    assert d.chosen == KVTier("q8_0", "q8_0") and not d.spills and not d.floor_fallback
    assert d.resident_budget_tokens == QWEN_CTX


def test_active_weights_leave_out_embeddings_and_idle_experts() -> None:
    tensors = qwen14b_q8_tensors()
    embd = tensors["token_embd.weight"]
    assert active_weight_bytes(tensors) == sum(tensors.values()) - embd
    tied = {k: v for k, v in tensors.items() if k != "output.weight"}  # the head reads token_embd
    assert active_weight_bytes(tied) == sum(tied.values())
    moe = {"token_embd.weight": 100, "output.weight": 10, "blk.0.attn_q.weight": 7, "blk.0.ffn_gate_inp.weight": 3,
           "blk.0.ffn_up_exps.weight": 800, "blk.0.ffn_down_exps.bias": 80, "blk.0.ffn_up_shexp.weight": 5,
           "per_layer_token_embd.weight": 1000}
    assert active_weight_bytes(moe, n_expert=8, n_expert_used=2) == 10 + 7 + 3 + 200 + 20 + 5
    assert active_weight_bytes(moe) == 10 + 7 + 3 + 800 + 80 + 5  # no expert count: all read
    with pytest.raises(TieringError, match="n_expert_used=9"):
        active_weight_bytes(moe, n_expert=8, n_expert_used=9)


def test_engage_cost_fit() -> None:
    """extra = c_engage + bytes / bw: recovered exactly; no tail costs nothing; noise without a
    positive slope leaves the smallest tail's extra time as c_engage."""
    c, gbps = 0.8e-3, 6.7
    tails = [0, 1_000_000, 4_000_000, 16_000_000]
    extra = [0.0] + [c + b / (gbps * 1e9) for b in tails[1:]]
    got_c, got_bw = fit_engage_cost(tails, extra)
    assert got_c == pytest.approx(c) and got_bw == pytest.approx(gbps)
    assert fit_engage_cost([0], [5.0]) == (0.0, None)  # a zero tail never engages the path
    assert fit_engage_cost([10, 20], [3e-4, 2e-4]) == (3e-4, None)
    assert fit_engage_cost([10, 20], [-1e-4, -2e-4]) == (0.0, None)
    with pytest.raises(TieringError, match="2 tail sizes but 1"):
        fit_engage_cost([1, 2], [0.1])


def test_spill_under_tstar_keeps_f16() -> None:
    f16 = tier_kv_bytes(QWEN14B.profile, KV_TIER_LADDER[0], QWEN_CTX)
    weights = weights_for_tstar(14.0, f16, 0.20, 6.7)
    d = _choose(QWEN14B, QWEN_CTX, budget=f16 - 10 * MIB, weights=weights)
    assert d is not None and d.chosen == KVTier("f16", "f16")
    assert d.chosen_spill_bytes == 10 * MIB
    per_token = QWEN14B.profile("f16", "f16").marginal_kv_bytes_per_token()
    assert d.resident_budget_tokens == QWEN_CTX - math.ceil(10 * MIB / per_token)  # whole tokens spill
    assert d.predicted_drop < 0.20


def test_floor_that_still_spills_is_chosen() -> None:
    q4 = tier_kv_bytes(QWEN14B.profile, KV_TIER_LADDER[2], QWEN_CTX)
    weights = weights_for_tstar(14.0, 12_288 * MIB, 0.20, 6.7)
    d = _choose(QWEN14B, QWEN_CTX, budget=q4 - 500 * MIB, weights=weights)
    assert d is not None and d.chosen == KVTier("q4_0", "q4_0")
    assert d.floor_fallback and d.chosen_spill_bytes == 500 * MIB
    assert d.resident_budget_tokens < QWEN_CTX


def test_slow_link_tstar_grows_with_target_drop_like_the_reference() -> None:
    # reference: 0 -> 62 -> 157 -> 235 MiB for target_drop 0.02 -> 0.30 -> 0.70 -> 0.99.
    # Inputs fixed so that T*(0.30) = 62 MiB; the formula is linear in target_drop, and lands
    # within 10% of the two larger reference values.
    f16 = 12_288 * MIB
    weights = weights_for_tstar(62.0, f16, 0.30, 6.7)
    t_res = t_resident_s(weights, f16, VRAM_GBPS)
    got = [tstar_bytes(d, t_res, C_ENGAGE_S, 6.7) / MIB for d in (0.02, 0.30, 0.70, 0.99)]
    assert got[0] <= 0
    assert got[1] == pytest.approx(62.0)
    assert got[2] == pytest.approx(157.0, rel=0.10) and got[3] == pytest.approx(235.0, rel=0.10)
    assert got == sorted(got)


@settings(max_examples=examples(60), deadline=None)
@given(
    d1=st.floats(0.0, 2.0),
    d2=st.floats(0.0, 2.0),
    c1=st.integers(1, 1_000_000),
    c2=st.integers(1, 1_000_000),
    weights=st.floats(0.0, 1e11),
    host=st.sampled_from([SLOW_HOST, FAST_HOST, {"host_ram_gbps": 11.5, "pcie_gbps": None}]),
)
def test_tstar_monotone_in_target_drop_and_context(d1, d2, c1, c2, weights, host) -> None:
    lo_d, hi_d = sorted((d1, d2))
    lo_c, hi_c = sorted((c1, c2))
    a = _choose(QWEN14B, lo_c, weights=weights, host=host, target_drop=lo_d)
    b = _choose(QWEN14B, lo_c, weights=weights, host=host, target_drop=hi_d)
    c = _choose(QWEN14B, hi_c, weights=weights, host=host, target_drop=lo_d)
    assert a is not None and b is not None and c is not None
    assert a.tstar_bytes <= b.tstar_bytes
    assert a.tstar_bytes <= c.tstar_bytes
    assert a.tstar_bytes <= 800 * MIB


@settings(max_examples=examples(60), deadline=None)
@given(budget_mib=st.floats(0, 20_000), n_ctx=st.integers(0, 200_000), drop=st.floats(0.0, 1.0))
def test_choice_is_first_fitting_tier_else_floor(budget_mib, n_ctx, drop) -> None:
    d = _choose(QWEN14B, n_ctx, budget=budget_mib * MIB, weights=15.7e9, target_drop=drop)
    assert d is not None
    allowed = d.budget_bytes + max(d.tstar_bytes, 0.0)
    fitting = [i for i, b in enumerate(d.kv_bytes) if b <= allowed]
    assert d.chosen_index == (fitting[0] if fitting else len(d.ladder) - 1)
    assert d.floor_fallback == (not fitting)
    assert 0 <= d.resident_budget_tokens <= n_ctx
    assert (d.resident_budget_tokens == n_ctx) == (d.chosen_spill_bytes == 0)


# --- explicit types ----------------------------------------------------------------------------


def test_explicit_v_disables_the_choice() -> None:
    assert _choose(budget=0.0, explicit_type_v="q8_0") is None
    assert _choose(budget=0.0, explicit_type_k="f16", explicit_type_v="f16") is None
    with pytest.raises(TieringError, match="'q9'"):
        _choose(budget=0.0, explicit_type_v="q9")


def test_explicit_k_holds_k_and_walks_v() -> None:
    f16 = tier_kv_bytes(QWEN14B.profile, KV_TIER_LADDER[0], QWEN_CTX)
    d = _choose(budget=0.8 * f16, explicit_type_k="f16")
    assert d is not None and d.explicit_type_k == "f16"
    assert [t.name for t in d.ladder] == ["f16/f16", "f16/q8_0", "f16/q4_0"]
    assert d.chosen == KVTier("f16", "q8_0")  # 0.766 of f16
    d = _choose(budget=0.0, explicit_type_k="q8_0")
    assert d is not None and d.chosen == KVTier("q8_0", "q4_0") and d.floor_fallback


def test_head_dims_leave_out_unbuildable_tiers() -> None:
    tiny = LayerKVProfile(5, 0, 0, 640.0)  # stories260K: head_dim 8 -> only f16 can be built
    d = choose_tier(
        lambda k, v: tiny, 4096, 1000.0, weights_active_bytes=1e6, vram_gbps=10.0, host_ram_gbps=10.0,
        pcie_gbps=None, c_engage_s=1e-4, head_dims=(8, 8),
    )
    assert d is not None and [t.name for t in d.ladder] == ["f16/f16"]
    assert [t.name for t in d.unsupported] == ["q8_0/q8_0", "q4_0/q4_0"]
    assert d.chosen.name == "f16/f16" and d.floor_fallback and d.binding_link == "none"


def test_bad_inputs_are_named() -> None:
    with pytest.raises(TieringError, match="budget_bytes"):
        _choose(budget=-1.0)
    with pytest.raises(TieringError, match="vram_gbps"):
        choose_tier(QWEN14B.profile, 10, 0.0, weights_active_bytes=0, vram_gbps=0.0,
                    host_ram_gbps=1.0, pcie_gbps=None, c_engage_s=0.0)
    with pytest.raises(TieringError, match="n_ctx"):
        _choose(n_ctx=-5)


# --- audit log ---------------------------------------------------------------------------------


def test_decision_logged_at_warning_with_terms(caplog: pytest.LogCaptureFixture) -> None:
    f16 = tier_kv_bytes(QWEN14B.profile, KV_TIER_LADDER[0], QWEN_CTX)
    d = _choose(budget=f16 - 1630 * MIB, weights=weights_for_tstar(14.0, f16, 0.20, 6.7))
    assert d is not None
    with caplog.at_level(logging.WARNING, logger="kvres.tiering"):
        log_tier_decision(d)
    [rec] = [r for r in caplog.records if r.name == "kvres.tiering"]
    assert rec.levelno == logging.WARNING
    msg = rec.getMessage()
    for term in ("KV tier q8_0/q8_0", "budget=10658.0 MiB", "spill=1630.0 MiB", "T*=14.0 MiB",
                 "bw_eff=6.70 GB/s", "binding=pcie", "c_engage=0.800 ms", "t_resident="):
        assert term in msg, (term, msg)
    terms = rec.kvres_tier_decision  # type: ignore[attr-defined]
    assert terms["chosen"] == "q8_0/q8_0" and terms["top_tier_spill_bytes"] == 1630 * MIB
    assert terms["binding_link"] == "pcie"
    assert terms["position_shift"] is False
    assert "position_shift=false (quantized K q8_0: rebase=False policies only)" in msg


def test_a_quantized_k_tier_records_that_it_cannot_shift() -> None:
    """llama.cpp cannot K-shift a quantized K cache: a decision that picks one says so, so an
    operator sees that only rebase=False streaming / scored policies run on that backend."""
    assert tier_can_shift(KVTier("f16", "q4_0")) and tier_can_shift(KVTier("f32", "f16"))
    assert not tier_can_shift(KVTier("q8_0", "f16")) and not tier_can_shift(KVTier("q4_0", "q4_0"))
    f16 = tier_kv_bytes(QWEN14B.profile, KV_TIER_LADDER[0], QWEN_CTX)
    quantized = _choose(budget=f16 - 1630 * MIB, weights=QWEN14B_Q8_ACTIVE)
    kept = _choose(budget=f16, weights=QWEN14B_Q8_ACTIVE)
    v_only = _choose(budget=0.8 * f16, weights=QWEN14B_Q8_ACTIVE, explicit_type_k="f16")
    assert quantized is not None and kept is not None and v_only is not None
    assert quantized.chosen.type_k == "q8_0" and not quantized.position_shift
    assert quantized.as_dict()["position_shift"] is False and "position_shift=false" in quantized.summary()
    assert kept.chosen == KVTier("f16", "f16") and kept.position_shift
    assert kept.as_dict()["position_shift"] is True and "position_shift" not in kept.summary()
    assert v_only.chosen.type_v != "f16" and v_only.position_shift  # a quantized V still shifts
