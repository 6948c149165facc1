"""The KV layout kvres chooses when a backend's config leaves it (``kv_layout=None``): the pure
decision on sizes, and what a backend, the HTTP front's catalog and the cluster make of it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import kv_layout_of, llama_cache_cells, llama_spare_streams
from kvres.actors.backend_setup.kv_config import resolve_kv_layout, resolve_kv_tier
from kvres.actors.backend_setup.kv_layout_choice import (
    SPLIT_MIN_SESSIONS,
    SPLIT_MIN_STREAM_TOKENS,
    choose_kv_layout,
)
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.sizing.device_placement import Placement
from kvres.cluster.serve.catalog import session_context
from tests.capacity.arch_models import ARCH_MODELS, write_arch_model

CPU = Placement((), 0, None, "CPU")


def test_split_where_many_sessions_are_resident_with_streams_that_hold_them() -> None:
    chat_fleet = choose_kv_layout(n_ctx=4096, n_seq_max=8)
    assert chat_fleet.layout == "split" and chat_fleet.chosen
    assert "n_seq_max=8" in chat_fleet.reason and "512 tokens" in chat_fleet.reason
    edge = choose_kv_layout(n_ctx=SPLIT_MIN_SESSIONS * SPLIT_MIN_STREAM_TOKENS, n_seq_max=SPLIT_MIN_SESSIONS)
    assert edge.layout == "split"


@pytest.mark.parametrize(("sizes", "why"), [
    ({"n_ctx": 4096, "n_seq_max": SPLIT_MIN_SESSIONS - 1}, "few sessions resident"),
    ({"n_ctx": 2048, "n_seq_max": 6}, "341 tokens < 512"),  # a stream too short for a session
    ({"n_ctx": 4096, "n_seq_max": 8, "sliding_window": True}, "sliding window"),
    ({"n_ctx": 4096, "n_seq_max": 8, "spills": True}, "spills"),
    ({"n_ctx": 4096, "n_seq_max": 8, "evicting_sessions": True}, "policy evicts"),
    ({"n_ctx": 4096, "n_seq_max": 8, "session_tokens": 2048}, "less than one session may hold"),
])
def test_unified_where_a_session_must_evict_or_few_are_resident(sizes: dict[str, int], why: str) -> None:
    choice = choose_kv_layout(**sizes)
    assert choice.layout == "unified" and why in choice.reason


def test_other_engines_have_one_layout_and_an_explicit_one_wins() -> None:
    assert kv_layout_of(BackendConfig(engine="openvino")) is None
    # the default sizes (8 sessions, n_ctx 4096, 2,048 tokens a session): a split stream of 512 would
    # cut every session's context to a quarter, so they stay unified
    default = kv_layout_of(BackendConfig())
    assert default.layout == "unified" and "kv_budget_tokens=2048" in default.reason
    assert kv_layout_of(BackendConfig(kv_budget_tokens=512)).layout == "split"  # 8 sessions of 512 tokens
    kept = kv_layout_of(BackendConfig(kv_layout="unified"))
    assert kept.layout == "unified" and not kept.chosen
    assert kv_layout_of(BackendConfig(kv_layout="split", n_seq_max=2, n_ctx=256, kv_budget_tokens=200)).layout == "split"
    # what sizing prices is what the engine will allocate: one stream per session and a spare
    assert llama_spare_streams(BackendConfig(kv_budget_tokens=512)) == 1
    assert llama_cache_cells(BackendConfig(kv_budget_tokens=512)).kv_unified is False
    assert llama_cache_cells(BackendConfig()).kv_unified is True
    assert llama_cache_cells(BackendConfig(kv_layout="unified")).kv_unified is True


def test_a_backend_resolves_and_logs_its_layout(stories_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What a backend runs: ``resolve_kv_tier`` (a config it does not change comes back as it is),
    then ``resolve_kv_layout``."""
    config = BackendConfig(model_path=stories_model, kv_budget_tokens=512)
    tuned, _ = resolve_kv_tier(config, stories_model, env={}, placement=CPU)
    assert tuned is config
    with caplog.at_level(logging.INFO, logger="kvres.capacity"):
        fleet = resolve_kv_layout(tuned, stories_model)
    assert fleet.kv_layout == "split"
    assert any("KV layout split" in r.getMessage() for r in caplog.records)
    assert resolve_kv_layout(BackendConfig(model_path=stories_model, n_seq_max=2, kv_budget_tokens=512),
                             stories_model).kv_layout == "unified"
    assert resolve_kv_layout(BackendConfig(model_path=stories_model), stories_model).kv_layout == "unified"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kvres.capacity"):
        asked = resolve_kv_layout(BackendConfig(model_path=stories_model, kv_layout="unified"), stories_model)
    assert asked.kv_layout == "unified" and not caplog.records  # nothing chosen, nothing to say
    assert resolve_kv_layout(BackendConfig(engine="openvino"), stories_model).kv_layout is None  # no llama layout
    # by memory: the sizes its memory buys (stories260K's 512-token trained context over 8: 64 each)
    memory, _ = resolve_kv_tier(BackendConfig(model_path=stories_model, kv_memory_bytes=64 << 20), stories_model,
                                env={}, placement=CPU)
    assert memory.kv_layout == "unified" and memory.n_ctx // memory.n_seq_max < SPLIT_MIN_STREAM_TOKENS
    roomy, _ = resolve_kv_tier(BackendConfig(model_path=stories_model, kv_memory_bytes=64 << 20, n_ctx=8192,
                                             n_seq_max=4, kv_budget_tokens=2048), stories_model, env={}, placement=CPU)
    assert roomy.kv_layout == "split"


def test_a_sliding_window_model_stays_unified(tmp_path: Path) -> None:
    gemma2 = write_arch_model(ARCH_MODELS["gemma2"], tmp_path / "gemma2.gguf")
    config = BackendConfig(model_path=gemma2)
    choice = kv_layout_of(config, gemma2)
    assert choice.layout == "unified" and "sliding window" in choice.reason
    assert resolve_kv_layout(config, gemma2).kv_layout == "unified"


def test_the_catalog_reports_the_chosen_layouts_context(stories_model: Path) -> None:
    fleet = BackendConfig(model_path=stories_model, kv_budget_tokens=512)  # split: 4096 / 8
    assert session_context(fleet, keeps_every_token=True) == 512
    # a cluster whose default policy evicts keeps the unified cache: a session reaches n_ctx
    assert session_context(fleet, keeps_every_token=False) == 4096
    assert not SessionPolicy.streaming(512).residency.keeps_every_token


def test_a_spilling_kv_tier_keeps_the_unified_layout(stories_model: Path, tmp_path: Path) -> None:
    """T* (opt-in) that spills runs its sessions with eviction from their middle: unified, though
    the sizes alone (4 sessions of 1,024 tokens) would choose split."""
    env = {"KVRES_KV_AUTO_TIER": "1", "KVRES_CACHE_DIR": str(tmp_path), "KVRES_HOST_RAM_GBPS": "10",
           "KVRES_VRAM_GBPS": "10", "KVRES_C_ENGAGE_MS": "0.8"}
    config = BackendConfig(model_path=stories_model, n_ctx=4096, n_seq_max=4, kv_budget_tokens=256, n_threads=1)
    assert kv_layout_of(config).layout == "split"
    tuned, decision = resolve_kv_tier(config, stories_model, env=env, placement=CPU)
    assert decision is not None and decision.spills
    assert tuned.kv_layout == "unified"
