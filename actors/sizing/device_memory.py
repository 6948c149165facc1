"""Free and total memory of the devices a backend can keep KV on, without torch.

Primitives:
- ``DeviceMemory(name, description, kind, free_bytes, total_bytes)``; ``kind`` is "cpu", "gpu",
  "igpu", "accel" or "host".
- ``host_memory()``: host RAM from ``/proc/meminfo`` (``MemAvailable`` is what is free).
- ``llama_devices()``: every device llama.cpp's ggml backends see (``ggml_backend_dev_memory``
  through ctypes on llama-cpp-python's own ``libggml``); a CPU-only build lists just the CPU.
- ``llama_gpu_memory(index)``: the ``index``-th GPU-like llama.cpp device, None without one.
- ``openvino_device_memory(device)``: an OpenVINO GPU's memory (its plugin reports the total only,
  so free = total), None for the CPU (host memory then).
- ``GPU_KINDS``: the kinds that are not host memory.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

GPU_KINDS = frozenset({"gpu", "igpu", "accel"})
_DEV_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # ggml_backend_dev_type


@dataclass(frozen=True)
class DeviceMemory:
    name: str
    description: str
    kind: str
    free_bytes: int
    total_bytes: int


def host_memory(meminfo: Path = Path("/proc/meminfo")) -> DeviceMemory:
    fields: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    total = fields.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    free = fields.get("MemAvailable", fields.get("MemFree", total))
    return DeviceMemory("host", "host RAM", "host", int(free), int(total))


def _ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    import llama_cpp

    from kvres.actors.engines.llama.library import load_llama

    load_llama()  # backends registered
    lib = Path(llama_cpp.__file__).parent / "lib"
    reg, base = ctypes.CDLL(str(lib / "libggml.so")), ctypes.CDLL(str(lib / "libggml-base.so"))
    reg.ggml_backend_dev_count.restype = ctypes.c_size_t
    reg.ggml_backend_dev_get.restype = ctypes.c_void_p
    reg.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in (base.ggml_backend_dev_name, base.ggml_backend_dev_description):
        fn.restype = ctypes.c_char_p
        fn.argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_type.restype = ctypes.c_int
    base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    size_p = ctypes.POINTER(ctypes.c_size_t)
    base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
    base.ggml_backend_dev_memory.restype = None
    return reg, base


def llama_devices() -> list[DeviceMemory]:
    reg, base = _ggml()
    out = []
    for i in range(int(reg.ggml_backend_dev_count())):
        dev = reg.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(DeviceMemory(
            (base.ggml_backend_dev_name(dev) or b"?").decode(), (base.ggml_backend_dev_description(dev) or b"").decode(),
            _DEV_KINDS.get(int(base.ggml_backend_dev_type(dev)), "unknown"), int(free.value), int(total.value),
        ))
    return out


def llama_gpu_memory(index: int = 0) -> DeviceMemory | None:
    gpus = [d for d in llama_devices() if d.kind in GPU_KINDS]
    return gpus[index] if 0 <= index < len(gpus) else None


def openvino_device_memory(device: str) -> DeviceMemory | None:
    if not device.upper().startswith("GPU"):
        return None
    import openvino as ov

    core = ov.Core()
    try:
        total = int(core.get_property(device, "GPU_DEVICE_TOTAL_MEM_SIZE"))
        name = str(core.get_property(device, "FULL_DEVICE_NAME"))
    except RuntimeError:
        return None
    return DeviceMemory(device, name, "gpu", total, total)
