"""The one table of KV cache precisions.

Primitives:
- ``KVType``: the precisions a backend can be configured with (f32, f16, q8_0, q4_0).
- ``KV_TYPES``: every ggml type a KV cache may be priced in, name -> ``KVTypeInfo`` (ggml type id,
  elements per quantization block, bytes per block); the configurable ones come first.
- ``CONFIGURABLE_KV_TYPES``, ``QUANTIZED_KV_TYPES``; ``kv_type_info(name)``,
  ``kv_type_row_bytes(name, n_elements)``, ``kv_type_fits_head(name, head_dim)``,
  ``flash_attn_for(type_v, flash_attn)`` (``ValueError`` for a quantized V cache without flash
  attention; otherwise what flash attention must be: on for a quantized V, else as given).

llama.cpp refuses a quantized cache whose head dimension is not a whole number of blocks, and it
needs flash attention for a quantized V cache; both rules read this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

KVType = Literal["f32", "f16", "q8_0", "q4_0"]


@dataclass(frozen=True)
class KVTypeInfo:
    ggml_id: int
    block_elements: int
    block_bytes: int

    @property
    def quantized(self) -> bool:
        return self.block_elements > 1


KV_TYPES: dict[str, KVTypeInfo] = {
    "f32": KVTypeInfo(0, 1, 4),
    "f16": KVTypeInfo(1, 1, 2),
    "q8_0": KVTypeInfo(8, 32, 34),
    "q4_0": KVTypeInfo(2, 32, 18),
    # priced only (a GGUF may report them; kvres does not configure them)
    "bf16": KVTypeInfo(30, 1, 2),
    "q4_1": KVTypeInfo(3, 32, 20),
    "q5_0": KVTypeInfo(6, 32, 22),
    "q5_1": KVTypeInfo(7, 32, 24),
}
CONFIGURABLE_KV_TYPES: tuple[str, ...] = get_args(KVType)
QUANTIZED_KV_TYPES: frozenset[str] = frozenset(n for n, info in KV_TYPES.items() if info.quantized)


def kv_type_info(name: str) -> KVTypeInfo:
    try:
        return KV_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown KV type {name!r}; known: {', '.join(KV_TYPES)}") from None


def kv_type_row_bytes(name: str, n_elements: int) -> float:
    """Bytes of one row of ``n_elements`` values stored as ``name`` (exact when blocks divide it)."""
    info = kv_type_info(name)
    if n_elements < 0:
        raise ValueError(f"n_elements must be >= 0, got {n_elements}")
    if n_elements % info.block_elements == 0:
        return float(n_elements // info.block_elements * info.block_bytes)
    return n_elements * info.block_bytes / info.block_elements


def kv_type_fits_head(name: str, head_dim: int) -> bool:
    """Whether one head's row holds whole quantization blocks of ``name``."""
    return head_dim % kv_type_info(name).block_elements == 0


def flash_attn_for(type_v: str, flash_attn: bool | None) -> bool | None:
    """``flash_attn`` as a V cache of ``type_v`` needs it: on for a quantized one (``ValueError`` if
    it was turned off), else as given."""
    if type_v not in QUANTIZED_KV_TYPES:
        return flash_attn
    if flash_attn is False:
        raise ValueError(f"type_v={type_v!r} needs flash attention; flash_attn=False was given")
    return True
