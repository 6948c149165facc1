"""The llama.cpp executor's constructor arguments, checked before anything is loaded.

Primitives:
- ``check_args(n_ctx, n_seq_max, type_k, type_v, flash_attn, n_batch, score_window, score_kernel,
  kv_layout) -> (n_ctx, flash_attn)``: ``ValueError`` naming the first bad value and its limit;
  returns ``n_ctx`` as an int and whether flash attention is forced on (a quantized V cache needs it).
- ``MIN_N_CTX``, ``MAX_SEQUENCES`` (llama.cpp's LLAMA_MAX_SEQ), ``KV_LAYOUTS``; the context they
  become is ``cache_shape``'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvres.policy.kv_types import CONFIGURABLE_KV_TYPES, flash_attn_for

from .cache_shape import RESERVED_SEQS

MIN_N_CTX = 32
MAX_SEQUENCES = 256
KV_LAYOUTS = ("unified", "split")


def check_args(n_ctx: Any, n_seq_max: int, type_k: str, type_v: str, flash_attn: bool | None, n_batch: int,
               score_window: int, score_kernel: int, kv_layout: str) -> tuple[int, bool | None]:
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, (int, np.integer)):
        raise ValueError(f"n_ctx must be an int, got {n_ctx!r}")
    if n_ctx < MIN_N_CTX:
        raise ValueError(f"n_ctx={n_ctx} is too small; it must be at least {MIN_N_CTX}")
    if n_ctx % 2:
        raise ValueError(f"n_ctx={n_ctx} is odd; llama.cpp needs an even context size")
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout={kv_layout!r} must be one of {', '.join(map(repr, KV_LAYOUTS))}")
    max_sessions = (MAX_SEQUENCES - RESERVED_SEQS) // 2
    if not 1 <= int(n_seq_max) <= max_sessions:
        raise ValueError(f"n_seq_max={n_seq_max} must be in [1, {max_sessions}]")
    for name, kv_type in (("type_k", type_k), ("type_v", type_v)):
        if kv_type not in CONFIGURABLE_KV_TYPES:
            raise ValueError(f"{name}={kv_type!r} is not a supported KV type ({', '.join(CONFIGURABLE_KV_TYPES)})")
    flash_attn = flash_attn_for(type_v, flash_attn)
    if n_batch < 1:
        raise ValueError(f"n_batch={n_batch} must be >= 1")
    if score_window < 1 or score_kernel < 1 or score_kernel % 2 == 0:
        raise ValueError(f"score_window={score_window} must be >= 1 and score_kernel={score_kernel} odd and >= 1")
    return int(n_ctx), flash_attn
