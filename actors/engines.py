"""Build the executor a backend config asks for.

Primitives:
- ``resolve_kv_tier(config, model_path, env) -> (config, decision)``: with KVRES_KV_AUTO_TIER=1,
  the T* choice (``kvres.actors.kv_tier_choice``) sets the KV types and the resident token budget
  (the spilled tail lives in the cold store); otherwise the config comes back unchanged.
- ``make_executor(config, model_path)``: a ``LlamaExecutor``, an OpenVINO executor of the
  configured mechanism (state slicing or re-prefill) or a ``GenAIExecutor`` (openvino-genai: the
  engine evicts).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kvres.policy.tiering import TierDecision

from .config import BackendConfig
from .executor import EngineManagedExecutor, Executor


def resolve_kv_tier(
    config: BackendConfig, model_path: Path, env: Mapping[str, str] | None = None
) -> tuple[BackendConfig, TierDecision | None]:
    """The config a llama backend really runs with. KV types the user set explicitly are kept
    (an explicit V type disables the choice); the byte budget is ``kv_budget_tokens`` at f16."""
    if config.engine != "llama":
        return config, None
    from .kv_tier_choice import choose_kv_types
    from .model_files import profile_from_gguf

    budget_bytes = profile_from_gguf(model_path).kv_bytes_for_context(config.kv_budget_tokens)
    explicit_k = config.type_k if "type_k" in config.model_fields_set else None
    explicit_v = config.type_v if "type_v" in config.model_fields_set else None
    choice = choose_kv_types(model_path, config.n_ctx, budget_bytes, explicit_k, explicit_v, env)
    if choice.decision is None:
        return config, None
    resident = max(1, min(config.n_ctx, int(choice.resident_budget_tokens)))
    tuned = config.model_copy(
        update={"type_k": choice.type_k, "type_v": choice.type_v, "kv_budget_tokens": resident}
    )
    return tuned, choice.decision


def make_executor(config: BackendConfig, model_path: Path) -> Executor | EngineManagedExecutor:
    if config.engine == "llama":
        from .llama import LlamaExecutor

        return LlamaExecutor(
            str(model_path), n_ctx=config.n_ctx, n_seq_max=config.n_seq_max,
            type_k=config.type_k, type_v=config.type_v, n_threads=config.n_threads,
        )
    if config.engine == "openvino-genai":
        from .openvino.genai_executor import GenAIExecutor

        return GenAIExecutor(model_path, num_threads=config.n_threads or 1)
    from .openvino import openvino_executor

    return openvino_executor(model_path, mode=config.openvino_mode, num_threads=config.n_threads or 1)


__all__ = ["make_executor", "resolve_kv_tier"]
