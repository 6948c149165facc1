"""The one tier interface the RAM and disk tiers implement, with the bookkeeping they share.

Primitives:
- ``Evicted(key, block)``: a block a ``put`` pushed out of its tier to stay within budget;
  ``block`` is the block itself where the tier hands it back (RAM: the caller may keep it in
  another tier), None where it is gone for good (disk: its file is deleted).
- ``BlockTier(budget_bytes)``: the abstract tier. Each tier implements
  ``cost(block) -> int`` (the bytes it would bill), ``put(block, priority=0) -> list[Evicted]``
  (coldest first; ``BlockTooLargeError`` when ``cost`` exceeds the whole budget), ``get(key)``,
  ``pop(key)``, ``delete(key) -> bool``, ``flush()``, ``close()``. Shared: ``budget_bytes``,
  ``used_bytes``, ``len``, ``in``, iteration, ``keys()``, ``keys_for_session(session_id)``
  (sorted), ``session_ids()``, ``fits(block)``, ``drop_session(session_id) -> list[BlockKey]``,
  ``destroy() -> int`` (every block deleted), ``startup_dropped`` (keys a persistent tier dropped
  when it opened, to stay within budget).

A tier is not thread-safe; ``TieredStore`` (tiered.py) holds one in front of another.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from .block import KVBlock
from .keys import BlockKey, validate_session_id


@dataclass(frozen=True)
class Evicted:
    key: BlockKey
    block: KVBlock | None


class BlockTier(ABC):
    """Blocks under a byte budget, indexed by ``BlockKey``."""

    def __init__(self, budget_bytes: int) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"{type(self).__name__} budget_bytes must be an int >= 0, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self._used = 0
        self.startup_dropped: list[BlockKey] = []

    # ---- what each tier implements -----------------------------------------------------------

    @property
    @abstractmethod
    def _held(self) -> Collection[BlockKey]:
        """The keys held, in the tier's own order (a dict's keys: membership costs O(1))."""

    @abstractmethod
    def cost(self, block: KVBlock) -> int:
        """Bytes ``block`` is billed for in this tier."""

    @abstractmethod
    def put(self, block: KVBlock, priority: int = 0) -> list[Evicted]:
        """Store ``block`` (replacing one with the same key); return what was evicted, coldest first."""

    @abstractmethod
    def get(self, key: BlockKey) -> KVBlock | None:
        """The block under ``key`` (now the most recently used), or None."""

    @abstractmethod
    def pop(self, key: BlockKey) -> KVBlock | None:
        """Remove and return the block under ``key``, or None."""

    @abstractmethod
    def delete(self, key: BlockKey) -> bool: ...

    @abstractmethod
    def flush(self) -> None:
        """Make every stored block durable."""

    @abstractmethod
    def close(self) -> None:
        """Release what the tier holds besides its blocks; the tier must not be used afterwards."""

    # ---- shared ------------------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def keys(self) -> list[BlockKey]:
        return list(self._held)

    def __iter__(self) -> Iterator[BlockKey]:
        return iter(self.keys())

    def keys_for_session(self, session_id: str) -> list[BlockKey]:
        validate_session_id(session_id)
        return sorted(k for k in self._held if k.session_id == session_id)

    def session_ids(self) -> set[str]:
        return {k.session_id for k in self._held}

    def fits(self, block: KVBlock) -> bool:
        """Whether ``block`` could be held at all (its cost is within the budget)."""
        return self.cost(block) <= self.budget_bytes

    def drop_session(self, session_id: str) -> list[BlockKey]:
        """Delete every block of ``session_id``; return their keys."""
        keys = self.keys_for_session(session_id)
        for key in keys:
            self.delete(key)
        return keys

    def destroy(self) -> int:
        """Delete every block; return how many."""
        count = len(self)
        for key in self.keys():
            self.delete(key)
        return count

