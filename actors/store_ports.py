"""Where a backend parks blocks: the cold store of its node, reached in-process or through Ray.

Primitives:
- ``LocalStorePort(name, stores)``: ``ColdStoreServer`` objects in this process, by name (tests,
  single-process use).
- ``RayStorePort(name, namespace)``: ``ColdStoreActor`` handles looked up by name, so a block
  parked on one node can be fetched from another.
- ``cold_store_name(node_id)``: the actor name of a node's cold store.

Both implement ``kvres.actors.backend.StorePort``: ``put(block) -> ColdRef``, ``get(ref)``,
``delete(ref)``, ``tiers(refs)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from .backend import ColdRef


def cold_store_name(node_id: str) -> str:
    return f"kvres-coldstore-{node_id[:16]}"


class LocalStorePort:
    def __init__(self, name: str, stores: Mapping[str, Any]) -> None:
        if name not in stores:
            raise ValueError(f"store {name!r} is not among {sorted(stores)}")
        self.name = name
        self._stores = stores

    def _store(self, name: str) -> Any:
        try:
            return self._stores[name]
        except KeyError:
            raise ValueError(f"unknown cold store {name!r}") from None

    def put(self, block: Any) -> ColdRef:
        result = self._stores[self.name].put(block)
        return ColdRef(self.name, result.key, block.payload_nbytes)

    def get(self, ref: ColdRef) -> Any | None:
        return self._store(ref.store).get(ref.key)

    def delete(self, ref: ColdRef) -> None:
        self._store(ref.store).delete(ref.key)

    def tiers(self, refs: Sequence[ColdRef]) -> list[str | None]:
        return [self._store(r.store).tiers([r.key])[0] for r in refs]


class RayStorePort:
    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self._namespace = namespace
        self._handles: dict[str, Any] = {}

    def _handle(self, name: str) -> Any:
        import ray

        if name not in self._handles:
            self._handles[name] = ray.get_actor(name, namespace=self._namespace)
        return self._handles[name]

    def put(self, block: Any) -> ColdRef:
        import ray

        result = ray.get(self._handle(self.name).put.remote(block))
        return ColdRef(self.name, result.key, block.payload_nbytes)

    def get(self, ref: ColdRef) -> Any | None:
        import ray

        return ray.get(self._handle(ref.store).get.remote(ref.key))

    def delete(self, ref: ColdRef) -> None:
        import ray

        ray.get(self._handle(ref.store).delete.remote(ref.key))

    def tiers(self, refs: Sequence[ColdRef]) -> list[str | None]:
        import ray

        by_store: dict[str, list[int]] = defaultdict(list)
        for i, ref in enumerate(refs):
            by_store[ref.store].append(i)
        out: list[str | None] = [None] * len(refs)
        for store, idx in by_store.items():
            tiers = ray.get(self._handle(store).tiers.remote([refs[i].key for i in idx]))
            for i, tier in zip(idx, tiers, strict=True):
                out[i] = tier
        return out
