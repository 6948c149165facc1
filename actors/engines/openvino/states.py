"""Read and write a request's KV states as numpy arrays, and splice them by sequence index.

Primitives:
- ``KVArrays``: a list, one ``(keys, values)`` pair per layer, each ``[1, kv_heads, seq, head_dim]``.
- ``read_kv(request, state_names, geometry) -> KVArrays``: copies, matched by state name (the order
  of ``query_state()`` is not stable).
- ``write_kv(request, state_names, kv)``: assigns every state (an empty sequence resets them).
- ``kv_len(kv)``, ``take(kv, start, stop)``, ``concat(*parts)``,
  ``kv_to_payload(kv) / payload_to_kv(payload, geometry, n_tokens)``: the block payload is float32
  ``[layer, k|v, kv_head, token, dim]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import openvino as ov

from kvres.coldstore.block import KVGeometry

F32 = npt.NDArray[np.float32]
KVArrays = list[tuple[F32, F32]]
StateNames = Sequence[tuple[str, str]]


def empty_kv(geometry: KVGeometry) -> KVArrays:
    z = np.zeros((1, geometry.n_kv_heads, 0, geometry.head_dim), dtype=np.float32)
    return [(z, z) for _ in range(geometry.n_layers)]


def read_kv(request: ov.InferRequest, names: StateNames, geometry: KVGeometry) -> KVArrays:
    by_name = {s.name: s for s in request.query_state()}
    out: KVArrays = []
    for k_name, v_name in names:
        k = np.array(by_name[k_name].state.data, dtype=np.float32, copy=True)
        v = np.array(by_name[v_name].state.data, dtype=np.float32, copy=True)
        if k.ndim != 4 or k.shape[0] != 1 or k.shape[2] == 0:  # never written, or reset
            return empty_kv(geometry)
        out.append((k, v))
    return out


def write_kv(request: ov.InferRequest, names: StateNames, kv: KVArrays) -> None:
    if kv_len(kv) == 0:
        request.reset_state()
        return
    by_name = {s.name: s for s in request.query_state()}
    for (k_name, v_name), (k, v) in zip(names, kv, strict=True):
        by_name[k_name].state = ov.Tensor(np.ascontiguousarray(k, dtype=np.float32))
        by_name[v_name].state = ov.Tensor(np.ascontiguousarray(v, dtype=np.float32))


def kv_len(kv: KVArrays) -> int:
    return int(kv[0][0].shape[2]) if kv else 0


def take(kv: KVArrays, start: int, stop: int | None = None) -> KVArrays:
    return [(k[:, :, start:stop], v[:, :, start:stop]) for k, v in kv]


def concat(*parts: KVArrays) -> KVArrays:
    return [
        (np.concatenate([p[i][0] for p in parts], axis=2), np.concatenate([p[i][1] for p in parts], axis=2))
        for i in range(len(parts[0]))
    ]


def kv_to_payload(kv: KVArrays) -> bytes:
    arr = np.stack([np.stack([k[0], v[0]]) for k, v in kv])  # [L, 2, H, T, D]
    return np.ascontiguousarray(arr, dtype=np.float32).tobytes()


def payload_to_kv(payload: bytes | bytearray | memoryview, geometry: KVGeometry, n_tokens: int) -> KVArrays:
    shape = (geometry.n_layers, 2, geometry.n_kv_heads, n_tokens, geometry.head_dim)
    arr = np.frombuffer(payload, dtype=np.float32)
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"payload holds {arr.size} floats, expected {int(np.prod(shape))} for {shape}")
    arr = arr.reshape(shape)
    return [(arr[i, 0][None].copy(), arr[i, 1][None].copy()) for i in range(geometry.n_layers)]
