"""Host-RAM tier: blocks kept as objects under a byte budget, evicted by priority then LRU.

Primitives:
- ``ram_cost(block) -> int``: the bytes a block is billed for (payload + a per-token and per-block
  overhead for its header fields).
- ``RamTier(budget_bytes, copy_payloads=False)``: a ``BlockTier`` (tier.py);
  ``put(block, priority=0) -> list[Evicted]`` (the blocks evicted to make room, coldest first,
  each handed back with its key), ``get(key)`` (marks it recently used), ``peek(key)``,
  ``pop(key)``, ``delete(key)``, ``pop_coldest()``, ``cost(block)`` (``ram_cost``), ``flush()``
  and ``close()`` (nothing to do), and the shared bookkeeping (``keys()``,
  ``keys_for_session(session_id)``, ``used_bytes``, ``budget_bytes``, ...).

Blocks are stored as given: no encoding, no checksum. With ``copy_payloads=False`` the tier keeps
the caller's payload object (``bytes``, or a buffer the caller promises not to change); with
``copy_payloads=True`` any payload that is not ``bytes`` (or a view of ``bytes``) is copied once into a private read-only
buffer so the tier owns it (use this when payloads are views of memory that will be reused or released, such as
buffers mapped from Ray's object store); the buffers come from ``pool`` (``payload_pool.PayloadPool``),
which keeps those released for the next copies (at most ``POOL_IDLE_MAX_BYTES`` or 1/16 of the budget
idle): a copy into memory the process already holds costs a memcpy, into fresh memory a page fault per page.

Eviction order: lowest ``priority`` first; least recently used first within a priority.
The budget is never exceeded: ``put`` evicts first, and a block larger than the whole budget is
refused with ``BlockTooLargeError``.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Collection

from .block import KVBlock
from .errors import BlockTooLargeError
from .keys import BlockKey
from .payload_pool import PayloadPool
from .tier import BlockTier, Evicted

BLOCK_OVERHEAD_BYTES = 256
PER_TOKEN_OVERHEAD_BYTES = 16
POOL_IDLE_MAX_BYTES = 256 << 20  # buffers kept for reuse: at most this, or 1/16 of the budget


def ram_cost(block: KVBlock) -> int:
    """Bytes a block is billed for in RAM."""
    return (
        block.payload_nbytes
        + BLOCK_OVERHEAD_BYTES
        + PER_TOKEN_OVERHEAD_BYTES * (len(block.token_ids) + len(block.positions))
    )


def _immutable(payload: bytes | bytearray | memoryview) -> bool:
    """``bytes``, or a view of ``bytes`` (an export made in place): nobody can change it."""
    return isinstance(payload, bytes) or (isinstance(payload, memoryview) and isinstance(payload.obj, bytes))


class RamTier(BlockTier):
    """Blocks in host RAM under ``budget_bytes``."""

    def __init__(self, budget_bytes: int, *, copy_payloads: bool = False) -> None:
        super().__init__(budget_bytes)
        self.pool = PayloadPool(min(budget_bytes // 16, POOL_IDLE_MAX_BYTES)) if copy_payloads else None
        # priority -> key -> (block, cost); each OrderedDict is in LRU order (oldest first).
        self._buckets: dict[int, OrderedDict[BlockKey, tuple[KVBlock, int]]] = {}
        self._priority: dict[BlockKey, int] = {}

    @property
    def _held(self) -> Collection[BlockKey]:
        return self._priority

    def cost(self, block: KVBlock) -> int:
        return ram_cost(block)

    def put(self, block: KVBlock, priority: int = 0) -> list[Evicted]:
        """Store ``block`` (replacing one with the same key); return the blocks evicted, coldest first."""
        key = BlockKey.of(block)
        cost = ram_cost(block)
        if cost > self.budget_bytes:
            raise BlockTooLargeError(
                f"block {key} costs {cost} bytes in RAM; the RAM tier budget is {self.budget_bytes}"
            )
        if self.pool is not None and not _immutable(block.payload):
            block = dataclasses.replace(block, payload=self.pool.copy(block.payload))
        self._remove(key)
        evicted: list[Evicted] = []
        while self._used + cost > self.budget_bytes:
            evicted.append(self._evict_one())
        self._buckets.setdefault(priority, OrderedDict())[key] = (block, cost)
        self._priority[key] = priority
        self._used += cost
        return evicted

    def get(self, key: BlockKey) -> KVBlock | None:
        """The block under ``key`` (now the most recently used), or None."""
        priority = self._priority.get(key)
        if priority is None:
            return None
        bucket = self._buckets[priority]
        bucket.move_to_end(key)
        return bucket[key][0]

    def peek(self, key: BlockKey) -> KVBlock | None:
        """The block under ``key`` without touching its recency, or None."""
        priority = self._priority.get(key)
        return None if priority is None else self._buckets[priority][key][0]

    def pop(self, key: BlockKey) -> KVBlock | None:
        """Remove and return the block under ``key``, or None."""
        return self._remove(key)

    def delete(self, key: BlockKey) -> bool:
        return self._remove(key) is not None

    def flush(self) -> None:
        """Nothing to make durable: RAM is volatile."""

    def close(self) -> None:
        """Nothing to release besides the blocks."""

    def pop_coldest(self) -> KVBlock | None:
        """Remove and return the block that would be evicted next, or None when empty."""
        return self._evict_one().block if self._priority else None

    def _remove(self, key: BlockKey) -> KVBlock | None:
        priority = self._priority.pop(key, None)
        if priority is None:
            return None
        bucket = self._buckets[priority]
        block, cost = bucket.pop(key)
        if not bucket:
            del self._buckets[priority]
        self._used -= cost
        return block

    def _evict_one(self) -> Evicted:
        priority = min(self._buckets)
        bucket = self._buckets[priority]
        key, (block, cost) = bucket.popitem(last=False)
        if not bucket:
            del self._buckets[priority]
        del self._priority[key]
        self._used -= cost
        return Evicted(key, block)
