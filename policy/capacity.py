"""SWA-aware KV capacity (T0).

Primitives:
- ``LayerKVProfile(global_layers, windowed_layers, window, per_layer_kv_bytes)``:
  ``kv_bytes_for_context(ctx)``, ``marginal_kv_bytes_per_token()``, ``dense_kv_bytes_for_context(ctx)``.
- ``resolve_context_for_budget(profile, budget_bytes, max_context)``: the largest context whose KV
  fits a byte budget (windowed floor + marginal growth, not budget / flat bytes per token).
- ``profile_from_metadata(meta, type_k, type_v)``: the profile from GGUF-style metadata (reading
  the file is ``kvres.actors.model_files``' job; this layer does no I/O).

Windowed (sliding-window attention) layers keep at most ``window`` tokens of KV, so only global
layers grow past the window. ``window == 0`` means dense: every layer grows with the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .kv_types import kv_type_row_bytes


@dataclass(frozen=True)
class LayerKVProfile:
    """KV geometry of a model: how many layers grow with the context and how fast."""

    global_layers: int
    windowed_layers: int
    window: int
    per_layer_kv_bytes: float  # K + V bytes for one token in one layer

    def __post_init__(self) -> None:
        for name in ("global_layers", "windowed_layers", "window"):
            if getattr(self, name) < 0:
                raise ValueError(f"LayerKVProfile.{name} must be >= 0, got {getattr(self, name)}")
        if self.per_layer_kv_bytes <= 0:
            raise ValueError(
                f"LayerKVProfile.per_layer_kv_bytes must be > 0, got {self.per_layer_kv_bytes}"
            )
        if self.global_layers + self.windowed_layers == 0:
            raise ValueError("LayerKVProfile needs at least one layer")

    @property
    def layers(self) -> int:
        return self.global_layers + self.windowed_layers

    @property
    def dense(self) -> bool:
        return self.window == 0 or self.windowed_layers == 0

    def dense_kv_bytes_for_context(self, ctx: int) -> float:
        """What the cache would cost if every layer were billed for every token."""
        _check_ctx(ctx)
        return self.layers * self.per_layer_kv_bytes * ctx

    def kv_bytes_for_context(self, ctx: int) -> float:
        _check_ctx(ctx)
        if self.dense:
            return self.dense_kv_bytes_for_context(ctx)
        return (
            self.global_layers * self.per_layer_kv_bytes * ctx
            + self.windowed_layers * self.per_layer_kv_bytes * min(ctx, self.window)
        )

    def marginal_kv_bytes_per_token(self) -> float:
        """Growth cost of one more token past the window: global layers only."""
        if self.dense:
            return self.layers * self.per_layer_kv_bytes
        return self.global_layers * self.per_layer_kv_bytes


def _check_ctx(ctx: int) -> None:
    if ctx < 0:
        raise ValueError(f"context length must be >= 0, got {ctx}")


def resolve_context_for_budget(
    profile: LayerKVProfile, budget_bytes: float, max_context: int | None = None
) -> int:
    """The largest context length whose KV bytes fit ``budget_bytes`` (capped at ``max_context``)."""
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    if max_context is not None and max_context < 0:
        raise ValueError(f"max_context must be >= 0, got {max_context}")
    all_layers = profile.layers * profile.per_layer_kv_bytes
    if profile.dense:
        ctx = int(budget_bytes // all_layers)
    else:
        floor = all_layers * profile.window  # every layer full up to the window
        if budget_bytes < floor:
            ctx = int(budget_bytes // all_layers)
        elif profile.global_layers == 0:
            if max_context is None:
                raise ValueError(
                    "every layer is windowed, so any context fits; pass max_context to bound it"
                )
            return max_context
        else:
            growth = profile.marginal_kv_bytes_per_token()
            ctx = profile.window + int((budget_bytes - floor) // growth)
    # Float floor division can land one off at exact boundaries; settle on the exact answer.
    while ctx > 0 and profile.kv_bytes_for_context(ctx) > budget_bytes:
        ctx -= 1
    while profile.kv_bytes_for_context(ctx + 1) <= budget_bytes and (
        max_context is None or ctx < max_context
    ):
        ctx += 1
    return ctx if max_context is None else min(ctx, max_context)


def _windowed_layer_count(block_count: int, pattern: Any) -> int:
    """Windowed layers from ``sliding_window_pattern``: a per-layer bool array (True = windowed)
    or, in older files, a scalar stride n where every n-th layer is global."""
    if isinstance(pattern, list):
        if len(pattern) != block_count:
            raise ValueError(
                f"sliding_window_pattern has {len(pattern)} entries, block_count is {block_count}"
            )
        return sum(1 for p in pattern if bool(p))
    stride = int(pattern)
    if stride <= 0:
        return block_count
    return block_count - math.ceil(block_count / stride)


def profile_from_metadata(
    meta: dict[str, Any], type_k: str = "f16", type_v: str = "f16"
) -> LayerKVProfile:
    """Build a profile from GGUF-style metadata (``<arch>.*`` keys, arch in general.architecture)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("metadata lacks general.architecture")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"metadata lacks {arch}.{key}")
        return value

    blocks = int(get("block_count"))
    n_embd = int(get("embedding_length"))
    n_head = get("attention.head_count")
    n_head = int(max(n_head) if isinstance(n_head, list) else n_head)
    n_head_kv = get("attention.head_count_kv", n_head)
    n_head_kv = int(max(n_head_kv) if isinstance(n_head_kv, list) else n_head_kv)
    head_k = int(get("attention.key_length", n_embd // n_head))
    head_v = int(get("attention.value_length", n_embd // n_head))
    per_layer = kv_type_row_bytes(type_k, n_head_kv * head_k) + kv_type_row_bytes(
        type_v, n_head_kv * head_v
    )
    window = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0)
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if window == 0:
        return LayerKVProfile(blocks, 0, 0, per_layer)
    windowed = blocks if pattern is None else _windowed_layer_count(blocks, pattern)
    return LayerKVProfile(blocks - windowed, windowed, window, per_layer)
