"""The T* decision reaches the llama backend's context (opt-in), and changes nothing when off."""

from __future__ import annotations

from kvres.actors.config import BackendConfig
from kvres.actors.engines import make_executor, resolve_kv_tier

PINNED = {"KVRES_HOST_RAM_GBPS": "10", "KVRES_VRAM_GBPS": "10",
          "KVRES_C_ENGAGE_MS": "0.8"}


def test_auto_tier_off_leaves_the_config_byte_identical(stories_model) -> None:
    config = BackendConfig(model_path=stories_model, n_ctx=1024, kv_budget_tokens=512)
    tuned, decision = resolve_kv_tier(config, stories_model, env={})
    assert decision is None and tuned is config
    tuned, decision = resolve_kv_tier(config, stories_model, env={"KVRES_KV_AUTO_TIER": "0", **PINNED})
    assert decision is None and tuned is config


def test_auto_tier_on_applies_types_and_resident_budget(stories_model, caplog, tmp_path) -> None:
    env = {"KVRES_KV_AUTO_TIER": "1", "KVRES_CACHE_DIR": str(tmp_path), **PINNED}
    config = BackendConfig(model_path=stories_model, n_ctx=1024, kv_budget_tokens=512, n_threads=1)
    with caplog.at_level("WARNING", logger="kvres.tiering"):
        tuned, decision = resolve_kv_tier(config, stories_model, env=env)
    assert decision is not None
    assert (tuned.type_k, tuned.type_v) == (decision.chosen.type_k, decision.chosen.type_v)
    assert 1 <= tuned.kv_budget_tokens <= config.n_ctx
    assert any("T*" in r.getMessage() or "tier" in r.getMessage().lower() for r in caplog.records)
    executor = make_executor(tuned, stories_model)
    assert (executor.type_k, executor.type_v) == (tuned.type_k, tuned.type_v)
    explicit = BackendConfig(model_path=stories_model, n_ctx=1024, kv_budget_tokens=512, type_v="f16")
    kept, none = resolve_kv_tier(explicit, stories_model, env=env)
    assert none is None and kept is explicit  # an explicit V type disables the choice
