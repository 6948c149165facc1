"""Automatic KV tier choice (T*): quantize the KV cache, or keep a higher precision and spill its tail.

Primitives:
- ``KVTier(type_k, type_v)``; ``KV_TIER_LADDER`` (f16/f16, q8_0/q8_0, q4_0/q4_0) and ``V_LADDER``
  (f16, q8_0, q4_0 under a held K); ``tier_ladder(explicit_type_k)``;
  ``tier_supported(tier, head_dim_k, head_dim_v)``: a quantized type's block must divide the head
  dimension (llama.cpp refuses the context otherwise, e.g. q8_0 on stories260K's head_dim 8);
  ``tier_can_shift(tier)``: whether cells of that cache can move positions (not with a quantized
  K: llama.cpp 0.3.36 cannot apply the K-shift to it), i.e. whether re-basing policies can run.
- ``ProfileFactory``: ``(type_k, type_v) -> LayerKVProfile``; ``layout_profile_factory(layout, cells)``
  (a ``kvres.policy.kv_layout.ModelKVLayout`` priced per tier) and ``metadata_profile_factory(meta)``
  build one; ``tier_kv_bytes(factory, tier, n_ctx)``; ``head_dims_from_metadata(meta)``.
- ``active_weight_bytes(tensor_bytes, n_expert, n_expert_used)``: ``W_active``, the weights one
  decode step reads (token embeddings only as the output head when tied; MoE experts by the share
  of experts a token uses).
- ``fit_engage_cost(tail_bytes, extra_step_s) -> (c_engage_s, gbps)``: ``extra = c_engage +
  bytes / bw`` over measured tails; no tail, no cost.
- ``effective_bandwidth(host_ram_gbps, pcie_gbps) -> (bw_eff_gbps, binding_link)``: the slower of
  the RAM and PCIe legs, and which binds ("pcie", "host_ram", or "none" when there is no device link).
- ``t_resident_s``, ``drop_fraction`` (the drop model), ``tstar_bytes``, ``fits``: the formulas of
  docs/policies.md, T*, in SI units (GB/s = 1e9 bytes/s, seconds, bytes).
- ``choose_tier(...) -> TierDecision | None``: first tier with ``kv_bytes(i) <= budget + T*``, floor
  fallback, explicit-type handling; ``TierDecision`` holds every term (``summary()`` for the log),
  and ``position_shift``: whether the chosen cache can shift positions.
- ``TierConfig``: target drop and spill cap (read from the environment by ``kvres.actors.sizing.tier_env``).
- ``TieringError`` (a ValueError).

The formulas::

    drop(tail) = (c_engage + tail_bytes / bw_eff) / t_resident          (0 when tail == 0)
    T*_bytes   = min((target_drop * t_resident - c_engage) * bw_eff, max_spill_bytes)
    t_resident = (W_active + KV_resident_bytes) / vram_bw
    bw_eff     = min(pcie_bw, host_ram_bw)

``KV_resident_bytes`` is the KV of the whole context at the ladder's top tier (the cache that would
be resident if it fitted): the time the drop is measured against. A T* <= 0 allows no spill at all.
Pure: numpy/stdlib only, no Ray, no engines, no environment, no logging.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from .capacity import LayerKVProfile, resolve_context_for_budget
from .errors import KvresError
from .kv_layout import CacheCells, ModelKVLayout, layout_from_metadata
from .kv_types import KV_TYPES, QUANTIZED_KV_TYPES, kv_type_fits_head

MIB = 1024 * 1024
GB = 1e9

DEFAULT_TARGET_DROP = 0.20
DEFAULT_MAX_SPILL_MIB = 800.0

Link = Literal["pcie", "host_ram", "none"]


class TieringError(KvresError, ValueError):
    """Inputs of the tier choice that make no sense (negative sizes, unknown KV types, ...)."""


# ---------------------------------------------------------------------------------------------
# The ladder


@dataclass(frozen=True)
class KVTier:
    type_k: str
    type_v: str

    def __post_init__(self) -> None:
        for name in ("type_k", "type_v"):
            value = getattr(self, name)
            if value not in KV_TYPES:
                raise TieringError(f"KVTier.{name}={value!r} is not a KV type; known: {', '.join(KV_TYPES)}")

    @property
    def name(self) -> str:
        return f"{self.type_k}/{self.type_v}"


KV_TIER_LADDER: tuple[KVTier, ...] = (
    KVTier("f16", "f16"),
    KVTier("q8_0", "q8_0"),
    KVTier("q4_0", "q4_0"),
)
V_LADDER: tuple[str, ...] = ("f16", "q8_0", "q4_0")
DEFAULT_TIER = KV_TIER_LADDER[0]


def tier_supported(tier: KVTier, head_dim_k: int, head_dim_v: int) -> bool:
    """Whether a KV cache of ``tier`` can be built for these head dimensions."""
    return kv_type_fits_head(tier.type_k, head_dim_k) and kv_type_fits_head(tier.type_v, head_dim_v)


def tier_can_shift(tier: KVTier) -> bool:
    """Whether a cache of ``tier`` can move cells to other positions (re-basing, admitting after a
    gap). Not with a quantized K cache: llama.cpp 0.3.36 crashes applying the RoPE K-shift to it, so
    only policies that keep position gaps (``rebase=False``) run there."""
    return tier.type_k not in QUANTIZED_KV_TYPES


def head_dims_from_metadata(meta: Mapping[str, Any]) -> tuple[int, int]:
    """(head_dim_k, head_dim_v) every layer's heads share (see ``ModelKVLayout.head_dims``)."""
    return layout_from_metadata(meta).head_dims


