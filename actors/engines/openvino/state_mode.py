"""State slicing: the OpenVINO executor that edits the KV states themselves.

Primitives:
- ``StateExecutor(model_path, **options)`` (``mode = "state"``; options as ``OpenVINOExecutor``):
  the sync slices the KV states by name and re-bases the kept keys by a numpy RoPE rotation
  (``rope.rotate_keys``), each by how far it moved: one slice and one rotation for a whole plan.
  Admitting recomputes only the admitted tokens over the resident prefix before them and splices
  them in, the tail keeping its KV (rotated if it had to move up); importing splices the block's KV
  in, rotated to its place. Eviction makes no engine call. ``position_shift`` needs the RoPE
  parameters of the model (a converted GGUF records them).
  For recall: ``recall_attention`` scores cold blocks by a new turn's attention with the blocks
  spliced into a scoring request's states (nothing imported; ``prepare_recall`` splices them and
  loads the request while the backend is idle, kept for the turn if the session stays as it
  is), ``exchange`` evicts and imports many
  ranges with one read and one write of the states (``kvres.policy.recall.exchange_layout``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from kvres.actors.engines.executor import RECALL_PREP_BYTES, check_block_token_ids
from kvres.coldstore.block import KVBlock
from kvres.policy.errors import BlockMismatchError, CapabilityError
from kvres.policy.positions import AdmitOp, PositionMap
from kvres.policy.ranges import Range
from kvres.policy.recall import exchange_layout
from kvres.policy.scoring import AttentionCapture

from .base_executor import ENGINE, OpenVINOExecutor, RecomputeError, Session
from .rope import turn_keys
from .states import KVArrays, concat, read_kv, take


class StateExecutor(OpenVINOExecutor):
    mode = "state"
    _recall_memo: _RecallMemo | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recall_preps: OrderedDict[str, _RecallPrep] = OrderedDict()  # newest last

    def close_session(self, session_id: str) -> None:
        super().close_session(session_id)
        self._recall_preps.pop(session_id, None)

    def _forget_recall(self, session_id: str) -> None:
        self._recall_preps.pop(session_id, None)
        if self._recall_memo is not None and self._recall_memo.session_id == session_id:
            self._recall_memo = None

    def _can_rebase(self) -> bool:
        return self.loaded.rope is not None

    def _apply_pending(self, session_id: str, s: Session) -> None:
        held = s.held
        entries = np.nonzero(held.resident_mask())[0]  # log index of each held entry
        keep = s.positions.resident_mask()[entries]
        if keep.sum() != s.positions.resident_count:
            raise RuntimeError("state mode has admissions pending; they are never deferred")
        kept = entries[keep]
        moved = s.positions.all_positions()[kept] - held.all_positions()[kept]
        kv = [(k[:, :, keep], v[:, :, keep]) for k, v in self._kv(s)]
        self._set_kv(s, self._rotate(kv, moved))
        s.kv_map = None

    def admit_range(self, session_id: str, rng: Range) -> None:
        s = self._get(session_id)
        new_map = s.positions.copy()
        op = new_map.admit(rng)
        self.sync(session_id)
        kv = self._kv(s)
        idx = self._index(s.positions, rng.start)
        head, tail = take(kv, 0, idx), self._rotate(take(kv, idx), op.tail_shift)
        try:
            self._set_kv(s, head)
            self._run(s, s.tokens[rng.start:rng.end], list(op.positions), idx)
            fresh = take(read_kv(s.request, self.loaded.state_names, self.loaded.geometry), idx)
            self._set_kv(s, concat(head, fresh, tail))
        except Exception as exc:
            self._set_kv(s, kv)
            raise RecomputeError(f"recomputing {rng} of session {session_id!r} failed: {exc}") from exc
        s.positions = new_map

    def _place_block(
        self, session_id: str, s: Session, block: KVBlock, part: KVArrays, new_map: PositionMap, op: AdmitOp
    ) -> None:
        self.sync(session_id)
        kv = self._kv(s)
        idx = self._index(s.positions, block.token_range.start)
        head, tail = take(kv, 0, idx), self._rotate(take(kv, idx), op.tail_shift)
        part = self._rotate(part, op.positions[0] - block.positions[0])
        self._set_kv(s, concat(head, part, tail))
        s.positions = new_map

    # -- recall: many blocks in one step ---------------------------------------------------------
    # Entries are handled as one float32 array ``[layer, k|v, kv_head, entry, dim]`` (the block
    # payload's layout), with the log index and the position each entry's key was rotated for.
    def recall_attention(
        self, session_id: str, blocks: Sequence[KVBlock], tokens: Sequence[int], window: int, rebase: bool
    ) -> AttentionCapture:
        s = self._get(session_id)
        if not self._caps.attention_capture:
            raise CapabilityError(f"model {self.loaded.source!r} exposes no attention probabilities")
        toks = self._valid_tokens(tokens)
        if not toks:
            raise ValueError("recall_attention needs the turn's tokens")
        self.sync(session_id)
        prep = self._recall_preps.pop(session_id, None)
        if prep is None or not prep.holds(s, blocks, rebase):
            prep = self._recall_prep(session_id, s, blocks, rebase)
        # the exchange that follows a recall reads the same entries: keep them for it
        self._recall_memo = prep.memo
        first = prep.first
        loaded = self._score_holds is prep
        probs, logits, own = self._scoring_pass().attention_after(
            prep.kv, toks, list(range(first, first + len(toks))), window, loaded=loaded)
        s.prefill = _Prefill(tuple(toks), own, first, logits, s.positions.all_positions())
        keys = np.concatenate([prep.memo.merged.index, len(s.tokens) + np.arange(len(toks), dtype=np.int64)])
        return AttentionCapture(probs, keys, keys[keys.size - probs.shape[2]:].copy())

    def prepare_recall(self, session_id: str, blocks: Sequence[KVBlock], rebase: bool) -> bool:
        """What ``recall_attention`` does before it runs the turn (read, check, merge and move the
        entries), kept for the session's next recall while it is unchanged; False when that would
        take more than ``RECALL_PREP_BYTES`` (prepared sessions together: the oldest go first)."""
        s = self._get(session_id)
        self._recall_preps.pop(session_id, None)
        g = self.loaded.geometry
        n = s.positions.resident_count + sum(len(b.token_range) for b in blocks)
        if 3 * n * g.n_layers * 2 * g.n_kv_heads * g.head_dim * 4 > RECALL_PREP_BYTES:
            return False
        self.sync(session_id)
        prep = self._recall_prep(session_id, s, blocks, rebase)
        self._recall_preps[session_id] = prep
        self._scoring_pass().load(prep.kv)
        self._score_holds = prep
        held = sum(p.nbytes for p in self._recall_preps.values())
        while held > RECALL_PREP_BYTES and len(self._recall_preps) > 1:
            held -= self._recall_preps.popitem(last=False)[1].nbytes
        return True

    def _recall_prep(self, session_id: str, s: Session, blocks: Sequence[KVBlock], rebase: bool) -> _RecallPrep:
        layout = exchange_layout(s.positions, (), [(b.token_range, b.positions) for b in blocks], rebase)
        old = self._resident_entries(s)
        merged = _merge(old, self._block_entries(session_id, s, blocks), layout.resident)
        memo = _RecallMemo(session_id, s.positions.all_positions(), old, merged, frozenset(id(b) for b in blocks))
        return _RecallPrep(tuple(blocks), rebase, memo, _unstack(self._moved(merged, layout.positions)),
                           layout.next_pos)

    def exchange(self, session_id: str, evict: Sequence[Range], blocks: Sequence[KVBlock], rebase: bool) -> list[KVBlock]:
        s = self._get(session_id)
        if rebase and not self._caps.position_shift:
            raise CapabilityError(f"state mode cannot re-base the positions of model {self.loaded.source!r}")
        self.sync(session_id)
        layout = exchange_layout(s.positions, evict, [(b.token_range, b.positions) for b in blocks], rebase)
        memo, self._recall_memo = self._recall_memo, None
        if memo is None or memo.session_id != session_id or not np.array_equal(memo.positions, s.positions.all_positions()):
            memo = None
        old = memo.old if memo is not None else self._resident_entries(s)
        exported = []
        for rng in evict:
            sel = np.nonzero((old.index >= rng.start) & (old.index < rng.end))[0]
            exported.append(KVBlock(
                fingerprint=self.fingerprint, model_id=self.loaded.model_id, engine=ENGINE,
                type_k=self.kv_type, type_v=self.kv_type, geometry=self.loaded.geometry,
                session_id=session_id, token_range=rng, token_ids=tuple(s.tokens[rng.start:rng.end]),
                payload=np.ascontiguousarray(old.kv[:, :, :, sel]).tobytes(),
                positions=tuple(old.source[sel].tolist()),
                meta={"dtype": "float32", "layout": "layer,kv,kv_head,token,dim", "rope": "norm"},
            ))
        if memo is not None and all(id(b) in memo.blocks for b in blocks):
            merged = memo.merged.take(np.nonzero(layout.resident[memo.merged.index])[0])
        else:
            merged = _merge(old, self._block_entries(session_id, s, blocks), layout.resident)
        self._set_kv(s, _unstack(self._moved(merged, layout.positions)))
        before = s.positions.all_positions()
        s.positions.relayout(layout.resident, layout.positions, layout.next_pos)
        p = s.prefill
        s.prefill = replace(p, positions=s.positions.all_positions()) \
            if isinstance(p, _Prefill) and np.array_equal(p.positions, before) else None
        return exported

    def append(self, session_id: str, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """An append that is exactly the turn a recall's scoring pass decoded takes its entries
        (keys moved to where they go) and logits instead of running the model again."""
        s = self._get(session_id)
        p, s.prefill = s.prefill, None
        if isinstance(p, _Prefill) and s.kv_map is None and p.tokens == tuple(self._valid_tokens(tokens)) \
                and np.array_equal(p.positions, s.positions.all_positions()):
            rope = self.loaded.rope
            delta = s.positions.next_pos - p.first
            if rope is not None or delta == 0:
                own = p.kv if delta == 0 or rope is None else \
                    [(turn_keys(k, np.full(k.shape[2], delta), rope), v) for k, v in p.kv]
                self._set_kv(s, concat(self._kv(s), own))
                s.positions.append(len(p.tokens))
                s.tokens.extend(p.tokens)
                return p.logits.copy()
        return super().append(session_id, tokens)

    def _resident_entries(self, s: Session) -> _Entries:
        kv = self._kv(s)
        index = np.nonzero(s.positions.resident_mask())[0].astype(np.int64)
        arr = np.stack([np.stack([k[0], v[0]]) for k, v in kv]) if kv else np.zeros((0, 2, 0, 0, 0), np.float32)
        return _Entries(arr, index, s.positions.all_positions()[index])

    def _block_entries(self, session_id: str, s: Session, blocks: Sequence[KVBlock]) -> _Entries | None:
        """The blocks' entries, checked (engine, token ids, payload size) and read in one pass per
        block length."""
        if not blocks:
            return None
        g = self.loaded.geometry
        for block in blocks:
            if not isinstance(block, KVBlock):
                raise BlockMismatchError(f"expected a KVBlock, got {type(block).__name__}")
            if block.fingerprint != self.fingerprint:
                block.check_fingerprint(self.fingerprint)
        cols = np.array([(b.token_range.start, b.token_range.end, len(b.payload) if isinstance(b.payload, bytes)
                          else b.payload_nbytes, len(b.positions)) for b in blocks], dtype=np.int64)
        lens = cols[:, 1] - cols[:, 0]
        sizes = 4 * g.n_layers * 2 * g.n_kv_heads * g.head_dim * lens
        bad = np.nonzero((sizes != cols[:, 2]) | (lens != cols[:, 3]))[0]
        if bad.size:
            b = blocks[int(bad[0])]
            raise BlockMismatchError(f"block for {b.token_range} of session {b.session_id!r}: a "
                                     f"{b.payload_nbytes}-byte payload and {len(b.positions)} positions; its "
                                     f"{len(b.token_range)} tokens need {int(sizes[bad[0]])} bytes and as many positions")
        index = check_block_token_ids(session_id, s.tokens, blocks)  # the log index of each entry
        source = np.fromiter(chain.from_iterable(b.positions for b in blocks), dtype=np.int64, count=index.size)
        by_len: dict[int, list[int]] = {}
        for i, n in enumerate(lens.tolist()):
            by_len.setdefault(n, []).append(i)
        parts, order = [], []
        starts = np.cumsum(lens) - lens
        for n, ids in by_len.items():
            raw = np.frombuffer(b"".join(blocks[i].payload for i in ids), dtype=np.float32)
            arr = raw.reshape(len(ids), g.n_layers, 2, g.n_kv_heads, n, g.head_dim).transpose(1, 2, 3, 0, 4, 5)
            parts.append(arr.reshape(g.n_layers, 2, g.n_kv_heads, len(ids) * n, g.head_dim))
            order.append((starts[ids][:, None] + np.arange(n)).reshape(-1))
        arr = np.concatenate(parts, axis=3) if len(parts) > 1 else np.ascontiguousarray(parts[0])
        entries = np.concatenate(order)  # entry j of ``arr`` is entry entries[j] of the blocks in order
        return _Entries(arr, index[entries], source[entries])

    def _moved(self, e: _Entries, target: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The entries' KV with every key turned to its ``target`` position (by log index)."""
        delta = target[e.index] - e.source
        moved = np.nonzero(delta)[0]
        if not moved.size:
            return e.kv
        rope = self.loaded.rope
        if rope is None:
            raise CapabilityError(f"model {self.loaded.source!r} does not record its RoPE parameters; cannot move keys")
        arr = e.kv.copy()
        keys = arr[:, 0]  # [layer, kv_head, entry, dim], a view into arr
        if moved.size == delta.size:
            keys[...] = turn_keys(e.kv[:, 0], delta, rope)
        else:
            keys[:, :, moved] = turn_keys(e.kv[:, 0][:, :, moved], delta[moved], rope)
        return arr


