"""Where a backend parks blocks: the cold store of its node, and the stores of other nodes.

Primitives:
- ``ColdRef(store, key, nbytes)``: a block parked in the store named ``store``.
- ``StorePort``: a ``kvres.coldstore.ColdStore`` over the backend's home store (``name``), plus
  ``at(store)``: the same interface over another store by name, so a block parked on one node can
  be fetched from another after a migration. ``refs(results, blocks)`` turns a batch of put
  results into ``ColdRef``s of the home store.
- ``RayStorePort(name, namespace)``: the port over ``ColdStoreActor``s looked up by name; every
  call, batched ones included, is one Ray call.
- ``cold_store_name(node_id)``: the actor name of a node's cold store.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvres.coldstore import BlockKey, ColdStore, KVBlock, PutResult, Tier
from kvres.policy.recall import RecallCosts


def cold_store_name(node_id: str) -> str:
    return f"kvres-coldstore-{node_id[:16]}"


@dataclass(frozen=True)
class ColdRef:
    store: str
    key: BlockKey
    nbytes: int


class StorePort(ColdStore):
    name: str

    @abstractmethod
    def at(self, store: str) -> ColdStore:
        """The store named ``store`` (this port itself for the home store)."""

    def refs(self, results: Sequence[PutResult], blocks: Sequence[KVBlock]) -> list[ColdRef]:
        return [ColdRef(self.name, r.key, b.payload_nbytes) for r, b in zip(results, blocks, strict=True)]


class RayStorePort(StorePort):
    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self._namespace = namespace
        self._handle: Any = None

    def at(self, store: str) -> ColdStore:
        return self if store == self.name else RayStorePort(store, self._namespace)

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        if self._handle is None:
            self._handle = ray.get_actor(self.name, namespace=self._namespace)
        return ray.get(getattr(self._handle, method).remote(*args))

    def put(self, block: KVBlock, priority: int = 0) -> PutResult:
        result: PutResult = self._call("put", block, priority)
        return result

    def put_many(self, blocks: Sequence[KVBlock], priority: int = 0) -> list[PutResult]:
        return list(self._call("put_many", list(blocks), priority)) if blocks else []

    def get(self, key: BlockKey) -> KVBlock | None:
        block: KVBlock | None = self._call("get", key)
        return block

    def get_many(self, keys: Sequence[BlockKey]) -> list[KVBlock | None]:
        return list(self._call("get_many", list(keys))) if keys else []

    def pop_many(
        self, keys: Sequence[BlockKey], nbytes: Sequence[int] | None = None, costs: RecallCosts | None = None
    ) -> list[KVBlock | None]:
        if not keys:
            return []
        return list(self._call("pop_many", list(keys), None if nbytes is None else list(nbytes), costs))

    def delete(self, key: BlockKey) -> bool:
        return bool(self._call("delete", key))

    def delete_many(self, keys: Sequence[BlockKey]) -> int:
        return int(self._call("delete_many", list(keys))) if keys else 0

    def tier_of(self, key: BlockKey) -> Tier | None:
        tier: Tier | None = self._call("tier_of", key)
        return tier

    def tiers(self, keys: Sequence[BlockKey]) -> list[Tier | None]:
        return list(self._call("tiers", list(keys))) if keys else []

    def list_session(self, session_id: str) -> list[BlockKey]:
        return list(self._call("list_session", session_id))

    def drop_session(self, session_id: str) -> int:
        return int(self._call("drop_session", session_id))
