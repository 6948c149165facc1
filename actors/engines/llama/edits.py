"""Session edits on the llama.cpp executor: truncation (rollback), forks and shared prefixes.

Primitives (called by the ``LlamaExecutor`` methods ``truncate`` / ``fork_session`` /
``share_prefix``, under its lock):
- ``truncate(s, session_id, length, ops, recall, materialize) -> logits | None``: the log of session
  ``s`` keeps its first ``length`` tokens (``materialize`` restores its pending imports).
  Imports still pending past ``length`` are dropped unrestored; the session's cells at the dropped
  tokens' positions leave its sequence the way evicted cells do (parked, ``cache_ops``), so the
  next tokens refill their cells in order and appending the dropped tokens again gives bit-identical
  logits; the positions become ``session_table.truncated_positions``'s. The logits returned are
  the last kept token's, decoded in the scratch sequence over the cells before it
  (``CacheOps.peek``): the session's own cells stay as they were.
- ``fork(src, seq, ops, materialize) -> Session``: a new session on the free sequence ``seq`` that
  shares every cell of ``src`` (``CacheOps.share``: ``llama_memory_seq_cp``, one copy of the KV
  visible to both sequences, copied for the fork only when one side moves its cells), with a copy
  of its log, positions and last logits. The shared cells count against ``n_ctx`` for each session
  that holds them (the budget counts tokens per session).
- ``share_prefix(src, dst, n, ops, materialize, windowed, ensure_room)``: the empty session ``dst``
  takes the first ``n`` tokens of ``src`` and shares their cells (``CacheOps.share`` up to position
  ``n``), as a fork of that prefix: not decoded again. ``src`` must hold them where a prefill puts
  them (``CapabilityError`` otherwise, and on a sliding-window cache); ``RangeError`` when ``dst`` is
  not empty or ``n`` is out of ``src``'s log.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from kvres.policy.errors import CapabilityError, RangeError

from ..session_table import check_truncate_length, truncated_positions
from .cache_ops import CacheOps
from .recall_exchange import RecallExchange
from .session import Session

Materialize = Callable[[Session], None]


def truncate(s: Session, session_id: str, length: int, ops: CacheOps, recall: RecallExchange,
             materialize: Materialize) -> npt.NDArray[np.float32] | None:
    length = check_truncate_length(session_id, length, len(s.tokens))
    if length < len(s.tokens):
        _cut(s, session_id, length, ops, recall, materialize)
    if s.logits is not None:
        return s.logits.copy()
    if not s.tokens or not s.positions.resident_mask()[-1]:
        return None
    materialize(s)
    s.logits = ops.peek(s.seq, s.tokens[-1], int(s.positions.all_positions()[-1]))
    return s.logits.copy()


def _cut(s: Session, session_id: str, length: int, ops: CacheOps, recall: RecallExchange, materialize: Materialize) -> None:
    recall.forget(session_id)
    if recall.memo is not None and recall.memo.session_id == session_id:
        recall.memo = None
    s.prefill = None
    s.logits = None
    s.pending = [p for p in s.pending if p.rng.start < length]
    if any(p.rng.end > length for p in s.pending):
        materialize(s)
    in_engine = s.positions.resident_mask()
    for p in s.pending:
        in_engine[p.rng.start : p.rng.end] = False
    gone = s.positions.all_positions()[length:][in_engine[length:]]
    if gone.size:
        ops.remove(s.seq, gone, 0)
    s.positions = truncated_positions(s.positions, length)
    del s.tokens[length:]


def fork(src: Session, seq: int, ops: CacheOps, materialize: Materialize) -> Session:
    """The fork of ``src`` on the free session sequence ``seq``."""
    materialize(src)
    ops.share(src.seq, seq)
    ops.live += src.positions.resident_count
    return Session(seq, tokens=list(src.tokens), positions=src.positions.copy(),
                   logits=None if src.logits is None else src.logits.copy())


def share_prefix(src: Session, dst: Session, n: int, ops: CacheOps, materialize: Materialize, windowed: bool,
                 ensure_room: Callable[[int], int]) -> None:
    if dst.tokens or not 0 < n <= len(src.tokens):
        raise RangeError(f"cannot share {n} of {len(src.tokens)} tokens into a session holding {len(dst.tokens)} "
                         "(it must be empty)")
    if windowed:
        raise CapabilityError("a sliding-window cache cannot share a prefix between sequences")
    materialize(src)
    if not (src.positions.resident_mask()[:n].all() and np.array_equal(src.positions.all_positions()[:n], np.arange(n))):
        raise CapabilityError(f"the source does not hold its first {n} tokens at the positions a prefill gives them")
    ensure_room(n)
    ops.share(src.seq, dst.seq, n)
    ops.live += n
    dst.positions.append(n)
    dst.tokens.extend(src.tokens[:n])
    dst.logits = None
