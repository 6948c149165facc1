"""The OpenVINO executor's mechanisms by name.

Primitives:
- ``MODES``: mode name -> executor class: ``"state"`` -> ``StateExecutor`` (state slicing),
  ``"recompute"`` -> ``RecomputeExecutor`` (re-prefill).
- ``openvino_executor(model_path, mode="state", **options) -> OpenVINOExecutor``: the executor of
  that mode; ``options`` are ``OpenVINOExecutor``'s (``num_threads``, ``precision``, ...). Raises
  ``ValueError`` naming the known modes.
"""

from __future__ import annotations

import os
from typing import Any

from .base_executor import OpenVINOExecutor
from .recompute_mode import RecomputeExecutor
from .state_mode import StateExecutor

MODES: dict[str, type[OpenVINOExecutor]] = {"state": StateExecutor, "recompute": RecomputeExecutor}


def openvino_executor(model_path: str | os.PathLike[str], mode: str = "state", **options: Any) -> OpenVINOExecutor:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {tuple(MODES)}, got {mode!r}")
    return MODES[mode](model_path, **options)
