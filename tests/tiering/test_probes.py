"""Probes: host RAM bandwidth, the per-device cache, env overrides, and llama.cpp micro-benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvres.actors.sizing import gpu_probes, host_ram_probe, probe_cache, probes
from kvres.actors.sizing.host_ram_probe import measure_host_ram_gbps
from kvres.actors.sizing.llama_probes import ONE_THREAD_CPU, ProbeEngine, measure_c_engage, probe_context
from kvres.actors.sizing.probe_cache import device_key, model_key
from kvres.actors.sizing.probe_common import ProbeError
from kvres.actors.sizing.probes import load_probes
from kvres.actors.sizing.tier_env import EnvValueError
from kvres.policy.recall import PrefillCost, TierCost, recall_or_recompute


def test_host_ram_bandwidth_is_plausible() -> None:
    gbps = measure_host_ram_gbps(buffer_bytes=64 * 1024**2, repeats=3)
    assert 0.5 <= gbps <= 500.0


def test_an_elided_copy_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_ram_probe.np, "copyto", lambda dst, src: None)
    with pytest.raises(ProbeError, match="checksum"):
        measure_host_ram_gbps(buffer_bytes=1024**2, repeats=1)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"KVRES_CACHE_DIR": str(tmp_path), **extra}


def test_cache_written_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "measure_host_ram_gbps", lambda: 12.5)
    first = load_probes(env=_env(tmp_path), engine_probes=False)
    path = Path(first.cache_file or "")
    assert path.parent == tmp_path and path.name == f"probes-{device_key()}.json"
    data = json.loads(path.read_text())
    assert data["host_ram_gbps"] == 12.5 and data["device"] == first.device
    assert first.sources["host_ram_gbps"] == "measured"
    assert first.c_engage_ms == probes.DEFAULT_C_ENGAGE_MS and first.sources["c_engage_ms"] == "default"
    if not gpu_probes.gpu_present():  # this machine: no device link, the "device" is host RAM
        assert first.pcie_gbps is None and first.link == "none" and first.vram_gbps == 12.5

    def boom() -> float:
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(probes, "measure_host_ram_gbps", boom)
    second = load_probes(env=_env(tmp_path), engine_probes=False)
    assert second.host_ram_gbps == 12.5 and second.sources["host_ram_gbps"] == "cached"
    assert path.read_text() == json.dumps(data, indent=2, sort_keys=True)


def test_env_overrides_win_over_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "measure_host_ram_gbps", lambda: 12.5)
    load_probes(env=_env(tmp_path), engine_probes=False)
    env = _env(
        tmp_path, KVRES_HOST_RAM_GBPS="9.3", KVRES_PCIE_GBPS="51.2", KVRES_VRAM_GBPS="960", KVRES_C_ENGAGE_MS="0.8"
    )
    p = load_probes(env=env, engine_probes=False)
    assert (p.host_ram_gbps, p.pcie_gbps, p.vram_gbps, p.c_engage_ms) == (9.3, 51.2, 960.0, 0.8)
    assert p.bw_eff_gbps == 9.3 and p.link == "host_ram"
    assert {p.sources[k] for k in ("host_ram_gbps", "pcie_gbps", "vram_gbps", "c_engage_ms")} == {"env"}
    with pytest.raises(EnvValueError, match="KVRES_PCIE_GBPS='fast'"):
        load_probes(env=_env(tmp_path, KVRES_PCIE_GBPS="fast"), engine_probes=False)


def test_refresh_remeasures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "measure_host_ram_gbps", lambda: 12.5)
    load_probes(env=_env(tmp_path), engine_probes=False)
    monkeypatch.setattr(probes, "measure_host_ram_gbps", lambda: 13.0)
    assert load_probes(env=_env(tmp_path), engine_probes=False, refresh=True).host_ram_gbps == 13.0


@pytest.fixture(scope="module")
def wide_kv_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 layers of 8 KV heads of 64: 8 KiB of f16 KV per token, so a spilled tail weighs MiBs."""
    from tests.capacity.arch_models import DENSE, ArchModel, write_arch_model

    spec = ArchModel("llama", 4, DENSE, n_embd=128, n_head=8, n_head_kv=8, head_dim=64, n_ff=64)
    return write_arch_model(spec, tmp_path_factory.mktemp("wide") / "wide-kv.gguf")


