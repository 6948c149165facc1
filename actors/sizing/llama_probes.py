"""llama.cpp micro-benchmarks: what a step, a prefill and a block import cost on this engine.

Primitives:
- ``ProbeEngine(n_threads=1, n_gpu_layers=0, main_gpu=None)``: how the probes run the model (a
  backend's own decode threads and offload); ``key`` names it in the probe cache.
  ``ONE_THREAD_CPU`` is the default: a probe inside a process that serves decodes on one thread,
  since only one thread per process may decode with more
  (``kvres.actors.engines.llama.decode_threads``).
- ``probe_context(model_path, n_ctx, n_batch=512, engine=ONE_THREAD_CPU)``: a ``ProbeContext``
  (one model + context of two sequences: 0 the probe's, 1 the scratch for export / re-admission),
  closed on exit: ``tokens(n)``, ``decode``, ``rm``, ``export(p0, p1)``, ``admit(blob)``.
- ``measure_c_engage(model_path, ...) -> CEngageMeasurement``: the extra cost per decode step of
  attending over a spilled tail instead of a resident one, and its fixed part c_engage.
- ``measure_prefill_cost(model_path, ...)``: prefill (tokens/s, fixed s per call).
- ``measure_import_cost(model_path, ...)``: (GB/s, fixed latency) of re-admitting an exported block.
- ``measure_block_bytes(model_path, block_tokens)``: sizes of real exported blocks.

Each takes ``engine``; a bad argument or an unusable model is a ``ProbeError`` naming it.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel
from kvres.policy.errors import ModelLoadError
from kvres.policy.tiering import fit_engage_cost

from .probe_common import ProbeError, fit_cost


@dataclass(frozen=True)
class ProbeEngine:
    """The engine settings a probe measures with: decode threads, layers offloaded, main GPU."""

    n_threads: int = 1
    n_gpu_layers: int = 0
    main_gpu: int | None = None

    def __post_init__(self) -> None:
        if self.n_threads < 1 or self.n_gpu_layers < 0 or (self.main_gpu is not None and self.main_gpu < 0):
            raise ProbeError(
                f"probe engine needs n_threads >= 1, n_gpu_layers >= 0, main_gpu >= 0 or None; got "
                f"n_threads={self.n_threads}, n_gpu_layers={self.n_gpu_layers}, main_gpu={self.main_gpu}"
            )

    @property
    def key(self) -> str:
        """What the figures depend on besides device and model (the main GPU is one of a kind)."""
        return f"threads={self.n_threads},gpu_layers={self.n_gpu_layers}"


ONE_THREAD_CPU = ProbeEngine()


class ProbeContext:
    """One model + context (2 sequences, unified KV): sequence 0 is the probe's, sequence 1 the
    scratch for export / re-admission."""

    def __init__(self, model_path: str | os.PathLike[str], n_ctx: int, n_batch: int, engine: ProbeEngine) -> None:
        try:
            self.model = LlamaModel(model_path, n_gpu_layers=engine.n_gpu_layers, main_gpu=engine.main_gpu)
        except ModelLoadError as exc:
            raise ProbeError(f"probe model unusable: {exc}") from exc
        try:
            self.ctx = LlamaContext(self.model, n_ctx=n_ctx + n_ctx % 2, n_seq_max=2, n_batch=n_batch,
                                    n_threads=engine.n_threads)
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
def probe_context(
    model_path: str | os.PathLike[str], n_ctx: int, n_batch: int = 512, engine: ProbeEngine = ONE_THREAD_CPU
) -> Iterator[ProbeContext]:
    eng = ProbeContext(model_path, n_ctx, n_batch, engine)
    try:
        yield eng
    finally:
        eng.close()


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
    engine: ProbeEngine = ONE_THREAD_CPU,
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
    with probe_context(model_path, n_ctx=n_prompt + 8, engine=engine) as eng:
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
    model_path: str | os.PathLike[str], sizes: Sequence[int] = (16, 64, 256), repeats: int = 3,
    engine: ProbeEngine = ONE_THREAD_CPU,
) -> tuple[float, float]:
    """(tokens/s, fixed s per call) of prefill: best-of-``repeats`` prefills of several sizes into
    an empty cache, fitted as ``fixed + n / rate``."""
    if not sizes or min(sizes) < 1 or repeats < 1:
        raise ProbeError(f"prefill probe needs sizes >= 1 and repeats >= 1, got {sizes}, {repeats}")
    with probe_context(model_path, n_ctx=max(sizes) + 8, engine=engine) as eng:
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
    fixed, slope = fit_cost(sizes, times)
    return 1.0 / slope, fixed


def measure_import_cost(
    model_path: str | os.PathLike[str],
    block_tokens: Sequence[int] = (16, 64, 256),
    n_prompt: int = 320,
    repeats: int = 9,
    engine: ProbeEngine = ONE_THREAD_CPU,
) -> tuple[float, float]:
    """(GB/s, fixed latency s) of re-admitting an exported KV block from host memory.

    Blocks of several sizes are exported from a prefilled context, evicted, and re-admitted
    (``llama_state_seq_set_data`` + ``llama_memory_seq_cp``); the median times are fitted as
    ``latency + bytes / bandwidth``.
    """
    if not block_tokens or max(block_tokens) > n_prompt or min(block_tokens) < 1:
        raise ProbeError(f"import probe needs 1 <= block_tokens <= n_prompt, got {block_tokens}, {n_prompt}")
    with probe_context(model_path, n_ctx=n_prompt + 8, engine=engine) as eng:
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
    latency, slope = fit_cost(sizes, times)
    return 1.0 / slope / 1e9, latency


def measure_block_bytes(
    model_path: str | os.PathLike[str], block_tokens: Sequence[int] = (16, 64, 256),
    engine: ProbeEngine = ONE_THREAD_CPU,
) -> list[int]:
    """Bytes of a real exported KV block (``llama_state_seq`` blob) of each size, default KV types."""
    if not block_tokens or min(block_tokens) < 1:
        raise ProbeError(f"block sizes must be >= 1, got {block_tokens}")
    n_prompt = max(block_tokens)
    with probe_context(model_path, n_ctx=n_prompt + 8, engine=engine) as eng:
        eng.decode(eng.tokens(n_prompt), 0)
        return [len(eng.export(n_prompt - n, n_prompt)) for n in block_tokens]
