"""Measured host and engine costs for the KV tier choice (T*) and for recall-vs-recompute.

Primitives:
- ``measure_host_ram_gbps(buffer_bytes=None, repeats=5)``: memcpy bandwidth (``np.copyto`` between
  buffers four times the last-level cache, best of ``repeats``); the destination is checksummed
  against the source after every copy, so the copy cannot be elided and a wrong copy is an error.
- ``gpu_device()``: llama.cpp's first GPU-like device (its own device list, no torch), else None;
  ``gpu_present()``, ``gpu_name()``.
- ``measure_gpu_gbps(model_path=None)``: (device memory GB/s, host -> device GB/s) where a GPU
  exists: through torch when it is installed with CUDA (device copies, pinned host memory), else
  through llama.cpp (``measure_llama_gpu_gbps``: a fully offloaded decode step reads every active
  weight once, so weights / step time is the device bandwidth decode sees; a KV block written into
  the offloaded cache crosses the link). None without a GPU (no device link) or, on a GPU, without
  torch and without a model: ``load_probes`` then takes the documented fallback figures
  (``FALLBACK_VRAM_GBPS``, ``FALLBACK_PCIE_GBPS``) and logs a warning.
- ``measure_c_engage(model_path)``: the extra cost per decode step of attending over a spilled
  tail instead of a resident one, and its fixed part c_engage (see its docstring);
  ``measure_prefill_cost(model_path)``: prefill (tokens/s, fixed s per call);
  ``measure_import_cost(model_path)``: (GB/s, fixed latency) of re-admitting an exported KV block;
  ``measure_block_bytes(model_path, block_tokens)``: sizes of real exported blocks. All four run
  on ``kvres.actors.engines.llama.engine`` (one context of two sequences, one thread).
- ``measure_disk_read_cost(directory=None)``: (GB/s, fixed latency s) of reading a block back from
  the cold store's disk tier: blocks written by a real ``kvres.coldstore.DiskTier``, their pages
  dropped from the page cache, read and decoded (``DiskTier.get``: checksum and tag verified).
  ``load_disk_read_cost(directory=None, env=None, refresh=False) -> DiskReadCost``: measured once
  per folder's file system and cached in the same file; ``KVRES_DISK_READ_GBPS`` and
  ``KVRES_DISK_LATENCY_MS`` override it.
- ``probed_recall_costs(model_path, env=None, disk_dir=None) -> RecallCosts | None``: the
  recall-or-recompute costs of both cold tiers ("ram": re-admitting an exported block; "disk":
  reading it from disk, then re-admitting it) and of prefill; None without the engine figures.
- ``load_probes(model_path=None, env=os.environ, cache_dir=None, refresh=False) -> ProbeResults``:
  every figure, measured once per device (and per model where it depends on one: prefill, import
  and c_engage, keyed by ``kvres.actors.model_files.model_id``), cached in
  ``<cache dir>/probes-<device>.json``; the cache dir is ``platformdirs.user_cache_dir("kvres")``
  or ``KVRES_CACHE_DIR``. ``KVRES_HOST_RAM_GBPS``, ``KVRES_PCIE_GBPS``, ``KVRES_VRAM_GBPS`` and
  ``KVRES_C_ENGAGE_MS`` override the figures (and are then not measured).
- ``ProbeError``: a probe that could not run or gave an impossible figure.

GB/s here is 1e9 bytes per second of payload moved (a memcpy of n bytes counts n, not 2n).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import re
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel
from kvres.actors.model_files import model_id
from kvres.coldstore import BlockKey, ColdStoreError, DiskTier, KVBlock, KVGeometry, make_fingerprint
from kvres.policy.errors import KvresError, ModelLoadError
from kvres.policy.ranges import Range
from kvres.policy.recall import PrefillCost, RecallCosts, TierCost
from kvres.policy.tiering import Link, effective_bandwidth, fit_engage_cost

from .device_memory import DeviceMemory, llama_gpu_memory
from .tier_env import env_float

CACHE_VERSION = 3  # 2: c_engage is the extra step cost of a spilled tail (fitted with a zero tail); 3: per model
ENV_CACHE_DIR = "KVRES_CACHE_DIR"
ENV_HOST_RAM = "KVRES_HOST_RAM_GBPS"
ENV_PCIE = "KVRES_PCIE_GBPS"
ENV_VRAM = "KVRES_VRAM_GBPS"
ENV_C_ENGAGE = "KVRES_C_ENGAGE_MS"
ENV_DISK_READ = "KVRES_DISK_READ_GBPS"
ENV_DISK_LATENCY = "KVRES_DISK_LATENCY_MS"
DEFAULT_C_ENGAGE_MS = 0.8  # docs/policies.md, T*: reference figure, used only when no model is measured

logger = logging.getLogger("kvres.tiering")

MIN_PLAUSIBLE_GBPS = 0.05
MAX_PLAUSIBLE_GBPS = 20_000.0  # above any real memory system: a figure past it means an elided copy


class ProbeError(KvresError, RuntimeError):
    """A probe could not run, or measured something impossible."""


# ---------------------------------------------------------------------------------------------
# Host RAM


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
    _check_plausible("host RAM bandwidth", gbps)
    return gbps


def _check_plausible(what: str, gbps: float) -> None:
    if not (MIN_PLAUSIBLE_GBPS <= gbps <= MAX_PLAUSIBLE_GBPS):
        raise ProbeError(
            f"{what} probe measured {gbps:.3g} GB/s, outside {MIN_PLAUSIBLE_GBPS}..{MAX_PLAUSIBLE_GBPS}"
        )


# ---------------------------------------------------------------------------------------------
# GPU (only where one exists)

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
    model_path: str | os.PathLike[str], n_gpu_layers: int = 999, steps: int = 20, block_tokens: int = 256
) -> tuple[float, float]:
    """(device GB/s, host -> device GB/s) through llama.cpp, no torch needed.

    Device: one-token decode steps of the model with ``n_gpu_layers`` offloaded read every active
    weight (``kvres.actors.model_files.active_weight_bytes_of``) once: bytes / median step time.
    Link: a ``block_tokens`` KV block exported to host memory and written back into the offloaded
    cache (``llama_state_seq_set_data``): bytes / median time. On a CPU-only build both are host
    figures (everything stays in host memory)."""
    from kvres.actors.model_files import active_weight_bytes_of

    weights = active_weight_bytes_of(model_path)
    with _engine(model_path, n_ctx=block_tokens + 16, n_batch=block_tokens, n_gpu_layers=n_gpu_layers) as eng:
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
    _check_plausible("device memory bandwidth (llama.cpp decode)", vram)
    _check_plausible("host -> device bandwidth (llama.cpp KV write)", link)
    return vram, link


def measure_gpu_gbps(
    model_path: str | os.PathLike[str] | None = None, n_bytes: int = 512 * 1024**2, repeats: int = 5
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
        vram, pcie = measure_llama_gpu_gbps(model_path)
    else:
        return None
    _check_plausible("device memory bandwidth", vram)
    _check_plausible("PCIe bandwidth", pcie)
    return vram, pcie


# ---------------------------------------------------------------------------------------------
# llama.cpp micro-benchmarks


class _Engine:
    """One model + context (2 sequences, unified KV, one thread): sequence 0 is the probe's,
    sequence 1 the scratch for export / re-admission."""

    def __init__(self, model_path: str | os.PathLike[str], n_ctx: int, n_batch: int, n_gpu_layers: int = 0) -> None:
        try:
            self.model = LlamaModel(model_path, n_gpu_layers=n_gpu_layers)
        except ModelLoadError as exc:
            raise ProbeError(f"probe model unusable: {exc}") from exc
        try:
            self.ctx = LlamaContext(self.model, n_ctx=n_ctx + n_ctx % 2, n_seq_max=2, n_batch=n_batch)
        except BaseException as exc:
            self.model.close()
            raise ProbeError(f"llama.cpp could not create a probe context: {exc}") from exc

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    def tokens(self, n: int, seed: int = 0) -> list[int]:
        rng = np.random.default_rng(seed)
        return [int(t) for t in rng.integers(3, max(4, self.model.n_vocab), size=n)]

    def decode(self, tokens: Sequence[int], pos0: int, seq: int = 0) -> npt.NDArray[np.float32]:
        return self.ctx.decode(tokens, pos0, seq)

    def rm(self, seq: int, p0: int, p1: int) -> None:
        self.ctx.seq_rm(seq, p0, p1)

    def export(self, p0: int, p1: int, scratch: int = 1) -> bytes:
        """Cells [p0, p1) of sequence 0 as a llama_state_seq blob (via a scratch sequence)."""
        self.ctx.seq_cp(0, scratch, p0, p1)
        try:
            return self.ctx.state_get(scratch)
        finally:
            self.rm(scratch, -1, -1)

    def admit(self, blob: bytes, scratch: int = 1) -> None:
        """Re-admit an exported blob into sequence 0 at its original positions."""
        if not self.ctx.state_set(scratch, blob):
            raise ProbeError("llama_state_seq_set_data refused the block")
        self.ctx.seq_cp(scratch, 0, -1, -1)
        self.rm(scratch, -1, -1)


@contextlib.contextmanager
def _engine(
    model_path: str | os.PathLike[str], n_ctx: int, n_batch: int = 512, n_gpu_layers: int = 0
) -> Iterator[_Engine]:
    eng = _Engine(model_path, n_ctx, n_batch, n_gpu_layers)
    try:
        yield eng
    finally:
        eng.close()


def _fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b x."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(intercept), float(slope)


@dataclass(frozen=True)
class CEngageMeasurement:
    c_engage_s: float  # the fixed part of the extra step time, the fit's intercept
    tail_tokens: tuple[int, ...]
    tail_bytes: tuple[int, ...]  # KV bytes of each tail (0 for the zero tail)
    resident_step_s: float  # median decode step, whole cache resident
    spill_step_s: tuple[float, ...]  # median step with the tail spilled, per tail
    extra_step_s: tuple[float, ...]  # median of (spill - the resident step before it), per tail
    tail_gbps: float | None  # the fit's slope: bytes of tail per extra second
    n_prompt: int


def measure_c_engage(
    model_path: str | os.PathLike[str],
    n_prompt: int = 256,
    tails: Sequence[int] = (0, 16, 64, 128),
    steps: int = 40,
) -> CEngageMeasurement:
    """The extra cost per decode step of a windowed cache whose tail is spilled, against the same
    attention fully resident, from a llama.cpp micro-benchmark; c_engage is its fixed part.

    Both variants attend the new token over the same keys (``n_prompt`` cached tokens + itself)
    with the same shapes. Resident: every key stays in the cache; a decode step, then the new
    token is removed. Windowed + spilled tail: the cache holds the first ``n_prompt - tail`` keys
    (the window); the last ``tail`` keys live in host memory as an exported ``llama_state_seq``
    blob that each step has to attend over, so the step engages the spill path: the tail is
    written into the cache (``llama_state_seq_set_data`` into a scratch sequence, shared with
    ``llama_memory_seq_cp``), the token decoded, and the tail evicted again
    (``llama_memory_seq_rm``). A zero tail engages nothing: that step is the resident one. Steps of
    the two variants alternate so drift hits both alike: the extra time of a tail is the median of
    its steps' differences from the resident step just before (medians resist scheduler noise; a
    difference of two steps a moment apart does not see the machine's load move between tails).
    The extra time per tail is fitted as ``c_engage + tail_bytes / bw`` (``kvres.policy.tiering.fit_engage_cost``).
    """
    if n_prompt < 2 or not tails or min(tails) < 0 or max(tails) >= n_prompt or steps < 1:
        raise ProbeError(f"c_engage probe needs 0 <= tails < n_prompt, steps >= 1; got {n_prompt}, {tails}, {steps}")
    with _engine(model_path, n_ctx=n_prompt + 8) as eng:
        eng.decode(eng.tokens(n_prompt), 0)
        resident: list[float] = []
        spill_medians: list[float] = []
        extra: list[float] = []
        tail_bytes: list[int] = []
        for tail in tails:
            blob = eng.export(n_prompt - tail, n_prompt) if tail else b""
            tail_bytes.append(len(blob))
            spill: list[float] = []
            paired: list[float] = []
            for _ in range(steps):
                t0 = time.perf_counter()
                eng.decode([5], n_prompt)
                eng.rm(0, n_prompt, -1)
                resident.append(time.perf_counter() - t0)
                if tail:
                    eng.rm(0, n_prompt - tail, -1)  # the tail is out: a windowed cache
                t0 = time.perf_counter()
                if tail:
                    eng.admit(blob)
                eng.decode([5], n_prompt)
                eng.rm(0, n_prompt - tail if tail else n_prompt, -1)
                spill.append(time.perf_counter() - t0)
                paired.append(spill[-1] - resident[-1])
                if tail:
                    eng.admit(blob)  # back to fully resident for the next resident step
            spill_medians.append(float(np.median(spill)))
            extra.append(float(np.median(paired)))
    res = float(np.median(resident))
    c_engage, gbps = fit_engage_cost(tail_bytes, extra)
    return CEngageMeasurement(
        c_engage_s=c_engage,
        tail_tokens=tuple(tails),
        tail_bytes=tuple(tail_bytes),
        resident_step_s=res,
        spill_step_s=tuple(spill_medians),
        extra_step_s=tuple(extra),
        tail_gbps=gbps,
        n_prompt=n_prompt,
    )


def measure_prefill_cost(
    model_path: str | os.PathLike[str], sizes: Sequence[int] = (16, 64, 256), repeats: int = 3
) -> tuple[float, float]:
    """(tokens/s, fixed s per call) of prefill: best-of-``repeats`` prefills of several sizes into
    an empty cache, fitted as ``fixed + n / rate``."""
    if not sizes or min(sizes) < 1 or repeats < 1:
        raise ProbeError(f"prefill probe needs sizes >= 1 and repeats >= 1, got {sizes}, {repeats}")
    with _engine(model_path, n_ctx=max(sizes) + 8) as eng:
        toks = eng.tokens(max(sizes))
        eng.decode(toks[:8], 0)  # warm-up: graph allocation is not prefill
        eng.rm(0, -1, -1)
        times: list[float] = []
        for n in sizes:
            best = math.inf
            for _ in range(repeats):
                t0 = time.perf_counter()
                eng.decode(toks[:n], 0)
                best = min(best, time.perf_counter() - t0)
                eng.rm(0, -1, -1)
            times.append(best)
    fixed, slope = _fit_line(sizes, times) if len(set(sizes)) >= 2 else (0.0, times[0] / sizes[0])
    if slope <= 0:
        fixed, slope = 0.0, max(t / n for t, n in zip(times, sizes, strict=True))
    return 1.0 / slope, max(0.0, fixed)


def measure_import_cost(
    model_path: str | os.PathLike[str],
    block_tokens: Sequence[int] = (16, 64, 256),
    n_prompt: int = 320,
    repeats: int = 9,
) -> tuple[float, float]:
    """(GB/s, fixed latency s) of re-admitting an exported KV block from host memory.

    Blocks of several sizes are exported from a prefilled context, evicted, and re-admitted
    (``llama_state_seq_set_data`` + ``llama_memory_seq_cp``); the median times are fitted as
    ``latency + bytes / bandwidth``.
    """
    if not block_tokens or max(block_tokens) > n_prompt or min(block_tokens) < 1:
        raise ProbeError(f"import probe needs 1 <= block_tokens <= n_prompt, got {block_tokens}, {n_prompt}")
    with _engine(model_path, n_ctx=n_prompt + 8) as eng:
        eng.decode(eng.tokens(n_prompt), 0)
        sizes: list[int] = []
        times: list[float] = []
        for n in block_tokens:
            blob = eng.export(n_prompt - n, n_prompt)
            samples = []
            for _ in range(repeats):
                eng.rm(0, n_prompt - n, -1)
                t0 = time.perf_counter()
                eng.admit(blob)
                samples.append(time.perf_counter() - t0)
            sizes.append(len(blob))
            times.append(float(np.median(samples)))
    latency, slope = _fit_line(sizes, times) if len(set(sizes)) >= 2 else (0.0, times[0] / sizes[0])
    if slope <= 0:  # noise swamped the size dependence: bill everything as bandwidth
        latency, slope = 0.0, max(t / s for t, s in zip(times, sizes, strict=True))
    return 1.0 / slope / 1e9, max(0.0, latency)


def measure_block_bytes(model_path: str | os.PathLike[str], block_tokens: Sequence[int] = (16, 64, 256)) -> list[int]:
    """Bytes of a real exported KV block (``llama_state_seq`` blob) of each size, default KV types."""
    if not block_tokens or min(block_tokens) < 1:
        raise ProbeError(f"block sizes must be >= 1, got {block_tokens}")
    n_prompt = max(block_tokens)
    with _engine(model_path, n_ctx=n_prompt + 8) as eng:
        eng.decode(eng.tokens(n_prompt), 0)
        return [len(eng.export(n_prompt - n, n_prompt)) for n in block_tokens]


# ---------------------------------------------------------------------------------------------
# The cold store's disk tier

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
    the system temp folder, where a cold store's disk tier goes unless configured elsewhere).

    Blocks of each size are written by a real ``DiskTier`` (fsync-ed, as the cold store writes
    them), their pages dropped from the page cache, and read back with ``DiskTier.get`` (header,
    payload, checksum and tag: what a recall pays before the import); the median times are fitted
    as ``latency + bytes / bandwidth``. A cold read: a block still in the page cache reads faster."""
    if not block_bytes or min(block_bytes) < 1 or repeats < 1:
        raise ProbeError(f"disk probe needs block_bytes >= 1 and repeats >= 1, got {block_bytes}, {repeats}")
    parent = Path(directory) if directory is not None else Path(tempfile.gettempdir())
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
    latency, slope = _fit_line(sizes, times) if len(set(sizes)) >= 2 else (0.0, times[0] / sizes[0])
    if slope <= 0:  # noise swamped the size dependence: bill everything as bandwidth
        latency, slope = 0.0, max(t / s for t, s in zip(times, sizes, strict=True))
    gbps = 1.0 / slope / 1e9
    if not (math.isfinite(gbps) and 0 < gbps <= MAX_PLAUSIBLE_GBPS):
        raise ProbeError(f"disk read probe measured {gbps:.3g} GB/s, outside (0, {MAX_PLAUSIBLE_GBPS}]")
    return gbps, max(0.0, latency)


