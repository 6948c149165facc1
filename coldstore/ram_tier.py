"""Host-RAM tier: blocks kept as objects under a byte budget, evicted by priority then LRU.

Primitives:
- ``ram_cost(block) -> int``: the bytes a block is billed for (payload + a per-token and per-block
  overhead for its header fields).
- ``RamTier(budget_bytes, copy_payloads=False)``:
  ``put(block, priority=0) -> list[KVBlock]`` (the blocks evicted to make room, coldest first),
  ``get(key)`` (marks it recently used), ``peek(key)``, ``pop(key)``, ``delete(key)``,
  ``keys()``, ``keys_for_session(session_id)``, ``used_bytes``, ``budget_bytes``.

Blocks are stored as given: no encoding, no checksum. With ``copy_payloads=False`` the tier keeps
the caller's payload object (``bytes``, or a buffer the caller promises not to change); with
``copy_payloads=True`` any payload that is not ``bytes`` is copied once into a private read-only
buffer so the tier owns it (use this when payloads are views of memory that will be reused or released, such as
buffers mapped from Ray's object store).

Eviction order: lowest ``priority`` first; least recently used first within a priority.
The budget is never exceeded: ``put`` evicts first, and a block larger than the whole budget is
refused with ``BlockTooLargeError``.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from .block import KVBlock
from .codec import payload_view
from .errors import BlockTooLargeError
from .keys import BlockKey, validate_session_id

BLOCK_OVERHEAD_BYTES = 256
PER_TOKEN_OVERHEAD_BYTES = 16


def ram_cost(block: KVBlock) -> int:
    """Bytes a block is billed for in RAM."""
    return (
        block.payload_nbytes
        + BLOCK_OVERHEAD_BYTES
        + PER_TOKEN_OVERHEAD_BYTES * (len(block.token_ids) + len(block.positions))
    )


def _owned_copy(payload: bytes | bytearray | memoryview) -> memoryview:
    """A read-only byte view of a private copy of ``payload`` (one memcpy; numpy allocates with
    huge pages where it can, which makes large copies faster than ``bytes(payload)``)."""
    owned = np.frombuffer(payload_view(payload), dtype=np.uint8).copy()
    owned.flags.writeable = False
    return owned.data


class RamTier:
    """Blocks in host RAM under ``budget_bytes``."""

    def __init__(self, budget_bytes: int, *, copy_payloads: bool = False) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"RamTier budget_bytes must be an int >= 0, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self.copy_payloads = copy_payloads
        self._used = 0
        # priority -> key -> (block, cost); each OrderedDict is in LRU order (oldest first).
        self._buckets: dict[int, OrderedDict[BlockKey, tuple[KVBlock, int]]] = {}
        self._priority: dict[BlockKey, int] = {}

    @property
    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._priority)

    def __contains__(self, key: object) -> bool:
        return key in self._priority

    def keys(self) -> list[BlockKey]:
        return list(self._priority)

    def __iter__(self) -> Iterator[BlockKey]:
        return iter(self.keys())

    def keys_for_session(self, session_id: str) -> list[BlockKey]:
        validate_session_id(session_id)
        return sorted(k for k in self._priority if k.session_id == session_id)

    def fits(self, block: KVBlock) -> bool:
        """Whether ``block`` could be held at all (its cost is within the budget)."""
        return ram_cost(block) <= self.budget_bytes

    def put(self, block: KVBlock, priority: int = 0) -> list[KVBlock]:
        """Store ``block`` (replacing one with the same key); return the blocks evicted, coldest first."""
        key = BlockKey.of(block)
        cost = ram_cost(block)
        if cost > self.budget_bytes:
            raise BlockTooLargeError(
                f"block {key} costs {cost} bytes in RAM; the RAM tier budget is {self.budget_bytes}"
            )
        if self.copy_payloads and not isinstance(block.payload, bytes):
            block = dataclasses.replace(block, payload=_owned_copy(block.payload))
        self._remove(key)
        evicted: list[KVBlock] = []
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

    def pop_coldest(self) -> KVBlock | None:
        """Remove and return the block that would be evicted next, or None when empty."""
        return self._evict_one() if self._priority else None

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

    def _evict_one(self) -> KVBlock:
        priority = min(self._buckets)
        bucket = self._buckets[priority]
        key, (block, cost) = bucket.popitem(last=False)
        if not bucket:
            del self._buckets[priority]
        del self._priority[key]
        self._used -= cost
        return block
