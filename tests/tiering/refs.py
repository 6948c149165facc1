"""Synthetic models for the tier-choice tests (reference figures of docs/policies.md, T*)."""

from __future__ import annotations

from kvres.policy.tiering import MIB, KVLayout, t_resident_s

# Qwen2.5-14B: 48 layers, 8 KV heads of 128 dims; f16 KV is 192 KiB per token, 12,288 MiB at 65,536.
QWEN14B = KVLayout(global_layers=48, windowed_layers=0, window=0, n_kv_heads=8, head_dim_k=128, head_dim_v=128)
QWEN_CTX = 65_536
VRAM_GBPS = 936.0  # RTX 3090
C_ENGAGE_S = 0.8e-3

# A small dense model (Qwen2.5-3B-like): 36 layers, 2 KV heads of 128 dims, ~2 GB of weights.
SMALL = KVLayout(global_layers=36, windowed_layers=0, window=0, n_kv_heads=2, head_dim_k=128, head_dim_v=128)
SMALL_WEIGHTS = 2.0e9

# Gemma-like SWA layout: 42 layers of which 7 global, window 512 (docs/policies.md, T0's worked check).
SWA = KVLayout(global_layers=7, windowed_layers=35, window=512, n_kv_heads=8, head_dim_k=128, head_dim_v=128)


def weights_for_tstar(tstar_mib: float, kv_bytes: float, target_drop: float, bw_eff_gbps: float) -> float:
    """W_active that makes T*(target_drop) == tstar_mib for the Qwen inputs (solves the formula)."""
    t_res = (tstar_mib * MIB / (bw_eff_gbps * 1e9) + C_ENGAGE_S) / target_drop
    weights = t_res * VRAM_GBPS * 1e9 - kv_bytes
    assert abs(t_resident_s(weights, kv_bytes, VRAM_GBPS) - t_res) < 1e-12
    return weights
