"""llama.cpp sequence-state blobs (``llama_state_seq_get_data``): their header, and their cells as arrays.

Primitives:
- ``read_cell_positions(payload) -> np.ndarray``: the cache position of every KV cell in the
  blob, in the blob's cell order; raises ``BlockMismatchError`` when the bytes are not a
  single-stream, single-sequence state in the layout this module knows.
- ``read_keys(payload, n_layer, n_kv_heads, head_dim, type_k)``: the K rows as floats (f32 / f16).
- ``section_positions(payload) -> list[np.ndarray]``: the cell positions of each cache section
  (a sliding-window model's blob holds two: its global and its windowed layers' caches), the blob
  walked to its end (``BlockMismatchError`` when it does not end where its sections do).
- ``expected_payload_size(n_cells, n_layer, k_row_bytes, v_row_bytes) -> int``: the exact size
  of such a blob, so a truncated or padded payload is refused before llama.cpp reads it.
- ``StateCells``: the cells of one or more blobs as arrays (positions, K rows and V rows as raw
  bytes per layer, V always row-wise); ``parse_cells(payloads)`` (blobs of one size are read in one
  vectorised pass), ``StateCells.take(index)``, ``StateCells.concat(parts)``,
  ``StateCells.to_blob(v_trans)``: the blob llama.cpp restores (cells in the given order).

Layout (llama.cpp src/llama-kv-cache.cpp, state_write / state_write_meta, as written by
llama-cpp-python 0.3.36): u32 magic, u32 (the source sequence id; not read), u32 n_stream, then
per stream u32 cell_count and per cell
(i32 pos, u32 n_seq_id, i32 seq_id * n_seq_id), then u32 v_trans, u32 n_layer, per layer a
12-byte K header and the K rows, then per layer a 12-byte V header and the V rows (row-wise or,
with v_trans, element-wise: the same byte count; the 12-byte V header is then i32 type, u32
element size, u32 values per cell). The header lets an import be refused before llama.cpp sees a
blob whose cells do not match the block; ``StateCells`` lets a batch of blocks and a session's
own cells be merged, re-ordered and re-positioned in numpy and restored in one call.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvres.policy.errors import BlockMismatchError

STATE_MAGIC = 0xAF143CD8


def read_cell_positions(payload: bytes | bytearray | memoryview) -> npt.NDArray[np.int64]:
    buf = memoryview(payload).cast("B")
    if buf.nbytes < 16:
        raise BlockMismatchError(f"KV payload of {buf.nbytes} bytes is too short for a state header")
    magic, _seq, n_stream, n_cells = struct.unpack_from("<4I", buf, 0)
    if magic != STATE_MAGIC:
        raise BlockMismatchError(f"KV payload has state magic {magic:#x}; expected {STATE_MAGIC:#x}")
    if n_stream != 1:
        raise BlockMismatchError(f"KV payload holds {n_stream} streams; expected 1")
    meta_end = 16 + 12 * n_cells
    if buf.nbytes < meta_end:
        raise BlockMismatchError(f"KV payload is truncated: {n_cells} cells need {meta_end} header bytes")
    cells = np.frombuffer(buf, dtype="<i4", count=3 * n_cells, offset=16).reshape(n_cells, 3)
    if n_cells and np.any(cells[:, 1] != 1):
        raise BlockMismatchError("KV payload has cells shared by several sequences; expected one")
    return cells[:, 0].astype(np.int64)


def section_positions(payload: bytes | bytearray | memoryview) -> list[npt.NDArray[np.int64]]:
    """The cell positions of every cache section of a blob, in order: one section for a model
    without sliding windows, two (the global layers' cache, then the windowed layers') for one
    with them (llama.cpp's ``llama_kv_cache_iswa`` writes both; the windowed section holds only the
    cells inside the window of the exported sequence's last position). The blob must end where its
    last section does; ``BlockMismatchError`` otherwise."""
    buf = memoryview(payload).cast("B")
    if buf.nbytes < 8 or struct.unpack_from("<I", buf, 0)[0] != STATE_MAGIC:
        raise BlockMismatchError(f"KV payload of {buf.nbytes} bytes has no state header")
    out: list[npt.NDArray[np.int64]] = []
    offset = 8
    try:
        while offset < buf.nbytes:
            n_stream, n = struct.unpack_from("<2I", buf, offset)
            if n_stream != 1:
                raise BlockMismatchError(f"KV payload section holds {n_stream} streams; expected 1")
            offset += 8
            if n == 0:  # llama.cpp writes nothing more for a section without cells
                out.append(np.zeros(0, dtype=np.int64))
                continue
            cells = np.frombuffer(buf, dtype="<i4", count=3 * n, offset=offset).reshape(n, 3)
            if np.any(cells[:, 1] != 1):
                raise BlockMismatchError("KV payload has cells shared by several sequences; expected one")
            out.append(cells[:, 0].astype(np.int64))
            offset += 12 * n
            v_trans, n_layer = struct.unpack_from("<2I", buf, offset)
            spans = _data_spans(buf, n, n_layer, bool(v_trans), offset + 8)
            offset = spans[-1][1] if spans else offset + 8
    except (struct.error, ValueError) as exc:
        raise BlockMismatchError(f"KV payload of {buf.nbytes} bytes is truncated ({exc})") from None
    if offset != buf.nbytes or not out:
        raise BlockMismatchError(f"KV payload of {buf.nbytes} bytes does not end where its cache sections do ({offset})")
    return out


def expected_payload_size(n_cells: int, n_layer: int, k_row_bytes: int, v_row_bytes: int) -> int:
    meta = 16 + 12 * n_cells
    data = 8 + n_layer * (12 + n_cells * k_row_bytes) + n_layer * (12 + n_cells * v_row_bytes)
    return meta + data


def read_keys(
    payload: bytes | bytearray | memoryview, n_layer: int, n_kv_heads: int, head_dim: int, type_k: str
) -> npt.NDArray[np.float32]:
    """The K rows of a state blob as ``(n_layer, n_kv_heads, n_cells, head_dim)`` float32, in the
    blob's cell order (f32 / f16 K caches only: a quantized row is not a float vector)."""
    dtypes: dict[str, np.dtype[np.floating]] = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2")}
    if type_k not in dtypes:
        raise BlockMismatchError(f"K rows of type {type_k!r} cannot be read as floats (f32 / f16 only)")
    buf = memoryview(payload).cast("B")
    n_cells = read_cell_positions(buf).shape[0]
    offset = 16 + 12 * n_cells + 8  # cell metadata, then u32 v_trans and u32 n_layer
    row = n_kv_heads * head_dim
    out = np.empty((n_layer, n_kv_heads, n_cells, head_dim), dtype=np.float32)
    for layer in range(n_layer):
        _k_type, row_bytes = struct.unpack_from("<iQ", buf, offset)
        if row_bytes != row * dtypes[type_k].itemsize:
            raise BlockMismatchError(f"layer {layer} K rows are {row_bytes} bytes; expected {row} {type_k} values")
        offset += 12
        rows = np.frombuffer(buf, dtype=dtypes[type_k], count=n_cells * row, offset=offset)
        out[layer] = rows.reshape(n_cells, n_kv_heads, head_dim).transpose(1, 0, 2)
        offset += n_cells * row_bytes
    return out


_HEAD = 16  # u32 magic, u32 (not read), u32 n_stream, u32 n_cells
_FLOAT_SIZES = {0: 4, 1: 2}  # ggml type id -> bytes per value (f32, f16); quantized rows have none


@dataclass(frozen=True)
class StateCells:
    """KV cells as arrays: ``positions`` (n,), ``k`` / ``v`` (n_layer, n, row bytes) raw rows (V
    row-wise even when the blob stored it transposed), the per-layer ggml type ids, the element
    size of a V value (0 for quantized rows) and the blob's first 8 bytes (written back unchanged)."""

    prefix: bytes
    positions: npt.NDArray[np.int64]
    k: npt.NDArray[np.uint8]
    v: npt.NDArray[np.uint8]
    k_types: tuple[int, ...]
    v_types: tuple[int, ...]
    v_el: int

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    def take(self, index: npt.ArrayLike) -> StateCells:
        idx = np.asarray(index, dtype=np.int64)
        return StateCells(self.prefix, self.positions[idx], self.k[:, idx], self.v[:, idx],
                          self.k_types, self.v_types, self.v_el)

    def with_positions(self, positions: npt.ArrayLike, k: npt.NDArray[np.uint8] | None = None) -> StateCells:
        return StateCells(self.prefix, np.asarray(positions, dtype=np.int64), self.k if k is None else k, self.v,
                          self.k_types, self.v_types, self.v_el)

    @staticmethod
    def concat(parts: Sequence[StateCells]) -> StateCells:
        first = parts[0]
        for p in parts[1:]:
            if p.k.shape[2] != first.k.shape[2] or p.v.shape[2] != first.v.shape[2] or p.k_types != first.k_types:
                raise BlockMismatchError("KV cells of different layouts cannot be merged")
        return StateCells(first.prefix, np.concatenate([p.positions for p in parts]),
                          np.concatenate([p.k for p in parts], axis=1), np.concatenate([p.v for p in parts], axis=1),
                          first.k_types, first.v_types, first.v_el)

    def to_blob(self, v_trans: bool, seq: int = 0) -> bytes:
        """The blob of these cells, in this order (V transposed when ``v_trans``)."""
        n, n_layer = len(self), self.k.shape[0]
        meta = np.empty((n, 3), dtype="<i4")
        meta[:, 0], meta[:, 1], meta[:, 2] = self.positions, 1, seq
        out = [self.prefix, struct.pack("<2I", 1, n), meta.tobytes(), struct.pack("<2I", int(v_trans), n_layer)]
        k_row = self.k.shape[2]
        for layer in range(n_layer):
            out += [struct.pack("<iQ", self.k_types[layer], k_row), self.k[layer].tobytes()]
        v_row = self.v.shape[2]
        for layer in range(n_layer):
            if not v_trans:
                out += [struct.pack("<iQ", self.v_types[layer], v_row), self.v[layer].tobytes()]
                continue
            if not self.v_el:
                raise BlockMismatchError("quantized V rows cannot be stored transposed")
            values = v_row // self.v_el
            el = self.v[layer].view(f"<u{self.v_el}").T  # (values, cells): one value of every cell per row
            out += [struct.pack("<iII", self.v_types[layer], self.v_el, values), np.ascontiguousarray(el).tobytes()]
        return b"".join(out)


def _parse_group(payloads: Sequence[bytes | bytearray | memoryview]) -> StateCells:
    """Blobs of one byte size (so one layout) read in one pass."""
    first = memoryview(payloads[0]).cast("B")
    size = first.nbytes
    n = read_cell_positions(first).shape[0]
    raw = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), size)
    head = raw[:, :_HEAD].view("<u4")
    if np.any(head[:, 0] != STATE_MAGIC) or np.any(head[:, 2] != 1) or np.any(head[:, 3] != n):
        raise BlockMismatchError("KV payloads of one size disagree on their state header")
    meta = raw[:, _HEAD : _HEAD + 12 * n].copy().view("<i4").reshape(len(payloads), n, 3)
    if np.any(meta[:, :, 1] != 1):
        raise BlockMismatchError("KV payload has cells shared by several sequences; expected one")
    offset = _HEAD + 12 * n
    try:
        v_trans, n_layer = struct.unpack_from("<2I", first, offset)
        end = _data_spans(first, n, n_layer, bool(v_trans))[-1][1] if n_layer else offset + 8
    except struct.error:
        end = -1
    if end != size:
        raise BlockMismatchError(f"KV payload of {size} bytes does not hold the {n} cells its header announces")
    offset += 8
    k_types, v_types, ks, vs = [], [], [], []
    v_el = 0
    for _ in range(n_layer):
        k_type, k_row = struct.unpack_from("<iQ", first, offset)
        offset += 12
        ks.append(raw[:, offset : offset + n * k_row].reshape(-1, n, k_row))
        k_types.append(k_type)
        offset += n * k_row
    for _ in range(n_layer):
        if v_trans:
            v_type, v_el, values = struct.unpack_from("<iII", first, offset)
            v_row = v_el * values
            offset += 12
            block = raw[:, offset : offset + n * v_row].copy().view(f"<u{v_el}").reshape(-1, values, n)
            vs.append(np.ascontiguousarray(block.transpose(0, 2, 1)).view(np.uint8).reshape(-1, n, v_row))
        else:
            v_type, v_row = struct.unpack_from("<iQ", first, offset)
            offset += 12
            vs.append(raw[:, offset : offset + n * v_row].reshape(-1, n, v_row))
        v_types.append(v_type)
        offset += n * v_row
    if offset != size:
        raise BlockMismatchError(f"KV payload of {size} bytes does not end where its {n} cells do ({offset})")
    # the per-layer headers were read from the first blob: the others must agree byte for byte
    if len(payloads) > 1:
        spans = _data_spans(first, n, n_layer, bool(v_trans))
        headers = [(0, 4), (8, _HEAD), (_HEAD + 12 * n, spans[0][0])]
        headers += [(spans[i][1], spans[i + 1][0]) for i in range(len(spans) - 1)]
        for lo, hi in headers:
            if np.any(raw[1:, lo:hi] != raw[0, lo:hi]):
                raise BlockMismatchError("KV payloads of one size disagree on their layer headers")
    return StateCells(
        bytes(first[:8]), meta[:, :, 0].reshape(-1).astype(np.int64),
        np.ascontiguousarray(np.stack(ks).reshape(n_layer, -1, ks[0].shape[2])),
        np.ascontiguousarray(np.stack(vs).reshape(n_layer, -1, vs[0].shape[2])),
        tuple(k_types), tuple(v_types), int(v_el) if v_trans else _FLOAT_SIZES.get(v_types[0], 0),
    )


