"""A backend's store port over cold stores in this process (tests, single-process use).

Primitives:
- ``LocalStorePort(name, stores)``: ``stores`` maps store names to ``ColdStore`` objects (e.g.
  ``ColdStoreServer``); ``name`` is the home store. ``calls`` counts the calls per method, so a
  test can check how many store round trips an operation made. Thread-safe: one lock, shared
  with the ports ``at`` returns, runs one store call at a time (a ``ColdStoreServer`` is not
  thread-safe; the cold-store actor runs its calls one at a time the same way).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kvres.actors.host.store_ports import StorePort
from kvres.coldstore import BlockKey, ColdStore, KVBlock, PutResult, Tier
from kvres.policy.recall import RecallCosts


class LocalStorePort(StorePort):
    def __init__(self, name: str, stores: Mapping[str, ColdStore], calls: Counter[str] | None = None,
                 lock: threading.RLock | None = None) -> None:
        if name not in stores:
            raise ValueError(f"store {name!r} is not among {sorted(stores)}")
        self.name = name
        self._stores = stores
        self.calls: Counter[str] = Counter() if calls is None else calls
        self._lock = threading.RLock() if lock is None else lock

    def _run(self, method: str, *args: Any) -> Any:
        with self._lock:
            self.calls[method] += 1
            return getattr(self._home, method)(*args)

    @property
    def _home(self) -> ColdStore:
        return self._stores[self.name]

    def at(self, store: str) -> ColdStore:
        if store not in self._stores:
            raise ValueError(f"unknown cold store {store!r}; known: {sorted(self._stores)}")
        return self if store == self.name else LocalStorePort(store, self._stores, self.calls, self._lock)

    def put(self, block: KVBlock, priority: int = 0) -> PutResult:
        return self._run("put", block, priority)  # type: ignore[no-any-return]

    def put_many(self, blocks: Sequence[KVBlock], priority: int = 0) -> list[PutResult]:
        return self._run("put_many", blocks, priority)  # type: ignore[no-any-return]

    def get(self, key: BlockKey) -> KVBlock | None:
        return self._run("get", key)  # type: ignore[no-any-return]

    def get_many(self, keys: Sequence[BlockKey]) -> list[KVBlock | None]:
        return self._run("get_many", keys)  # type: ignore[no-any-return]

    def pop_many(
        self, keys: Sequence[BlockKey], nbytes: Sequence[int] | None = None, costs: RecallCosts | None = None
    ) -> list[KVBlock | None]:
        return self._run("pop_many", keys, nbytes, costs)  # type: ignore[no-any-return]

    def delete(self, key: BlockKey) -> bool:
        return self._run("delete", key)  # type: ignore[no-any-return]

    def delete_many(self, keys: Sequence[BlockKey]) -> int:
        return self._run("delete_many", keys)  # type: ignore[no-any-return]

    def tier_of(self, key: BlockKey) -> Tier | None:
        return self._run("tier_of", key)  # type: ignore[no-any-return]

    def tiers(self, keys: Sequence[BlockKey]) -> list[Tier | None]:
        return self._run("tiers", keys)  # type: ignore[no-any-return]

    def list_session(self, session_id: str) -> list[BlockKey]:
        return self._run("list_session", session_id)  # type: ignore[no-any-return]

    def drop_session(self, session_id: str) -> int:
        return self._run("drop_session", session_id)  # type: ignore[no-any-return]