def tier_ladder(explicit_type_k: str | None = None) -> tuple[KVTier, ...]:
    """The tiers walked, least to most compression: the KV ladder, or V_LADDER under a held K."""
    if explicit_type_k is None:
        return KV_TIER_LADDER
    if explicit_type_k not in KV_TYPES:
        raise TieringError(f"explicit type_k={explicit_type_k!r} is not a KV type; known: {', '.join(KV_TYPES)}")
    return tuple(KVTier(explicit_type_k, v) for v in V_LADDER)


# ---------------------------------------------------------------------------------------------
# KV bytes per tier

ProfileFactory = Callable[[str, str], LayerKVProfile]


def layout_profile_factory(layout: ModelKVLayout, cells: CacheCells | None = None) -> ProfileFactory:
    """Price ``layout`` at any tier (``ModelKVLayout.profile``; ``cells`` as llama.cpp allocates)."""

    def factory(type_k: str, type_v: str) -> LayerKVProfile:
        return layout.profile(type_k, type_v, cells)

    return factory


def metadata_profile_factory(meta: Mapping[str, Any], cells: CacheCells | None = None) -> ProfileFactory:
    """A factory over the layout GGUF-style metadata describes (``kv_layout.layout_from_metadata``)."""
    return layout_profile_factory(layout_from_metadata(meta), cells)


def tier_kv_bytes(profile_for: ProfileFactory, tier: KVTier, n_ctx: int) -> float:
    """KV bytes of ``n_ctx`` tokens at ``tier`` (windowed layers capped at their window)."""
    return profile_for(tier.type_k, tier.type_v).kv_bytes_for_context(n_ctx)


# ---------------------------------------------------------------------------------------------
# The formulas


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise TieringError(f"{name} must be a finite number > 0, got {value!r}")


def _check_non_negative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise TieringError(f"{name} must be a finite number >= 0, got {value!r}")


def effective_bandwidth(host_ram_gbps: float, pcie_gbps: float | None) -> tuple[float, Link]:
    """RAM -> device bandwidth: ``min(pcie, host_ram)`` and the binding link; no link -> host RAM, "none"."""
    _check_positive("host_ram_gbps", host_ram_gbps)
    if pcie_gbps is None:
        return host_ram_gbps, "none"
    _check_positive("pcie_gbps", pcie_gbps)
    if pcie_gbps <= host_ram_gbps:
        return pcie_gbps, "pcie"
    return host_ram_gbps, "host_ram"


def t_resident_s(weights_active_bytes: float, kv_resident_bytes: float, vram_gbps: float) -> float:
    """Per-token decode time with the cache resident: every active weight and KV byte read once."""
    _check_non_negative("weights_active_bytes", weights_active_bytes)
    _check_non_negative("kv_resident_bytes", kv_resident_bytes)
    _check_positive("vram_gbps", vram_gbps)
    return (weights_active_bytes + kv_resident_bytes) / (vram_gbps * GB)


