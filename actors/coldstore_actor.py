"""The per-node cold store as a Ray actor: a thin wrapper around ``kvres.coldstore.TieredStore``.

Primitives:
- ``ColdStoreServer(ram_budget_bytes, disk_path=None, disk_budget_bytes=0, promote_on_get=False,
  copy_payloads=True, fsync=True)``: the plain class (works without Ray), a
  ``kvres.coldstore.ColdStore`` (single and batched put / get / delete / tiers, ``list_session``,
  ``drop_session``) plus ``stats`` (a flat ``dict[str, int]`` for metrics), ``drain_dropped``,
  ``flush``, ``close``. A batched call is one Ray call for the whole batch.
- ``MeteredColdStoreServer``: the same, publishing ``kvres_cold_bytes`` / ``kvres_cold_blocks`` per
  tier after every change; ``MeteredColdStoreActor`` is what the cluster starts on every node.
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

from kvres.coldstore import BlockKey, ColdStore, KVBlock, PutResult, Tier, TieredStore
from kvres.policy.recall import RecallCosts

from .metrics import RayMetrics


class ColdStoreServer(ColdStore):
    """A ``TieredStore`` behind a Ray-friendly method set; ``_changed`` runs after every change."""

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
            ram_budget_bytes, disk_path, disk_budget_bytes,
            promote_on_get=promote_on_get, copy_payloads=copy_payloads, fsync=fsync,
        )

    def __repr__(self) -> str:
        """Bytes and blocks per tier, for Ray's dashboard (its Repr column)."""
        def size(n: int) -> str:
            for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
                if n >= scale:
                    return f"{n / scale:.1f} {unit}"
            return f"{n} B"

        st = self._store.stats()
        return (f"{type(self).__name__}(ram {size(st.ram_bytes)} in {st.ram_blocks} blocks "
                f"of {size(st.ram_budget_bytes)}, disk {size(st.disk_bytes)} in {st.disk_blocks} blocks "
                f"of {size(st.disk_budget_bytes)})")

    def _changed(self) -> None:
        """Called after every call that may move bytes between tiers."""

    def put(self, block: KVBlock, priority: int = 0) -> PutResult:
        result = self._store.put(block, priority)
        self._changed()
        return result

    def put_many(self, blocks: Sequence[KVBlock], priority: int = 0) -> list[PutResult]:
        results = self._store.put_many(blocks, priority)
        self._changed()
        return results

    def get(self, key: BlockKey) -> KVBlock | None:
        block = self._store.get(key)
        self._changed()  # a promotion or a dropped corrupt file moves bytes between tiers
        return block

    def get_many(self, keys: Sequence[BlockKey]) -> list[KVBlock | None]:
        blocks = self._store.get_many(keys)
        self._changed()
        return blocks

    def pop_many(
        self, keys: Sequence[BlockKey], nbytes: Sequence[int] | None = None, costs: RecallCosts | None = None
    ) -> list[KVBlock | None]:
        blocks = self._store.pop_many(keys, nbytes, costs)
        self._changed()
        return blocks

    def delete(self, key: BlockKey) -> bool:
        deleted = self._store.delete(key)
        self._changed()
        return deleted

    def delete_many(self, keys: Sequence[BlockKey]) -> int:
        deleted = self._store.delete_many(keys)
        self._changed()
        return deleted

    def drop_session(self, session_id: str) -> int:
        dropped = self._store.drop_session(session_id)
        self._changed()
        return dropped

    def tier_of(self, key: BlockKey) -> Tier | None:
        return self._store.tier_of(key)

    def tiers(self, keys: Sequence[BlockKey]) -> list[Tier | None]:
        return self._store.tiers(keys)

    def list_session(self, session_id: str) -> list[BlockKey]:
        return self._store.list_session(session_id)

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
    ``kvres_cold_blocks`` per tier for its node (``kvres.actors.metrics``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._metrics = RayMetrics()
        self._node = ray.get_runtime_context().get_node_id()
        self._changed()

    def _changed(self) -> None:
        stats = self._store.stats()
        self._metrics.set_cold(self._node, "ram", stats.ram_bytes, stats.ram_blocks)
        self._metrics.set_cold(self._node, "disk", stats.disk_bytes, stats.disk_blocks)


ColdStoreActor = ray.remote(ColdStoreServer)
MeteredColdStoreActor = ray.remote(MeteredColdStoreServer)
