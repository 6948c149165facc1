"""Backends configured by memory: the bytes become a context and a token budget (T0), the engine's
allocation fits them, the sessions' resident KV stays within them, and stats() shows both."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.backend_setup.kv_budget import kv_profiles, memory_budget, resolve_kv_memory
from kvres.actors.backend_setup.kv_config import resolve_kv_tier
from kvres.actors.config import BackendConfig, SessionPolicy
from kvres.actors.default_model import write_tiny_model
from kvres.actors.engines.llama import cache_shape
from kvres.actors.host.backend import BackendHost
from kvres.actors.ray_actors.coldstore_actor import ColdStoreServer
from kvres.actors.sizing import kv_tier_choice
from kvres.actors.sizing.device_memory import DeviceMemory, host_memory, llama_devices
from kvres.actors.sizing.device_placement import Placement
from kvres.policy.backend_planner import plan_backend
from kvres.policy.capacity import CapacityError
from kvres.testing import LocalStorePort

from .arch_models import ARCH_MODELS, write_arch_model
from .llama_report import llama_log, parse_kv_log

STORIES_F16 = 640  # bytes per token: 5 layers, 4 KV heads of 8, K + V at f16
CPU = Placement((), 0, None, "CPU")


def _tokens(n: int, seed: int = 0) -> list[int]:
    return [3 + (i * 7 + seed) % 200 for i in range(n)]


@pytest.fixture()
def store(tmp_path: Path) -> LocalStorePort:
    return LocalStorePort("node", {"node": ColdStoreServer(1 << 22, tmp_path / "cold", 1 << 24)})


def _serve(config: BackendConfig, model: Path, store: LocalStorePort, memory: int,
           state_tensors: bool = False) -> dict[str, object]:
    """Two streaming sessions grown far past their budgets; the resident KV bytes never exceed
    ``memory`` (and, with ``state_tensors``, equal what the OpenVINO engine's KV state tensors
    hold). Returns the last stats."""
    executor = make_executor(config, model, CPU)
    host = BackendHost(config, executor, plan_backend, store)
    half = config.kv_budget_tokens // 2
    stats = host.stats()
    try:
        for sid in ("a", "b"):
            host.open_session(sid, SessionPolicy.streaming(half, sink_tokens=4, recent_tokens=32))
        for step in range(6):
            for sid in ("a", "b"):
                host.append(sid, _tokens(97, step))
                stats = host.stats()
                assert stats["resident_tokens"] <= config.kv_budget_tokens
                assert 0 < stats["resident_kv_bytes"] <= memory
                if state_tensors:  # what the engine itself holds: its KV state tensors
                    held = sum(v.state.byte_size for s in executor._sessions.values()  # type: ignore[union-attr]
                               for v in s.request.query_state())
                    assert held == stats["resident_kv_bytes"]  # kvres's bill is the engine's own
        assert stats["kv_budget_bytes"] == config.kv_memory_bytes
        assert stats["free_kv_bytes"] == stats["kv_budget_bytes"] - stats["resident_kv_bytes"]
        assert host.session_stats("a")["counters"]["evictions"] > 0
    finally:
        close = getattr(executor, "close", None)
        if close is not None:
            close()
    return stats


def test_llama_backend_by_memory(stories_model: Path, store: LocalStorePort) -> None:
    memory = STORIES_F16 * 900
    config = BackendConfig(name="mem", model_path=stories_model, kv_memory_bytes=memory, n_seq_max=2, n_threads=1)
    tuned, decision = resolve_kv_tier(config, stories_model, env={}, placement=CPU)
    assert decision is None
    # 900 tokens' worth: 768 cells (a multiple of 256) hold the context and llama.cpp's 2 reserved cells
    assert (tuned.n_ctx, tuned.kv_budget_tokens) == (766, 766)
    assert tuned.kv_memory_bytes == memory and tuned.kv_memory_fraction is None
    with llama_log() as lines:
        executor = make_executor(tuned, stories_model, CPU)
    cells = executor._ctx.n_cells  # type: ignore[union-attr]
    executor.close()  # type: ignore[union-attr]
    report = parse_kv_log(lines, cells)
    assert cells == cache_shape.context_cells(tuned.n_ctx) == 768
    assert report.buffer_bytes == pytest.approx(cells * STORIES_F16, rel=0.01) and report.buffer_bytes <= memory
    _serve(tuned, stories_model, store, memory)


def test_openvino_backend_by_memory(stories_model: Path, store: LocalStorePort) -> None:
    memory = 2 * STORIES_F16 * 400  # the IR keeps f32 KV: 1,280 bytes per token
    config = BackendConfig(name="ov-mem", engine="openvino", model_path=stories_model, kv_memory_bytes=memory,
                           n_seq_max=2, n_threads=1)
    tuned, _ = resolve_kv_tier(config, stories_model, env={}, placement=CPU)
    assert (tuned.n_ctx, tuned.kv_budget_tokens) == (400, 400)
    _serve(tuned, stories_model, store, memory, state_tensors=True)


def test_executor_allocation_matches_llama_cpp_for_a_windowed_model(tmp_path: Path) -> None:
    """The llama executor's own context (2 n_seq_max + 1 sequences, small SWA cache) on gemma3."""
    model = write_arch_model(ARCH_MODELS["gemma3"], tmp_path / "gemma3.gguf")
    config = BackendConfig(model_path=model, n_ctx=1000, kv_budget_tokens=500, n_seq_max=3, n_threads=1)
    with llama_log() as lines:
        executor = make_executor(config, model, CPU)
    cells = executor._ctx.n_cells  # type: ignore[union-attr]
    executor.close()  # type: ignore[union-attr]
    allocation, resident = kv_profiles(config, model)
    assert cells == cache_shape.context_cells(1000) == 1024
    assert allocation.kv_bytes_for_context(cells) == pytest.approx(parse_kv_log(lines, cells).buffer_bytes, rel=0.01)
    assert resident.window_cap == 3 * 128  # three sessions, each its own window
    # the executor's context and sizing's prices both come from cache_shape
    assert (cache_shape.RESERVED_CELLS, cache_shape.RESERVED_SEQS) == (2, 1)
    assert cache_shape.context_request(1000, 3, "unified") == (1002, 7)


