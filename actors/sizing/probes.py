"""Every measured figure the KV tier choice (T*) and recall-vs-recompute need, in one place.

Primitives:
- ``load_probes(model_path=None, env=os.environ, refresh=False, engine_probes=True,
  engine=ONE_THREAD_CPU) -> ProbeResults``: every figure, measured once per device (and per model
  and probe engine where it depends on them: prefill, import and c_engage) and cached
  (``kvres.actors.sizing.probe_cache``); ``KVRES_HOST_RAM_GBPS``, ``KVRES_PCIE_GBPS``,
  ``KVRES_VRAM_GBPS`` and ``KVRES_C_ENGAGE_MS`` override the figures (and are then not measured).
- ``load_model_figures(model_path, engine=..., env=None, refresh=False, c_engage=True,
  measure=True) -> (figures, measured)``: one model's own figures only (no host or GPU probe)
  and the names of those measured now; ``measure=False`` returns what is cached, measuring nothing.
- ``ProbeResults``: the figures, with where each came from.
- ``DEFAULT_C_ENGAGE_MS``: c_engage where no model is measured (docs/policies.md, T*).

The measurements themselves: ``host_ram_probe``, ``gpu_probes``, ``llama_probes``, ``disk_probe``;
recall costs from these figures: ``recall_costs``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvres.policy.tiering import Link, effective_bandwidth

from .gpu_probes import FALLBACK_PCIE_GBPS, FALLBACK_VRAM_GBPS, gpu_name, gpu_present, measure_gpu_gbps
from .host_ram_probe import measure_host_ram_gbps
from .llama_probes import (
    ONE_THREAD_CPU,
    ProbeEngine,
    measure_c_engage,
    measure_import_cost,
    measure_prefill_cost,
)
from .probe_cache import (
    ENV_C_ENGAGE,
    ENV_HOST_RAM,
    ENV_PCIE,
    ENV_VRAM,
    cache_path,
    device_key,
    model_key,
    read_cache,
    update_cache,
)
from .tier_env import env_float

DEFAULT_C_ENGAGE_MS = 0.8  # docs/policies.md, T*: reference figure, used only when no model is measured

logger = logging.getLogger("kvres.tiering")


@dataclass(frozen=True)
class ProbeResults:
    """Every figure the tier choice and recall-vs-recompute need; ``sources`` says where each came
    from: "measured", "cached", "env" or "default"."""

    device: str
    host_ram_gbps: float
    pcie_gbps: float | None
    vram_gbps: float
    c_engage_ms: float
    prefill_tokens_per_s: float | None = None
    prefill_fixed_s: float | None = None
    import_gbps: float | None = None
    import_latency_s: float | None = None
    cache_file: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def bw_eff_gbps(self) -> float:
        return effective_bandwidth(self.host_ram_gbps, self.pcie_gbps)[0]

    @property
    def link(self) -> Link:
        return effective_bandwidth(self.host_ram_gbps, self.pcie_gbps)[1]

    @property
    def c_engage_s(self) -> float:
        return self.c_engage_ms / 1e3


def load_model_figures(
    model_path: str | os.PathLike[str],
    *,
    engine: ProbeEngine = ONE_THREAD_CPU,
    env: Mapping[str, str] | None = None,
    refresh: bool = False,
    c_engage: bool = True,
    measure: bool = True,
) -> tuple[dict[str, float], frozenset[str]]:
    """``model_path``'s figures measured with ``engine``: prefill (``prefill_tokens_per_s``,
    ``prefill_fixed_s``), import (``import_gbps``, ``import_latency_s``) and, with ``c_engage``,
    ``c_engage_ms``; and the names of those measured by this call. Missing ones are measured and
    cached, or left out with ``measure=False``."""
    env = os.environ if env is None else env
    device = device_key()
    path = cache_path(env, device)
    key = model_key(model_path, engine)
    cached = {} if refresh else dict(read_cache(path).get("models", {}).get(key, {}))
    figures = dict(cached)
    if measure:
        if "prefill_tokens_per_s" not in figures:
            figures["prefill_tokens_per_s"], figures["prefill_fixed_s"] = measure_prefill_cost(
                model_path, engine=engine)
        if "import_gbps" not in figures:
            figures["import_gbps"], figures["import_latency_s"] = measure_import_cost(model_path, engine=engine)
        if c_engage and "c_engage_ms" not in figures:
            # the model's own: what a step pays to attend over a spilled tail depends on its layers
            figures["c_engage_ms"] = measure_c_engage(model_path, engine=engine).c_engage_s * 1e3
    measured = frozenset(figures) - frozenset(cached)
    if measured:
        update_cache(path, device, {"models": {key: figures}})
    return figures, measured


def load_probes(
    model_path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    refresh: bool = False,
    engine_probes: bool = True,
    engine: ProbeEngine = ONE_THREAD_CPU,
) -> ProbeResults:
    """Probe results for this device: env overrides, else the cache, else measured (then cached).

    ``model_path`` (a GGUF) is what the llama.cpp micro-benchmarks run, with ``engine``; without
    it c_engage is the reference figure of docs/policies.md, T* (0.8 ms, source "default") and the
    model-specific figures are None.
    ``engine_probes=False`` skips the llama.cpp probes (c_engage then "default").
    """
    env = os.environ if env is None else env
    overrides = {
        "host_ram_gbps": env_float(env, ENV_HOST_RAM, None, strict=True),
        "pcie_gbps": env_float(env, ENV_PCIE, None, strict=True),
        "vram_gbps": env_float(env, ENV_VRAM, None, strict=True),
        "c_engage_ms": env_float(env, ENV_C_ENGAGE, None),
    }
    device = device_key()
    path = cache_path(env, device)
    cached = {} if refresh else read_cache(path)
    changes: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def figure(name: str, measure: Callable[[], Any]) -> Any:
        if overrides.get(name) is not None:
            sources[name] = "env"
            return overrides[name]
        if name in cached:
            sources[name] = "cached"
            return cached[name]
        value = changes[name] = measure()
        sources[name] = "measured"
        return value

    host = figure("host_ram_gbps", measure_host_ram_gbps)
    gpu: tuple[float, float] | None = None
    fallback = False
    need_pcie = overrides["pcie_gbps"] is None and "pcie_gbps" not in cached
    need_vram = overrides["vram_gbps"] is None and "vram_gbps" not in cached
    if need_pcie or need_vram:
        gpu = measure_gpu_gbps(model_path if engine_probes else None, main_gpu=engine.main_gpu)
        if gpu is None and gpu_present():  # a GPU neither torch nor llama.cpp could measure
            gpu, fallback = (FALLBACK_VRAM_GBPS, FALLBACK_PCIE_GBPS), True
            logger.warning(
                "GPU %s: no torch with CUDA and no model to run llama.cpp's probe on; using the fallback "
                "figures vram %.0f GB/s, pcie %.0f GB/s (set %s / %s to the real ones)",
                gpu_name() or "?", FALLBACK_VRAM_GBPS, FALLBACK_PCIE_GBPS, ENV_VRAM, ENV_PCIE,
            )
    pcie = figure("pcie_gbps", lambda: None if gpu is None else gpu[1])
    vram = figure("vram_gbps", lambda: host if gpu is None else gpu[0])  # CPU: the "device" is host RAM
    if fallback:
        for name in ("pcie_gbps", "vram_gbps"):
            if sources.get(name) == "measured":
                sources[name] = "default"
                changes.pop(name, None)  # not cached: measured next time a model or torch is there
    if changes:
        update_cache(path, device, changes)

    model_figs: dict[str, float] = {}
    measured: frozenset[str] = frozenset()
    if model_path is not None and engine_probes:
        model_figs, measured = load_model_figures(
            model_path, engine=engine, env=env, refresh=refresh, c_engage=overrides["c_engage_ms"] is None)
        sources["model"] = "measured" if measured else "cached"
    if overrides["c_engage_ms"] is not None:
        c_ms, sources["c_engage_ms"] = overrides["c_engage_ms"], "env"
    elif "c_engage_ms" in model_figs:
        c_ms = model_figs["c_engage_ms"]
        sources["c_engage_ms"] = "measured" if "c_engage_ms" in measured else "cached"
    else:
        c_ms, sources["c_engage_ms"] = DEFAULT_C_ENGAGE_MS, "default"
    return ProbeResults(
        device=device,
        host_ram_gbps=float(host),
        pcie_gbps=None if pcie is None else float(pcie),
        vram_gbps=float(vram),
        c_engage_ms=float(c_ms),
        prefill_tokens_per_s=model_figs.get("prefill_tokens_per_s"),
        prefill_fixed_s=model_figs.get("prefill_fixed_s"),
        import_gbps=model_figs.get("import_gbps"),
        import_latency_s=model_figs.get("import_latency_s"),
        cache_file=str(path),
        sources=sources,
    )
