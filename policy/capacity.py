"""SWA-aware KV capacity (T0).

Primitives:
- ``kv_type_row_bytes(kv_type, n_elements)``: bytes of one row of ``n_elements`` in a ggml KV type.
- ``LayerKVProfile(global_layers, windowed_layers, window, per_layer_kv_bytes)``:
  ``kv_bytes_for_context(ctx)``, ``marginal_kv_bytes_per_token()``, ``dense_kv_bytes_for_context(ctx)``.
- ``resolve_context_for_budget(profile, budget_bytes, max_context)``: the largest context whose KV
  fits a byte budget (windowed floor + marginal growth, not budget / flat bytes per token).
- ``profile_from_gguf(path, type_k, type_v)``: the profile read from GGUF metadata.

Windowed (sliding-window attention) layers keep at most ``window`` tokens of KV, so only global
layers grow past the window. ``window == 0`` means dense: every layer grows with the context.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

# ggml block geometry: (elements per block, bytes per block)
_KV_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q5_1": (32, 24),
    "q5_0": (32, 22),
    "q4_1": (32, 20),
    "q4_0": (32, 18),
}
KV_TYPES: tuple[str, ...] = tuple(_KV_TYPES)


def kv_type_row_bytes(kv_type: str, n_elements: int) -> float:
    """Bytes of one row of ``n_elements`` values stored as ``kv_type`` (exact when it divides)."""
    if kv_type not in _KV_TYPES:
        raise ValueError(f"unknown KV type {kv_type!r}; known: {', '.join(KV_TYPES)}")
    if n_elements < 0:
        raise ValueError(f"n_elements must be >= 0, got {n_elements}")
    per_block, block_bytes = _KV_TYPES[kv_type]
    if n_elements % per_block == 0:
        return float(n_elements // per_block * block_bytes)
    return n_elements * block_bytes / per_block


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


def _field_value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    values = [field.parts[i] for i in field.data]
    decoded = []
    for v in values:
        if v.dtype.kind == "u" and v.dtype.itemsize == 1 and field.types and field.types[-1].name == "STRING":
            decoded.append(bytes(v).decode("utf-8"))
        else:
            decoded.append(v.tolist()[0] if len(v) == 1 else v.tolist())
    if len(decoded) == 1 and not (field.types and field.types[0].name == "ARRAY"):
        return decoded[0]
    return decoded


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


def read_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All key/value metadata of a GGUF file (strings decoded, arrays as lists)."""
    from gguf import GGUFReader  # lazy: reading a file is not needed to plan

    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {os.fspath(path)!r}")
    try:
        reader = GGUFReader(os.fspath(path))
    except Exception as exc:  # gguf raises ValueError/struct errors for foreign files
        raise ValueError(f"not a GGUF file: {os.fspath(path)!r} ({exc})") from exc
    return {key: _field_value(reader, key) for key in reader.fields if not key.startswith("tokenizer.")}


def profile_from_gguf(
    path: str | os.PathLike[str], type_k: str = "f16", type_v: str = "f16"
) -> LayerKVProfile:
    return profile_from_metadata(read_gguf_metadata(path), type_k, type_v)
