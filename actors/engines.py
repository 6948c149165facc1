"""Build the executor a backend config asks for.

Primitives:
- ``make_executor(config, model_path)``: a ``LlamaExecutor`` or an ``OpenVINOExecutor``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvres.cluster.config import BackendConfig


def make_executor(config: BackendConfig, model_path: Path) -> Any:
    if config.engine == "llama":
        from kvres.actors.llama import LlamaExecutor

        return LlamaExecutor(
            str(model_path), n_ctx=config.n_ctx, n_seq_max=config.n_seq_max,
            type_k=config.type_k, type_v=config.type_v, n_threads=config.n_threads,
        )
    from kvres.actors.openvino import OpenVINOExecutor

    return OpenVINOExecutor(str(model_path), mode=config.openvino_mode)