def drop_fraction(tail_bytes: float, c_engage_s: float, bw_eff_gbps: float, t_res_s: float) -> float:
    """Relative per-token slowdown of spilling ``tail_bytes``: (c_engage + tail/bw_eff) / t_resident."""
    _check_non_negative("tail_bytes", tail_bytes)
    _check_non_negative("c_engage_s", c_engage_s)
    _check_positive("bw_eff_gbps", bw_eff_gbps)
    _check_positive("t_resident_s", t_res_s)
    if tail_bytes == 0:
        return 0.0  # nothing spilled: the spill path is never engaged
    return (c_engage_s + tail_bytes / (bw_eff_gbps * GB)) / t_res_s


def tstar_bytes(
    target_drop: float,
    t_res_s: float,
    c_engage_s: float,
    bw_eff_gbps: float,
    max_spill_bytes: float = DEFAULT_MAX_SPILL_MIB * MIB,
) -> float:
    """The largest tail whose drop stays at ``target_drop``, capped by the spill cliff; may be <= 0."""
    _check_non_negative("target_drop", target_drop)
    _check_positive("t_resident_s", t_res_s)
    _check_non_negative("c_engage_s", c_engage_s)
    _check_positive("bw_eff_gbps", bw_eff_gbps)
    _check_non_negative("max_spill_bytes", max_spill_bytes)
    return min((target_drop * t_res_s - c_engage_s) * bw_eff_gbps * GB, max_spill_bytes)


def fits(kv_bytes: float, budget_bytes: float, tstar: float) -> bool:
    """The fit rule ``kv_bytes <= budget + T*``; a T* <= 0 allows no spill (it never shrinks the budget)."""
    return kv_bytes <= budget_bytes + max(tstar, 0.0)


_EMBEDDINGS = ("token_embd.", "per_layer_token_embd.")


def active_weight_bytes(tensor_bytes: Mapping[str, int], n_expert: int = 0, n_expert_used: int = 0) -> float:
    """Weights a decode step reads: every tensor except the embedding tables (one row is looked up,
    unless the output head is tied to ``token_embd``, which the head then reads whole) and, of the
    routed expert tensors (``*_exps``), only the share ``n_expert_used / n_expert``."""
    if n_expert < 0 or n_expert_used < 0 or n_expert_used > max(n_expert, 0):
        raise TieringError(f"n_expert_used={n_expert_used} must be within 0..n_expert={n_expert}")
    share = n_expert_used / n_expert if n_expert else 1.0
    tied = "output.weight" not in tensor_bytes
    total = 0.0
    for name, size in tensor_bytes.items():
        if size < 0:
            raise TieringError(f"tensor {name!r} has a negative size {size}")
        if name.startswith(_EMBEDDINGS):
            total += size if tied and name == "token_embd.weight" else 0
        elif "_exps." in name:
            total += size * share
        else:
            total += size
    return total


def fit_engage_cost(tail_bytes: Sequence[float], extra_step_s: Sequence[float]) -> tuple[float, float | None]:
    """(c_engage seconds, GB/s) of ``extra = c_engage + tail_bytes / bw`` over tails > 0.

    A zero tail never engages the spill path, so it costs nothing and is left out of the fit. The
    intercept is floored at 0; without a positive slope (noise swamped the size dependence) the
    smallest tail's extra time is all c_engage and no bandwidth is returned."""
    if len(tail_bytes) != len(extra_step_s):
        raise TieringError(f"{len(tail_bytes)} tail sizes but {len(extra_step_s)} step times")
    points = [(float(b), float(e)) for b, e in zip(tail_bytes, extra_step_s, strict=True) if b > 0]
    if not points:
        return 0.0, None
    if any(not math.isfinite(e) for _, e in points):
        raise TieringError(f"step times must be finite, got {list(extra_step_s)}")
    smallest = min(points)[1]
    if len({b for b, _ in points}) < 2:
        return max(0.0, smallest), None
    xs = np.array([b for b, _ in points])
    ys = np.array([e for _, e in points])
    slope, intercept = (float(v) for v in np.polyfit(xs, ys, 1))
    if slope <= 0:
        return max(0.0, smallest), None
    return max(0.0, intercept), 1.0 / slope / GB


