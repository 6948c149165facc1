"""The llama context a ``LlamaExecutor`` asks for, known before anything loads (what sizing prices).

Primitives:
- ``RESERVED_CELLS`` (applying pending K-shifts decodes one throwaway token), ``RESERVED_SEQS``
  (the scratch sequence; each session also has a parking sequence, ``cache_ops``),
  ``SPARE_STREAM_SESSIONS`` (from this many sessions on a split layout keeps one stream more, to
  move sessions through), ``N_BATCH`` (the executor's default ``n_batch``).
- ``spare_streams(kv_layout, n_seq_max) -> int``: the streams a split layout has beside its
  sessions' (0 or 1), each as large as a session's.
- ``context_request(n_ctx, n_seq_max, kv_layout) -> (cells, sequences)``: the ``n_ctx`` and
  ``n_seq_max`` the executor creates its ``LlamaContext`` with: one unified cache of ``n_ctx``
  and the reserved cells over ``2 * n_seq_max + 1`` sequences, or one stream per session (and
  the spare).
- ``cache_cells(kv_layout, n_seq_max) -> CacheCells``: how llama.cpp sizes that context's caches
  (micro-batches of ``N_BATCH``, llama.cpp's small SWA cache: the window of every sequence plus
  one micro-batch); ``context_cells(n_ctx)``: the cells of a unified context for ``n_ctx`` tokens
  (the reserved cells added, padded to 256).
- ``default_threads()``: the decode threads when none are given.
"""

from __future__ import annotations

import os

from kvres.policy.kv_layout import CacheCells

RESERVED_CELLS = 2
RESERVED_SEQS = 1
SPARE_STREAM_SESSIONS = 8
N_BATCH = 512


def spare_streams(kv_layout: str, n_seq_max: int) -> int:
    return int(kv_layout == "split" and n_seq_max >= SPARE_STREAM_SESSIONS)


def context_request(n_ctx: int, n_seq_max: int, kv_layout: str) -> tuple[int, int]:
    if kv_layout == "split":
        spare = spare_streams(kv_layout, n_seq_max)
        return n_ctx + spare * (n_ctx // n_seq_max), n_seq_max + spare
    return n_ctx + RESERVED_CELLS, 2 * n_seq_max + RESERVED_SEQS


def cache_cells(kv_layout: str, n_seq_max: int) -> CacheCells:
    if kv_layout == "split":  # one stream per session (and a spare), no parking or scratch sequences
        return CacheCells(n_seq_max=n_seq_max + spare_streams(kv_layout, n_seq_max), n_ubatch=N_BATCH,
                          kv_unified=False, swa_full=False)
    return CacheCells(n_seq_max=2 * n_seq_max + RESERVED_SEQS, n_ubatch=N_BATCH, kv_unified=True, swa_full=False)


def context_cells(n_ctx: int) -> int:
    return CacheCells().context_cells(n_ctx + RESERVED_CELLS)


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))
