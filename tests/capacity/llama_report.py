"""llama.cpp's own account of a model's KV caches, read from what it logs while loading.

Primitives: ``CacheReport`` (one cache: cells, layers, K / V types, buffer bytes) and
``KVReport`` (the per-layer windowed flags and every cache); ``llama_kv_report(path, **context)``
loads the model and creates one context with the real engine (``kvres.actors.engines.llama.engine``);
``llama_log()`` collects what llama.cpp logs inside a ``with`` block, ``parse_kv_log(lines,
n_ctx)`` reads a report from it (e.g. around building a whole executor).

The log is the only place llama.cpp 0.3.36 states its KV buffer sizes (``llama_get_memory_breakdown``
is C++ only); its MiB figures carry two decimals, so the caches tested are MiB-sized.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvres.actors.engines.llama.engine import LlamaContext, LlamaModel

MIB = 1024 * 1024
_LAYER = re.compile(r"load_tensors: layer +(\d+) assigned to device \S+, is_swa = (\d)")
_BUFFER = re.compile(r"llama_kv_cache: +\S+ KV buffer size = +([\d.]+) MiB")
_SIZE = re.compile(
    r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
    r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB"
)


@dataclass(frozen=True)
class CacheReport:
    cells: int  # per stream
    layers: int
    streams: int
    type_k: str
    type_v: str
    buffer_bytes: float  # the allocated buffer, from its MiB figure


@dataclass(frozen=True)
class KVReport:
    windowed: tuple[bool, ...]  # llama.cpp's is_swa per block
    caches: tuple[CacheReport, ...]
    n_ctx: int  # cells of the context

    @property
    def buffer_bytes(self) -> float:
        return sum(c.buffer_bytes for c in self.caches)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def llama_log() -> Iterator[list[str]]:
    log = logging.getLogger("kvres.llama")
    handler, level = _Lines(), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def llama_kv_report(path: Path, **context: Any) -> KVReport:
    """Load ``path``, create a context with ``context`` (``LlamaContext`` keywords) and parse what
    llama.cpp reports about its KV caches."""
    with llama_log() as lines:
        model = LlamaModel(path)
        try:
            ctx = LlamaContext(model, **context)
            n_ctx = ctx.n_cells
            ctx.close()
        finally:
            model.close()
    return parse_kv_log(lines, n_ctx)


def parse_kv_log(lines: list[str], n_ctx: int) -> KVReport:
    flags: dict[int, bool] = {}
    buffers: list[float] = []
    sizes: list[tuple[Any, ...]] = []
    for line in lines:
        if m := _LAYER.search(line):
            flags[int(m.group(1))] = m.group(2) == "1"
        elif m := _BUFFER.search(line):
            buffers.append(float(m.group(1)) * MIB)
        elif m := _SIZE.search(line):
            sizes.append(m.groups())
    if len(buffers) != len(sizes) or not sizes:
        raise AssertionError(f"unexpected llama.cpp KV log: {len(buffers)} buffers, {len(sizes)} sizes")
    caches = tuple(
        CacheReport(int(s[1]), int(s[2]), int(s[4]), s[5], s[7], b) for s, b in zip(sizes, buffers, strict=True)
    )
    n_layer = max(flags) if flags else 0  # the last "layer" line is the output layer
    return KVReport(tuple(flags[i] for i in range(n_layer)), caches, n_ctx)
