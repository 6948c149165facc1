"""A backend configured by memory: its KV budget in bytes, resolved into a context and a token budget (T0).

Primitives:
- ``kv_profiles(config, model_path, type_k, type_v) -> (allocation, resident)``: the profile of what
  the engine allocates for a context, and of what the sessions keep resident (each its own window),
  from the engine's ``EngineSpec`` (``engine_registry``), as the KV device is.
- ``memory_budget(config, model_path, placement) -> MemoryBudget``: the bytes the config grants:
  ``kv_memory_bytes`` as a target, ``kv_memory_fraction`` of the free memory of the device the KV
  lives on (the main GPU from llama.cpp's own device list when layers are offloaded, an OpenVINO
  GPU, else host RAM) less the model weights still to load there and ``kv_memory_reserve_bytes``.
- ``context_cap(config, model_path)``: the explicit ``n_ctx``, else the model's trained context.
- ``resolve_kv_memory(config, model_path, budget=None, ...) -> (config, MemoryResolution)``:
  ``n_ctx`` (the largest context whose allocation fits, capped) and ``kv_budget_tokens`` (the most
  resident tokens of ``n_seq_max`` sessions that fit); ``MemoryResolution`` keeps every term.

An explicit ``n_ctx`` / ``kv_budget_tokens`` caps what the memory buys; a budget too small for
the smallest context (64 tokens, 16 resident) is a ``CapacityError`` naming both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvres.actors.config import BackendConfig
from kvres.actors.engines.llama.cache_shape import RESERVED_CELLS, context_cells
from kvres.actors.sizing.device_memory import DeviceMemory, host_memory
from kvres.actors.sizing.device_placement import Placement
from kvres.policy.capacity import CapacityError, LayerKVProfile, MemoryBudget, resolve_context_for_budget
from kvres.policy.kv_layout import LLAMA_CELL_PAD

from .engine_registry import engine_spec, llama_spare_streams

MIN_N_CTX, MAX_N_CTX, MIN_BUDGET_TOKENS = 64, 1 << 20, 16


@dataclass(frozen=True)
class MemoryResolution:
    device: str
    free_bytes: float | None
    used_bytes: float
    reserve_bytes: float
    fraction: float
    target_bytes: float | None
    budget_bytes: float
    type_k: str
    type_v: str
    n_ctx: int
    kv_budget_tokens: int
    allocated_bytes: float  # what the engine allocates for n_ctx (llama.cpp's context)
    resident_bytes: float  # kv_budget_tokens resident, each session billed its own window

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_profiles(
    config: BackendConfig, model_path: Path, type_k: str | None = None, type_v: str | None = None
) -> tuple[LayerKVProfile, LayerKVProfile]:
    """(allocation, resident) profiles of the backend's engine at these KV types."""
    return engine_spec(config.engine).kv_profiles(config, model_path, type_k or config.type_k,
                                                  type_v or config.type_v)


def _weights_bytes(model_path: Path) -> float:
    if model_path.is_dir():
        return float(sum(p.stat().st_size for p in model_path.glob("*.bin")))
    return float(model_path.stat().st_size)


def kv_device_memory(config: BackendConfig, placement: Placement | None) -> DeviceMemory:
    """The memory the backend's KV lives in (its engine's device, else host RAM)."""
    return engine_spec(config.engine).kv_device(config, placement) or host_memory()


def memory_budget(
    config: BackendConfig, model_path: Path, placement: Placement | None = None,
    device: DeviceMemory | None = None,
) -> tuple[MemoryBudget, str]:
    """The granted bytes and the name of the memory they come from ("target" when only a target)."""
    if not config.memory_budgeted:
        raise CapacityError(f"backend {config.name!r} has no memory budget (kv_memory_bytes / kv_memory_fraction)")
    target = None if config.kv_memory_bytes is None else float(config.kv_memory_bytes)
    if config.kv_memory_fraction is None:
        return MemoryBudget(None, target_bytes=target), "target"
    memory = device or kv_device_memory(config, placement)
    return MemoryBudget(
        float(memory.free_bytes), used_bytes=_weights_bytes(model_path),
        reserve_bytes=float(config.kv_memory_reserve_bytes), fraction=config.kv_memory_fraction,
        target_bytes=target,
    ), f"{memory.name} ({memory.description})"