def test_c_engage_is_the_extra_step_cost_of_a_spilled_tail(wide_kv_model: Path) -> None:
    """Tails of 0, 64 and 1,024 tokens (0, 0.5 and 8 MiB) over the same 1,100 keys: a zero tail
    engages nothing and costs nothing extra, the extra cost grows with the tail, and c_engage is
    the fixed part of that extra cost, never a whole decode step."""
    m = measure_c_engage(wide_kv_model, n_prompt=1100, tails=(0, 64, 1024), steps=30)
    zero, small, big = m.extra_step_s
    assert m.tail_bytes[0] == 0 < m.tail_bytes[1] < m.tail_bytes[2]
    assert m.tail_bytes[2] > 1024 * 8192  # the KV of the tail, plus the blob's cell headers
    assert big > small and big > 0
    assert abs(zero) < 0.25 * big  # within noise of the resident step
    assert 0.0 <= m.c_engage_s <= big
    assert m.tail_gbps is not None and m.tail_gbps > 0
    assert m.resident_step_s > 0 and all(s > 0 for s in m.spill_step_s)


def test_c_engage_bad_tails_are_named(stories_model: Path) -> None:
    with pytest.raises(ProbeError, match="tails < n_prompt"):
        measure_c_engage(stories_model, n_prompt=32, tails=(0, 64))


