"""Synthetic models for the tier-choice tests (reference figures of docs/policies.md, T*)."""

from __future__ import annotations

from kvres.policy.kv_layout import ModelKVLayout
from kvres.policy.tiering import MIB, active_weight_bytes, t_resident_s

# Qwen2.5-14B: 48 layers, 8 KV heads of 128 dims; f16 KV is 192 KiB per token, 12,288 MiB at 65,536.
QWEN14B = ModelKVLayout.uniform(global_layers=48, windowed_layers=0, window=0, n_kv_heads=8, head_dim_k=128,
                                head_dim_v=128)
QWEN_CTX = 65_536
VRAM_GBPS = 936.0  # RTX 3090
C_ENGAGE_S = 0.8e-3

# A small dense model (Qwen2.5-3B-like): 36 layers, 2 KV heads of 128 dims, ~2 GB of weights.
SMALL = ModelKVLayout.uniform(global_layers=36, windowed_layers=0, window=0, n_kv_heads=2, head_dim_k=128,
                              head_dim_v=128)
SMALL_WEIGHTS = 2.0e9

# Gemma-like SWA layout: 42 layers of which 7 global, window 512 (docs/policies.md, T0's worked check).
SWA = ModelKVLayout.uniform(global_layers=7, windowed_layers=35, window=512, n_kv_heads=8, head_dim_k=128,
                            head_dim_v=128)


def qwen14b_q8_tensors() -> dict[str, int]:
    """Tensor sizes of Qwen2.5-14B stored as Q8_0 (matrices 34 bytes per 32 weights, norms and biases
    f32): n_embd 5120, 48 blocks, 40 query / 8 KV heads of 128, n_ff 13,824, vocab 152,064, untied."""
    q8 = 34 / 32
    embd, ff, kv, vocab = 5120, 13_824, 8 * 128, 152_064
    tensors = {"token_embd.weight": int(vocab * embd * q8), "output.weight": int(vocab * embd * q8),
               "output_norm.weight": 4 * embd}
    for i in range(48):
        for name, n in (("attn_q.weight", embd * embd), ("attn_k.weight", embd * kv), ("attn_v.weight", embd * kv),
                        ("attn_output.weight", embd * embd), ("ffn_gate.weight", embd * ff),
                        ("ffn_up.weight", embd * ff), ("ffn_down.weight", ff * embd)):
            tensors[f"blk.{i}.{name}"] = int(n * q8)
        for name, n in (("attn_q.bias", embd), ("attn_k.bias", kv), ("attn_v.bias", kv),
                        ("attn_norm.weight", embd), ("ffn_norm.weight", embd)):
            tensors[f"blk.{i}.{name}"] = 4 * n
    return tensors


QWEN14B_Q8_ACTIVE = active_weight_bytes(qwen14b_q8_tensors())  # ~14.75 GB: no input embedding table


def weights_for_tstar(tstar_mib: float, kv_bytes: float, target_drop: float, bw_eff_gbps: float) -> float:
    """W_active that makes T*(target_drop) == tstar_mib for the Qwen inputs (solves the formula; used
    only where a test is about the formula's shape, not about a real model)."""
    t_res = (tstar_mib * MIB / (bw_eff_gbps * 1e9) + C_ENGAGE_S) / target_drop
    weights = t_res * VRAM_GBPS * 1e9 - kv_bytes
    assert abs(t_resident_s(weights, kv_bytes, VRAM_GBPS) - t_res) < 1e-12
    return weights
