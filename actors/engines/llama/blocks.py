"""The llama executor's KV blocks: their format, how they are made and how they are checked.

Primitives:
- ``ENGINE``: the engine name blocks carry (``"llama.cpp"``).
- ``BlockFormat(model_id, type_k, type_v, geometry, flash_attn, export_refusal=None, windowed=False)``:
  the blocks of one executor. ``payload_format`` (``llama-state-seq/v-rows``, or ``.../v-trans``
  without flash attention, which stores V rows transposed; ``llama-state-seq-iswa/...`` for a
  sliding-window model, whose blobs hold the global and the windowed layers' caches),
  ``fingerprint``, ``k_row`` / ``v_row`` (bytes of one cell's K / V row in one layer), ``v_trans``.
  ``require_export()``: ``CapabilityError(export_refusal)`` where the KV cannot leave the engine;
  ``require_cells()``: ``CapabilityError`` where blobs cannot be read as cell arrays (windowed).
  ``block(session_id, rng, token_ids, payload, positions) -> KVBlock``.
  ``blob(cells) -> bytes``: cells as the state blob this format restores.
  ``check_payload(block)``: its payload's size and cell positions match the block (a windowed
  blob: both sections walked, the global cells at the block's positions, the windowed ones among them).
  ``check_blocks(session_id, log, blocks, spans)``: many blocks at once (type, fingerprint, payload
  sizes, token ids against the session's ``log``; cell positions are checked when parsed).
  ``empty_cells() -> StateCells``: no cells, in this format.

Errors: a block that does not match raises ``BlockMismatchError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvres.actors.engines.executor import check_block_token_ids
from kvres.coldstore.block import KVBlock, KVGeometry, make_fingerprint
from kvres.policy.errors import BlockMismatchError, CapabilityError
from kvres.policy.kv_types import kv_type_row_bytes
from kvres.policy.ranges import Range
from kvres.policy.recall import BlockSpans

from .state_blob import StateCells, expected_payload_size, read_cell_positions, section_positions

ENGINE = "llama.cpp"


@dataclass(frozen=True)
class BlockFormat:
    model_id: str
    type_k: str
    type_v: str
    geometry: KVGeometry
    flash_attn: bool
    export_refusal: str | None = None  # why this model's KV cannot be exported; None: it can
    windowed: bool = False  # a sliding-window model: each blob holds two cache sections
    k_row: int = field(init=False)
    v_row: int = field(init=False)
    payload_format: str = field(init=False)
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        row = self.geometry.n_kv_heads * self.geometry.head_dim
        object.__setattr__(self, "k_row", int(kv_type_row_bytes(self.type_k, row)))
        object.__setattr__(self, "v_row", int(kv_type_row_bytes(self.type_v, row)))
        # V rows are stored transposed without flash attention: another payload layout.
        payload_format = (f"llama-state-seq{'-iswa' if self.windowed else ''}/"
                          f"{'v-rows' if self.flash_attn else 'v-trans'}")
        object.__setattr__(self, "payload_format", payload_format)
        object.__setattr__(self, "fingerprint", make_fingerprint(
            self.model_id, f"{ENGINE}:{payload_format}", self.type_k, self.type_v, self.geometry))

    @property
    def v_trans(self) -> bool:
        return not self.flash_attn

    def require_export(self) -> None:
        if self.export_refusal is not None:
            raise CapabilityError(self.export_refusal)

    def block(self, session_id: str, rng: Range, token_ids: Sequence[int], payload: bytes | memoryview,
              positions: Sequence[int]) -> KVBlock:
        return KVBlock(
            fingerprint=self.fingerprint, model_id=self.model_id, engine=ENGINE,
            type_k=self.type_k, type_v=self.type_v, geometry=self.geometry,
            session_id=session_id, token_range=rng, token_ids=tuple(token_ids), payload=payload,
            positions=tuple(positions), meta={"payload_format": self.payload_format},
        )

    def blob(self, cells: StateCells) -> bytes:
        return cells.to_blob(self.v_trans)

    def require_cells(self) -> None:
        """Reading blobs as cell arrays (a recall's scoring pass and its exchange) needs one cache
        section per blob: a sliding-window model's blocks are imported whole instead."""
        if self.windowed:
            raise CapabilityError("the blocks of a sliding-window model hold two KV caches, which a recall "
                                  "cannot merge in numpy: its cold blocks are imported whole instead")

    def check_payload(self, block: KVBlock) -> None:
        rng = block.token_range
        if self.windowed:
            self._check_windowed(block)
            return
        size = expected_payload_size(len(rng), self.geometry.n_layers, self.k_row, self.v_row)
        if block.payload_nbytes != size:
            raise BlockMismatchError(
                f"block for {rng} has a {block.payload_nbytes}-byte payload; {len(rng)} cells of "
                f"this model and KV types take {size} bytes"
            )
        cells = read_cell_positions(block.payload)
        if not block.positions or not np.array_equal(np.sort(cells), np.asarray(block.positions)):
            raise BlockMismatchError(
                f"block for {rng}: its payload's cell positions do not match its header positions"
            )

    def _check_windowed(self, block: KVBlock) -> None:
        """A sliding-window blob: two sections walked to the end; the global layers' cells are the
        block's positions, the windowed layers' a subset of them (those inside the window)."""
        sections = section_positions(block.payload)
        want = np.asarray(block.positions, dtype=np.int64)
        if len(sections) != 2 or not block.positions or not np.array_equal(np.sort(sections[0]), want) \
                or not np.isin(sections[1], want).all():
            raise BlockMismatchError(
                f"block for {block.token_range}: its payload's {len(sections)} cache sections do not hold the "
                "cells of its positions"
            )

    def check_blocks(self, session_id: str, log: Sequence[int], blocks: Sequence[KVBlock], spans: BlockSpans) -> None:
        """What ``check_payload`` and ``SessionTable._check_block`` check, for many blocks at once
        (ranges are checked by ``exchange_layout``, cell positions when the payloads are parsed)."""
        self.require_export()
        self.require_cells()
        if not blocks:
            return
        for block in blocks:
            if not isinstance(block, KVBlock):
                raise BlockMismatchError(f"expected a KVBlock, got {type(block).__name__}")
            if block.fingerprint != self.fingerprint:
                block.check_fingerprint(self.fingerprint)
        nbytes = np.fromiter((len(b.payload) if isinstance(b.payload, bytes) else b.payload_nbytes for b in blocks),
                             dtype=np.int64, count=len(blocks))
        cols = spans.spans
        lens = cols[:, 1] - cols[:, 0]
        sizes = 16 + 12 * lens + 8 + self.geometry.n_layers * (24 + lens * (self.k_row + self.v_row))
        bad = np.nonzero(sizes != nbytes)[0]
        if bad.size:
            b = blocks[int(bad[0])]
            raise BlockMismatchError(f"block for {b.token_range} has a {b.payload_nbytes}-byte payload; its "
                                     f"{len(b.token_range)} cells of this model and KV types take {int(sizes[bad[0]])}")
        check_block_token_ids(session_id, log, blocks)

    def empty_cells(self) -> StateCells:
        n_layer = self.geometry.n_layers
        return StateCells(b"", np.zeros(0, dtype=np.int64), np.zeros((n_layer, 0, self.k_row), dtype=np.uint8),
                          np.zeros((n_layer, 0, self.v_row), dtype=np.uint8), (0,) * n_layer, (0,) * n_layer, 0)
