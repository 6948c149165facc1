"""The one cold-store interface: what the tiered store, the per-node actor and a backend's port share.

Primitives:
- ``ColdStore``: single-block ``put(block, priority=0) -> PutResult``, ``get(key)``,
  ``delete(key)``, ``tier_of(key)``, ``list_session(session_id)``; batched ``put_many``,
  ``get_many``, ``pop_many`` (read and remove, skipping reads that cost more than a recompute),
  ``delete_many``, ``tiers`` and ``drop_session``, which loop over the single calls
  by default so an implementation overrides only what it can do faster (a Ray actor: one call for
  the whole batch).
- ``PutResult``: where a block went, which blocks moved RAM -> disk, which were dropped for good.
- ``Tier``: ``"ram"`` or ``"disk"``.

Blocks are named by ``BlockKey`` (session id, token range, fingerprint) everywhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvres.policy.recall import RecallCosts

from .block import KVBlock
from .errors import ColdStoreError
from .keys import BlockKey

Tier = Literal["ram", "disk"]


@dataclass(frozen=True)
class PutResult:
    key: BlockKey
    tier: Tier
    spilled: tuple[BlockKey, ...] = ()
    dropped: tuple[BlockKey, ...] = ()
    errors: tuple[str, ...] = ()


class ColdStore(ABC):
    @abstractmethod
    def put(self, block: KVBlock, priority: int = 0) -> PutResult: ...

    @abstractmethod
    def get(self, key: BlockKey) -> KVBlock | None:
        """The block under ``key``, or None when the store does not hold it (any more)."""

    @abstractmethod
    def delete(self, key: BlockKey) -> bool: ...

    @abstractmethod
    def tier_of(self, key: BlockKey) -> Tier | None: ...

    @abstractmethod
    def list_session(self, session_id: str) -> list[BlockKey]: ...

    def put_many(self, blocks: Sequence[KVBlock], priority: int = 0) -> list[PutResult]:
        return [self.put(block, priority) for block in blocks]

    def get_many(self, keys: Sequence[BlockKey]) -> list[KVBlock | None]:
        """Like ``get`` for each key, except that a block that cannot be read (corrupt, foreign)
        comes back as None instead of failing the batch: its owner recomputes it."""
        out: list[KVBlock | None] = []
        for key in keys:
            try:
                out.append(self.get(key))
            except ColdStoreError:
                out.append(None)
        return out

    def pop_many(
        self, keys: Sequence[BlockKey], nbytes: Sequence[int] | None = None, costs: RecallCosts | None = None
    ) -> list[KVBlock | None]:
        """Remove the blocks and return them (None where gone or unreadable, as ``get_many``).

        With ``costs`` (and each block's ``nbytes``), a block that is slower to read from its tier
        than to recompute from its tokens is removed unread and comes back as None."""
        if costs is not None and (nbytes is None or len(nbytes) != len(keys)):
            raise ValueError(f"pop_many with costs needs one nbytes per key ({len(keys)} keys)")
        out: list[KVBlock | None] = []
        for i, key in enumerate(keys):
            tier = self.tier_of(key)
            read = tier is not None and (
                costs is None or nbytes is None or costs.worth_reading(nbytes[i], len(key.token_range), tier)
            )
            out.append(self.get_many([key])[0] if read else None)
            self.delete(key)
        return out

    def delete_many(self, keys: Sequence[BlockKey]) -> int:
        return sum(1 for key in keys if self.delete(key))

    def tiers(self, keys: Sequence[BlockKey]) -> list[Tier | None]:
        return [self.tier_of(key) for key in keys]

    def drop_session(self, session_id: str) -> int:
        """Remove every block of ``session_id``; return how many."""
        return self.delete_many(self.list_session(session_id))