@dataclass(frozen=True)
class _Entries:
    kv: npt.NDArray[np.float32]  # [layer, k|v, kv_head, entry, dim]
    index: npt.NDArray[np.int64]  # log index of each entry
    source: npt.NDArray[np.int64]  # the position its key is rotated for

    def take(self, sel: npt.NDArray[np.int64]) -> _Entries:
        return _Entries(self.kv[:, :, :, sel], self.index[sel], self.source[sel])


@dataclass(frozen=True)
class _Prefill:
    """A turn decoded by a recall's scoring pass (over the resident and every cold entry): its
    entries (keys rotated for ``first``, its first position there) and last logits, taken by the
    session's next append if it is exactly these tokens and the session still holds
    ``positions`` (what the exchange after the scoring pass left)."""

    tokens: tuple[int, ...]
    kv: KVArrays
    first: int
    logits: npt.NDArray[np.float32]
    positions: npt.NDArray[np.int64]


@dataclass(frozen=True)
class _RecallMemo:
    """What ``recall_attention`` read, for the ``exchange`` that follows (valid while the
    session's positions are unchanged)."""

    session_id: str
    positions: npt.NDArray[np.int64]
    old: _Entries
    merged: _Entries  # the resident entries and the blocks' in log order, not yet moved
    blocks: frozenset[int]


