"""The timed operations of the llama mechanism benchmark, one resident size at a time.

Primitives:
- ``prompt(executor, n)``: ``n`` tokens of story text for the model.
- ``measure_eviction(executor, resident, repeats) -> dict``: StreamingLLM eviction of a middle
  range behind 4 sinks with re-basing, the K-shift applied (``flush``), against recomputing the
  same survivors (a prefill of them in a fresh session); then each side's next decode.
- ``measure_import(executor, resident, repeats) -> dict``: a suspended session of ``resident``
  tokens reopened from its token log and given back its exported block (restored by ``flush``),
  against re-prefilling it from the log (``admit_range``); then each side's next decode.

Mechanism times stop when the cache is ready; end-to-end times add the next token's decode,
which both sides need. Every figure is the median over ``repeats`` fresh sessions; set-up (the
initial prefill, the export) is outside the timed regions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvres.actors.engines.llama import LlamaExecutor
from kvres.policy import Range
from kvres.testing import kl_divergence

SINKS = 4
NEXT = 13
STORY = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
    "with her friends. One day, she saw a big red ball under a tree. She ran to get it, but a dog "
    "took it first. Tom had a toy car. He liked to drive it around the house."
)


def prompt(executor: LlamaExecutor, n: int) -> list[int]:
    tokens = executor.tokenize(STORY)
    while len(tokens) < n:
        tokens += executor.tokenize(" " + STORY, add_bos=False)
    return tokens[:n]


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _median_ms(samples: dict[str, list[float]]) -> dict[str, float]:
    return {f"{name}_ms": 1e3 * statistics.median(values) for name, values in samples.items()}


def measure_eviction(executor: LlamaExecutor, resident: int, repeats: int) -> dict[str, Any]:
    """Prefill 2 * resident tokens, evict [4, resident + 4) re-based: ``resident`` survive."""
    tokens = prompt(executor, 2 * resident)
    evicted = Range(SINKS, resident + SINKS)
    survivors = tokens[:SINKS] + tokens[resident + SINKS :]
    t: dict[str, list[float]] = {k: [] for k in (
        "evict_calls", "kshift", "evict_rebase", "evict_next_decode", "recompute", "recompute_next_decode")}
    kl = 0.0
    for _ in range(repeats):
        executor.open_session("evict")
        executor.append("evict", tokens)
        t_evict, _ = _timed(lambda: executor.evict_range("evict", evicted, rebase=True))
        t_shift, _ = _timed(lambda: executor.flush("evict"))
        t_next, after_evict = _timed(lambda: executor.append("evict", [NEXT]))
        executor.close_session("evict")
        executor.open_session("recompute")
        t_recompute, _ = _timed(lambda: executor.append("recompute", survivors))
        t_rnext, recomputed = _timed(lambda: executor.append("recompute", [NEXT]))
        executor.close_session("recompute")
        for name, value in (("evict_calls", t_evict), ("kshift", t_shift), ("evict_rebase", t_evict + t_shift),
                            ("evict_next_decode", t_next), ("recompute", t_recompute),
                            ("recompute_next_decode", t_rnext)):
            t[name].append(value)
        kl = kl_divergence(recomputed, after_evict)
    ms = _median_ms(t)
    e2e_evict = statistics.median(a + b for a, b in zip(t["evict_rebase"], t["evict_next_decode"], strict=True))
    e2e_recompute = statistics.median(a + b for a, b in zip(t["recompute"], t["recompute_next_decode"], strict=True))
    return {
        "resident_tokens": resident,
        "evicted_tokens": len(evicted),
        **ms,
        "recompute_over_evict_rebase": ms["recompute_ms"] / ms["evict_rebase_ms"],
        "end_to_end_evict_ms": 1e3 * e2e_evict,
        "end_to_end_recompute_ms": 1e3 * e2e_recompute,
        "end_to_end_ratio": e2e_recompute / e2e_evict,
        "kl_recompute_vs_evicted_nats": kl,
    }


def measure_import(executor: LlamaExecutor, resident: int, repeats: int) -> dict[str, Any]:
    tokens = prompt(executor, resident)
    executor.open_session("source")
    executor.append("source", tokens)
    expected = executor.append("source", [NEXT])
    block = executor.export_range("source", Range(0, resident))
    log = executor.token_log("source")[:resident]
    executor.close_session("source")
    t: dict[str, list[float]] = {k: [] for k in ("import", "import_next_decode", "reprefill",
                                                 "reprefill_next_decode")}
    diff = 0.0

    def restore() -> None:
        executor.import_range("import", block)
        executor.flush("import")

    for _ in range(repeats):
        executor.open_session("import", log)
        t_import, _ = _timed(restore)
        t_inext, imported = _timed(lambda: executor.append("import", [NEXT]))
        executor.close_session("import")
        executor.open_session("reprefill", log)
        t_reprefill, _ = _timed(lambda: executor.admit_range("reprefill", Range(0, resident)))
        t_rnext, _ = _timed(lambda: executor.append("reprefill", [NEXT]))
        executor.close_session("reprefill")
        for name, value in (("import", t_import), ("import_next_decode", t_inext),
                            ("reprefill", t_reprefill), ("reprefill_next_decode", t_rnext)):
            t[name].append(value)
        diff = float(np.max(np.abs(imported - expected)))
    ms = _median_ms(t)
    e2e_import = statistics.median(a + b for a, b in zip(t["import"], t["import_next_decode"], strict=True))
    e2e_reprefill = statistics.median(a + b for a, b in zip(t["reprefill"], t["reprefill_next_decode"], strict=True))
    return {
        "resident_tokens": resident,
        "block_bytes": block.payload_nbytes,
        **ms,
        "reprefill_over_import": ms["reprefill_ms"] / ms["import_ms"],
        "end_to_end_import_ms": 1e3 * e2e_import,
        "end_to_end_reprefill_ms": 1e3 * e2e_reprefill,
        "end_to_end_ratio": e2e_reprefill / e2e_import,
        "import_max_abs_logit_diff": diff,
    }
