"""The cold store's disk tier: what reading a block back from it costs.

Primitives:
- ``default_disk_folder()``: where a cold store keeps its disk tier when none is configured
  (``<user cache>/kvres/coldstore``, as ``kvres.actors.ray_actors.coldstore_actor.default_store_dir``).
- ``measure_disk_read_cost(directory=None, block_bytes=..., repeats=3) -> (GB/s, latency s)``:
  blocks written by a real ``kvres.coldstore.DiskTier`` in a temporary folder inside
  ``directory``, their pages dropped from the page cache, read and decoded (``DiskTier.get``:
  checksum and tag verified), fitted as ``latency + bytes / bandwidth``.
- ``load_disk_read_cost(directory=None, env=None, refresh=False) -> DiskReadCost``: measured once
  per file system and cached in the probe cache (``kvres.actors.sizing.probe_cache``);
  ``KVRES_DISK_READ_GBPS`` and ``KVRES_DISK_LATENCY_MS`` override it. ``cached_disk_read_cost``:
  the same without measuring (None when not cached).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import platformdirs

from kvres.coldstore import BlockKey, DiskTier, KVBlock, KVGeometry, make_fingerprint
from kvres.policy.ranges import Range

from .probe_cache import ENV_DISK_LATENCY, ENV_DISK_READ, cache_path, device_key, read_cache, update_cache
from .probe_common import MAX_PLAUSIBLE_GBPS, ProbeError, fit_cost
from .tier_env import env_float


def default_disk_folder() -> Path:
    return Path(platformdirs.user_cache_dir("kvres")) / "coldstore"


_PROBE_GEOMETRY = KVGeometry(n_layers=1, n_kv_heads=1, head_dim=32)
_PROBE_FINGERPRINT = make_fingerprint("kvres-disk-probe", "probe", "f16", "f16", _PROBE_GEOMETRY)


def _probe_block(n_bytes: int, seed: int) -> KVBlock:
    payload = np.random.default_rng(seed).integers(0, 256, size=n_bytes, dtype=np.uint8).tobytes()
    rng = Range(16 * seed, 16 * seed + 16)
    return KVBlock(
        fingerprint=_PROBE_FINGERPRINT, model_id="kvres-disk-probe", engine="probe", type_k="f16",
        type_v="f16", geometry=_PROBE_GEOMETRY, session_id="disk-probe", token_range=rng,
        token_ids=tuple(range(16)), payload=payload, positions=tuple(range(rng.start, rng.end)),
    )


def _drop_page_cache(path: Path) -> None:
    """Ask the kernel to forget the (clean, fsync-ed) pages of ``path``, so the next read goes to
    the device; a no-op where unsupported (and on tmpfs, where RAM is the device)."""
    fadvise = getattr(os, "posix_fadvise", None)
    if fadvise is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure_disk_read_cost(
    directory: str | os.PathLike[str] | None = None,
    block_bytes: Sequence[int] = (64 << 10, 512 << 10, 4 << 20),
    repeats: int = 3,
) -> tuple[float, float]:
    """(GB/s, fixed latency s) of reading a block back from a disk tier in ``directory`` (default:
    ``default_disk_folder()``, where a cold store's disk tier goes unless configured elsewhere).

    Blocks of each size are written by a real ``DiskTier`` (fsync-ed, as the cold store writes
    them), their pages dropped from the page cache, and read back with ``DiskTier.get`` (header,
    payload, checksum and tag: what a recall pays before the import); the median times are fitted
    as ``latency + bytes / bandwidth``. A cold read: a block still in the page cache reads faster."""
    if not block_bytes or min(block_bytes) < 1 or repeats < 1:
        raise ProbeError(f"disk probe needs block_bytes >= 1 and repeats >= 1, got {block_bytes}, {repeats}")
    parent = Path(directory) if directory is not None else default_disk_folder()
    sizes: list[int] = []
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kvres-disk-probe-", dir=parent) as tmp:
        tier = DiskTier(Path(tmp) / "tier", budget_bytes=4 * max(block_bytes) + (1 << 20))
        try:
            for i, n in enumerate(block_bytes):
                block = _probe_block(int(n), i)
                key = BlockKey.of(block)
                samples = []
                for _ in range(repeats):
                    tier.put(block)
                    _drop_page_cache(tier.file_path(key))
                    t0 = time.perf_counter()
                    back = tier.get(key)
                    samples.append(time.perf_counter() - t0)
                    if back is None or back.payload_nbytes != n:
                        raise ProbeError(f"disk probe: the {n}-byte block did not read back whole")
                    tier.delete(key)
                sizes.append(int(n))
                times.append(float(np.median(samples)))
        finally:
            tier.close()
    latency, slope = fit_cost(sizes, times)
    gbps = 1.0 / slope / 1e9
    if not (math.isfinite(gbps) and 0 < gbps <= MAX_PLAUSIBLE_GBPS):
        raise ProbeError(f"disk read probe measured {gbps:.3g} GB/s, outside (0, {MAX_PLAUSIBLE_GBPS}]")
    return gbps, latency


@dataclass(frozen=True)
class DiskReadCost:
    """Reading a block back from the disk tier in ``directory``: ``latency_s + bytes / gbps``;
    ``sources`` as in ``ProbeResults`` ("measured", "cached" or "env")."""

    directory: str
    gbps: float
    latency_s: float
    sources: Mapping[str, str] = field(default_factory=dict)


def _disk_key(directory: Path) -> str:
    """The cache key of a folder: its file system's device number (folders on one file system
    read alike, so a backend's cold store in a new folder measures nothing again)."""
    return f"dev-{os.stat(directory).st_dev}"


def load_disk_read_cost(
    directory: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    refresh: bool = False,
) -> DiskReadCost:
    """The disk tier's read cost for ``directory`` (default: ``default_disk_folder()``, created
    0700 if missing): env overrides, else the probe cache (``probes-<device>.json``, per file
    system), else measured (then cached)."""
    if directory is None:
        default_disk_folder().mkdir(mode=0o700, parents=True, exist_ok=True)
    cost = _disk_read_cost(directory, env, refresh=refresh, measure=True)
    assert cost is not None  # measured when not cached
    return cost


def cached_disk_read_cost(
    directory: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> DiskReadCost | None:
    """``load_disk_read_cost`` without measuring: None when the figures are neither set by the
    environment nor cached (or the folder does not exist yet)."""
    try:
        return _disk_read_cost(directory, env, refresh=False, measure=False)
    except FileNotFoundError:
        return None


def _disk_read_cost(
    directory: str | os.PathLike[str] | None, env: Mapping[str, str] | None, *, refresh: bool, measure: bool
) -> DiskReadCost | None:
    env = os.environ if env is None else env
    gbps_env = env_float(env, ENV_DISK_READ, None, strict=True)
    latency_ms_env = env_float(env, ENV_DISK_LATENCY, None)
    folder = Path(directory) if directory is not None else default_disk_folder()
    if gbps_env is not None and latency_ms_env is not None:
        return DiskReadCost(str(folder), gbps_env, latency_ms_env / 1e3, {"gbps": "env", "latency_s": "env"})
    device = device_key()
    path = cache_path(env, device)
    key = _disk_key(folder)
    cached = {} if refresh else read_cache(path)
    figures = dict(cached.get("disk", {}).get(key, {}))
    source = "cached"
    if "gbps" not in figures or "latency_s" not in figures:
        if not measure:
            return None
        figures["gbps"], figures["latency_s"] = measure_disk_read_cost(folder)
        source = "measured"
        update_cache(path, device, {"disk": {key: figures}})
    gbps = float(figures["gbps"]) if gbps_env is None else gbps_env
    latency = float(figures["latency_s"]) if latency_ms_env is None else latency_ms_env / 1e3
    sources = {"gbps": "env" if gbps_env is not None else source,
               "latency_s": "env" if latency_ms_env is not None else source}
    return DiskReadCost(str(folder), gbps, latency, sources)
