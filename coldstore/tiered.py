"""Tiered store: host RAM in front of disk, with rolling spill and byte budgets on both.

Primitives:
- ``TieredStore(ram, disk=None, promote_on_get=False)`` over any ``BlockTier`` (tier.py), and
  ``TieredStore.open(ram_budget_bytes, disk_path=None, disk_budget_bytes=0, ..., secret=None)``
  (a ``RamTier`` in front of a ``DiskTier``; ``secret`` keys the disk tier's block tags):
  ``put(block, priority=0) -> PutResult``, ``get(key, promote=None)``,
  ``get_range(session_id, token_range, fingerprint)`` (refuses a block of another fingerprint),
  ``delete(key)``, ``list_session(session_id)``, ``session_ids()``, ``drop_session(session_id)``,
  ``tier_of(key)``, ``stats() -> StoreStats``, ``drain_dropped()``, ``flush()``, ``close()``,
  ``destroy()`` (every block gone, the disk tier's folder removed).
  It implements ``kvres.coldstore.ColdStore`` (batched calls included).
- ``StoreStats``: bytes and blocks per tier, budgets, hits, misses, spills, promotions, drops.

Rules:
- A block lives in exactly one tier. ``put`` stores into RAM; the coldest RAM blocks (lowest
  priority, then least recently used) roll to disk until RAM is within budget; disk drops its own
  least recently used blocks to stay within its budget. What is dropped is returned in
  ``PutResult.dropped`` and logged for ``drain_dropped()`` (the planner recomputes those ranges).
- A block too big for RAM goes straight to disk; too big for both raises ``BlockTooLargeError``.
- A block that goes straight to disk and cannot be written (a full disk) is not kept: its own key
  is in its ``PutResult.dropped`` (with the error), counted in ``drops`` and ``spill_errors``.
- Disk failures never break RAM: a failed spill (``DiskFullError``, ``DiskWriteError``) drops the
  spilled block, reports it in ``PutResult.dropped`` / ``errors`` and counts a ``spill_error``;
  a block that had to go straight to disk raises the error and leaves the store unchanged.
- ``get`` on a disk hit moves the block back to RAM when promotion is on (at priority 0).
- Not thread-safe: one caller at a time (the Ray actor runs one call at a time).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import asdict, dataclass, field

from kvres.policy.ranges import Range

from .block import KVBlock
from .disk_tier import DiskTier
from .errors import BlockCorruptError, BlockFingerprintError, BlockTooLargeError, DiskWriteError
from .interface import ColdStore, PutResult, Tier
from .keys import BlockKey, validate_fingerprint, validate_session_id
from .ram_tier import RamTier
from .tier import BlockTier, Evicted

logger = logging.getLogger("kvres.coldstore")


@dataclass
class StoreCounters:
    puts: int = 0  # put calls, a refused one included
    hits_ram: int = 0  # gets answered from RAM
    hits_disk: int = 0  # gets answered from disk
    misses: int = 0  # gets of a key no tier holds (or holds for another fingerprint)
    spills: int = 0  # blocks moved from RAM to disk to make room
    promotions: int = 0  # disk hits copied back into RAM
    drops: int = 0  # blocks no tier kept (their owner recomputes them)
    spill_errors: int = 0  # writes the disk refused (full, or an OS error)
    corrupt: int = 0  # disk reads that failed their check


@dataclass(kw_only=True)
class StoreStats(StoreCounters):
    ram_bytes: int
    ram_blocks: int
    ram_budget_bytes: int
    disk_bytes: int
    disk_blocks: int
    disk_budget_bytes: int

    @property
    def hits(self) -> int:
        return self.hits_ram + self.hits_disk

    def as_dict(self) -> dict[str, int]:
        out = asdict(self)
        out["hits"] = self.hits
        return out


@dataclass
class _Moves:
    spilled: list[BlockKey] = field(default_factory=list)
    dropped: list[BlockKey] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class TieredStore(ColdStore):
    """RAM tier in front of an optional disk tier."""

    def __init__(
        self,
        ram: BlockTier,
        disk: BlockTier | None = None,
        *,
        promote_on_get: bool = False,
        max_drop_log: int = 100_000,
    ) -> None:
        self.ram = ram
        self.disk = disk
        self.promote_on_get = promote_on_get
        self._counters = StoreCounters()
        self._drop_log: deque[BlockKey] = deque(maxlen=max_drop_log)
        if disk is not None and disk.startup_dropped:
            self._record_drops(disk.startup_dropped)

    @classmethod
    def open(
        cls,
        ram_budget_bytes: int,
        disk_path: str | os.PathLike[str] | None = None,
        disk_budget_bytes: int = 0,
        *,
        promote_on_get: bool = False,
        copy_payloads: bool = False,
        fsync: bool = True,
        defer_dir_sync: bool = True,
        secret: bytes | None = None,
    ) -> TieredStore:
        ram = RamTier(ram_budget_bytes, copy_payloads=copy_payloads)
        disk = (
            None
            if disk_path is None
            else DiskTier(disk_path, disk_budget_bytes, fsync=fsync, defer_dir_sync=defer_dir_sync,
                          secret=secret)
        )
        return cls(ram, disk, promote_on_get=promote_on_get)

    def flush(self) -> None:
        """Make every block on disk durable (see ``DiskTier.flush``); RAM is volatile by nature."""
        if self.disk is not None:
            self.disk.flush()

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    def destroy(self) -> int:
        """Remove every block of both tiers and the disk tier's folder (see ``DiskTier.destroy``),
        closing the store; return how many blocks were removed."""
        count = self.ram.destroy()
        if self.disk is not None:
            count += self.disk.destroy()
        return count

    # ---- writes ------------------------------------------------------------------------------

    def put(self, block: KVBlock, priority: int = 0) -> PutResult:
        """Store ``block``; see the module docstring for where it goes and what it displaces."""
        key = BlockKey.of(block)
        if self.ram.fits(block):
            evicted = self.ram.put(block, priority)
            if self.disk is not None:
                self.disk.delete(key)  # a newer copy now lives in RAM
            moves = self._spill(evicted)
            tier: Tier = "ram"
        else:
            if self.disk is None:
                raise BlockTooLargeError(
                    f"block {key} costs {self.ram.cost(block)} bytes; the RAM budget is "
                    f"{self.ram.budget_bytes} and there is no disk tier"
                )
            try:
                dropped = self.disk.put(block)
            except BlockTooLargeError as exc:
                raise BlockTooLargeError(
                    f"block {key} fits neither tier: it costs {self.ram.cost(block)} bytes in RAM "
                    f"(budget {self.ram.budget_bytes}); {exc}"
                ) from exc
            except DiskWriteError as exc:  # a full disk: the block is not kept, and says so
                logger.warning("cold store: block %s not kept: %s: %s", key, type(exc).__name__, exc)
                self._counters.spill_errors += 1
                self._counters.puts += 1
                self._record_drops([key])
                return PutResult(key, "disk", (), (key,), (str(exc),))
            self.ram.delete(key)
            moves = _Moves(dropped=[out.key for out in dropped])
            tier = "disk"
        self._counters.puts += 1
        self._record_drops(moves.dropped)
        return PutResult(key, tier, tuple(moves.spilled), tuple(moves.dropped), tuple(moves.errors))

    def _spill(self, evicted: list[Evicted]) -> _Moves:
        """Move what RAM evicted to disk; what cannot go there is dropped."""
        moves = _Moves()
        for out in evicted:
            key = out.key
            if self.disk is None or out.block is None:
                moves.dropped.append(key)
                continue
            try:
                moves.dropped.extend(dropped.key for dropped in self.disk.put(out.block))
            except BlockTooLargeError:
                moves.dropped.append(key)
                continue
            except DiskWriteError as exc:
                moves.dropped.append(key)
                moves.errors.append(str(exc))
                self._counters.spill_errors += 1
                continue
            moves.spilled.append(key)
            self._counters.spills += 1
        return moves

    def _record_drops(self, keys: list[BlockKey]) -> None:
        self._counters.drops += len(keys)
        self._drop_log.extend(keys)

    def drain_dropped(self) -> list[BlockKey]:
        """Keys dropped for good since the last call (by puts, promotions or start-up)."""
        out = list(self._drop_log)
        self._drop_log.clear()
        return out

    # ---- reads -------------------------------------------------------------------------------

    def get(self, key: BlockKey, promote: bool | None = None) -> KVBlock | None:
        """The block under ``key`` or None; a damaged disk file raises ``BlockCorruptError``."""
        block = self.ram.get(key)
        if block is not None:
            self._counters.hits_ram += 1
            return block
        if self.disk is not None:
            try:
                block = self.disk.get(key)
            except (BlockCorruptError, BlockFingerprintError):
                self._counters.corrupt += 1
                raise
            if block is not None:
                self._counters.hits_disk += 1
                if (self.promote_on_get if promote is None else promote) and self.ram.fits(block):
                    self.disk.delete(key)
                    moves = self._spill(self.ram.put(block))
                    self._record_drops(moves.dropped)
                    self._counters.promotions += 1
                return block
        self._counters.misses += 1
        return None

    def get_range(self, session_id: str, token_range: Range, fingerprint: str) -> KVBlock | None:
        """The block of ``session_id`` covering exactly ``token_range`` for ``fingerprint``.

        Raises ``BlockFingerprintError`` when the store holds that range only for another
        fingerprint (another model, KV type or geometry), so a caller never imports it by mistake.
        """
        validate_fingerprint(fingerprint)
        key = BlockKey(session_id, token_range, fingerprint)
        if key in self.ram or (self.disk is not None and key in self.disk):
            return self.get(key)
        others = [k.fingerprint for k in self.list_session(session_id) if k.token_range == token_range]
        if others:
            self._counters.misses += 1
            raise BlockFingerprintError(
                f"session {session_id!r} range {token_range} is stored with fingerprint(s) "
                f"{sorted(set(others))}, not the requested {fingerprint!r}"
            )
        return self.get(key)

    def tier_of(self, key: BlockKey) -> Tier | None:
        if key in self.ram:
            return "ram"
        if self.disk is not None and key in self.disk:
            return "disk"
        return None

    def __contains__(self, key: object) -> bool:
        return key in self.ram or (self.disk is not None and key in self.disk)

    def session_ids(self) -> set[str]:
        """Every session with a block in either tier."""
        ids = self.ram.session_ids()
        return ids | self.disk.session_ids() if self.disk is not None else ids

    def list_session(self, session_id: str) -> list[BlockKey]:
        keys = self.ram.keys_for_session(session_id)
        if self.disk is not None:
            keys += self.disk.keys_for_session(session_id)
        return sorted(keys)

    # ---- removal -----------------------------------------------------------------------------

    def delete(self, key: BlockKey) -> bool:
        in_ram = self.ram.delete(key)
        on_disk = self.disk.delete(key) if self.disk is not None else False
        return in_ram or on_disk

    def drop_session(self, session_id: str) -> int:
        """Remove every block of ``session_id`` from both tiers; return how many."""
        validate_session_id(session_id)
        count = len(self.ram.drop_session(session_id))
        if self.disk is not None:
            count += len(self.disk.drop_session(session_id))
        return count

    # ---- numbers -----------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        return StoreStats(
            ram_bytes=self.ram.used_bytes,
            ram_blocks=len(self.ram),
            ram_budget_bytes=self.ram.budget_bytes,
            disk_bytes=0 if self.disk is None else self.disk.used_bytes,
            disk_blocks=0 if self.disk is None else len(self.disk),
            disk_budget_bytes=0 if self.disk is None else self.disk.budget_bytes,
            **asdict(self._counters),
        )
