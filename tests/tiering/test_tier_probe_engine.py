"""T*'s probes on the backend's own device and thread count: the engine registry names the probe
engine from the backend's config and placement, and the model's figures (c_engage, prefill,
import) of a multi-threaded backend are measured in a probe child, never in the backend's process
(where only the step loop may decode with more than one thread), then read from the probe cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import engine_spec, llama_threads
from kvres.actors.backend_setup.kv_config import resolve_kv_tier
from kvres.actors.config import BackendConfig
from kvres.actors.default_model import write_tiny_model
from kvres.actors.sizing import probes
from kvres.actors.sizing.device_placement import Placement
from kvres.actors.sizing.llama_probes import ProbeEngine
from kvres.actors.sizing.probe_cache import model_key

CPU = Placement((), 0, None, "CPU")
GPU = Placement((0,), 999, 0, "CPU")


def test_the_probe_engine_is_the_backends_own() -> None:
    probe = engine_spec("llama").tier_probe
    assert probe is not None
    assert probe(BackendConfig(n_threads=3), CPU) == ProbeEngine(3, 0, None)
    assert probe(BackendConfig(n_threads=3), GPU) == ProbeEngine(3, 999, 0)
    default = BackendConfig()
    assert probe(default, CPU).n_threads == llama_threads(default) >= 1  # the executor's default
    assert engine_spec("openvino").tier_probe is None  # no T* choice there


def test_a_multi_threaded_backend_measures_its_tier_figures_in_a_child(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")  # 256 bytes of f16 KV per token
    env = {"KVRES_KV_AUTO_TIER": "1", "KVRES_CACHE_DIR": str(tmp_path / "cache"), "KVRES_HOST_RAM_GBPS": "10",
           "KVRES_VRAM_GBPS": "10", "KVRES_PCIE_GBPS": "12"}

    def in_this_process(*_a: object, **_k: object) -> None:
        raise AssertionError("a T* figure was measured in the backend's process")

    for name in ("measure_c_engage", "measure_prefill_cost", "measure_import_cost"):
        monkeypatch.setattr(probes, name, in_this_process)  # the child process is not patched
    config = BackendConfig(model_path=model, n_ctx=4094, kv_memory_bytes=700_000, n_seq_max=1, n_threads=2)
    tuned, decision = resolve_kv_tier(config, model, env=env, placement=CPU)
    assert decision is not None and decision.c_engage_s >= 0
    [cache] = (tmp_path / "cache").rglob("probes-*.json")
    models = json.loads(cache.read_text())["models"]
    assert list(models) == [model_key(model, ProbeEngine(2))]  # two threads, as the backend decodes
    assert {"c_engage_ms", "prefill_tokens_per_s", "import_gbps"} <= set(models[model_key(model, ProbeEngine(2))])
    assert (tuned.type_k, tuned.type_v) == (decision.chosen.type_k, decision.chosen.type_v)
