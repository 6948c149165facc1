"""Recall on llama.cpp: a session's cells and cold blocks' cells merged, moved and scored in numpy.

Primitives:
- ``RecallExchange(fmt, model, model_path, ops, scoring, materialize, room)``: the recall half of one
  ``LlamaExecutor`` (``fmt`` its ``blocks.BlockFormat``, ``scoring`` its scoring context,
  ``materialize`` what restores a session's pending imports, ``room(n)`` its free cells, or
  ``ContextFullError`` when fewer than ``n``), called under the executor's lock:
  ``attention(s, session_id, blocks, tokens, window, rebase) -> AttentionCapture`` (the executor's
  ``recall_attention``), ``prepare(s, session_id, blocks, rebase) -> bool`` (``prepare_recall``),
  ``forget(session_id)``, ``exchange(s, session_id, evict, blocks, rebase) -> exported blocks``,
  ``take_prefill(s, tokens)`` (``tokens`` appended from the session's prefill, without a decode,
  where it holds them: their logits, else None) and ``moved(cells, target)`` (cells at other
  positions, their keys turned).
- ``as_f16(cells, type_k, type_v) -> StateCells``: the cells with f16 K and V rows (what the scoring
  context holds); quantized rows are dequantized (``quant_rows``).

Mechanism: the session's cells and the cold blocks' are read as arrays (``state_blob.StateCells``),
merged in log order, moved to the positions ``kvres.policy.recall.exchange_layout`` gives them in
numpy (``rope.KeyRotation``; f16 through ggml's converters) and restored in one state write: into
the scoring context (f16, V transposed) to decode the new turn there with attention capture, and
into the session for the exchange. The turn's cells and logits from the scoring pass are kept
(``session.Prefill``) for the next append of exactly those tokens. What a recall reads is kept for
the exchange that follows it (``RecallMemo``); what it computes before the turn can be done ahead
while the backend is idle (``RecallPrep``, within ``RECALL_PREP_BYTES`` over all sessions).
A sliding-window model's blobs hold two caches: its recalls raise ``CapabilityError`` here (the
host then imports the cold blocks whole, ``import_range``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.actors.engines.executor import RECALL_PREP_BYTES
from kvres.actors.model_files import read_gguf_metadata
from kvres.coldstore.block import KVBlock
from kvres.policy.errors import BlockMismatchError, CapabilityError
from kvres.policy.ranges import Range
from kvres.policy.recall import BlockSpans, exchange_layout
from kvres.policy.scoring import AttentionCapture

from .attention import ScoringContext
from .blocks import BlockFormat
from .cache_ops import CacheOps
from .engine import LlamaModel
from .ggml_tensors import f16_to_f32, f32_to_f16
from .llama_errors import ContextFullError, EngineError
from .quant_rows import DEQUANTIZABLE, dequantize_rows
from .rope import KeyRotation, key_rotation
from .session import Prefill, Session
from .state_blob import StateCells, parse_cells

_FLOAT_DTYPES: dict[str, np.dtype[Any]] = {"f16": np.dtype("<f2"), "f32": np.dtype("<f4")}


@dataclass(frozen=True)
class RecallMemo:
    """What ``recall_attention`` read, for the ``exchange`` that follows it (valid while the
    session's positions are unchanged): its resident cells, and those merged with the blocks'
    cells in log order at the positions they were stored at."""

    session_id: str
    positions: npt.NDArray[np.int64]
    old: tuple[StateCells, npt.NDArray[np.int64]]
    cells: StateCells
    index: npt.NDArray[np.int64]
    blocks: frozenset[int]  # ids of the blocks merged in


@dataclass(frozen=True)
class RecallPrep:
    """What ``recall_attention`` computes before it decodes the turn (``prepare_recall``, done
    while the backend is idle): valid while the session holds ``memo.positions`` with nothing
    pending, for these very blocks and ``rebase``."""

    blocks: tuple[KVBlock, ...]
    rebase: bool
    memo: RecallMemo
    blob: bytes  # the scoring context's state: resident and block cells at their recall positions
    n_cells: int
    first: int  # the turn's first position there

    @property
    def nbytes(self) -> int:
        old, merged = self.memo.old[0], self.memo.cells
        return old.k.nbytes + old.v.nbytes + merged.k.nbytes + merged.v.nbytes + len(self.blob)

    def holds(self, s: Session, blocks: Sequence[KVBlock], rebase: bool) -> bool:
        return (rebase == self.rebase and not s.pending and len(blocks) == len(self.blocks)
                and all(a is b for a, b in zip(blocks, self.blocks, strict=True))
                and np.array_equal(self.memo.positions, s.positions.all_positions()))


class RecallExchange:
    def __init__(
        self, fmt: BlockFormat, model: LlamaModel, model_path: Path, ops: CacheOps,
        scoring: Callable[[], ScoringContext], materialize: Callable[[Session], None], room: Callable[[int], int],
    ) -> None:
        self.fmt, self.model, self.model_path, self.ops = fmt, model, model_path, ops
        self._scoring, self._materialize, self._room = scoring, materialize, room
        self.memo: RecallMemo | None = None
        self.preps: OrderedDict[str, RecallPrep] = OrderedDict()  # newest last

    def attention(
        self, s: Session, session_id: str, blocks: Sequence[KVBlock], toks: list[int], window: int, rebase: bool
    ) -> AttentionCapture:
        self.fmt.require_cells()
        prep = self.preps.pop(session_id, None)
        if prep is None or not prep.holds(s, blocks, rebase):
            prep = self._prep(s, session_id, blocks, rebase)
        # the exchange that follows a recall reads the same cells: keep them for it
        self.memo = prep.memo
        first = prep.first
        keys = np.concatenate([prep.memo.index, len(s.tokens) + np.arange(len(toks), dtype=np.int64)])
        capture, logits, own = self._scoring().capture_after(prep.blob, prep.n_cells, toks, first, keys,
                                                             window, holder=prep)
        s.prefill = None
        if self.fmt.type_k == self.fmt.type_v == "f16":  # the scoring context's types: its cells fit as they are
            fresh = parse_cells([own])
            if np.array_equal(fresh.positions, np.arange(first, first + len(toks))):
                s.prefill = Prefill(tuple(toks), fresh, logits, s.positions.all_positions())
        return capture

    def prepare(self, s: Session, session_id: str, blocks: Sequence[KVBlock], rebase: bool) -> bool:
        self.preps.pop(session_id, None)
        self.fmt.require_cells()
        n_cells = s.positions.resident_count + sum(len(b.token_range) for b in blocks)
        per_cell = self.fmt.geometry.n_layers * (self.fmt.k_row + self.fmt.v_row)
        if 3 * n_cells * per_cell > RECALL_PREP_BYTES:  # resident, merged and encoded copies
            return False
        prep = self._prep(s, session_id, blocks, rebase)
        self.preps[session_id] = prep
        self._scoring().load(prep.blob, prep.n_cells, prep)
        held = sum(p.nbytes for p in self.preps.values())
        while held > RECALL_PREP_BYTES and len(self.preps) > 1:
            held -= self.preps.popitem(last=False)[1].nbytes
        return True

    def forget(self, session_id: str) -> None:
        self.preps.pop(session_id, None)

    def _prep(self, s: Session, session_id: str, blocks: Sequence[KVBlock], rebase: bool) -> RecallPrep:
        spans = _spans_of(blocks)
        layout = exchange_layout(s.positions, (), spans, rebase)
        self.fmt.check_blocks(session_id, s.tokens, blocks, spans)
        old = self._resident_cells(s)
        merged, log_index = self._merged_cells(blocks, layout.resident, old, spans)
        memo = RecallMemo(session_id, s.positions.all_positions(), old, merged, log_index,
                          frozenset(id(b) for b in blocks))
        cells = self.moved(merged, layout.positions[log_index])
        # the scoring context holds f16 and, without flash attention, V transposed
        blob = as_f16(cells, self.fmt.type_k, self.fmt.type_v).to_blob(v_trans=True) if len(cells) else b""
        first = int(cells.positions[-1]) + 1 if len(cells) else 0
        return RecallPrep(tuple(blocks), rebase, memo, blob, len(cells), first)

    def exchange(
        self, s: Session, session_id: str, evict: Sequence[Range], blocks: Sequence[KVBlock], rebase: bool
    ) -> list[KVBlock]:
        """Evict ``evict`` and import ``blocks`` in one state restore: the session's cells read once
        (or taken from the recall before), merged with the blocks', moved to ``exchange_layout``'s
        positions and written back; the evicted ranges exported."""
        self.fmt.require_cells()
        spans = _spans_of(blocks)
        layout = exchange_layout(s.positions, evict, spans, rebase)
        memo, self.memo = self.memo, None
        if memo is None or memo.session_id != session_id or s.pending \
                or not np.array_equal(memo.positions, s.positions.all_positions()):
            memo = None
        old, old_index = memo.old if memo is not None else self._resident_cells(s)
        bounds = np.searchsorted(old_index, [(r.start, r.end) for r in evict]).reshape(-1, 2)
        exported = []
        for rng, (lo, hi) in zip(evict, bounds.tolist(), strict=True):
            part = old.take(np.arange(lo, hi))
            exported.append(self.fmt.block(session_id, rng, s.tokens[rng.start : rng.end], self.fmt.blob(part),
                                           part.positions.tolist()))
        if memo is not None and all(id(b) in memo.blocks for b in blocks):
            keep = layout.resident[memo.index]  # cells of blocks left cold are not resident there
            cells, log_index = memo.cells.take(np.nonzero(keep)[0]), memo.index[keep]
        else:
            self.fmt.check_blocks(session_id, s.tokens, blocks, spans)
            cells, log_index = self._merged_cells(blocks, layout.resident, (old, old_index), spans)
        self._write(s, session_id, old, self.moved(cells, layout.positions[log_index]))
        before = s.positions.all_positions()
        s.positions.relayout(layout.resident, layout.positions, layout.next_pos)
        s.logits = None
        if s.prefill is not None and np.array_equal(s.prefill.positions, before):
            s.prefill = replace(s.prefill, positions=s.positions.all_positions())
        else:
            s.prefill = None
        return exported

    def _write(self, s: Session, session_id: str, old: StateCells, cells: StateCells) -> None:
        """Replace the session's ``old`` cells by ``cells``; if llama.cpp refuses them, the old ones
        are restored (else the session's KV is gone) and ``ContextFullError`` says which."""
        self._room(len(cells) - len(old))
        if len(old):
            self.ops.remove(s.seq, old.positions, 0)
        if not len(cells):
            return
        self.ops.reserve(len(cells))
        if self.ops.restore(s.seq, self.fmt.blob(cells), cells.positions.tolist(), 0):
            return
        restored = len(old) and self.ops.restore(s.seq, self.fmt.blob(old), old.positions.tolist(), 0)
        if not restored:
            s.positions.relayout(np.zeros(len(s.tokens), dtype=bool), np.zeros(len(s.tokens)), 0)
        raise ContextFullError(
            f"llama.cpp could not restore {len(cells)} cells for session {session_id!r}"
            + ("; it is as before" if restored else "; its KV is lost (its tokens are not)"),
            needed=len(cells), free=self._room(0),
        )

    def take_prefill(self, s: Session, toks: list[int]) -> npt.NDArray[np.float32] | None:
        """Append ``toks`` from the session's prefill (taken from it; its cells restored, moved to
        where they go, no decode) when it holds exactly them and the session is as the prefill
        expects: their logits, or None (nothing appended)."""
        p, s.prefill = s.prefill, None
        if p is None or p.tokens != tuple(toks) or not np.array_equal(p.positions, s.positions.all_positions()):
            return None
        first = s.positions.next_pos
        try:
            cells = self.moved(p.cells, np.arange(first, first + len(toks), dtype=np.int64))
        except CapabilityError:
            return None  # its keys cannot be moved here: decode the tokens after all
        self.ops.reserve(len(toks))
        if not self.ops.restore(s.seq, self.fmt.blob(cells), cells.positions.tolist(), 0):
            return None
        return s.appended(toks, p.logits)

    def _resident_cells(self, s: Session) -> tuple[StateCells, npt.NDArray[np.int64]]:
        """The session's resident cells in log order (one state read), with their log indices."""
        self._materialize(s)
        self.ops.flush_shifts()  # the K rows read must carry their rotation
        index = np.nonzero(s.positions.resident_mask())[0].astype(np.int64)
        if not index.size:
            return self.fmt.empty_cells(), index
        cells = parse_cells([self.ops.ctx.state_get(s.seq)])
        if np.any(np.diff(cells.positions) < 0):
            cells = cells.take(np.argsort(cells.positions, kind="stable"))
        if not np.array_equal(cells.positions, s.positions.all_positions()[index]):
            raise EngineError(f"sequence {s.seq} holds other cells than its session's positions say")
        return cells, index

    def _merged_cells(
        self, blocks: Sequence[KVBlock], keep: npt.NDArray[np.bool_],
        old: tuple[StateCells, npt.NDArray[np.int64]], spans: BlockSpans,
    ) -> tuple[StateCells, npt.NDArray[np.int64]]:
        """The ``old`` cells where ``keep`` says so and the blocks' cells, in log order, with the
        log index of each (cells keep the positions they were stored at)."""
        parts, index = [], []
        if len(old[0]):
            held = keep[old[1]]
            parts.append(old[0] if held.all() else old[0].take(np.nonzero(held)[0]))
            index.append(old[1][held])
        if blocks:
            cols, expected = spans.spans, spans.positions
            lens = cols[:, 1] - cols[:, 0]
            cells = parse_cells([b.payload for b in blocks])
            owner = np.repeat(np.arange(len(blocks)), lens)
            if not np.array_equal(cells.positions, expected):  # payloads list cells in cell order: sort them
                cells = cells.take(np.lexsort((cells.positions, owner)))
                if not np.array_equal(cells.positions, expected):
                    bad = blocks[int(owner[np.nonzero(cells.positions != expected)[0][0]])]
                    raise BlockMismatchError(
                        f"block for {bad.token_range}: its payload's cell positions do not match its header positions")
            parts.append(cells)
            index.append(cols[owner, 0] + np.arange(len(cells)) - np.repeat(np.cumsum(lens) - lens, lens))
        if not parts:
            return self.fmt.empty_cells(), np.zeros(0, dtype=np.int64)
        if len(parts) == 1:
            return parts[0], index[0]
        # interleave the two runs (each in log order) straight into place
        log_index = np.concatenate(index)
        order = np.argsort(log_index, kind="stable")
        slot = np.empty_like(order)
        slot[order] = np.arange(order.size)
        a, b = parts
        k = np.empty((a.k.shape[0], order.size, a.k.shape[2]), dtype=np.uint8)
        v = np.empty((a.v.shape[0], order.size, a.v.shape[2]), dtype=np.uint8)
        pos = np.empty(order.size, dtype=np.int64)
        for part, where in ((a, slot[: len(a)]), (b, slot[len(a) :])):
            k[:, where], v[:, where], pos[where] = part.k, part.v, part.positions
        return StateCells(a.prefix, pos, k, v, a.k_types, a.v_types, a.v_el), log_index[order]

    def moved(self, cells: StateCells, target: npt.NDArray[np.int64]) -> StateCells:
        """``cells`` at ``target`` positions, their keys turned by how far each moved."""
        delta = target - cells.positions
        moved = np.nonzero(delta)[0]
        if not moved.size:
            return cells.with_positions(target)
        rotation = self._key_rotation()
        type_k = self.fmt.type_k
        if rotation is None or type_k not in _FLOAT_DTYPES:
            raise CapabilityError(
                f"cells of a {type_k} K cache cannot be moved to other positions here"
                + ("" if rotation is None else " (numpy turns f32 / f16 keys only)"))
        g = self.fmt.geometry
        every = moved.size == delta.size  # then no gather / scatter of the moved rows
        k = cells.k.copy() if not every else cells.k
        rows = (k if every else k[:, moved]).view(_FLOAT_DTYPES[type_k])
        rows = rows.reshape(g.n_layers, moved.size, g.n_kv_heads, g.head_dim)
        if type_k == "f16":
            rows = f16_to_f32(rows)
        turned = rotation.rotate(rows, delta[moved], axis=1)
        back = (f32_to_f16(turned) if type_k == "f16" else turned).reshape(g.n_layers, moved.size, -1).view(np.uint8)
        if every:
            return cells.with_positions(target, back)
        k[:, moved] = back
        return cells.with_positions(target, k)

    def _key_rotation(self) -> KeyRotation | None:
        if not hasattr(self, "_rotation"):
            self._rotation = key_rotation(self.model, read_gguf_metadata(self.model_path))
        return self._rotation


def as_f16(cells: StateCells, type_k: str, type_v: str) -> StateCells:
    for name in (type_k, type_v):
        if name not in _FLOAT_DTYPES and name not in DEQUANTIZABLE:
            raise CapabilityError(f"a {type_k}/{type_v} KV cache cannot be scored without re-prefilling it "
                                  f"(readable as f16: f16, f32, {', '.join(DEQUANTIZABLE)})")
    n_layer = cells.k.shape[0]
    f16 = 1  # GGML_TYPE_F16
    return StateCells(cells.prefix, cells.positions, _rows_f16(cells.k, type_k), _rows_f16(cells.v, type_v),
                      (f16,) * n_layer, (f16,) * n_layer, 2)


def _rows_f16(rows: npt.NDArray[np.uint8], type_name: str) -> npt.NDArray[np.uint8]:
    if type_name == "f16":
        return rows
    n_layer, n = rows.shape[0], rows.shape[1]
    if type_name == "f32":
        values = f32_to_f16(rows.view("<f4"))
    else:
        values = dequantize_rows(rows, type_name)
    return values.view(np.uint8).reshape(n_layer, n, -1)


def _spans_of(blocks: Sequence[KVBlock]) -> BlockSpans:
    return BlockSpans.of([(b.token_range, b.positions) for b in blocks])
