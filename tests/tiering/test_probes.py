"""Probes: host RAM bandwidth, the per-device cache, env overrides, and llama.cpp micro-benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvres.actors import probes
from kvres.actors.model_files import model_id
from kvres.actors.probes import ProbeError, load_probes, measure_c_engage, measure_host_ram_gbps
from kvres.actors.tier_env import EnvValueError
from kvres.policy.recall import PrefillCost, TierCost, recall_or_recompute


def test_host_ram_bandwidth_is_plausible() -> None:
    gbps = measure_host_ram_gbps(buffer_bytes=64 * 1024**2, repeats=3)
    assert 0.5 <= gbps <= 500.0


def test_an_elided_copy_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes.np, "copyto", lambda dst, src: None)
    with pytest.raises(ProbeError, match="checksum"):
        measure_host_ram_gbps(buffer_bytes=1024**2, repeats=1)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"KVRES_CACHE_DIR": str(tmp_path), **extra}


def test_cache_written_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "measure_host_ram_gbps", lambda: 12.5)
    first = load_probes(env=_env(tmp_path), engine_probes=False)
    path = Path(first.cache_file or "")
    assert path.parent == tmp_path and path.name == f"probes-{probes.device_key()}.json"
    data = json.loads(path.read_text())
    assert data["host_ram_gbps"] == 12.5 and data["device"] == first.device
    assert first.sources["host_ram_gbps"] == "measured"
    assert first.c_engage_ms == probes.DEFAULT_C_ENGAGE_MS and first.sources["c_engage_ms"] == "default"
    if not probes.gpu_present():  # this machine: no device link, the "device" is host RAM
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


def test_c_engage_micro_benchmark(stories_model: Path) -> None:
    m = measure_c_engage(stories_model, n_prompt=96, tails=(8, 32, 64), steps=6)
    assert np.isfinite(m.c_engage_s) and m.c_engage_s >= 0
    assert m.tail_bytes == tuple(sorted(m.tail_bytes)) and m.tail_bytes[0] > 8 * 640
    assert m.resident_step_s > 0 and all(s > 0 for s in m.spill_step_s)


def test_engine_probes_cached_per_model(tmp_path: Path, stories_model: Path) -> None:
    env = _env(tmp_path, KVRES_HOST_RAM_GBPS="11.5")
    p = load_probes(stories_model, env=env)
    assert p.prefill_tokens_per_s and p.prefill_tokens_per_s > 0
    assert p.import_gbps and p.import_gbps > 0 and p.import_latency_s is not None
    assert p.sources["c_engage_ms"] == "measured" and p.sources["model"] == "measured"
    again = load_probes(stories_model, env=env)
    assert again.sources["c_engage_ms"] == "cached" and again.sources["model"] == "cached"
    assert again.prefill_tokens_per_s == p.prefill_tokens_per_s
    assert list(json.loads(Path(p.cache_file or "").read_text())["models"]) == [model_id(stories_model)]


def test_recall_vs_recompute_with_real_costs(stories_model: Path, tmp_path: Path) -> None:
    """A real exported block of stories260K: its bytes, the measured import cost and prefill rate."""
    p = load_probes(stories_model, env=_env(tmp_path, KVRES_HOST_RAM_GBPS="11.5", KVRES_C_ENGAGE_MS="0.1"))
    assert p.import_gbps is not None and p.import_latency_s is not None and p.prefill_tokens_per_s
    with probes._engine(stories_model, n_ctx=136) as eng:

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
