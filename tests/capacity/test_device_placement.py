"""GPUs Ray assigns a backend reach its engine: llama.cpp layer offload and main device, OpenVINO's
device. This machine has no GPU, so the tests check that the parameters arrive where the engine
takes them (llama.cpp's model parameters, OpenVINO's compile_model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openvino as ov
import pytest

from kvres.actors.backend_setup.engine_registry import make_executor
from kvres.actors.config import BackendConfig
from kvres.actors.sizing.device_placement import ALL_LAYERS, Placement, assigned_gpu_ids, placement_for


def test_placement_from_ray_gpu_ids() -> None:
    config = BackendConfig(num_gpus=1)
    assert placement_for(config, [], {}) == Placement((), 0, None, "CPU")
    # Ray narrows CUDA_VISIBLE_DEVICES to the actor's GPUs: the first one is device 0 in-process
    assert placement_for(config, ["2"], {"CUDA_VISIBLE_DEVICES": "2"}) == Placement(("2",), ALL_LAYERS, 0, "CPU")
    assert placement_for(config, ["3", "1"], {"CUDA_VISIBLE_DEVICES": "1,3"}).main_gpu == 1
    assert placement_for(config, ["2"], {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}).main_gpu == 2
    partial = BackendConfig(num_gpus=1, n_gpu_layers=12, openvino_device="GPU")
    assert placement_for(partial, ["1"], {}) == Placement(("1",), 12, 0, "GPU.1")
    assert placement_for(BackendConfig(openvino_device="GPU.0"), [], {}).openvino_device == "GPU.0"
    assert assigned_gpu_ids() == []  # not inside a Ray worker


def test_llama_offload_parameters_reach_the_model(stories_model: Path) -> None:
    config = BackendConfig(model_path=stories_model, n_ctx=256, kv_budget_tokens=128, n_seq_max=1, n_threads=1)
    gpu = Placement(("0",), ALL_LAYERS, 0, "CPU")
    executor = make_executor(config, stories_model, gpu)
    try:
        model = executor._model  # type: ignore[union-attr]
        assert (model.n_gpu_layers, model.main_gpu) == (ALL_LAYERS, 0)  # read back from llama_model_params
        executor.open_session("s")
        assert executor.append("s", [1, 5, 9]).shape[0] > 0  # a CPU build runs it all on the CPU
    finally:
        executor.close()  # type: ignore[union-attr]
    cpu = make_executor(config, stories_model, Placement((), 0, None, "CPU"))
    try:
        assert cpu._model.n_gpu_layers == 0  # type: ignore[union-attr]
    finally:
        cpu.close()  # type: ignore[union-attr]


def test_openvino_device_reaches_compile_model(stories_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    devices: list[str] = []
    compile_model = ov.Core.compile_model

    def recording(self: ov.Core, model: Any, device: str = "CPU", config: Any = None) -> Any:
        devices.append(device)
        return compile_model(self, model, "CPU", config or {})  # no GPU here: compile for the CPU

    monkeypatch.setattr(ov.Core, "compile_model", recording)
    config = BackendConfig(engine="openvino", model_path=stories_model, n_threads=1, openvino_device="GPU")
    executor = make_executor(config, stories_model, placement_for(config, ["1"], {}))
    assert devices == ["GPU.1"] and executor.device == "GPU.1"  # type: ignore[union-attr]
