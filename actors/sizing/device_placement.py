"""Where a backend's engine runs: the GPUs Ray assigned its actor, turned into engine parameters.

Primitives:
- ``assigned_gpu_ids() -> list[str]``: ``ray.get_gpu_ids()`` inside a Ray worker, [] elsewhere.
- ``Placement(gpu_ids, n_gpu_layers, main_gpu, openvino_device)``; ``placement_for(config,
  gpu_ids, env=os.environ)``:
  - llama.cpp: with GPUs, every layer is offloaded (``n_gpu_layers`` 999 unless the config says
    otherwise) and ``main_gpu`` is the first assigned GPU as the process sees it: Ray narrows
    ``CUDA_VISIBLE_DEVICES`` to the assigned ids, so that is index 0 (its position in
    ``CUDA_VISIBLE_DEVICES`` when that lists more, the raw id when
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` keeps every GPU visible). Without GPUs nothing
    is offloaded (``n_gpu_layers`` 0), so a GPU build never grabs a GPU Ray gave to another actor.
  - OpenVINO: ``openvino_device`` from the config; a bare "GPU" becomes "GPU.<first assigned id>".
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvres.actors.config import BackendConfig

ALL_LAYERS = 999  # llama.cpp clamps it to the model's layer count (+ the output layer)


def assigned_gpu_ids() -> list[str]:
    import ray

    if not ray.is_initialized():
        return []
    try:
        return [str(i) for i in ray.get_gpu_ids()]
    except Exception:  # not inside a worker (a driver): no GPU was assigned to this process
        return []


@dataclass(frozen=True)
class Placement:
    gpu_ids: tuple[str, ...]
    n_gpu_layers: int
    main_gpu: int | None
    openvino_device: str


def _main_gpu(first: str, env: Mapping[str, str]) -> int:
    if env.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"):
        return int(first)
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible.index(first) if first in visible else 0


def placement_for(
    config: BackendConfig, gpu_ids: Sequence[str], env: Mapping[str, str] | None = None
) -> Placement:
    env = os.environ if env is None else env
    ids = tuple(str(i) for i in gpu_ids)
    if ids:
        layers = ALL_LAYERS if config.n_gpu_layers is None else config.n_gpu_layers
        main: int | None = _main_gpu(ids[0], env)
    else:
        layers, main = 0 if config.n_gpu_layers is None else config.n_gpu_layers, None
    device = config.openvino_device
    if device.upper() == "GPU" and ids:
        device = f"GPU.{ids[0]}"
    return Placement(ids, layers, main, device)