def test_fraction_of_free_memory_less_weights_and_reserve(stories_model: Path) -> None:
    config = BackendConfig(model_path=stories_model, kv_memory_fraction=0.5, kv_memory_reserve_bytes=1 << 20)
    gpu = DeviceMemory("CUDA0", "a test GPU", "gpu", free_bytes=8 << 20, total_bytes=16 << 20)
    budget, source = memory_budget(config, stories_model, device=gpu)
    weights = stories_model.stat().st_size
    assert budget.bytes == 0.5 * ((8 << 20) - weights - (1 << 20)) and source == "CUDA0 (a test GPU)"
    capped = config.model_copy(update={"kv_memory_bytes": 100_000})
    assert memory_budget(capped, stories_model, device=gpu)[0].bytes == 100_000
    tuned, res = resolve_kv_memory(config, stories_model, budget, source=source)
    assert res.budget_bytes == budget.bytes and res.allocated_bytes <= budget.bytes
    assert tuned.n_ctx == 2048  # the memory holds more: capped by the model's trained context
    # the real host, through /proc/meminfo (no GPU is assigned here)
    small = BackendConfig(model_path=stories_model, kv_memory_fraction=0.001, n_ctx=4096)
    budget, source = memory_budget(small, stories_model, CPU)
    assert source.startswith("host") and budget.free_bytes is not None
    assert 0 < budget.free_bytes <= host_memory().total_bytes
    resolved, _ = resolve_kv_tier(small, stories_model, env={}, placement=CPU)
    assert resolved.kv_memory_fraction is None and resolved.kv_memory_bytes is not None
    assert resolved.n_ctx <= 4096 and resolved.kv_budget_tokens <= resolved.n_ctx
    assert [d.kind for d in llama_devices()][:1] == ["cpu"]  # llama.cpp's own device list


