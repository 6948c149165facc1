"""SWA-aware KV capacity (T0): what a context costs, and the largest context a budget holds.

Primitives:
- ``LayerKVProfile(global_layers, windowed_layers, window, per_layer_kv_bytes,
  windowed_layer_kv_bytes=None, windowed_cells=None)``: ``kv_bytes_for_context(ctx)``,
  ``marginal_kv_bytes_per_token()``, ``dense_kv_bytes_for_context(ctx)``, ``window_cap``,
  ``for_sessions(n)``.
- ``resolve_context_for_budget(profile, budget_bytes, max_context)``: the largest context whose KV
  fits a byte budget (windowed floor + marginal growth, not budget / flat bytes per token).
- ``MemoryBudget(free_bytes, used_bytes=0, reserve_bytes=0, fraction=1.0, target_bytes=None)``:
  ``bytes``, the KV memory a backend may use: ``min(target, fraction * (free - used - reserve))``.
- ``CapacityError`` (a ValueError): inputs that make no sense, named with their limit.

The profile of a model's metadata is ``kvres.policy.kv_layout``'s (``profile_from_metadata``).

Windowed (sliding-window attention) layers keep at most ``window_cap`` cells of KV (the window, or
what llama.cpp really allocates for it: the window of every sequence plus a micro-batch, padded),
so only global layers grow past it. ``window == 0`` means dense: every layer grows with the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .errors import KvresError


class CapacityError(KvresError, ValueError):
    """A KV size, budget or layout that makes no sense; the message names the value."""


@dataclass(frozen=True)
class LayerKVProfile:
    """KV bytes of a model: how many layers grow with the context and how fast.

    ``per_layer_kv_bytes`` is the K + V bytes of one token in one global layer (the mean over
    global layers when they differ); ``windowed_layer_kv_bytes`` the same for a windowed layer
    (None: the same as a global one); ``windowed_cells`` the most cells a windowed layer keeps
    (None: ``window``)."""

    global_layers: int
    windowed_layers: int
    window: int
    per_layer_kv_bytes: float
    windowed_layer_kv_bytes: float | None = None
    windowed_cells: int | None = None

    def __post_init__(self) -> None:
        for name in ("global_layers", "windowed_layers", "window"):
            if getattr(self, name) < 0:
                raise CapacityError(f"LayerKVProfile.{name} must be >= 0, got {getattr(self, name)}")
        if not self.per_layer_kv_bytes > 0:
            raise CapacityError(
                f"LayerKVProfile.per_layer_kv_bytes must be > 0, got {self.per_layer_kv_bytes}"
            )
        if self.windowed_layer_kv_bytes is not None and not self.windowed_layer_kv_bytes > 0:
            raise CapacityError(
                f"LayerKVProfile.windowed_layer_kv_bytes must be > 0, got {self.windowed_layer_kv_bytes}"
            )
        if self.windowed_cells is not None and self.windowed_cells < self.window:
            raise CapacityError(
                f"LayerKVProfile.windowed_cells={self.windowed_cells} is below the window {self.window}"
            )
        if self.global_layers + self.windowed_layers == 0:
            raise CapacityError("LayerKVProfile needs at least one layer")

    @property
    def layers(self) -> int:
        return self.global_layers + self.windowed_layers

    @property
    def dense(self) -> bool:
        return self.window == 0 or self.windowed_layers == 0

    @property
    def window_cap(self) -> int:
        """Most cells a windowed layer keeps."""
        return self.window if self.windowed_cells is None else self.windowed_cells

    @property
    def global_bytes_per_token(self) -> float:
        return self.global_layers * self.per_layer_kv_bytes

    @property
    def windowed_bytes_per_token(self) -> float:
        per = self.per_layer_kv_bytes if self.windowed_layer_kv_bytes is None else self.windowed_layer_kv_bytes
        return self.windowed_layers * per

    def dense_kv_bytes_for_context(self, ctx: int) -> float:
        """What the cache would cost if every layer were billed for every token."""
        _check_ctx(ctx)
        return (self.global_bytes_per_token + self.windowed_bytes_per_token) * ctx

    def kv_bytes_for_context(self, ctx: int) -> float:
        _check_ctx(ctx)
        if self.dense:
            return self.dense_kv_bytes_for_context(ctx)
        return self.global_bytes_per_token * ctx + self.windowed_bytes_per_token * min(ctx, self.window_cap)

    def marginal_kv_bytes_per_token(self) -> float:
        """Growth cost of one more token past the window cap: global layers only."""
        if self.dense:
            return self.global_bytes_per_token + self.windowed_bytes_per_token
        return self.global_bytes_per_token

    def for_sessions(self, n_sessions: int) -> LayerKVProfile:
        """The bill of ``n_sessions`` sessions together, each keeping its own window: windowed
        layers then hold up to ``n_sessions`` windows (an upper bound for any split of the tokens)."""
        if n_sessions < 1:
            raise CapacityError(f"n_sessions must be >= 1, got {n_sessions}")
        if self.dense or n_sessions == 1:
            return self
        return replace(self, windowed_cells=max(self.window_cap, self.window * n_sessions))


def _check_ctx(ctx: int) -> None:
    if ctx < 0:
        raise CapacityError(f"context length must be >= 0, got {ctx}")


def resolve_context_for_budget(
    profile: LayerKVProfile, budget_bytes: float, max_context: int | None = None
) -> int:
    """The largest context length whose KV bytes fit ``budget_bytes`` (capped at ``max_context``)."""
    if not budget_bytes >= 0:
        raise CapacityError(f"budget_bytes must be >= 0, got {budget_bytes}")
    if max_context is not None and max_context < 0:
        raise CapacityError(f"max_context must be >= 0, got {max_context}")
    all_layers = profile.global_bytes_per_token + profile.windowed_bytes_per_token
    if profile.dense:
        ctx = int(budget_bytes // all_layers)
    else:
        floor = all_layers * profile.window_cap  # every layer full up to the window cap
        if budget_bytes < floor:
            ctx = int(budget_bytes // all_layers)
        elif profile.global_layers == 0:
            if max_context is None:
                raise CapacityError(
                    "every layer is windowed, so any context fits; pass max_context to bound it"
                )
            return max_context
        else:
            growth = profile.marginal_kv_bytes_per_token()
            ctx = profile.window_cap + int((budget_bytes - floor) // growth)
    if max_context is not None:
        ctx = min(ctx, max_context)
    # Float floor division can land one off at exact boundaries; settle on the exact answer.
    while ctx > 0 and profile.kv_bytes_for_context(ctx) > budget_bytes:
        ctx -= 1
    while (max_context is None or ctx < max_context) and profile.kv_bytes_for_context(ctx + 1) <= budget_bytes:
        ctx += 1
    return ctx


@dataclass(frozen=True)
class MemoryBudget:
    """KV memory a backend may use: ``min(target, fraction * (free - used - reserve))``.

    ``free_bytes`` is what the device (or host) reports free, ``used_bytes`` what the backend will
    still take from it besides its KV (model weights not loaded yet), ``reserve_bytes`` what is kept
    for compute buffers and everything else; ``target_bytes`` caps the result."""

    free_bytes: float | None
    used_bytes: float = 0.0
    reserve_bytes: float = 0.0
    fraction: float = 1.0
    target_bytes: float | None = None

    def __post_init__(self) -> None:
        for name in ("free_bytes", "used_bytes", "reserve_bytes", "target_bytes"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise CapacityError(f"MemoryBudget.{name} must be a finite number >= 0, got {value!r}")
        if not (0 < self.fraction <= 1):
            raise CapacityError(f"MemoryBudget.fraction must be in (0, 1], got {self.fraction!r}")
        if self.free_bytes is None and self.target_bytes is None:
            raise CapacityError("MemoryBudget needs free_bytes or target_bytes")

    @property
    def available_bytes(self) -> float | None:
        if self.free_bytes is None:
            return None
        return self.fraction * max(0.0, self.free_bytes - self.used_bytes - self.reserve_bytes)

    @property
    def bytes(self) -> float:
        available = self.available_bytes
        if available is None:
            assert self.target_bytes is not None
            return self.target_bytes
        return available if self.target_bytes is None else min(self.target_bytes, available)

