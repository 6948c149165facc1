"""The engine registry: one spec per engine kvres runs, how to build its executor and what sizing
needs to know of it, looked up by name here and nowhere else.

Primitives:
- ``EngineSpec``: one engine: ``build(config, model_path, placement)`` its executor;
  ``kv_profiles(config, model_path, type_k, type_v) -> (allocation, resident)`` for sizing;
  ``kv_device(config, placement)`` the device memory its KV lives in (None: host RAM);
  ``cache_cells(config)`` how it allocates a fixed cache for a context (llama.cpp), None when its
  KV grows with the tokens; ``kv_tier_choice`` whether T* may choose its KV types;
  ``recall_probe(executor, placement)`` the ``ProbeEngine`` its recall costs are measured with,
  None when it takes no measured costs (it reads every cold block); ``tier_probe(config, placement)``
  the ``ProbeEngine`` T*'s probes measure with before the executor exists (the backend's own
  threads and offload: ``llama_threads(config)``); ``engine_evicts`` whether it evicts by itself
  (kvres does not address its KV: what a ``LoadReport`` tells placement); ``kv_layouts`` whether
  it has KV layouts to choose between (llama.cpp's unified and split, ``kv_layout_choice``).
- ``ENGINES``: the table, "llama", "openvino", "openvino-genai"; ``engine_spec(name)`` (an
  ``UnknownEngineError`` naming the name and the known ones).
- ``kv_layout_of(config, model_path=None, spills=False, evicting_sessions=False)``: the
  ``LayoutChoice`` the config runs (its own layout, else the one its sizes choose), None where its
  engine has no layouts.
- ``make_executor(config, model_path, placement=None)``: the engine's executor (a
  ``LlamaExecutor`` with layers offloaded and main GPU from the placement, an OpenVINO executor
  of the configured mechanism on the placement's device, or a ``GenAIExecutor``: the engine
  evicts). Without a placement it is taken from the GPUs Ray assigned this process
  (``kvres.actors.sizing.device_placement``).
- llama.cpp's cache as the llama executor creates it (``kvres.actors.engines.llama.cache_shape``),
  from a config: ``llama_cache_cells(config)``, ``llama_spare_streams(config)``; a config that
  leaves the KV layout to kvres gets the one its sizes choose (``kv_layout_choice``).

Callers ask here instead of branching on the name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvres.actors.config import BackendConfig
from kvres.actors.engines.executor import EngineManagedExecutor, Executor
from kvres.actors.engines.llama import cache_shape
from kvres.actors.sizing.device_memory import DeviceMemory, llama_gpu_memory, openvino_device_memory
from kvres.actors.sizing.device_placement import Placement, assigned_gpu_ids, placement_for
from kvres.policy.capacity import LayerKVProfile
from kvres.policy.errors import KvresError
from kvres.policy.kv_layout import CacheCells

from .kv_layout_choice import LayoutChoice, llama_kv_layout

if TYPE_CHECKING:
    from kvres.actors.sizing.llama_probes import ProbeEngine

AnyExecutor = Executor | EngineManagedExecutor


class UnknownEngineError(KvresError, ValueError):
    """A backend names an engine the registry does not know."""


@dataclass(frozen=True)
class EngineSpec:
    name: str
    build: Callable[[BackendConfig, Path, Placement], AnyExecutor]
    kv_profiles: Callable[[BackendConfig, Path, str, str], tuple[LayerKVProfile, LayerKVProfile]]
    kv_device: Callable[[BackendConfig, Placement | None], DeviceMemory | None]
    cache_cells: Callable[[BackendConfig], CacheCells] | None = None
    kv_tier_choice: bool = False
    recall_probe: Callable[[AnyExecutor, Placement], ProbeEngine] | None = None
    tier_probe: Callable[[BackendConfig, Placement], ProbeEngine] | None = None
    engine_evicts: bool = False
    kv_layouts: bool = False


# -- llama.cpp ------------------------------------------------------------------------------------

def _llama_build(config: BackendConfig, model_path: Path, placement: Placement) -> AnyExecutor:
    from kvres.actors.engines.llama import LlamaExecutor
    from kvres.actors.pins import check_llama_cpp_python

    check_llama_cpp_python()
    return LlamaExecutor(
        str(model_path), n_ctx=config.n_ctx, n_seq_max=config.n_seq_max,
        type_k=config.type_k, type_v=config.type_v, n_threads=config.n_threads,
        n_gpu_layers=placement.n_gpu_layers, main_gpu=placement.main_gpu, kv_layout=llama_kv_layout(config, model_path).layout,
        flash_attn=config.flash_attn,
    )


def llama_spare_streams(config: BackendConfig) -> int:
    """The streams a split layout has beside its sessions' (one to move them through, from
    ``cache_shape.SPARE_STREAM_SESSIONS`` sessions on), each as large as a session's."""
    return cache_shape.spare_streams(llama_kv_layout(config).layout, config.n_seq_max)


