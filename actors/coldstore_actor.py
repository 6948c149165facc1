"""The per-node cold store as a Ray actor: a thin wrapper around ``kvres.coldstore.TieredStore``.

Primitives:
- ``ColdStoreServer(ram_budget_bytes, disk_path=None, disk_budget_bytes=0, promote_on_get=False,
  copy_payloads=True, fsync=True)``: the plain class (works without Ray): ``put``, ``put_many``,
  ``get``, ``get_many``, ``get_range``, ``delete``, ``list_session``, ``drop_session``,
  ``tiers`` (where each key lives), ``stats`` (a flat ``dict[str, int]`` for metrics),
  ``drain_dropped``, ``flush``, ``close``.
- ``MeteredColdStoreServer``: the same, publishing ``kvres_cold_bytes`` / ``kvres_cold_blocks`` per
  tier after every change; ``MeteredColdStoreActor`` is what ``kvres.cluster.connect`` starts.
- ``ColdStoreActor``: ``ray.remote(ColdStoreServer)``; create it with
  ``ColdStoreActor.options(name=..., namespace=..., scheduling_strategy=...).remote(...)``.

Blocks cross process boundaries without extra copies: ``KVBlock`` pickles its payload as an
out-of-band ``PickleBuffer`` (protocol 5), so Ray puts the payload bytes in its object store once
and the receiver maps them (a read-only ``memoryview``) instead of unpickling a copy. On ``put``
the actor copies that mapped payload once into its own heap (``copy_payloads=True``), so the
RAM tier owns its bytes and does not pin object-store memory; ``get`` returns the stored block and
Ray again ships the payload out of band. Batch calls (``put_many`` / ``get_many``) amortise the
~1 ms cost of a Ray call over many blocks. The store is not thread-safe: keep the actor's default
``max_concurrency=1``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import ray

from kvres.coldstore import BlockKey, KVBlock, PutResult, TieredStore
from kvres.policy.ranges import Range


class ColdStoreServer:
    """A ``TieredStore`` behind a small, Ray-friendly method set."""

    def __init__(
        self,
        ram_budget_bytes: int,
        disk_path: str | os.PathLike[str] | None = None,
        disk_budget_bytes: int = 0,
        *,
        promote_on_get: bool = False,
        copy_payloads: bool = True,
        fsync: bool = True,
    ) -> None:
        self._store = TieredStore.open(
            ram_budget_bytes,
            disk_path,
            disk_budget_bytes,
            promote_on_get=promote_on_get,
            copy_payloads=copy_payloads,
            fsync=fsync,
        )

    def put(self, block: KVBlock, priority: int = 0) -> PutResult:
        return self._store.put(block, priority)

    def put_many(self, blocks: Sequence[KVBlock], priority: int = 0) -> list[PutResult]:
        return [self._store.put(block, priority) for block in blocks]

    def get(self, key: BlockKey, promote: bool | None = None) -> KVBlock | None:
        return self._store.get(key, promote)

    def get_many(self, keys: Sequence[BlockKey], promote: bool | None = None) -> list[KVBlock | None]:
        return [self._store.get(key, promote) for key in keys]

    def get_range(self, session_id: str, token_range: Range, fingerprint: str) -> KVBlock | None:
        return self._store.get_range(session_id, token_range, fingerprint)

    def delete(self, key: BlockKey) -> bool:
        return self._store.delete(key)

    def list_session(self, session_id: str) -> list[BlockKey]:
        return self._store.list_session(session_id)

    def drop_session(self, session_id: str) -> int:
        return self._store.drop_session(session_id)

    def tiers(self, keys: Sequence[BlockKey]) -> list[str | None]:
        """The tier ("ram" / "disk") holding each key, or None where it is gone."""
        return [self._store.tier_of(key) for key in keys]

    def stats(self) -> dict[str, int]:
        return self._store.stats().as_dict()

    def drain_dropped(self) -> list[BlockKey]:
        return self._store.drain_dropped()

    def flush(self) -> None:
        self._store.flush()

    def close(self) -> None:
        self._store.close()


class MeteredColdStoreServer(ColdStoreServer):
    """The server that runs in the cluster: after every change it sets ``kvres_cold_bytes`` and
    ``kvres_cold_blocks`` per tier for its node (``kvres.cluster.metrics``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from kvres.cluster.metrics import RayMetrics

        super().__init__(*args, **kwargs)
        self._metrics = RayMetrics()
        self._node = ray.get_runtime_context().get_node_id()
        self._publish()

    def _publish(self) -> None:
        stats = self._store.stats()
        self._metrics.set_cold(self._node, "ram", stats.ram_bytes, stats.ram_blocks)
        self._metrics.set_cold(self._node, "disk", stats.disk_bytes, stats.disk_blocks)

    def put(self, block: KVBlock, priority: int = 0) -> PutResult:
        result = super().put(block, priority)
        self._publish()
        return result

    def put_many(self, blocks: Sequence[KVBlock], priority: int = 0) -> list[PutResult]:
        results = super().put_many(blocks, priority)
        self._publish()
        return results

    def get(self, key: BlockKey, promote: bool | None = None) -> KVBlock | None:
        block = super().get(key, promote)
        self._publish()  # a promotion or a dropped corrupt file moves bytes between tiers
        return block

    def delete(self, key: BlockKey) -> bool:
        deleted = super().delete(key)
        self._publish()
        return deleted

    def drop_session(self, session_id: str) -> int:
        dropped = super().drop_session(session_id)
        self._publish()
        return dropped


ColdStoreActor = ray.remote(ColdStoreServer)
MeteredColdStoreActor = ray.remote(MeteredColdStoreServer)