def test_gpu_probes_without_torch(stories_model: Path, monkeypatch: pytest.MonkeyPatch,
                                  tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No GPU here: llama.cpp's own device list says so (no torch involved). The llama.cpp
    bandwidth probe runs on whatever it offloads to (the CPU here); a GPU that neither torch nor a
    model can measure gets the documented fallback figures, logged and not cached."""
    assert gpu_probes.gpu_device() is None and not gpu_probes.gpu_present() and gpu_probes.measure_gpu_gbps() is None
    vram, link = gpu_probes.measure_llama_gpu_gbps(stories_model, steps=4, block_tokens=64)
    assert vram > 0 and link > 0
    from kvres.actors.sizing.device_memory import DeviceMemory

    fake = DeviceMemory("CUDA0", "a GPU", "gpu", 1 << 30, 1 << 30)  # what a GPU build would list
    monkeypatch.setattr(gpu_probes, "gpu_device", lambda: fake)
    monkeypatch.setattr(gpu_probes, "_torch_cuda", lambda: None)
    monkeypatch.setattr(probes, "measure_host_ram_gbps", lambda: 12.5)
    measured: list[object] = []
    monkeypatch.setattr(gpu_probes, "measure_llama_gpu_gbps",
                        lambda path, main_gpu=None: measured.append(path) or (900.0, 25.0))
    assert gpu_probes.measure_gpu_gbps(stories_model) == (900.0, 25.0) and measured == [stories_model]
    with caplog.at_level("WARNING", logger="kvres.tiering"):
        p = load_probes(env=_env(tmp_path), engine_probes=False)
    assert (p.vram_gbps, p.pcie_gbps) == (gpu_probes.FALLBACK_VRAM_GBPS, gpu_probes.FALLBACK_PCIE_GBPS)
    assert p.sources["vram_gbps"] == p.sources["pcie_gbps"] == "default"
    assert "fallback" in caplog.text and "KVRES_VRAM_GBPS" in caplog.text
    assert "vram_gbps" not in json.loads(Path(p.cache_file or "").read_text())


def test_engine_probes_cached_per_model(tmp_path: Path, stories_model: Path) -> None:
    env = _env(tmp_path, KVRES_HOST_RAM_GBPS="11.5")
    p = load_probes(stories_model, env=env)
    assert p.prefill_tokens_per_s and p.prefill_tokens_per_s > 0
    assert p.import_gbps and p.import_gbps > 0 and p.import_latency_s is not None
    assert p.sources["c_engage_ms"] == "measured" and p.sources["model"] == "measured"
    again = load_probes(stories_model, env=env)
    assert again.sources["c_engage_ms"] == "cached" and again.sources["model"] == "cached"
    assert again.prefill_tokens_per_s == p.prefill_tokens_per_s
    assert list(json.loads(Path(p.cache_file or "").read_text())["models"]) == [model_key(stories_model, ONE_THREAD_CPU)]


def test_c_engage_is_measured_for_each_model(tmp_path: Path, stories_model: Path, wide_kv_model: Path) -> None:
    """A spilled tail costs each model its own: a second model on the same device measures its own
    c_engage instead of reusing the first one's."""
    env = _env(tmp_path, KVRES_HOST_RAM_GBPS="11.5")
    small = load_probes(stories_model, env=env)
    wide = load_probes(wide_kv_model, env=env)
    assert small.sources["c_engage_ms"] == wide.sources["c_engage_ms"] == "measured"
    models = json.loads(Path(wide.cache_file or "").read_text())["models"]
    assert {k: v["c_engage_ms"] for k, v in models.items()} == {
        model_key(stories_model, ONE_THREAD_CPU): small.c_engage_ms,
        model_key(wide_kv_model, ONE_THREAD_CPU): wide.c_engage_ms}
    assert load_probes(stories_model, env=env).sources["c_engage_ms"] == "cached"


def test_recall_vs_recompute_with_real_costs(stories_model: Path, tmp_path: Path) -> None:
    """A real exported block of stories260K: its bytes, the measured import cost and prefill rate."""
    p = load_probes(stories_model, env=_env(tmp_path, KVRES_HOST_RAM_GBPS="11.5", KVRES_C_ENGAGE_MS="0.1"))
    assert p.import_gbps is not None and p.import_latency_s is not None and p.prefill_tokens_per_s
    with probe_context(stories_model, n_ctx=136) as eng:

        def next_logits() -> np.ndarray:  # decode one probe token at 128, keep its logits, drop it
            out = eng.decode([7], 128)
            eng.rm(0, 128, -1)
            return out

        eng.decode(eng.tokens(128), 0)
        reference = next_logits()
        blob = eng.export(64, 128)
        eng.rm(0, 64, -1)
        eng.admit(blob)  # the recall path: the block comes back exactly
        assert np.array_equal(next_logits(), reference)
    assert len(blob) > 64 * 640
    tier = TierCost("ram", p.import_gbps, p.import_latency_s)
    prefill = PrefillCost(p.prefill_tokens_per_s, p.prefill_fixed_s or 0.0)
    d = recall_or_recompute(len(blob), 64, tier, prefill)
    assert d.recall_s > 0 and d.recompute_s > 0
    assert d.action == ("recall" if d.recall_s <= d.recompute_s else "recompute")
    # the same block behind a slow, high-latency tier (a cold disk) is recomputed instead
    disk = TierCost("disk", bandwidth_gbps=0.05, latency_s=d.recompute_s * 2)
    assert recall_or_recompute(len(blob), 64, disk, prefill).action == "recompute"


def test_model_figures_are_kept_per_probe_engine(tmp_path: Path, stories_model: Path) -> None:
    """Prefill on two threads is not prefill on one: each probe engine measures and caches its own."""
    env = _env(tmp_path, KVRES_HOST_RAM_GBPS="11.5", KVRES_C_ENGAGE_MS="0.1")
    one = probes.load_model_figures(stories_model, env=env, c_engage=False)
    two = probes.load_model_figures(stories_model, env=env, c_engage=False, engine=ProbeEngine(n_threads=2))
    assert one[1] == two[1] == {"prefill_tokens_per_s", "prefill_fixed_s", "import_gbps", "import_latency_s"}
    models = json.loads(probe_cache.cache_path(env).read_text())["models"]
    assert set(models) == {model_key(stories_model, ONE_THREAD_CPU), model_key(stories_model, ProbeEngine(2))}
    assert probes.load_model_figures(stories_model, env=env, engine=ProbeEngine(2), c_engage=False) == (two[0], frozenset())
    nothing = probes.load_model_figures(stories_model, env=env, engine=ProbeEngine(3), measure=False)
    assert nothing == ({}, frozenset())


def test_probe_engine_bad_values_are_named() -> None:
    with pytest.raises(ProbeError, match="n_threads=0"):
        ProbeEngine(n_threads=0)
    with pytest.raises(ProbeError, match="n_gpu_layers=-1"):
        ProbeEngine(n_gpu_layers=-1)


def test_cache_updates_merge_instead_of_replacing(tmp_path: Path) -> None:
    """Two writers (a backend's probe child and a T* choice) each keep what they measured."""
    path = tmp_path / "probes-x.json"
    probe_cache.update_cache(path, "x", {"host_ram_gbps": 10.0, "models": {"a": {"import_gbps": 1.0}}})
    probe_cache.update_cache(path, "x", {"models": {"a": {"c_engage_ms": 0.2}, "b": {"import_gbps": 2.0}}})
    data = probe_cache.read_cache(path)
    assert data["host_ram_gbps"] == 10.0 and data["device"] == "x"
    assert data["models"] == {"a": {"import_gbps": 1.0, "c_engage_ms": 0.2}, "b": {"import_gbps": 2.0}}
    path.write_text(json.dumps({**data, "version": probe_cache.CACHE_VERSION - 1}))
    assert probe_cache.read_cache(path) == {}  # another version's figures are not used