def _data_spans(
    buf: memoryview, n: int, n_layer: int, v_trans: bool, start: int | None = None,
) -> list[tuple[int, int]]:
    """Byte spans of the K and V data (not their headers) of a section of ``n`` cells whose layer
    data begins at ``start`` (by default, that of a single-section blob)."""
    spans = []
    offset = _HEAD + 12 * n + 8 if start is None else start
    for _ in range(n_layer):
        _t, row = struct.unpack_from("<iQ", buf, offset)
        spans.append((offset + 12, offset + 12 + n * row))
        offset += 12 + n * row
    for _ in range(n_layer):
        if v_trans:
            _t, el, values = struct.unpack_from("<iII", buf, offset)
            row = el * values
        else:
            _t, row = struct.unpack_from("<iQ", buf, offset)
        spans.append((offset + 12, offset + 12 + n * row))
        offset += 12 + n * row
    return spans


def parse_cells(payloads: Sequence[bytes | bytearray | memoryview]) -> StateCells:
    """The cells of ``payloads`` (single-sequence blobs of one model and KV types), concatenated in
    the given order; ``BlockMismatchError`` for a blob this layout does not describe."""
    if not payloads:
        raise ValueError("parse_cells needs at least one payload")
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(payloads):
        groups.setdefault(len(p) if isinstance(p, bytes) else memoryview(p).nbytes, []).append(i)
    parts, order = [], []
    for idx in groups.values():
        parts.append(_parse_group([payloads[i] for i in idx]))
        order += idx
    cells = StateCells.concat(parts) if len(parts) > 1 else parts[0]
    if len(parts) == 1 and order == sorted(order):
        return cells
    # back to the payloads' order: payload i's cells are a contiguous run in ``cells``
    counts = {i: len(parts[g]) // len(ix) for g, ix in enumerate(groups.values()) for i in ix}
    start, starts = 0, {}
    for i in order:
        starts[i] = start
        start += counts[i]
    index = np.concatenate([np.arange(starts[i], starts[i] + counts[i]) for i in range(len(payloads))])
    return cells.take(index)