def context_cap(config: BackendConfig, model_path: Path) -> int:
    if "n_ctx" in config.model_fields_set:
        return config.n_ctx
    trained = 0
    if model_path.is_file():
        from kvres.actors.model_files import read_gguf_metadata

        meta = read_gguf_metadata(model_path)
        trained = int(meta.get(f"{meta.get('general.architecture')}.context_length") or 0)
    return min(MAX_N_CTX, trained or config.n_ctx)


def _even(n: int) -> int:
    return n - n % 2


def resolve_kv_memory(
    config: BackendConfig,
    model_path: Path,
    budget: MemoryBudget | None = None,
    *,
    placement: Placement | None = None,
    source: str | None = None,
    type_k: str | None = None,
    type_v: str | None = None,
) -> tuple[BackendConfig, MemoryResolution]:
    """The config with ``n_ctx`` and ``kv_budget_tokens`` bought by its memory budget."""
    if budget is None:
        budget, source = memory_budget(config, model_path, placement)
    k, v = type_k or config.type_k, type_v or config.type_v
    allocation, resident = kv_profiles(config, model_path, k, v)
    grant = budget.bytes
    cap = _even(context_cap(config, model_path))
    if engine_spec(config.engine).cache_cells is not None:  # llama.cpp: a padded cache of cells per context
        cells = resolve_context_for_budget(allocation, grant)
        spare = llama_spare_streams(config)  # a split layout's spare stream takes a session's share more
        cells = cells * config.n_seq_max // (config.n_seq_max + spare) // LLAMA_CELL_PAD * LLAMA_CELL_PAD
        n_ctx = min(cap, cells - RESERVED_CELLS)
        allocated = allocation.kv_bytes_for_context(context_cells(n_ctx)) * (1 + spare / config.n_seq_max) \
            if n_ctx > 0 else 0.0
    else:
        n_ctx = min(cap, _even(resolve_context_for_budget(resident, grant, max_context=cap)))
        allocated = 0.0
    what = f"{config.engine} model {model_path.name!r} at {k}/{v}"
    if n_ctx < MIN_N_CTX:
        raise CapacityError(
            f"backend {config.name!r}: a KV memory budget of {grant:.0f} bytes holds a context of "
            f"{max(n_ctx, 0)} tokens of {what}; at least {MIN_N_CTX} are needed"
        )
    tokens = resolve_context_for_budget(resident, grant, max_context=n_ctx)
    if "kv_budget_tokens" in config.model_fields_set:
        tokens = min(tokens, config.kv_budget_tokens)
    if tokens < MIN_BUDGET_TOKENS:
        raise CapacityError(
            f"backend {config.name!r}: a KV memory budget of {grant:.0f} bytes keeps {tokens} tokens of "
            f"{what} resident; at least {MIN_BUDGET_TOKENS} are needed"
        )
    update: dict[str, Any] = {"n_ctx": n_ctx, "kv_budget_tokens": tokens, "kv_memory_bytes": max(1, int(grant)),
                              "kv_memory_fraction": None}
    update |= {name: value for name, value in (("type_k", k), ("type_v", v)) if getattr(config, name) != value}
    tuned = config.model_copy(update=update)
    return tuned, MemoryResolution(
        device=source or "target", free_bytes=budget.free_bytes, used_bytes=budget.used_bytes,
        reserve_bytes=budget.reserve_bytes, fraction=budget.fraction, target_bytes=budget.target_bytes,
        budget_bytes=grant, type_k=k, type_v=v, n_ctx=n_ctx, kv_budget_tokens=tokens,
        allocated_bytes=allocated, resident_bytes=resident.kv_bytes_for_context(tokens),
    )