# ---------------------------------------------------------------------------------------------
# The decision


@dataclass(frozen=True)
class TierDecision:
    """Every term of one tier choice, for the log and for audits (sizes in bytes, times in s)."""

    n_ctx: int
    budget_bytes: float
    ladder: tuple[KVTier, ...]
    kv_bytes: tuple[float, ...]  # per ladder tier, the whole context
    spill_bytes: tuple[float, ...]  # per ladder tier, max(0, kv_bytes - budget)
    weights_active_bytes: float
    vram_gbps: float
    host_ram_gbps: float
    pcie_gbps: float | None
    bw_eff_gbps: float
    binding_link: Link
    c_engage_s: float
    kv_resident_bytes: float  # the top tier's KV, the cache t_resident is measured with
    t_resident_s: float
    target_drop: float
    max_spill_bytes: float
    tstar_bytes: float  # after the cliff cap; <= 0 means never spill
    chosen: KVTier
    chosen_index: int
    chosen_spill_bytes: float
    predicted_drop: float  # drop(chosen_spill_bytes)
    resident_budget_tokens: int  # tokens of the chosen tier that fit the budget; the rest spill
    floor_fallback: bool  # nothing fitted budget + T*: the floor was taken anyway
    explicit_type_k: str | None
    unsupported: tuple[KVTier, ...] = ()  # ladder tiers left out: head dims not whole blocks

    @property
    def top_tier_spill_bytes(self) -> float:
        return self.spill_bytes[0]

    @property
    def spills(self) -> bool:
        return self.chosen_spill_bytes > 0

    @property
    def position_shift(self) -> bool:
        """Whether the chosen cache can shift positions (``tier_can_shift``): False for a quantized
        K, where only gap-keeping (``rebase=False``) streaming and scored policies can run."""
        return tier_can_shift(self.chosen)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: tiers as "k/v" names."""
        out = asdict(self)
        out["ladder"] = [t.name for t in self.ladder]
        out["chosen"] = self.chosen.name
        out["kv_bytes"] = list(self.kv_bytes)
        out["spill_bytes"] = list(self.spill_bytes)
        out["unsupported"] = [t.name for t in self.unsupported]
        out["top_tier_spill_bytes"] = self.top_tier_spill_bytes
        out["position_shift"] = self.position_shift
        return out

    def summary(self) -> str:
        pcie = "none" if self.pcie_gbps is None else f"{self.pcie_gbps:.2f}"
        why = "floor: still spills past T*" if self.floor_fallback else (
            "spills within T*" if self.spills else "fits the budget"
        )
        return (
            f"KV tier {self.chosen.name} ({why}) n_ctx={self.n_ctx} "
            f"budget={self.budget_bytes / MIB:.1f} MiB "
            f"top tier {self.ladder[0].name} kv={self.kv_bytes[0] / MIB:.1f} MiB "
            f"spill={self.top_tier_spill_bytes / MIB:.1f} MiB "
            f"T*={self.tstar_bytes / MIB:.1f} MiB (target_drop={self.target_drop:g}, "
            f"cap={self.max_spill_bytes / MIB:.0f} MiB) "
            f"bw_eff={self.bw_eff_gbps:.2f} GB/s binding={self.binding_link} "
            f"(host_ram={self.host_ram_gbps:.2f} pcie={pcie} vram={self.vram_gbps:.2f} GB/s) "
            f"c_engage={self.c_engage_s * 1e3:.3f} ms t_resident={self.t_resident_s * 1e3:.3f} ms "
            f"W_active={self.weights_active_bytes / MIB:.1f} MiB "
            f"chosen spill={self.chosen_spill_bytes / MIB:.1f} MiB "
            f"drop={self.predicted_drop:.3f} resident_tokens={self.resident_budget_tokens}"
            + ("" if self.position_shift else
               f" position_shift=false (quantized K {self.chosen.type_k}: rebase=False policies only)")
            + (f" explicit type_k={self.explicit_type_k}" if self.explicit_type_k else "")
            + (f" unsupported={','.join(t.name for t in self.unsupported)}" if self.unsupported else "")
        )


def choose_tier(
    profile_for: ProfileFactory,
    n_ctx: int,
    budget_bytes: float,
    *,
    weights_active_bytes: float,
    vram_gbps: float,
    host_ram_gbps: float,
    pcie_gbps: float | None,
    c_engage_s: float,
    target_drop: float = DEFAULT_TARGET_DROP,
    max_spill_bytes: float = DEFAULT_MAX_SPILL_MIB * MIB,
    explicit_type_k: str | None = None,
    explicit_type_v: str | None = None,
    head_dims: tuple[int, int] | None = None,
) -> TierDecision | None:
    """The first tier (least to most compression) with ``kv_bytes <= budget + T*``, else the floor.

    An explicit V type disables the choice (returns None: use the explicit types as given); an
    explicit K type holds K and walks only ``V_LADDER``. With ``head_dims`` (k, v), tiers whose
    quantization blocks do not divide them are left out (listed in ``unsupported``).
    """
    if explicit_type_v is not None:
        if explicit_type_v not in KV_TYPES:
            raise TieringError(
                f"explicit type_v={explicit_type_v!r} is not a KV type; known: {', '.join(KV_TYPES)}"
            )
        return None
    if n_ctx < 0:
        raise TieringError(f"n_ctx must be >= 0, got {n_ctx}")
    _check_non_negative("budget_bytes", budget_bytes)
    full = tier_ladder(explicit_type_k)
    unsupported: tuple[KVTier, ...]
    if head_dims is None:
        ladder, unsupported = full, ()
    else:
        ladder = tuple(t for t in full if tier_supported(t, *head_dims))
        unsupported = tuple(t for t in full if t not in ladder)
        if not ladder:
            raise TieringError(
                f"no tier of {[t.name for t in full]} can be built for head dims {head_dims}"
            )
    kv = tuple(tier_kv_bytes(profile_for, t, n_ctx) for t in ladder)
    spill = tuple(max(0.0, b - budget_bytes) for b in kv)
    bw_eff, link = effective_bandwidth(host_ram_gbps, pcie_gbps)
    t_res = t_resident_s(weights_active_bytes, kv[0], vram_gbps)
    tstar = tstar_bytes(target_drop, t_res, c_engage_s, bw_eff, max_spill_bytes)
    index = next((i for i, b in enumerate(kv) if fits(b, budget_bytes, tstar)), None)
    floor = index is None
    chosen_index = len(ladder) - 1 if index is None else index
    chosen = ladder[chosen_index]
    resident_tokens = resolve_context_for_budget(
        profile_for(chosen.type_k, chosen.type_v), budget_bytes, max_context=n_ctx
    )
    return TierDecision(
        n_ctx=n_ctx,
        budget_bytes=float(budget_bytes),
        ladder=ladder,
        kv_bytes=kv,
        spill_bytes=spill,
        weights_active_bytes=float(weights_active_bytes),
        vram_gbps=float(vram_gbps),
        host_ram_gbps=float(host_ram_gbps),
        pcie_gbps=None if pcie_gbps is None else float(pcie_gbps),
        bw_eff_gbps=float(bw_eff),
        binding_link=link,
        c_engage_s=float(c_engage_s),
        kv_resident_bytes=kv[0],
        t_resident_s=t_res,
        target_drop=float(target_drop),
        max_spill_bytes=float(max_spill_bytes),
        tstar_bytes=tstar,
        chosen=chosen,
        chosen_index=chosen_index,
        chosen_spill_bytes=spill[chosen_index],
        predicted_drop=drop_fraction(spill[chosen_index], c_engage_s, bw_eff, t_res),
        resident_budget_tokens=resident_tokens,
        floor_fallback=floor,
        explicit_type_k=explicit_type_k,
        unsupported=unsupported,
    )


@dataclass(frozen=True)
class TierConfig:
    auto: bool = False
    target_drop: float = DEFAULT_TARGET_DROP
    max_spill_bytes: float = DEFAULT_MAX_SPILL_MIB * MIB

    def __post_init__(self) -> None:
        _check_non_negative("TierConfig.target_drop", self.target_drop)
        _check_non_negative("TierConfig.max_spill_bytes", self.max_spill_bytes)
