"""The engine registry: one spec per engine name, asked instead of branching on the name."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from kvres.actors.backend_setup.engine_registry import (
    ENGINES,
    UnknownEngineError,
    engine_spec,
    llama_cache_cells,
    make_executor,
)
from kvres.actors.backend_setup.kv_budget import kv_device_memory
from kvres.actors.config import BackendConfig
from kvres.actors.sizing.device_placement import Placement
from kvres.actors.sizing.llama_probes import ProbeEngine

ROOT = Path(__file__).resolve().parents[2]
CPU = Placement((), 0, None, "CPU")


def test_every_configurable_engine_has_a_spec() -> None:
    names = typing.get_args(BackendConfig.model_fields["engine"].annotation)
    assert set(ENGINES) == set(names) and all(ENGINES[n].name == n for n in names)
    with pytest.raises(UnknownEngineError, match="'vllm'.*llama, openvino, openvino-genai"):
        engine_spec("vllm")


def test_what_each_engine_says() -> None:
    llama, openvino, genai = ENGINES["llama"], ENGINES["openvino"], ENGINES["openvino-genai"]
    assert llama.kv_tier_choice and llama.recall_probe is not None and llama.cache_cells is not None
    config = BackendConfig(n_seq_max=3)
    assert llama.cache_cells(config) == llama_cache_cells(config)
    for spec in (openvino, genai):  # KV grows with the tokens; no T*, no measured recall costs
        assert not spec.kv_tier_choice and spec.recall_probe is None and spec.cache_cells is None
    assert llama.kv_device(config, CPU) is None and kv_device_memory(config, CPU).kind == "host"
    assert openvino.kv_device(BackendConfig(engine="openvino"), CPU) is None  # the OpenVINO CPU: host RAM


def test_llama_recall_probe_runs_as_the_backend_does(stories_model: Path) -> None:
    config = BackendConfig(model_path=stories_model, n_ctx=256, kv_budget_tokens=256, n_threads=3)
    executor = make_executor(config, stories_model, CPU)
    try:
        probe = ENGINES["llama"].recall_probe
        assert probe is not None and probe(executor, CPU) == ProbeEngine(3, 0, None)
        gpu = Placement(("0",), 999, 0, "CPU")
        assert probe(executor, gpu) == ProbeEngine(3, 999, 0)
    finally:
        executor.close()  # type: ignore[union-attr]


def test_no_engine_name_branches_outside_the_registry() -> None:
    """``config.engine ==`` / ``!=`` lives in the registry only (the package code and the tests):
    there is none anywhere, the specs are looked up by name."""
    pattern = re.compile(r"\bengine\s*[!=]=\s*[\"']")
    found = [f"{p.relative_to(ROOT)}:{i}" for folder in ("actors", "cluster", "policy", "coldstore", "testing", "tests")
             for p in (ROOT / folder).rglob("*.py") if p.name != "engine_registry.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line) and "config." in line]
    assert found == []
