"""The header of a llama.cpp sequence-state blob (``llama_state_seq_get_data``), read-only.

Primitives:
- ``read_cell_positions(payload) -> np.ndarray``: the cache position of every KV cell in the
  blob, in the blob's cell order; raises ``BlockMismatchError`` when the bytes are not a
  single-stream, single-sequence state in the layout this module knows.
- ``read_keys(payload, n_layer, n_kv_heads, head_dim, type_k)``: the K rows as floats (f32 / f16).
- ``expected_payload_size(n_cells, n_layer, k_row_bytes, v_row_bytes) -> int``: the exact size
  of such a blob, so a truncated or padded payload is refused before llama.cpp reads it.

Layout (llama.cpp src/llama-kv-cache.cpp, state_write / state_write_meta, as written by
llama-cpp-python 0.3.36): u32 magic, u32 (the source sequence id; not read), u32 n_stream, then
per stream u32 cell_count and per cell
(i32 pos, u32 n_seq_id, i32 seq_id * n_seq_id), then u32 v_trans, u32 n_layer, per layer a
12-byte K header and the K rows, then per layer a 12-byte V header and the V rows (row-wise or,
with v_trans, element-wise: the same byte count). Only the header is read:
it lets an import be refused before llama.cpp sees a blob whose cells do not match the block.
"""

from __future__ import annotations

import struct

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
