"""Tiered store: rolling spill, promotion, reported drops, a full disk that leaves RAM working."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from kvres.coldstore import (
    BlockCorruptError,
    BlockFingerprintError,
    BlockKey,
    BlockTooLargeError,
    RamTier,
    TieredStore,
    encoded_size,
    ram_cost,
)
from kvres.policy.ranges import Range

from .helpers import OTHER_FINGERPRINT, make_block, payload_of

KIB = 1024


def _blocks(n: int, size: int = KIB, session_id: str = "sess-1") -> list:  # type: ignore[type-arg]
    return [make_block(payload_of(size, seed=i), start=4 * i, session_id=session_id) for i in range(n)]


def _store(tmp_path: Path, ram_blocks: int, disk_blocks: int, **kwargs: bool) -> TieredStore:
    probe = make_block(bytes(KIB))
    return TieredStore.open(
        ram_blocks * ram_cost(probe), tmp_path, disk_blocks * encoded_size(probe), fsync=False, **kwargs
    )


def _enospc(fd: int, buffers: object, offset: int) -> int:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_rolling_spill_then_reported_drops(tmp_path: Path) -> None:
    store = _store(tmp_path, ram_blocks=2, disk_blocks=2)
    blocks = _blocks(6)
    keys = [BlockKey.of(b) for b in blocks]
    assert store.put(blocks[0]).tier == "ram"
    store.put(blocks[1])
    result = store.put(blocks[2])
    assert result.spilled == (keys[0],) and result.dropped == ()
    assert store.tier_of(keys[0]) == "disk" and store.tier_of(keys[2]) == "ram"
    store.put(blocks[3])
    result = store.put(blocks[4])  # RAM spills 2; disk (holding 0, 1) drops 0
    assert result.spilled == (keys[2],) and result.dropped == (keys[0],)
    assert store.get(keys[0]) is None
    assert store.drain_dropped() == [keys[0]] and store.drain_dropped() == []
    stats = store.stats()
    assert (stats.ram_blocks, stats.disk_blocks, stats.spills, stats.drops, stats.misses) == (2, 2, 3, 1, 1)
    assert stats.ram_bytes <= stats.ram_budget_bytes and stats.disk_bytes <= stats.disk_budget_bytes
    store.close()


def test_disk_hits_and_promotion(tmp_path: Path) -> None:
    store = _store(tmp_path, ram_blocks=2, disk_blocks=4)
    blocks = _blocks(3)
    for b in blocks:
        store.put(b)
    cold = BlockKey.of(blocks[0])
    got = store.get(cold)
    assert got is not None and got.payload == blocks[0].payload and store.tier_of(cold) == "disk"
    got = store.get(cold, promote=True)
    assert got is not None and store.tier_of(cold) == "ram"
    assert store.tier_of(BlockKey.of(blocks[1])) == "disk"  # made room by spilling
    s = store.stats()
    assert (s.hits_disk, s.hits_ram, s.promotions) == (2, 0, 1)
    assert store.get(cold) is not None and store.stats().hits_ram == 1
    store.close()


def test_promote_on_get_is_configurable(tmp_path: Path) -> None:
    store = _store(tmp_path, ram_blocks=1, disk_blocks=4, promote_on_get=True)
    a, b = _blocks(2)
    store.put(a)
    store.put(b)
    assert store.tier_of(BlockKey.of(a)) == "disk"
    store.get(BlockKey.of(a))
    assert store.tier_of(BlockKey.of(a)) == "ram" and store.tier_of(BlockKey.of(b)) == "disk"
    store.close()


def test_a_newer_put_replaces_the_disk_copy(tmp_path: Path) -> None:
    store = _store(tmp_path, ram_blocks=1, disk_blocks=4)
    a, b = _blocks(2)
    store.put(a)
    store.put(b)
    newer = make_block(payload_of(KIB, seed=99), start=0)
    store.put(newer)
    assert store.tier_of(BlockKey.of(a)) == "ram"
    assert store.stats().disk_blocks == 1  # b was spilled; a's old copy is gone
    got = store.get(BlockKey.of(a))
    assert got is not None and got.payload == newer.payload
    store.close()


def test_big_blocks_go_straight_to_disk_and_too_big_ones_are_refused(tmp_path: Path) -> None:
    store = _store(tmp_path, ram_blocks=2, disk_blocks=8)
    big = make_block(payload_of(4 * KIB), start=0)
    result = store.put(big)
    assert result.tier == "disk" and store.tier_of(BlockKey.of(big)) == "disk"
    huge = make_block(payload_of(64 * KIB), start=8)
    with pytest.raises(BlockTooLargeError, match="fits neither tier.*RAM.*disk tier budget"):
        store.put(huge)
    no_disk = TieredStore(RamTier(1000))
    with pytest.raises(BlockTooLargeError, match="no disk tier"):
        no_disk.put(huge)
    store.close()


def test_without_disk_evicted_blocks_are_dropped() -> None:
    probe = make_block(bytes(KIB))
    store = TieredStore(RamTier(2 * ram_cost(probe)))
    blocks = _blocks(3)
    for b in blocks[:2]:
        store.put(b)
    assert store.put(blocks[2]).dropped == (BlockKey.of(blocks[0]),)
    assert store.stats().drops == 1 and store.stats().disk_budget_bytes == 0


def test_full_disk_during_spill_leaves_ram_working(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path, ram_blocks=2, disk_blocks=4)
    blocks = _blocks(4)
    store.put(blocks[0])
    store.put(blocks[1])
    monkeypatch.setattr(os, "pwritev", _enospc)
    result = store.put(blocks[2])  # spilling blocks[0] fails
    assert result.tier == "ram" and result.spilled == ()
    assert result.dropped == (BlockKey.of(blocks[0]),)
    assert len(result.errors) == 1 and "No space left" in result.errors[0]
    got = store.get(BlockKey.of(blocks[2]))
    assert got is not None and got.payload == blocks[2].payload
    assert store.stats().spill_errors == 1 and store.stats().disk_blocks == 0
    # A block that can only go to disk is not kept, says so, and changes nothing else.
    before = store.stats()
    lost = make_block(payload_of(4 * KIB), start=100)
    result = store.put(lost)
    assert result.dropped == (BlockKey.of(lost),) and "No space left" in result.errors[0]
    assert store.get(BlockKey.of(lost)) is None
    after = store.stats()
    assert (after.ram_blocks, after.ram_bytes, after.disk_blocks) == (
        before.ram_blocks, before.ram_bytes, before.disk_blocks)
    assert (after.drops, after.spill_errors) == (before.drops + 1, before.spill_errors + 1)
    monkeypatch.undo()
    assert store.put(blocks[3]).spilled == (BlockKey.of(blocks[1]),)  # the disk works again
    store.close()


def test_get_range_refuses_another_fingerprint(tmp_path: Path) -> None:
    store = _store(tmp_path, ram_blocks=2, disk_blocks=2)
    block = make_block(b"kv", fingerprint=OTHER_FINGERPRINT)
    store.put(block)
    with pytest.raises(BlockFingerprintError, match=OTHER_FINGERPRINT):
        store.get_range("sess-1", Range(0, 4), make_block(b"").fingerprint)
    got = store.get_range("sess-1", Range(0, 4), OTHER_FINGERPRINT)
    assert got is block
    assert store.get_range("sess-1", Range(4, 8), OTHER_FINGERPRINT) is None
    store.close()


def test_corrupt_disk_block_is_typed_and_then_a_miss(tmp_path: Path) -> None:
    store = _store(tmp_path, ram_blocks=1, disk_blocks=4)
    a, b = _blocks(2)
    store.put(a)
    store.put(b)
    assert store.disk is not None
    path = store.disk.file_path(BlockKey.of(a))
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(BlockCorruptError):
        store.get(BlockKey.of(a))
    assert store.get(BlockKey.of(a)) is None
    assert (store.stats().corrupt, store.stats().misses) == (1, 1)
    store.close()


def test_drop_session_and_list_session_span_both_tiers(tmp_path: Path) -> None:
    store = _store(tmp_path, ram_blocks=2, disk_blocks=8)
    gone = _blocks(4, session_id="gone")
    kept = _blocks(1, session_id="kept")
    for b in [*gone, *kept]:
        store.put(b)
    assert store.list_session("gone") == sorted(BlockKey.of(b) for b in gone)
    assert store.drop_session("gone") == 4
    assert store.list_session("gone") == [] and store.list_session("kept") == [BlockKey.of(kept[0])]
    assert store.delete(BlockKey.of(kept[0])) and not store.delete(BlockKey.of(kept[0]))
    store.close()


def test_disk_blocks_survive_a_restart(tmp_path: Path) -> None:
    store = _store(tmp_path, ram_blocks=1, disk_blocks=4)
    blocks = _blocks(3)
    for b in blocks:
        store.put(b)
    store.close()
    again = _store(tmp_path, ram_blocks=1, disk_blocks=4)
    assert again.stats().disk_blocks == 2 and again.stats().ram_blocks == 0  # RAM is volatile
    for b in blocks[:2]:
        got = again.get(BlockKey.of(b))
        assert got is not None and got.payload == b.payload
    again.close()