@dataclass(frozen=True)
class DiskReadCost:
    """Reading a block back from the disk tier in ``directory``: ``latency_s + bytes / gbps``;
    ``sources`` as in ``ProbeResults`` ("measured", "cached" or "env")."""

    directory: str
    gbps: float
    latency_s: float
    sources: Mapping[str, str] = field(default_factory=dict)


def _disk_key(directory: Path) -> str:
    """Which file system a folder is on (its device number and real path): the cache key."""
    real = directory.resolve()
    return f"{os.stat(real).st_dev}:{real}"


def load_disk_read_cost(
    directory: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    refresh: bool = False,
) -> DiskReadCost:
    """The disk tier's read cost for ``directory`` (default: the system temp folder): env
    overrides, else the probe cache (``probes-<device>.json``, per file system), else measured
    (then cached)."""
    env = os.environ if env is None else env
    gbps_env = env_float(env, ENV_DISK_READ, None, strict=True)
    latency_ms_env = env_float(env, ENV_DISK_LATENCY, None)
    folder = Path(directory) if directory is not None else Path(tempfile.gettempdir())
    if gbps_env is not None and latency_ms_env is not None:
        return DiskReadCost(str(folder), gbps_env, latency_ms_env / 1e3, {"gbps": "env", "latency_s": "env"})
    device = device_key()
    path = cache_path(env, device)
    key = _disk_key(folder)
    cached = {} if refresh else _read_cache(path)
    figures = dict(cached.get("disk", {}).get(key, {}))
    source = "cached"
    if "gbps" not in figures or "latency_s" not in figures:
        figures["gbps"], figures["latency_s"] = measure_disk_read_cost(folder)
        source = "measured"
        data: dict[str, Any] = {"version": CACHE_VERSION, "device": device, **_read_cache(path)}
        data.setdefault("disk", {})[key] = figures
        _write_cache(path, data)
    gbps = float(figures["gbps"]) if gbps_env is None else gbps_env
    latency = float(figures["latency_s"]) if latency_ms_env is None else latency_ms_env / 1e3
    sources = {"gbps": "env" if gbps_env is not None else source,
               "latency_s": "env" if latency_ms_env is not None else source}
    return DiskReadCost(str(folder), gbps, latency, sources)


