"""A backend's store port over cold stores in this process (tests, single-process use).

Primitives:
- ``LocalStorePort(name, stores)``: ``stores`` maps store names to ``ColdStore`` objects (e.g.
  ``ColdStoreServer``); ``name`` is the home store. ``calls`` counts the calls per method, so a
  test can check how many store round trips an operation made.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from kvres.actors.store_ports import StorePort
from kvres.coldstore import BlockKey, ColdStore, KVBlock, PutResult, Tier
from kvres.policy.recall import RecallCosts


class LocalStorePort(StorePort):
    def __init__(self, name: str, stores: Mapping[str, ColdStore], calls: Counter[str] | None = None) -> None:
        if name not in stores:
            raise ValueError(f"store {name!r} is not among {sorted(stores)}")
        self.name = name
        self._stores = stores
        self.calls: Counter[str] = Counter() if calls is None else calls

    @property
    def _home(self) -> ColdStore:
        return self._stores[self.name]

    def at(self, store: str) -> ColdStore:
        if store not in self._stores:
            raise ValueError(f"unknown cold store {store!r}; known: {sorted(self._stores)}")
        return self if store == self.name else LocalStorePort(store, self._stores, self.calls)

    def put(self, block: KVBlock, priority: int = 0) -> PutResult:
        self.calls["put"] += 1
        return self._home.put(block, priority)

    def put_many(self, blocks: Sequence[KVBlock], priority: int = 0) -> list[PutResult]:
        self.calls["put_many"] += 1
        return self._home.put_many(blocks, priority)

    def get(self, key: BlockKey) -> KVBlock | None:
        self.calls["get"] += 1
        return self._home.get(key)

    def get_many(self, keys: Sequence[BlockKey]) -> list[KVBlock | None]:
        self.calls["get_many"] += 1
        return self._home.get_many(keys)

    def pop_many(
        self, keys: Sequence[BlockKey], nbytes: Sequence[int] | None = None, costs: RecallCosts | None = None
    ) -> list[KVBlock | None]:
        self.calls["pop_many"] += 1
        return self._home.pop_many(keys, nbytes, costs)

    def delete(self, key: BlockKey) -> bool:
        self.calls["delete"] += 1
        return self._home.delete(key)

    def delete_many(self, keys: Sequence[BlockKey]) -> int:
        self.calls["delete_many"] += 1
        return self._home.delete_many(keys)

    def tier_of(self, key: BlockKey) -> Tier | None:
        self.calls["tier_of"] += 1
        return self._home.tier_of(key)

    def tiers(self, keys: Sequence[BlockKey]) -> list[Tier | None]:
        self.calls["tiers"] += 1
        return self._home.tiers(keys)

    def list_session(self, session_id: str) -> list[BlockKey]:
        self.calls["list_session"] += 1
        return self._home.list_session(session_id)

    def drop_session(self, session_id: str) -> int:
        self.calls["drop_session"] += 1
        return self._home.drop_session(session_id)
