"""The KV config a backend really runs with: its context, token budget and KV types resolved.

Primitives:
- ``resolve_kv_tier(config, model_path, env=None, placement=None) -> (config, decision)``: a
  memory-budgeted config (``BackendConfig.memory_budgeted``) gets ``n_ctx`` and
  ``kv_budget_tokens`` from its bytes (``kv_budget``); with KVRES_KV_AUTO_TIER=1 the KV types of
  an engine that allows it (its ``EngineSpec``, ``engine_registry``) come from the T* choice
  (``kvres.actors.sizing.kv_tier_choice``), whose budget is those same bytes (else
  ``kv_budget_tokens`` priced at f16). When the f16 cache of the whole context fits, nothing is
  probed or logged and the types stay; otherwise the config comes back unchanged. Where it
  changes, a config that leaves the llama.cpp KV layout to kvres (``kv_layout=None``) comes back
  with the one its sizes choose (``kv_layout_choice``: a memory-budgeted config's sizes are those
  its memory buys; a spilling T* decision makes it unified), logged with the reason; elsewhere
  ``resolve_kv_layout`` chooses it after this.
- ``resolve_kv_layout(config, model_path) -> config``: the config with the llama.cpp KV layout it
  runs set where it names none (``kv_layout_choice``), the choice logged with its reason; a config
  of an engine without layouts as it is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from kvres.actors.config import BackendConfig
from kvres.actors.sizing.device_placement import Placement, assigned_gpu_ids, placement_for
from kvres.policy.capacity import MemoryBudget
from kvres.policy.tiering import TierDecision

from .engine_registry import engine_spec
from .kv_budget import context_cap, memory_budget, resolve_kv_memory
from .kv_layout_choice import LayoutChoice, choose_kv_layout, llama_kv_layout, log_layout_choice

logger = logging.getLogger("kvres.capacity")


def resolve_kv_tier(
    config: BackendConfig, model_path: Path, env: Mapping[str, str] | None = None,
    placement: Placement | None = None,
) -> tuple[BackendConfig, TierDecision | None]:
    """The config a backend really runs with. KV types the user set explicitly are kept (an
    explicit V type disables the choice)."""
    env = os.environ if env is None else env
    from kvres.actors.sizing.tier_env import auto_tier_enabled

    spec = engine_spec(config.engine)
    if placement is None and config.memory_budgeted:
        placement = placement_for(config, assigned_gpu_ids(), env)
    budget, source = memory_budget(config, model_path, placement) if config.memory_budgeted else (None, None)
    kv_layout: LayoutChoice | None = None  # chosen here only where the config changes anyway
    if config.kv_layout is None and budget is not None and spec.kv_layouts:
        kv_layout = _layout_by_memory(config, model_path, budget, placement, source)
        config = config.model_copy(update={"kv_layout": kv_layout.layout})
    decision: TierDecision | None = None
    type_k: str = config.type_k
    type_v: str = config.type_v
    explicit_k = config.type_k if "type_k" in config.model_fields_set else None
    explicit_v = config.type_v if "type_v" in config.model_fields_set else None
    if spec.kv_tier_choice and auto_tier_enabled(env) and explicit_v is None:
        from kvres.actors.model_files import layout_from_gguf
        from kvres.actors.sizing.kv_tier_choice import choose_kv_types
        from kvres.actors.sizing.llama_probes import ProbeEngine
        from kvres.policy.tiering import layout_profile_factory

        layout = layout_from_gguf(model_path)
        if budget is not None:  # priced as the engine allocates the context
            budget_bytes, n_ctx = budget.bytes, context_cap(config, model_path)
            profile_for = layout_profile_factory(layout, spec.cache_cells(config) if spec.cache_cells else None)
        else:
            profile_for = layout_profile_factory(layout)
            budget_bytes, n_ctx = profile_for("f16", "f16").kv_bytes_for_context(config.kv_budget_tokens), config.n_ctx
        if profile_for(explicit_k or "f16", "f16").kv_bytes_for_context(n_ctx) > budget_bytes:
            # else the top tier holds the whole context: nothing to choose, probe or log.
            # The probes run with the backend's own threads and device (several threads: in a child).
            where = placement or placement_for(config, assigned_gpu_ids(), env)
            probe = spec.tier_probe(config, where) if spec.tier_probe else ProbeEngine(1, where.n_gpu_layers,
                                                                                      where.main_gpu)
            choice = choose_kv_types(model_path, n_ctx, budget_bytes, explicit_k, None, env,
                                     profile_for=profile_for, head_dims=layout.head_dims, engine=probe)
            decision = choice.decision
            type_k, type_v = choice.type_k, choice.type_v
            if budget is None and decision is not None:
                resident = max(1, min(config.n_ctx, int(choice.resident_budget_tokens)))
                config = config.model_copy(update={"type_k": type_k, "type_v": type_v, "kv_budget_tokens": resident})
    if decision is not None and config.kv_layout is None:  # T* changed the config: its layout now
        kv_layout = llama_kv_layout(config, model_path, spills=decision.spills)
        config = config.model_copy(update={"kv_layout": kv_layout.layout})
    elif decision is not None and decision.spills and kv_layout is not None and kv_layout.layout == "split":
        kv_layout = choose_kv_layout(config.n_ctx, config.n_seq_max, spills=True)
        config = config.model_copy(update={"kv_layout": kv_layout.layout})
    if kv_layout is not None:
        log_layout_choice(config.name, kv_layout)
    if budget is not None:
        config, memory = resolve_kv_memory(config, model_path, budget, placement=placement, source=source,
                                           type_k=type_k, type_v=type_v)
        logger.info("backend %s: KV memory %.1f MiB from %s buys n_ctx=%d, kv_budget_tokens=%d at %s/%s",
                    config.name, memory.budget_bytes / 2**20, memory.device, memory.n_ctx,
                    memory.kv_budget_tokens, memory.type_k, memory.type_v, extra={"kvres_memory": memory.as_dict()})
    return config, decision


def _layout_by_memory(config: BackendConfig, model_path: Path, budget: MemoryBudget,
                      placement: Placement | None, source: str | None) -> LayoutChoice:
    """The layout a memory-budgeted config's sizes choose: the context its memory buys in the
    unified layout (the split one's spare stream buys a little less)."""
    sized, _ = resolve_kv_memory(config.model_copy(update={"kv_layout": "unified"}), model_path, budget,
                                 placement=placement, source=source)
    return llama_kv_layout(sized.model_copy(update={"kv_layout": None}), model_path)


def resolve_kv_layout(config: BackendConfig, model_path: Path) -> BackendConfig:
    """The config with the KV layout it runs set (its engine's registry spec has layouts and the
    config names none), the choice logged; any other config as it is."""
    if config.kv_layout is not None or not engine_spec(config.engine).kv_layouts:
        return config
    choice = llama_kv_layout(config, model_path)
    log_layout_choice(config.name, choice)
    return config.model_copy(update={"kv_layout": choice.layout})