def probed_recall_costs(
    model_path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    disk_dir: str | os.PathLike[str] | None = None,
) -> RecallCosts | None:
    """What a cold store needs to decide recall or recompute for the blocks of ``model_path``'s
    backend (``kvres.policy.recall``), from the cached probes:

    - "ram": re-admitting an exported block (``measure_import_cost``);
    - "disk": reading it from the disk tier in ``disk_dir`` (``load_disk_read_cost``), then
      re-admitting it: latencies add, and so do the seconds per byte
      (``1 / bw = 1 / disk_bw + 1 / import_bw``);
    - prefill: ``measure_prefill_cost``.

    None when the engine figures are missing. A disk tier that cannot be probed (an unsafe or
    unwritable folder) is left out, logged: its blocks are then always read."""
    env = os.environ if env is None else env
    p = load_probes(model_path, env=env)
    if p.import_gbps is None or p.prefill_tokens_per_s is None:
        return None
    ram = TierCost("ram", p.import_gbps, p.import_latency_s or 0.0)
    tiers = {"ram": ram}
    try:
        disk = load_disk_read_cost(disk_dir, env=env)
    except (ProbeError, ColdStoreError, OSError) as exc:
        logger.warning("disk tier read cost not measured (%s): disk blocks are always read", exc)
    else:
        tiers["disk"] = TierCost("disk", 1.0 / (1.0 / disk.gbps + 1.0 / ram.bandwidth_gbps),
                                 disk.latency_s + ram.latency_s)
    return RecallCosts(tiers, PrefillCost(p.prefill_tokens_per_s, p.prefill_fixed_s or 0.0))


