"""kvres.actors.engines.openvino: the OpenVINO backend (converter, stateful IR, executors).

Primitives:
- ``openvino_executor(model_path, mode="state"|"recompute", **options)``: the executor of a
  mechanism, ``StateExecutor`` (state slicing) or ``RecomputeExecutor`` (re-prefill), both
  ``OpenVINOExecutor``; ``RecomputeError``; ``CompiledModelCache`` (compiled models they share).
- ``convert_gguf_to_ir(gguf_path, out_dir, attention=...)``, ``build_llama_model(weights)``,
  ``read_llama_gguf(path)``, ``load_model(path)``.
- ``rotate_keys`` / ``RopeParams``: numpy RoPE re-basing of cached keys.
- openvino-genai mode: ``export_genai_model(gguf_path, out_dir)``, ``GenAIEngine``,
  ``EngineEviction`` (genai's CacheEvictionConfig, "let the engine evict"); ``GenAIExecutor`` lives
  in ``genai_executor``; ``TextCodec``.

Importing this package imports openvino (a dependency of the ``openvino`` extra).
"""

from .base_executor import OpenVINOExecutor, RecomputeError
from .compiled import CompiledModelCache
from .convert import convert_gguf_to_ir
from .genai import EngineEviction, GenAIEngine, export_genai_model
from .gguf_weights import LlamaConfig, LlamaWeights, read_llama_gguf
from .graph import build_llama_model
from .model import LoadedModel, load_model
from .modes import MODES, openvino_executor
from .recompute_mode import RecomputeExecutor
from .rope import RopeParams, rotate_keys
from .state_mode import StateExecutor
from .text import TextCodec

__all__ = [
    "MODES",
    "CompiledModelCache",
    "EngineEviction",
    "GenAIEngine",
    "LlamaConfig",
    "LlamaWeights",
    "LoadedModel",
    "OpenVINOExecutor",
    "RecomputeError",
    "RecomputeExecutor",
    "RopeParams",
    "StateExecutor",
    "TextCodec",
    "build_llama_model",
    "convert_gguf_to_ir",
    "export_genai_model",
    "load_model",
    "openvino_executor",
    "read_llama_gguf",
    "rotate_keys",
]
