"""Where a backend parks blocks: the cold store of its node, and the stores of other nodes.

Primitives:
- ``ColdRef(store, key, nbytes)``: a block parked in the store named ``store``.
- ``StorePort``: a ``kvres.coldstore.ColdStore`` over the backend's home store (``name``), plus
  ``at(store)``: the same interface over another store by name, so a block parked on one node can
  be fetched from another after a migration. By ``ColdRef``, one batched call per store each:
  ``park(blocks) -> refs`` (into the home store), ``take(refs, costs)`` (read and remove),
  ``read(refs)`` (read, left there), ``tiers_of(refs)``, ``release(refs)``. Hints a port may use
  or ignore: ``defer_writes``, ``send_now``, ``flush``, ``prefetch``.

The ports: ``kvres.actors.ray_actors.ray_store_port.RayStorePort`` (the cold-store actors, over
Ray) and ``kvres.testing.LocalStorePort`` (in-process stores).

A store whose node died is gone for good (``ColdStoreGoneError``): ``take``, ``read`` and ``tiers_of`` answer
None for its refs (their tokens are recomputed from the log) and ``release`` skips them, so a session
whose blocks were parked or spilled there goes on.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvres.coldstore import BlockKey, ColdStore, KVBlock, Tier
from kvres.policy.errors import ColdStoreGoneError
from kvres.policy.recall import RecallCosts

logger = logging.getLogger("kvres.coldstore")
_T = TypeVar("_T")


@dataclass(frozen=True)
class ColdRef:
    store: str
    key: BlockKey
    nbytes: int


class StorePort(ColdStore):
    name: str

    @abstractmethod
    def at(self, store: str) -> ColdStore:
        """The store named ``store`` (this port itself for the home store)."""

    def defer_writes(self, defer: bool) -> None:
        """A hint from the backend: while ``defer`` holds it is running calls, and writes that
        need not be done now may wait. Ports that write at once ignore it."""

    def send_now(self) -> None:
        """Writes made so far go out without waiting for the backend to be between calls."""

    def flush(self) -> None:
        """Writes made so far are in the store when it returns (a session handed to another
        backend: that backend reads its blocks from the store, and its calls are not ordered
        after this port's). Ports that write at once have nothing to wait for."""

    def prefetch(self, refs: Sequence[ColdRef]) -> None:
        """A hint: ``take`` will soon ask for ``refs``; a port whose reads are slow may start them
        now, without waiting. Ports that read at once ignore it."""

    def park(self, blocks: Sequence[KVBlock]) -> list[ColdRef]:
        results = self.put_many(blocks)
        return [ColdRef(self.name, r.key, b.payload_nbytes) for r, b in zip(results, blocks, strict=True)]

    def take(self, refs: Sequence[ColdRef], costs: RecallCosts | None = None) -> list[KVBlock | None]:
        """The blocks behind ``refs``, removed from their stores (None where gone, unreadable or
        cheaper to recompute under ``costs``)."""
        return self._per_store(refs, lambda store, keys, idx: store.pop_many(keys, [refs[i].nbytes for i in idx], costs),
                               "parked")

    def read(self, refs: Sequence[ColdRef]) -> list[KVBlock | None]:
        """The blocks behind ``refs``, left in their stores (None where gone or unreadable)."""
        return self._per_store(refs, lambda store, keys, idx: store.get_many(keys), "spilled")

    def tiers_of(self, refs: Sequence[ColdRef]) -> list[Tier | None]:
        return self._per_store(refs, lambda store, keys, idx: store.tiers(keys), "")

    def _per_store(
        self, refs: Sequence[ColdRef], ask: Callable[[ColdStore, list[BlockKey], list[int]], Sequence[_T]],
        lost: str,
    ) -> list[_T | None]:
        """``ask`` of each store for its refs' keys, the answers in ``refs``' order; a store gone
        with its node answers None for all of them (``lost``: what they were, for the warning)."""
        out: list[_T | None] = [None] * len(refs)
        for store, idx in _by_store(refs).items():
            try:
                got = ask(self.at(store), [refs[i].key for i in idx], idx)
            except ColdStoreGoneError as exc:
                if lost:
                    logger.warning("%d block(s) %s in %s are gone (%s): recomputed from the log", len(idx), lost,
                                   store, exc)
                continue
            for i, answer in zip(idx, got, strict=True):
                out[i] = answer
        return out

    def release(self, refs: Sequence[ColdRef]) -> None:
        for store, idx in _by_store(refs).items():
            try:
                self.at(store).delete_many([refs[i].key for i in idx])
            except ColdStoreGoneError:
                continue  # gone with its node: nothing left to free


def _by_store(refs: Sequence[ColdRef]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, ref in enumerate(refs):
        groups.setdefault(ref.store, []).append(i)
    return groups