# ---------------------------------------------------------------------------------------------
# Cached results


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


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    override = env.get(ENV_CACHE_DIR)
    if override:
        return Path(override)
    import platformdirs

    return Path(str(platformdirs.user_cache_dir("kvres")))


def cache_path(env: Mapping[str, str] | None = None, device: str | None = None) -> Path:
    return cache_dir(env) / f"probes-{device or device_key()}.json"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    return data


def _write_cache(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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


def load_probes(
    model_path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    refresh: bool = False,
    engine_probes: bool = True,
) -> ProbeResults:
    """Probe results for this device: env overrides, else the cache, else measured (then cached).

    ``model_path`` (a GGUF) is what the llama.cpp micro-benchmarks run; without it c_engage is the
    reference figure of docs/policies.md, T* (0.8 ms, source "default") and the model-specific
    figures are None.
    ``engine_probes=False`` skips the llama.cpp probes (c_engage then "default" unless cached).
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
    cached = {} if refresh else _read_cache(path)
    data: dict[str, Any] = {"version": CACHE_VERSION, "device": device, **cached}
    data.setdefault("models", {})
    sources: dict[str, str] = {}
    dirty = False

    def figure(name: str, measure: Any) -> Any:
        nonlocal dirty
        if overrides.get(name) is not None:
            sources[name] = "env"
            return overrides[name]
        if name in cached:
            sources[name] = "cached"
            return cached[name]
        value = measure()
        data[name] = value
        sources[name] = "measured"
        dirty = True
        return value

    host = figure("host_ram_gbps", measure_host_ram_gbps)
    gpu: tuple[float, float] | None = None
    fallback = False
    need_pcie = overrides["pcie_gbps"] is None and "pcie_gbps" not in cached
    need_vram = overrides["vram_gbps"] is None and "vram_gbps" not in cached
    if need_pcie or need_vram:
        gpu = measure_gpu_gbps(model_path if engine_probes else None)
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
                data.pop(name, None)  # not cached: measured next time a model or torch is there

    model_figs: dict[str, Any] = {}
    if model_path is not None and engine_probes:
        key = model_id(model_path)
        model_cached = dict(data["models"].get(key, {}))
        model_figs = dict(model_cached)
        if "prefill_tokens_per_s" not in model_figs:
            model_figs["prefill_tokens_per_s"], model_figs["prefill_fixed_s"] = measure_prefill_cost(model_path)
        if "import_gbps" not in model_figs:
            model_figs["import_gbps"], model_figs["import_latency_s"] = measure_import_cost(model_path)
        if overrides["c_engage_ms"] is None and "c_engage_ms" not in model_figs:
            # the model's own: what a step pays to attend over a spilled tail depends on its layers
            model_figs["c_engage_ms"] = measure_c_engage(model_path).c_engage_s * 1e3
        if model_figs != model_cached:
            data["models"][key] = model_figs
            dirty = True
        sources["model"] = "cached" if model_figs == model_cached else "measured"

    if overrides["c_engage_ms"] is not None:
        c_ms, sources["c_engage_ms"] = overrides["c_engage_ms"], "env"
    elif "c_engage_ms" in model_figs:
        c_ms = model_figs["c_engage_ms"]
        sources["c_engage_ms"] = "cached" if model_cached.get("c_engage_ms") == c_ms else "measured"
    else:
        c_ms, sources["c_engage_ms"] = DEFAULT_C_ENGAGE_MS, "default"

    if dirty:
        _write_cache(path, data)
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
