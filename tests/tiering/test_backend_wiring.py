"""The T* decision reaches the llama backend's context (opt-in), and changes nothing when off."""

from __future__ import annotations

import logging

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.backend_setup.kv_config import resolve_kv_tier
from kvres.actors.config import BackendConfig

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


def test_auto_tier_on_with_f16_fitting_probes_logs_and_changes_nothing(
    stories_model, monkeypatch, caplog, tmp_path
) -> None:
    """The seed's promise: when the f16 cache of the whole context fits, turning the choice on
    changes nothing: no probe runs, no record is logged, the config object comes back as is (and
    a memory-budgeted config resolves exactly as with the choice off)."""
    from kvres.actors.sizing import kv_tier_choice, probes

    def boom(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a probe ran although f16 fits")

    for module, name in ((probes, "load_probes"), (kv_tier_choice, "load_probes"),
                         (kv_tier_choice, "choose_kv_types"), (probes, "measure_host_ram_gbps")):
        monkeypatch.setattr(module, name, boom)
    on = {"KVRES_KV_AUTO_TIER": "1", "KVRES_CACHE_DIR": str(tmp_path)}
    config = BackendConfig(model_path=stories_model, n_ctx=1024, kv_budget_tokens=1024)
    with caplog.at_level(logging.DEBUG):
        tuned, decision = resolve_kv_tier(config, stories_model, env=on)
    assert decision is None and tuned is config
    assert [r for r in caplog.records if r.name.startswith("kvres")] == []
    memory = BackendConfig(model_path=stories_model, n_ctx=1024, kv_budget_tokens=1024, kv_memory_bytes=64 << 20)
    with caplog.at_level(logging.DEBUG):
        tuned, decision = resolve_kv_tier(memory, stories_model, env=on)
    assert decision is None and tuned == resolve_kv_tier(memory, stories_model, env={})[0]
    assert not any(r.name == "kvres.tiering" for r in caplog.records)
    assert not list(tmp_path.iterdir())  # no probe cache written either