@dataclass(frozen=True)
class _RecallPrep:
    """What ``recall_attention`` computes before it runs the turn (``prepare_recall``, done while
    the backend is idle): valid while the session holds ``memo.positions`` with nothing pending,
    for these very blocks and ``rebase``."""

    blocks: tuple[KVBlock, ...]
    rebase: bool
    memo: _RecallMemo
    kv: KVArrays  # the scoring request's states: resident and block entries at their recall positions
    first: int  # the turn's first position there

    @property
    def nbytes(self) -> int:
        return self.memo.old.kv.nbytes + self.memo.merged.kv.nbytes + sum(k.nbytes + v.nbytes for k, v in self.kv)

    def holds(self, s: Session, blocks: Sequence[KVBlock], rebase: bool) -> bool:
        return (rebase == self.rebase and s.kv_map is None and len(blocks) == len(self.blocks)
                and all(a is b for a, b in zip(blocks, self.blocks, strict=True))
                and np.array_equal(self.memo.positions, s.positions.all_positions()))


def _merge(old: _Entries, blocks: _Entries | None, keep: npt.NDArray[np.bool_]) -> _Entries:
    """The resident entries ``keep`` holds and the blocks' entries, in log order."""
    parts = [old.take(np.nonzero(keep[old.index])[0])] if old.index.size else []
    if blocks is not None:
        parts.append(blocks)
    if not parts:
        return old
    if len(parts) == 1:
        return parts[0]
    # two runs, each in log order: interleave them straight into place
    index = np.concatenate([p.index for p in parts])
    order = np.argsort(index, kind="stable")
    slot = np.empty_like(order)
    slot[order] = np.arange(order.size)
    a, b = parts
    kv = np.empty(a.kv.shape[:3] + (order.size,) + a.kv.shape[4:], dtype=np.float32)
    source = np.empty(order.size, dtype=np.int64)
    for part, where in ((a, slot[: a.index.size]), (b, slot[a.index.size :])):
        kv[:, :, :, where] = part.kv
        source[where] = part.source
    return _Entries(kv, index[order], source)


def _unstack(arr: npt.NDArray[np.float32]) -> KVArrays:
    return [(arr[layer, 0][None], arr[layer, 1][None]) for layer in range(arr.shape[0])]
