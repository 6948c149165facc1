"""The KV types a backend creates a session's context with: the T* choice wired to real probes.

Primitives:
- ``choose_kv_types(model_path, n_ctx, budget_bytes, explicit_type_k=None, explicit_type_v=None,
  env=None, ..., engine=ONE_THREAD_CPU) -> (type_k, type_v, resident_budget_tokens, TierDecision | None)``.
- ``KVTypeChoice``: the same four values as a named tuple.

With KVRES_KV_AUTO_TIER unset (or 0) nothing is probed, read or logged: the result is exactly the
previous default, ``(explicit_type_k or "f16", explicit_type_v or "f16", n_ctx, None)``. An explicit
V type also disables the choice. Otherwise the model's layer structure (GGUF metadata), the probes
(``kvres.actors.sizing.probes.load_probes``: cached per device, env-overridable) and the env config feed
``kvres.policy.tiering.choose_tier``; the decision is logged at WARNING on "kvres.tiering".
``resident_budget_tokens`` is how many tokens of the chosen tier fit the budget; the tail past it
is the spill (kept in the cold store's RAM tier) and is 0 tokens when the chosen tier fits. A
decision that quantizes K records ``position_shift=False`` (in its log line and ``as_dict``): that
backend cannot re-base, so only ``rebase=False`` streaming and scored sessions run on it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import NamedTuple

from kvres.actors.model_files import active_weight_bytes_of, read_gguf_metadata
from kvres.policy.errors import ModelLoadError
from kvres.policy.tiering import (
    DEFAULT_TIER,
    ProfileFactory,
    TierDecision,
    TieringError,
    choose_tier,
    head_dims_from_metadata,
    metadata_profile_factory,
)

from .llama_probes import ONE_THREAD_CPU, ProbeEngine
from .probe_common import ProbeError
from .probes import ProbeResults, load_probes
from .recall_costs import measure_model_figures
from .tier_env import auto_tier_enabled, log_tier_decision, tier_config_from_env

logger = logging.getLogger("kvres.tiering")


class KVTypeChoice(NamedTuple):
    type_k: str
    type_v: str
    resident_budget_tokens: int
    decision: TierDecision | None


def choose_kv_types(
    model_path: str | os.PathLike[str] | None,
    n_ctx: int,
    budget_bytes: float,
    explicit_type_k: str | None = None,
    explicit_type_v: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    profile_for: ProfileFactory | None = None,
    head_dims: tuple[int, int] | None = None,
    weights_active_bytes: float | None = None,
    probes: ProbeResults | None = None,
    engine: ProbeEngine = ONE_THREAD_CPU,
    log: logging.Logger | None = None,
) -> KVTypeChoice:
    """KV types and resident token budget for a new context of ``n_ctx`` tokens.

    ``model_path`` (a GGUF) supplies the layer structure, the head dims, ``W_active`` (the weights
    one decode step reads: ``kvres.actors.model_files.active_weight_bytes_of``) and the model for
    the llama.cpp probes; ``profile_for`` / ``head_dims`` /
    ``weights_active_bytes`` / ``probes`` replace those parts (all four make ``model_path``
    optional). ``budget_bytes`` is the KV memory the context may keep resident; ``engine`` is what
    the llama.cpp probes run the model with (threads, offload: the backend's own); with more than
    one thread the model's figures are measured in a probe child (``recall_costs.measure_model_figures``).
    """
    env = os.environ if env is None else env
    previous = KVTypeChoice(
        explicit_type_k or DEFAULT_TIER.type_k, explicit_type_v or DEFAULT_TIER.type_v, n_ctx, None
    )
    if not auto_tier_enabled(env):
        return previous
    if explicit_type_v is not None:
        (log or logger).info(
            "KV auto tier off for this context: explicit type_v=%s (type_k=%s)", explicit_type_v, previous.type_k
        )
        return previous
    config = tier_config_from_env(env)
    if profile_for is None or head_dims is None:
        if model_path is None:
            raise TieringError("choose_kv_types needs model_path, or profile_for and head_dims")
        try:
            meta = read_gguf_metadata(model_path)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read KV layout of {os.fspath(model_path)!r}: {exc}") from exc
        profile_for = profile_for or metadata_profile_factory(meta)
        head_dims = head_dims or head_dims_from_metadata(meta)
    if weights_active_bytes is None:
        if model_path is None:
            raise TieringError("choose_kv_types needs model_path or weights_active_bytes")
        weights_active_bytes = active_weight_bytes_of(model_path)
    if probes is None:
        probes = load_probes(model_path, env=env, engine=_measured_apart(model_path, engine, env, log))
    decision = choose_tier(
        profile_for,
        n_ctx,
        budget_bytes,
        weights_active_bytes=weights_active_bytes,
        vram_gbps=probes.vram_gbps,
        host_ram_gbps=probes.host_ram_gbps,
        pcie_gbps=probes.pcie_gbps,
        c_engage_s=probes.c_engage_s,
        target_drop=config.target_drop,
        max_spill_bytes=config.max_spill_bytes,
        explicit_type_k=explicit_type_k,
        head_dims=head_dims,
    )
    assert decision is not None  # only None for an explicit V type, handled above
    log_tier_decision(decision, log)
    return KVTypeChoice(
        decision.chosen.type_k, decision.chosen.type_v, decision.resident_budget_tokens, decision
    )


def _measured_apart(model_path: str | os.PathLike[str] | None, engine: ProbeEngine, env: Mapping[str, str],
                    log: logging.Logger | None) -> ProbeEngine:
    """The engine the model's figures are read for: with more than one decode thread they are
    measured (where not cached) in a probe child, since only a backend's step loop may decode with
    more than one thread in its process; if the child fails, one thread in this process, as before."""
    if model_path is None or engine.n_threads <= 1:
        return engine
    try:
        measure_model_figures(model_path, engine, env)
    except ProbeError as exc:
        (log or logger).warning("T* probes of %s with %d threads failed (%s): measured on one thread",
                                os.fspath(model_path), engine.n_threads, exc)
        return ProbeEngine(1, engine.n_gpu_layers, engine.main_gpu)
    return engine
