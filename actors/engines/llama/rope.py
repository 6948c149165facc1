"""Moving cached keys to other positions in numpy, as llama.cpp's K-shift would.

Primitives:
- ``KeyRotation(freq_base, n_rot, neox)``: llama.cpp's rotary embedding (NORM: adjacent pairs
  ``(x[2i], x[2i+1])``; NEOX: halves ``(x[i], x[i + n_rot/2])``), angle ``pos * freq_base **
  (-2i / n_rot)``; dimensions past ``n_rot`` are not rotated.
  ``rotate(keys, delta, axis=-2)``: keys ``(..., head_dim)`` (after RoPE, as the cache holds them)
  turned by ``delta`` positions, one delta per cell along ``axis`` (R(p + d) = R(d) R(p): no
  recompute).
- ``key_rotation(model, metadata) -> KeyRotation | None``: the rotation of a loaded
  ``engine.LlamaModel`` (its GGUF ``metadata``), or None where numpy would not reproduce llama.cpp's
  (scaled, YaRN or multi-section RoPE, no RoPE).

Why here: a batched exchange rewrites a session's whole cache in one state restore (see
``recall``); the cells that move are turned here instead of by one
``seq_add`` per range (each a pass over the cache on the next decode).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .engine import LlamaModel

DEFAULT_FREQ_BASE = 10000.0  # llama.cpp's rope_freq_base when the GGUF names none


@dataclass(frozen=True)
class KeyRotation:
    freq_base: float
    n_rot: int
    neox: bool = False

    def __post_init__(self) -> None:
        if self.n_rot <= 0 or self.n_rot % 2:
            raise ValueError(f"RoPE n_rot must be a positive even int, got {self.n_rot!r}")
        if not self.freq_base > 0:
            raise ValueError(f"RoPE freq_base must be positive, got {self.freq_base!r}")

    def rotate(self, keys: npt.NDArray[np.floating[Any]], delta: npt.ArrayLike, axis: int = -2) -> npt.NDArray[np.float32]:
        """``keys`` (last axis: head_dim) turned by ``delta`` positions, one per entry of ``axis``
        (the cell axis)."""
        k = np.asarray(keys, dtype=np.float32)
        d = np.asarray(delta, dtype=np.float64).reshape(-1)
        axis = axis % k.ndim
        if axis == k.ndim - 1 or d.shape[0] != k.shape[axis]:
            raise ValueError(f"{d.shape[0]} deltas for {k.shape[axis] if axis < k.ndim else 0} cells")
        if k.shape[-1] < self.n_rot:
            raise ValueError(f"keys end in {k.shape[-1]} dims, fewer than n_rot={self.n_rot}")
        half = self.n_rot // 2
        inv_freq = self.freq_base ** (-np.arange(0, self.n_rot, 2, dtype=np.float64) / self.n_rot)
        shape = [1] * (k.ndim - 1) + [half]
        shape[axis] = d.shape[0]
        # cells move in runs by one amount: the angles are computed once per distinct delta
        distinct, which = np.unique(d, return_inverse=True)
        angles = distinct[:, None] * inv_freq
        if not self.neox and self.n_rot == k.shape[-1]:
            # adjacent pairs are complex numbers: one multiplication by e^(i theta) turns them
            pairs = np.ascontiguousarray(k).view(np.complex64)
            turn = np.exp(1j * angles).astype(np.complex64)[which].reshape(shape)
            turned: npt.NDArray[np.float32] = (pairs * turn).view(np.float32)
            return turned
        cos = np.cos(angles).astype(np.float32)[which].reshape(shape)
        sin = np.sin(angles).astype(np.float32)[which].reshape(shape)
        out = k.copy()
        if self.neox:
            x0, x1 = k[..., :half], k[..., half : self.n_rot]
            out[..., :half] = x0 * cos - x1 * sin
            out[..., half : self.n_rot] = x0 * sin + x1 * cos
        else:
            x0, x1 = k[..., 0 : self.n_rot : 2], k[..., 1 : self.n_rot : 2]
            out[..., 0 : self.n_rot : 2] = x0 * cos - x1 * sin
            out[..., 1 : self.n_rot : 2] = x0 * sin + x1 * cos
        return out


def key_rotation(model: LlamaModel, metadata: Mapping[str, Any]) -> KeyRotation | None:
    if model.rope not in ("norm", "neox") or model.rope_freq_scale != 1.0:
        return None
    arch = metadata.get("general.architecture")
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") or metadata.get(f"{arch}.rope.dimension_sections") is not None:
        return None
    n_rot = metadata.get(f"{arch}.rope.dimension_count")
    if n_rot is None:
        return None
    base = float(metadata.get(f"{arch}.rope.freq_base") or DEFAULT_FREQ_BASE)
    return KeyRotation(base, int(n_rot), neox=model.rope == "neox")
