"""Attention score aggregation (T2): from attention probabilities to one score per block.

Primitives:
- ``key_mass(attn)``: attention each key received, summed over every leading axis
  (layers, heads, query rows). ``attn`` is ``(..., n_query, n_key)``.
- ``H2OAccumulator``: H2O heavy-hitter scores, accumulated over query rows per key position;
  ``add(attn, key_positions)``, ``drop(ranges)`` (evicted keys), ``scores``.
- ``snapkv_key_scores(attn, window, kernel, pool)``: SnapKV scores from the last ``window`` query
  rows (the observation window), summed over heads and layers, pooled so neighbours of a hit
  survive together.
- ``pool_1d(scores, kernel, mode)``: centred max/avg pooling, same length out.
- ``AttentionCapture``: attention probabilities with the token-log index of each key and query.
- ``block_scores(key_scores, key_positions, ranges, reduce)``: per-key scores summed (or meaned,
  or maxed) into per-block scores; keys with no position (``-1``) are ignored. ``span_scores``:
  the same over ``starts`` / ``ends`` columns (a ``BlockTable``'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .ranges import Range

FloatArray = npt.NDArray[np.float64]


def key_mass(attn: npt.ArrayLike) -> FloatArray:
    a = np.asarray(attn, dtype=np.float64)
    if a.ndim < 2:
        raise ValueError(f"attention must have at least 2 dims (query, key), got shape {a.shape}")
    mass: FloatArray = a.reshape(-1, a.shape[-1]).sum(axis=0)
    return mass


class H2OAccumulator:
    """Accumulates, per key position, the attention it has received so far."""

    def __init__(self) -> None:
        self._scores: FloatArray = np.zeros(0, dtype=np.float64)

    @property
    def scores(self) -> FloatArray:
        return self._scores.copy()

    def add(self, attn: npt.ArrayLike, key_positions: npt.ArrayLike | None = None) -> None:
        """Add one step's attention ``(..., n_query, n_key)``; ``key_positions`` maps key columns to
        token positions (default: column i is position i; ``-1`` marks a column to ignore)."""
        mass = key_mass(attn)
        positions = (
            np.arange(mass.shape[0]) if key_positions is None else np.asarray(key_positions, dtype=np.int64)
        )
        if positions.shape != mass.shape:
            raise ValueError(
                f"key_positions has shape {positions.shape}, attention has {mass.shape[0]} keys"
            )
        valid = positions >= 0
        if not valid.any():
            return
        top = int(positions[valid].max()) + 1
        if top > self._scores.shape[0]:
            self._scores = np.concatenate([self._scores, np.zeros(top - self._scores.shape[0])])
        np.add.at(self._scores, positions[valid], mass[valid])

    def drop(self, ranges: Sequence[Range]) -> None:
        """Forget what the keys in ``ranges`` accumulated (they were evicted)."""
        for rng in ranges:
            self._scores[rng.start : min(rng.end, self._scores.shape[0])] = 0.0


def pool_1d(scores: npt.ArrayLike, kernel: int = 7, mode: str = "max") -> FloatArray:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"pool kernel must be odd and >= 1, got {kernel}")
    if mode not in ("max", "avg"):
        raise ValueError(f"pool mode must be 'max' or 'avg', got {mode!r}")
    if kernel == 1 or s.size == 0:
        return s.copy()
    half = kernel // 2
    if mode == "max":
        out = s.copy()
        for shift in range(1, half + 1):  # the window's maximum, one neighbour distance at a time
            np.maximum(out[shift:], s[:-shift], out=out[shift:])
            np.maximum(out[:-shift], s[shift:], out=out[:-shift])
        return out
    padded = np.pad(s, half, mode="constant", constant_values=0.0)
    counts = np.convolve(np.ones_like(s), np.ones(kernel), mode="same")
    return np.asarray(np.convolve(padded, np.ones(kernel), mode="valid") / counts, dtype=np.float64)


def snapkv_key_scores(
    attn: npt.ArrayLike, window: int, kernel: int = 7, pool: str = "max"
) -> FloatArray:
    """SnapKV: attention of the last ``window`` queries, summed over heads/layers, then pooled."""
    a = np.asarray(attn, dtype=np.float64)
    if a.ndim < 2:
        raise ValueError(f"attention must have at least 2 dims (query, key), got shape {a.shape}")
    if window < 1:
        raise ValueError(f"observation window must be >= 1, got {window}")
    observed = a[..., -window:, :]
    return pool_1d(key_mass(observed), kernel, pool)


def block_scores(
    key_scores: npt.ArrayLike,
    key_positions: npt.ArrayLike,
    ranges: Sequence[Range],
    reduce: str = "sum",
) -> FloatArray:
    """Aggregate per-key scores into one score per range (ranges are in token positions)."""
    starts = np.fromiter((r.start for r in ranges), dtype=np.int64, count=len(ranges))
    ends = np.fromiter((r.end for r in ranges), dtype=np.int64, count=len(ranges))
    return span_scores(key_scores, key_positions, starts, ends, reduce)


def span_scores(
    key_scores: npt.ArrayLike,
    key_positions: npt.ArrayLike,
    starts: npt.ArrayLike,
    ends: npt.ArrayLike,
    reduce: str = "sum",
) -> FloatArray:
    """``block_scores`` for ranges given as ``starts`` / ``ends`` columns (disjoint), e.g. a
    ``BlockTable``'s: no ``Range`` object per block."""
    scores = np.asarray(key_scores, dtype=np.float64).reshape(-1)
    positions = np.asarray(key_positions, dtype=np.int64).reshape(-1)
    if scores.shape != positions.shape:
        raise ValueError(f"{scores.shape[0]} key scores but {positions.shape[0]} key positions")
    if reduce not in ("sum", "mean", "max"):
        raise ValueError(f"reduce must be 'sum', 'mean' or 'max', got {reduce!r}")
    starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    ends = np.asarray(ends, dtype=np.int64).reshape(-1)
    out = np.zeros(starts.shape[0], dtype=np.float64)
    if not starts.size:
        return out
    order = np.argsort(starts, kind="stable")
    s_sorted, e_sorted = starts[order], ends[order]
    slot = np.searchsorted(s_sorted, positions, side="right") - 1
    inside = (slot >= 0) & (positions >= 0)
    inside[inside] &= positions[inside] < e_sorted[slot[inside]]
    idx = order[slot[inside]]
    vals = scores[inside]
    if reduce == "max":
        out[:] = -np.inf
        np.maximum.at(out, idx, vals)
        out[np.isneginf(out)] = 0.0
        return out
    np.add.at(out, idx, vals)
    if reduce == "mean":
        counts = np.bincount(idx, minlength=starts.shape[0]).astype(np.float64)
        out = np.divide(out, counts, out=np.zeros_like(out), where=counts > 0)
    return out


@dataclass(frozen=True)
class AttentionCapture:
    """Captured attention: ``probs`` (n_layer, n_head, n_query, n_key), ``key_positions`` and
    ``query_positions`` (the token-log index of each key / query row)."""

    probs: npt.NDArray[np.float32]
    key_positions: npt.NDArray[np.int64]
    query_positions: npt.NDArray[np.int64]

    @property
    def n_query(self) -> int:
        return int(self.probs.shape[2])
