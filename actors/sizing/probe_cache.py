"""Where measured figures are kept between runs, and the environment variables that replace them.

Primitives:
- ``cache_dir(env=None)``: ``KVRES_CACHE_DIR``, else ``platformdirs.user_cache_dir("kvres")``;
  ``cache_path(env=None, device=None)``: ``<cache dir>/probes-<device>.json``.
- ``device_key()``: a file-name-safe id of this machine's compute device (the GPU if any, else
  the CPU), so each device keeps its own figures.
- ``model_key(model_path, engine)``: the key of one model's figures under ``models``: its
  ``kvres.actors.model_files.model_id`` and the ``ProbeEngine`` it was measured with (threads,
  layers offloaded).
- ``read_cache(path) -> dict``: the cached figures ({} when missing, unreadable or of another
  ``CACHE_VERSION``); ``update_cache(path, device, changes)``: merges ``changes`` (nested dicts
  merged key by key) into the file under an exclusive lock and replaces it atomically, so two
  processes measuring at once (a backend's probe worker and a T* choice) both keep theirs.
- ``ENV_*``: the variables that override a figure (then it is neither measured nor cached):
  ``KVRES_HOST_RAM_GBPS``, ``KVRES_PCIE_GBPS``, ``KVRES_VRAM_GBPS``, ``KVRES_C_ENGAGE_MS``,
  ``KVRES_DISK_READ_GBPS``, ``KVRES_DISK_LATENCY_MS``; and ``KVRES_CACHE_DIR``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvres.actors.model_files import model_id

from .gpu_probes import gpu_name
from .llama_probes import ProbeEngine

# 2: c_engage is the extra step cost of a spilled tail; 3: per model; 4: per model and probe engine
CACHE_VERSION = 4
ENV_CACHE_DIR = "KVRES_CACHE_DIR"
ENV_HOST_RAM = "KVRES_HOST_RAM_GBPS"
ENV_PCIE = "KVRES_PCIE_GBPS"
ENV_VRAM = "KVRES_VRAM_GBPS"
ENV_C_ENGAGE = "KVRES_C_ENGAGE_MS"
ENV_DISK_READ = "KVRES_DISK_READ_GBPS"
ENV_DISK_LATENCY = "KVRES_DISK_LATENCY_MS"


def device_key() -> str:
    """A file-name-safe id of this machine's compute device (the GPU if any, else the CPU)."""
    name = gpu_name()
    if name is None:
        cpu = platform.processor() or platform.machine()
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        name = f"cpu-{cpu}-{os.cpu_count()}"
    digest = hashlib.sha256(f"{platform.node()}|{name}".encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:48]
    return f"{slug}-{digest}"


def model_key(model_path: str | os.PathLike[str], engine: ProbeEngine) -> str:
    return f"{model_id(model_path)}|{engine.key}"


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    from ..settings import read_settings

    override = read_settings(env).cache_dir
    if override:
        return Path(override)
    import platformdirs

    return Path(str(platformdirs.user_cache_dir("kvres")))


def cache_path(env: Mapping[str, str] | None = None, device: str | None = None) -> Path:
    return cache_dir(env) / f"probes-{device or device_key()}.json"


def read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    return data


def _merge(into: dict[str, Any], changes: Mapping[str, Any]) -> None:
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def update_cache(path: Path, device: str, changes: Mapping[str, Any]) -> None:
    """Merge ``changes`` into the cache file, under a lock (``<file>.lock``), replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data: dict[str, Any] = {**read_cache(path), "version": CACHE_VERSION, "device": device}
        _merge(data, changes)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=2, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
