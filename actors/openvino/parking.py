"""Where the recompute mode parks the KV it drops: the smallest cold-store interface it needs.

Primitives:
- ``BlockParking``: a protocol with ``put(block) -> key`` and ``get(key) -> block``; any cold store
  (the project's tiered store, a Ray actor handle wrapper, a dict in a test) fits it.
- ``has_parking(obj)``: whether ``obj`` has both methods (checked when an executor is built).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from kvres.coldstore.block import KVBlock


@runtime_checkable
class BlockParking(Protocol):
    def put(self, block: KVBlock) -> Any:
        """Store ``block``; return the key that ``get`` takes to find it again."""
        ...

    def get(self, key: Any) -> KVBlock: ...


def has_parking(obj: object) -> bool:
    return callable(getattr(obj, "put", None)) and callable(getattr(obj, "get", None))