def llama_cache_cells(config: BackendConfig) -> CacheCells:
    return cache_shape.cache_cells(llama_kv_layout(config).layout, config.n_seq_max)


def _llama_profiles(config: BackendConfig, model_path: Path, type_k: str, type_v: str
                    ) -> tuple[LayerKVProfile, LayerKVProfile]:
    from kvres.actors.model_files import layout_from_gguf

    layout = layout_from_gguf(model_path)
    return (layout.profile(type_k, type_v, llama_cache_cells(config)),
            layout.profile(type_k, type_v).for_sessions(config.n_seq_max))


def _llama_kv_device(config: BackendConfig, placement: Placement | None) -> DeviceMemory | None:
    if placement is not None and placement.gpu_ids and placement.n_gpu_layers:
        return llama_gpu_memory(placement.main_gpu or 0)
    return None


def _llama_recall_probe(executor: AnyExecutor, placement: Placement) -> ProbeEngine:
    """The backend's own decode threads and offload (the probes then measure what it runs)."""
    from kvres.actors.engines.llama import LlamaExecutor
    from kvres.actors.sizing.llama_probes import ProbeEngine

    if not isinstance(executor, LlamaExecutor):
        raise TypeError(f"a llama backend's executor must be a LlamaExecutor, got {type(executor).__name__}")
    return ProbeEngine(executor.n_threads, placement.n_gpu_layers, placement.main_gpu)


def llama_threads(config: BackendConfig) -> int:
    """The decode threads a llama backend runs with (``LlamaExecutor``'s default when unset)."""
    return config.n_threads or cache_shape.default_threads()


def _llama_tier_probe(config: BackendConfig, placement: Placement) -> ProbeEngine:
    """T*'s probes before the executor exists: the backend's own threads, offload and main GPU."""
    from kvres.actors.sizing.llama_probes import ProbeEngine

    return ProbeEngine(llama_threads(config), placement.n_gpu_layers, placement.main_gpu)


# -- OpenVINO -------------------------------------------------------------------------------------

def _openvino_build(config: BackendConfig, model_path: Path, placement: Placement) -> AnyExecutor:
    from kvres.actors.engines.openvino import openvino_executor

    return openvino_executor(model_path, mode=config.openvino_mode, num_threads=config.n_threads or 1,
                             device=placement.openvino_device)


def _genai_build(config: BackendConfig, model_path: Path, placement: Placement) -> AnyExecutor:
    from kvres.actors.engines.openvino.genai_executor import GenAIExecutor

    return GenAIExecutor(model_path, num_threads=config.n_threads or 1)


def _openvino_profiles(config: BackendConfig, model_path: Path, type_k: str, type_v: str
                       ) -> tuple[LayerKVProfile, LayerKVProfile]:
    """KV states grow with the tokens: no fixed cache; the profile of the model's IR (the KV types
    are the IR's own)."""
    from kvres.actors.engines.openvino import openvino_executor

    executor = openvino_executor(model_path, mode=config.openvino_mode, device=config.openvino_device,
                                 num_threads=config.n_threads or 1)
    profile = executor.kv_profile()
    return profile, profile.for_sessions(config.n_seq_max)


def _openvino_kv_device(config: BackendConfig, placement: Placement | None) -> DeviceMemory | None:
    return openvino_device_memory(placement.openvino_device if placement is not None else config.openvino_device)


ENGINES: Mapping[str, EngineSpec] = {
    "llama": EngineSpec("llama", _llama_build, _llama_profiles, _llama_kv_device, cache_cells=llama_cache_cells,
                        kv_tier_choice=True, recall_probe=_llama_recall_probe, tier_probe=_llama_tier_probe,
                        kv_layouts=True),
    "openvino": EngineSpec("openvino", _openvino_build, _openvino_profiles, _openvino_kv_device),
    "openvino-genai": EngineSpec("openvino-genai", _genai_build, _openvino_profiles, _openvino_kv_device,
                                 engine_evicts=True),
}


def engine_spec(name: str) -> EngineSpec:
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownEngineError(f"unknown engine {name!r}; kvres runs {', '.join(ENGINES)}") from None


def kv_layout_of(config: BackendConfig, model_path: Path | None = None, spills: bool = False,
                 evicting_sessions: bool = False) -> LayoutChoice | None:
    """The KV layout the config runs (its own, else the one its sizes choose), None where its
    engine has no layouts."""
    if not engine_spec(config.engine).kv_layouts:
        return None
    return llama_kv_layout(config, model_path, spills=spills, evicting_sessions=evicting_sessions)


def make_executor(config: BackendConfig, model_path: Path, placement: Placement | None = None) -> AnyExecutor:
    if placement is None:
        placement = placement_for(config, assigned_gpu_ids())
    return engine_spec(config.engine).build(config, model_path, placement)
