"""The GPU, where one exists: which it is, and its memory and host link bandwidths.

Primitives:
- ``gpu_device()``: llama.cpp's first GPU-like device (its own device list, no torch), else None;
  ``gpu_present()`` (that, or ``/dev/nvidia0``), ``gpu_name()``.
- ``measure_gpu_gbps(model_path=None, ..., main_gpu=None)``: (device memory GB/s, host -> device
  GB/s) where a GPU exists: through torch when it is installed with CUDA (device copies, pinned
  host memory), else through llama.cpp (``measure_llama_gpu_gbps``: a fully offloaded decode step
  reads every active weight once, so weights / step time is the device bandwidth decode sees; a KV
  block written into the offloaded cache crosses the link). None without a GPU (no device link) or,
  on a GPU, without torch and without a model: ``kvres.actors.sizing.probes.load_probes`` then
  takes the documented fallback figures (``FALLBACK_VRAM_GBPS``, ``FALLBACK_PCIE_GBPS``).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .device_memory import DeviceMemory, llama_gpu_memory
from .llama_probes import ProbeEngine, probe_context
from .probe_common import ProbeError, check_plausible

FALLBACK_VRAM_GBPS = 300.0  # a GPU that cannot be measured: a conservative current-generation figure
FALLBACK_PCIE_GBPS = 12.0  # PCIe 3.0 x16 in practice; KVRES_VRAM_GBPS / KVRES_PCIE_GBPS replace both


def gpu_device() -> DeviceMemory | None:
    """The first GPU-like device llama.cpp's ggml backends see (a CPU-only build sees none)."""
    try:
        return llama_gpu_memory(0)
    except (OSError, AttributeError):  # llama_cpp without its ggml library: no device list
        return None


def _torch_cuda() -> Any:
    try:
        import torch
    except Exception:  # not installed, or broken
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def gpu_present() -> bool:
    return gpu_device() is not None or Path("/dev/nvidia0").exists()


def gpu_name() -> str | None:
    device = gpu_device()
    if device is not None:
        return device.description or device.name
    if not Path("/dev/nvidia0").exists():
        return None
    torch = _torch_cuda()
    return None if torch is None else str(torch.cuda.get_device_name(0))


def _measure_torch_gbps(torch: Any, n_bytes: int, repeats: int) -> tuple[float, float]:
    src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    host = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True)
    host.random_(0, 255)

    def best_time(fn: Any) -> float:
        fn()
        torch.cuda.synchronize()
        best = math.inf
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return best

    vram = 2 * n_bytes / best_time(lambda: dst.copy_(src)) / 1e9
    pcie = n_bytes / best_time(lambda: src.copy_(host, non_blocking=True)) / 1e9
    if int(src[:4096].sum().item()) != int(host[:4096].sum().item()):
        raise ProbeError("PCIe probe: device copy differs from the host buffer")
    return vram, pcie


def measure_llama_gpu_gbps(
    model_path: str | os.PathLike[str], n_gpu_layers: int = 999, steps: int = 20, block_tokens: int = 256,
    main_gpu: int | None = None,
) -> tuple[float, float]:
    """(device GB/s, host -> device GB/s) through llama.cpp, no torch needed.

    Device: one-token decode steps of the model with ``n_gpu_layers`` offloaded read every active
    weight (``kvres.actors.model_files.active_weight_bytes_of``) once: bytes / median step time.
    Link: a ``block_tokens`` KV block exported to host memory and written back into the offloaded
    cache (``llama_state_seq_set_data``): bytes / median time. On a CPU-only build both are host
    figures (everything stays in host memory)."""
    from kvres.actors.model_files import active_weight_bytes_of

    weights = active_weight_bytes_of(model_path)
    engine = ProbeEngine(n_gpu_layers=n_gpu_layers, main_gpu=main_gpu)
    with probe_context(model_path, n_ctx=block_tokens + 16, n_batch=block_tokens, engine=engine) as eng:
        eng.decode(eng.tokens(block_tokens), 0)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            eng.decode([5], block_tokens)
            times.append(time.perf_counter() - t0)
            eng.rm(0, block_tokens, -1)
        blob = eng.export(0, block_tokens)
        writes = []
        for _ in range(max(3, steps // 4)):
            t0 = time.perf_counter()
            if not eng.ctx.state_set(1, blob):
                raise ProbeError("llama_state_seq_set_data refused the probe block")
            writes.append(time.perf_counter() - t0)
            eng.rm(1, -1, -1)
    vram = weights / max(float(np.median(times)), 1e-9) / 1e9
    link = len(blob) / max(float(np.median(writes)), 1e-9) / 1e9
    check_plausible("device memory bandwidth (llama.cpp decode)", vram)
    check_plausible("host -> device bandwidth (llama.cpp KV write)", link)
    return vram, link


def measure_gpu_gbps(
    model_path: str | os.PathLike[str] | None = None, n_bytes: int = 512 * 1024**2, repeats: int = 5,
    main_gpu: int | None = None,
) -> tuple[float, float] | None:
    """(device memory GB/s, host -> device GB/s) where a GPU exists, else None (see the module
    docstring for the torch and llama.cpp paths). A device-to-device copy of ``n_bytes`` counts
    2 * n bytes of traffic (read and write; what decode does with weights and KV)."""
    if not gpu_present():
        return None
    torch = _torch_cuda()
    if torch is not None:
        vram, pcie = _measure_torch_gbps(torch, n_bytes, repeats)
    elif model_path is not None and gpu_device() is not None:
        vram, pcie = measure_llama_gpu_gbps(model_path, main_gpu=main_gpu)
    else:
        return None
    check_plausible("device memory bandwidth", vram)
    check_plausible("PCIe bandwidth", pcie)
    return vram, pcie
