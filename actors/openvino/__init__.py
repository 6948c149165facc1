"""kvres.actors.openvino: the OpenVINO backend (converter, stateful IR, executor).

Primitives:
- ``OpenVINOExecutor(model_path, mode="state"|"recompute", cold_store=None, ...)``, ``RecomputeError``.
- ``convert_gguf_to_ir(gguf_path, out_dir, attention=...)``, ``build_llama_model(weights)``,
  ``read_llama_gguf(path)``, ``load_model(path)``.
- ``BlockParking``: the ``put`` / ``get`` protocol the recompute mode parks evicted blocks in.
- ``rotate_keys`` / ``RopeParams``: numpy RoPE re-basing of cached keys.
- openvino-genai mode: ``export_genai_model(gguf_path, out_dir)``, ``GenAIEngine``,
  ``EngineEviction`` (genai's CacheEvictionConfig, "let the engine evict"); ``TextCodec``.

Importing this package imports openvino (a dependency of the ``openvino`` extra).
"""

from .convert import convert_gguf_to_ir
from .executor import OpenVINOExecutor, RecomputeError
from .genai import EngineEviction, GenAIEngine, export_genai_model
from .gguf_weights import LlamaConfig, LlamaWeights, read_llama_gguf
from .graph import build_llama_model
from .model import LoadedModel, load_model
from .parking import BlockParking
from .rope import RopeParams, rotate_keys
from .text import TextCodec

__all__ = [
    "BlockParking",
    "EngineEviction",
    "GenAIEngine",
    "LlamaConfig",
    "LlamaWeights",
    "LoadedModel",
    "OpenVINOExecutor",
    "RecomputeError",
    "RopeParams",
    "TextCodec",
    "build_llama_model",
    "convert_gguf_to_ir",
    "export_genai_model",
    "load_model",
    "read_llama_gguf",
    "rotate_keys",
]
