"""A KV block as it travels between an engine and the cold store.

Primitives:
- ``KVGeometry(n_layers, n_kv_heads, head_dim)``.
- ``make_fingerprint(model_id, engine, type_k, type_v, geometry) -> str``: binds a block to the
  exact model, payload format, KV types and geometry.
- ``KVBlock``: header fields + raw payload bytes; ``check_fingerprint(expected)``.
  Pickling with protocol 5 hands the payload over as an out-of-band ``PickleBuffer``, so Ray moves
  it through its object store without copying it into the pickle stream (and a ``memoryview``
  payload, which plain pickle refuses, can travel too).
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass, field
from typing import Any

from kvres.policy.ranges import Range

from .errors import BlockFingerprintError


@dataclass(frozen=True)
class KVGeometry:
    n_layers: int
    n_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVGeometry.{name} must be a positive int, got {value!r}")


def make_fingerprint(
    model_id: str, engine: str, type_k: str, type_v: str, geometry: KVGeometry
) -> str:
    """Hex digest of everything a block's payload depends on."""
    text = "|".join(
        [model_id, engine, type_k, type_v,
         f"{geometry.n_layers}x{geometry.n_kv_heads}x{geometry.head_dim}"]
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class KVBlock:
    """KV of one token range of one session; ``payload`` is engine-specific raw bytes."""

    fingerprint: str
    model_id: str
    engine: str
    type_k: str
    type_v: str
    geometry: KVGeometry
    session_id: str
    token_range: Range
    token_ids: tuple[int, ...]
    payload: bytes | bytearray | memoryview
    positions: tuple[int, ...] = ()  # engine cache positions of the tokens when exported
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.token_range):
            raise ValueError(
                f"KVBlock has {len(self.token_ids)} token ids for range {self.token_range} "
                f"({len(self.token_range)} tokens)"
            )
        if self.positions and len(self.positions) != len(self.token_range):
            raise ValueError(
                f"KVBlock has {len(self.positions)} positions for range {self.token_range}"
            )

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        fields = (
            self.fingerprint, self.model_id, self.engine, self.type_k, self.type_v,
            self.geometry, self.session_id, self.token_range, self.token_ids,
        )
        view = memoryview(self.payload).cast("B")
        payload: object = (
            pickle.PickleBuffer(view) if isinstance(protocol, int) and protocol >= 5 else view.tobytes()
        )
        return (_rebuild_block, (fields, payload, self.positions, self.meta))

    @property
    def payload_nbytes(self) -> int:
        return memoryview(self.payload).nbytes

    def check_fingerprint(self, expected: str) -> None:
        if self.fingerprint != expected:
            raise BlockFingerprintError(
                f"block for session {self.session_id!r} range {self.token_range} has fingerprint "
                f"{self.fingerprint!r} (model {self.model_id!r}, engine {self.engine!r}, "
                f"KV {self.type_k}/{self.type_v}, geometry {self.geometry}"
                f"{', payload ' + str(self.meta['payload_format']) if 'payload_format' in self.meta else ''}); "
                f"expected {expected!r}"
            )


def _rebuild_block(
    fields: tuple[Any, ...], payload: Any, positions: tuple[int, ...], meta: dict[str, Any]
) -> KVBlock:
    """Unpickling helper: ``payload`` is bytes / bytearray in band, or a buffer out of band."""
    if not isinstance(payload, (bytes, bytearray)):
        payload = memoryview(payload).cast("B")
    (fingerprint, model_id, engine, type_k, type_v, geometry, session_id, token_range,
     token_ids) = fields
    return KVBlock(
        fingerprint, model_id, engine, type_k, type_v, geometry, session_id, token_range,
        token_ids, payload, positions, meta,
    )
