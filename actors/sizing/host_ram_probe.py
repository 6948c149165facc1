"""Host RAM bandwidth, measured by a checked memcpy.

Primitives:
- ``last_level_cache_bytes()``: the largest CPU cache sysfs reports (32 MiB if unknown).
- ``measure_host_ram_gbps(buffer_bytes=None, repeats=8)``: memcpy bandwidth (``np.copyto`` between
  buffers four times the last-level cache, best of ``repeats``); the destination is checksummed
  against the source after every copy, so the copy cannot be elided and a wrong copy is a
  ``ProbeError``.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import numpy as np

from .probe_common import ProbeError, check_plausible


def last_level_cache_bytes() -> int:
    """The largest CPU cache reported by sysfs (32 MiB if unknown)."""
    best = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        with contextlib.suppress(OSError, ValueError):
            text = path.read_text().strip().upper()
            scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
    return best or 32 * 1024**2


def measure_host_ram_gbps(buffer_bytes: int | None = None, repeats: int = 8) -> float:
    """memcpy bandwidth of host RAM in GB/s: best of ``repeats`` copies of ``buffer_bytes``."""
    if buffer_bytes is None:
        buffer_bytes = min(max(4 * last_level_cache_bytes(), 64 * 1024**2), 512 * 1024**2)
    if buffer_bytes < 8 or repeats < 1:
        raise ProbeError(f"host RAM probe needs buffer_bytes >= 8 and repeats >= 1, got {buffer_bytes}, {repeats}")
    n = buffer_bytes // 8
    rng = np.random.default_rng(12345)
    src = rng.integers(0, 2**63 - 1, size=n, dtype=np.int64)
    dst = np.zeros_like(src)  # touched once so page faults are not timed
    dst += 1
    best = math.inf
    for i in range(repeats):
        src[i % n] ^= 0x5A5A  # a different source each round: no copy can be reused
        expected = int(src.sum(dtype=np.int64))
        t0 = time.perf_counter()
        np.copyto(dst, src)
        elapsed = time.perf_counter() - t0
        if int(dst.sum(dtype=np.int64)) != expected:  # reads all of dst: the copy had to happen
            raise ProbeError("host RAM probe: destination checksum differs from the source")
        best = min(best, elapsed)
    gbps = n * 8 / max(best, 1e-9) / 1e9
    check_plausible("host RAM bandwidth", gbps)
    return gbps
