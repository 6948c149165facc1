"""Re-basing cached keys in numpy: llama.cpp NORM-style RoPE rotation by a position delta.

Primitives:
- ``RopeParams(freq_base, head_dim)``.
- ``rotate_keys(keys, delta, params) -> keys``: keys ``[..., seq, head_dim]`` (post-RoPE, as the
  states hold them) rotated as if their positions had moved by ``delta`` (a scalar or one delta per
  sequence entry). Rotation is relative: R(p + d) = R(d) R(p), so no recompute is needed.
- ``turn_keys(keys, delta, params) -> float32 keys``: the same for one delta per entry of the
  ``seq`` axis, in float32 arithmetic (angles in float64): what a recall moving ~1,000 entries
  at once uses.

The pairing is adjacent (x[2i], x[2i+1]) with angle ``pos * freq_base ** (-2i / head_dim)``, the
same as the graph in ``graph.py``; the NEOX half-split would rotate the wrong coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class RopeParams:
    freq_base: float
    head_dim: int

    def __post_init__(self) -> None:
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"RoPE head_dim must be a positive even int, got {self.head_dim!r}")
        if not self.freq_base > 0:
            raise ValueError(f"RoPE freq_base must be positive, got {self.freq_base!r}")


def rotate_keys(
    keys: npt.NDArray[np.floating], delta: int | npt.ArrayLike, params: RopeParams
) -> npt.NDArray[np.floating]:
    k = np.asarray(keys)
    if k.shape[-1] != params.head_dim:
        raise ValueError(f"keys end in {k.shape[-1]} dims, RoPE head_dim is {params.head_dim}")
    d = np.asarray(delta, dtype=np.float64)
    if d.ndim == 0 and float(d) == 0.0:
        return k.copy()
    half = params.head_dim // 2
    inv_freq = 1.0 / (params.freq_base ** (np.arange(0, params.head_dim, 2, dtype=np.float64)
                                           / params.head_dim))
    theta = d[..., None] * inv_freq if d.ndim else float(d) * inv_freq  # (seq, half) or (half,)
    cos, sin = np.cos(theta), np.sin(theta)
    pairs = k.astype(np.float64).reshape(*k.shape[:-1], half, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.reshape(k.shape).astype(k.dtype)


def turn_keys(keys: npt.NDArray[np.floating], delta: npt.ArrayLike, params: RopeParams) -> npt.NDArray[np.float32]:
    k = np.asarray(keys, dtype=np.float32)
    d = np.asarray(delta, dtype=np.float64).reshape(-1)
    if k.shape[-1] != params.head_dim or d.shape[0] != k.shape[-2]:
        raise ValueError(f"keys {k.shape} need head_dim {params.head_dim} and one delta per entry ({d.shape[0]})")
    inv_freq = params.freq_base ** (-np.arange(0, params.head_dim, 2, dtype=np.float64) / params.head_dim)
    # entries move in runs by one amount: the turn is computed once per distinct delta
    distinct, which = np.unique(d, return_inverse=True)
    turn = np.exp(1j * (distinct[:, None] * inv_freq)).astype(np.complex64)[which]  # (entries, half)
    # adjacent pairs are complex numbers: one multiplication turns them
    turned: npt.NDArray[np.float32] = (np.ascontiguousarray(k).view(np.complex64) * turn).view(np.float32)
    return turned
