"""The per-node cold store as a Ray actor: a thin wrapper around ``kvres.coldstore.TieredStore``.

Primitives:
- ``ColdStoreServer(ram_budget_bytes, disk_path=None, disk_budget_bytes=0, promote_on_get=False,
  copy_payloads=True, fsync=True, secret=None, cache_folder=None)``: the plain class (works
  without Ray), a ``kvres.coldstore.ColdStore`` (single and batched put / get / delete / tiers,
  ``list_session``, ``drop_session``) plus ``stats`` (a flat ``dict[str, int]`` for metrics),
  ``drain_dropped``, ``flush``, ``close``, ``session_ids``, ``disk_folder``, ``collect_orphans(live_session_ids,
  min_idle_s)`` (drop the blocks of every session not in the planner's directory) and ``destroy``
  (drop everything, remove the disk folder). A batched call is one Ray call for the whole batch.
- ``default_store_dir(cache_folder) -> Path``: ``<user cache>/kvres/coldstore/<cache_folder>``
  (``platformdirs.user_cache_dir``) on the node the store runs on; used when ``disk_path`` is None
  and ``cache_folder`` is given.
- ``MeteredColdStoreServer``: the same, publishing ``kvres_cold_bytes`` / ``kvres_cold_blocks`` per
  tier after every change, with the heap it started with frozen (``heap.freeze_startup_heap``),
  its disk folder claimed for its process (``store_folders.claim``; ``destroy`` releases it) and
  ``sweep_previous(prefix)``
  (the same namespace's folders an earlier run or a dead node left here, removed);
  ``MeteredColdStoreActor`` is what the cluster starts on every node.
- ``ColdStoreActor``: ``ray.remote(ColdStoreServer)``; create it with
  ``ColdStoreActor.options(name=..., namespace=..., scheduling_strategy=...).remote(...)``.

Blocks cross process boundaries without extra copies: ``KVBlock`` pickles its payload as an
out-of-band ``PickleBuffer`` (protocol 5), so Ray puts the payload bytes in its object store once
and the receiver maps them (a read-only ``memoryview``) instead of unpickling a copy. On ``put``
the actor copies that mapped payload once into its own heap (``copy_payloads=True``: into a buffer
its RAM tier reuses, ``kvres.coldstore.payload_pool``), so the RAM tier owns its bytes and does not
pin object-store memory; ``get`` returns the stored block and
Ray again ships the payload out of band. Batch calls (``put_many`` / ``get_many``) amortise the
~1 ms cost of a Ray call over many blocks. The store is not thread-safe: keep the actor's default
``max_concurrency=1``.

Disk blocks carry an HMAC tag keyed with ``secret`` (``kvres.coldstore.auth``): the driver that
creates a namespace's cold stores hands them the namespace's secret, which lives only in memory
(the actor's, and Ray's GCS, so a restarted actor gets it back), never in the store folder. A block
altered or forged without it is refused and recomputed by its owner.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import platformdirs
import ray

from kvres.actors.metrics import STORE_EVENTS, RayMetrics
from kvres.coldstore import (
    BlockKey,
    ColdStore,
    DiskTier,
    KVBlock,
    PutResult,
    Tier,
    TieredStore,
    UnsafeStoreDirError,
    private_dir,
    validate_session_id,
)
from kvres.policy.recall import RecallCosts

from .heap import freeze_startup_heap
from .store_folders import claim, release, sweep_siblings


def default_store_dir(cache_folder: str) -> Path:
    """This user's private cache folder for a store: missing levels created 0700; ``coldstore``
    and the store's folder checked by ``private_dir`` (no symlink, this user's, no group or other
    access; ``<user cache>/kvres`` itself, which also caches models, need only be this user's)."""
    if not cache_folder or cache_folder.startswith(".") or "/" in cache_folder or "\0" in cache_folder:
        raise UnsafeStoreDirError(repr(cache_folder), "a cache folder must be one plain folder name")
    stores = private_dir(Path(platformdirs.user_cache_dir("kvres")) / "coldstore")
    return private_dir(stores / cache_folder)


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
        secret: bytes | None = None,
        cache_folder: str | None = None,
    ) -> None:
        if disk_path is None and cache_folder is not None:
            disk_path = default_store_dir(cache_folder)
        self._store = TieredStore.open(
            ram_budget_bytes, disk_path, disk_budget_bytes,
            promote_on_get=promote_on_get, copy_payloads=copy_payloads, fsync=fsync, secret=secret,
        )
        self._last_put: dict[str, float] = {}  # session id -> monotonic time of its last put

    def __repr__(self) -> str:
        """Bytes and blocks per tier, for Ray's dashboard (its Repr column)."""
        def size(n: int) -> str:
            for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
                if n >= scale:
                    return f"{n / scale:.1f} {unit}"
            return f"{n} B"

        store: TieredStore | None = self.__dict__.get("_store")
        if store is None:
            return f"{type(self).__name__}(not started)"
        st = store.stats()
        return (f"{type(self).__name__}(ram {size(st.ram_bytes)} in {st.ram_blocks} blocks "
                f"of {size(st.ram_budget_bytes)}, disk {size(st.disk_bytes)} in {st.disk_blocks} blocks "
                f"of {size(st.disk_budget_bytes)})")

    def _changed(self) -> None:
        """Called after every call that may move bytes between tiers."""

    def put(self, block: KVBlock, priority: int = 0) -> PutResult:
        self._last_put[block.session_id] = time.monotonic()
        result = self._store.put(block, priority)
        self._changed()
        return result

    def put_many(self, blocks: Sequence[KVBlock], priority: int = 0) -> list[PutResult]:
        now = time.monotonic()
        self._last_put.update((block.session_id, now) for block in blocks)
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
        self._last_put.pop(session_id, None)
        self._changed()
        return dropped

    def pid(self) -> int:
        return os.getpid()

    def disk_folder(self) -> str | None:
        """The disk tier's folder, None without one (where a backend measures disk reads)."""
        disk = self._store.disk
        return str(disk.path) if isinstance(disk, DiskTier) else None

    def session_ids(self) -> list[str]:
        """Every session with a block here, sorted."""
        return sorted(self._store.session_ids())

    def collect_orphans(self, live_session_ids: Collection[str], min_idle_s: float = 60.0) -> dict[str, int]:
        """Drop every block of the sessions that are not in ``live_session_ids`` (the planner's
        directory) and had no block put for ``min_idle_s`` seconds (blocks of a session opened
        after the directory was read are kept; so are, until the next collection, blocks of a
        session closed meanwhile); return the blocks dropped per session."""
        live = {validate_session_id(sid) for sid in live_session_ids}
        now = time.monotonic()
        present = self._store.session_ids()
        dropped: dict[str, int] = {}
        for sid in present - live:
            if now - self._last_put.get(sid, -float("inf")) >= min_idle_s:
                dropped[sid] = self._store.drop_session(sid)
        for sid in [s for s in self._last_put if s not in present or s in dropped]:
            del self._last_put[sid]  # sessions closed through delete_many leave their time behind
        if dropped:
            self._changed()
        return dropped

    def destroy(self) -> int:
        """Drop every block of both tiers and remove the disk tier's folder (files kvres did not
        make stay, and so does their folder); the store is closed. Returns the blocks dropped."""
        dropped = self._store.destroy()
        self._last_put.clear()
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
    ``kvres_cold_blocks`` per tier for its node and counts its drops, failed disk writes and
    refused blocks (``kvres_store_blocks_lost``, ``kvres.actors.metrics``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._metrics = RayMetrics()
        self._node = ray.get_runtime_context().get_node_id()
        folder = self.disk_folder()
        if folder is not None:
            claim(folder, self._node)  # an earlier run's folder is found by its owner's death
        self._changed()
        freeze_startup_heap()

    def destroy(self) -> int:
        folder = self.disk_folder()
        dropped = super().destroy()
        if folder is not None:
            release(folder)
        return dropped

    def sweep_previous(self, prefix: str) -> list[dict[str, Any]]:
        """Remove the folders of this namespace's stores (``prefix``) whose owning process is
        gone (an earlier run of the cluster, a node that died) beside this store's; what was
        removed (``store_folders.sweep_siblings``)."""
        folder = self.disk_folder()
        return [] if folder is None else sweep_siblings(folder, prefix)

    def _changed(self) -> None:
        stats = self._store.stats()
        self._metrics.set_cold(self._node, "ram", stats.ram_bytes, stats.ram_blocks)
        self._metrics.set_cold(self._node, "disk", stats.disk_bytes, stats.disk_blocks)
        self._metrics.set_store_events(self._node, {event: int(getattr(stats, event)) for event in STORE_EVENTS})


ColdStoreActor = ray.remote(ColdStoreServer)
MeteredColdStoreActor = ray.remote(MeteredColdStoreServer)