def test_a_budget_too_small_is_named(stories_model: Path) -> None:
    config = BackendConfig(model_path=stories_model, kv_memory_bytes=20_000)
    with pytest.raises(CapacityError, match="20000 bytes holds a context of 0 tokens.*at least 64"):
        resolve_kv_tier(config, stories_model, env={}, placement=CPU)
    with pytest.raises(ValueError, match="kv_memory_fraction"):
        BackendConfig(kv_memory_fraction=1.5)


def test_tstar_budget_is_the_memory_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")  # 2 layers, 1 KV head of 32: 256 bytes per token at f16
    env = {"KVRES_KV_AUTO_TIER": "1", "KVRES_CACHE_DIR": str(tmp_path), "KVRES_HOST_RAM_GBPS": "10",
           "KVRES_VRAM_GBPS": "10", "KVRES_C_ENGAGE_MS": "0.8"}

    def no_probe(*a: object, **k: object) -> None:
        raise AssertionError("probed although f16 fits")

    roomy = BackendConfig(model_path=model, n_ctx=4094, kv_memory_bytes=4 << 20, n_seq_max=1, n_threads=1)
    monkeypatch.setattr(kv_tier_choice, "load_probes", no_probe)
    with caplog.at_level(logging.DEBUG, logger="kvres.tiering"):
        tuned, decision = resolve_kv_tier(roomy, model, env=env, placement=CPU)
    assert decision is None and (tuned.type_k, tuned.type_v) == ("f16", "f16") and tuned.n_ctx == 4094
    assert not caplog.records
    monkeypatch.undo()
    tight = roomy.model_copy(update={"kv_memory_bytes": 700_000})
    tuned, decision = resolve_kv_tier(tight, model, env=env, placement=CPU)
    assert decision is not None and decision.budget_bytes == 700_000
    assert (tuned.type_k, tuned.type_v) == (decision.chosen.type_k, decision.chosen.type_v) != ("f16", "f16")
    allocation, _ = kv_profiles(tuned, model)
    assert allocation.kv_bytes_for_context(cache_shape.context_cells(tuned.n_ctx)) <= 700_000


def test_token_configured_backend_with_f16_fitting_is_unchanged(stories_model: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(kv_tier_choice, "load_probes", lambda *a, **k: pytest.fail("probed"))
    config = BackendConfig(model_path=stories_model, n_ctx=1024, kv_budget_tokens=1024)
    with caplog.at_level(logging.DEBUG):
        tuned, decision = resolve_kv_tier(config, stories_model, env={"KVRES_KV_AUTO_TIER": "1"})
    assert tuned is config and decision is None
    assert not [r for r in caplog.records if r.name.startswith("kvres")]


def test_explicit_token_figures_cap_what_the_memory_buys(stories_model: Path) -> None:
    roomy = BackendConfig(model_path=stories_model, kv_memory_bytes=64 << 20, kv_budget_tokens=5000)
    tuned, _ = resolve_kv_tier(roomy, stories_model, env={}, placement=CPU)
    assert tuned.n_ctx == 2048 and tuned.kv_budget_tokens == 2048  # the trained context caps both
    capped = BackendConfig(model_path=stories_model, kv_memory_bytes=64 << 20, n_ctx=1024, kv_budget_tokens=300)
    tuned, _ = resolve_kv_tier(capped, stories_model, env={}, placement=CPU)
    assert (tuned.n_ctx, tuned.kv_budget_tokens) == (1024, 300)
    again, _ = resolve_kv_tier(tuned, stories_model, env={}, placement=CPU)
    assert (again.n_ctx, again.kv_budget_tokens, again.kv_memory_bytes) == (1024, 300, 64 << 20)
