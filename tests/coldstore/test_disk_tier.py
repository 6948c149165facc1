"""Disk tier: atomic 0600 files, index rebuilt at start-up, budgets, damage and a full disk."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from kvres.coldstore import (
    BlockChecksumError,
    BlockCorruptError,
    BlockFingerprintError,
    BlockKey,
    BlockTooLargeError,
    DiskFullError,
    DiskTier,
    DiskWriteError,
    Evicted,
    StoreLockedError,
    encoded_size,
)
from kvres.policy.ranges import Range

from .helpers import OTHER_FINGERPRINT, make_block, payload_of

KIB = 1024


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_round_trip_and_file_modes(tmp_path: Path) -> None:
    root = tmp_path / "store"
    payload = payload_of(100 * KIB, seed=1)
    block = make_block(payload)
    with DiskTier(root, 1 << 20) as disk:
        assert disk.put(block) == []
        key = BlockKey.of(block)
        got = disk.get(key)
        assert got is not None and bytes(got.payload) == payload and got.meta == block.meta
        path = disk.file_path(key)
        assert path.is_file() and path.is_relative_to(root / "blocks")
        assert _mode(path) == 0o600
        assert _mode(root) == 0o700 and _mode(path.parent) == 0o700
        assert disk.used_bytes == path.stat().st_size == encoded_size(block)
        assert list((root / "tmp").iterdir()) == []


DISK_SIZES = [0, 1, (1 << 20) - 1, 1 << 20, (3 << 20) + 5, 64 << 20]  # both write paths


@pytest.mark.parametrize("size", DISK_SIZES, ids=[f"{s}B" for s in DISK_SIZES])
def test_round_trips_are_bit_exact_across_restart(tmp_path: Path, size: int) -> None:
    payload = payload_of(size, seed=size)
    block = make_block(payload)
    with DiskTier(tmp_path, 128 << 20) as disk:
        disk.put(block)
    with DiskTier(tmp_path, 128 << 20) as disk:
        got = disk.get(BlockKey.of(block))
        assert got is not None and got.payload_nbytes == size and got.payload == payload
        assert disk.used_bytes == encoded_size(block)


def test_files_are_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        with DiskTier(tmp_path / "s", 1 << 20) as disk:
            block = make_block(b"abc")
            disk.put(block)
            assert _mode(disk.file_path(BlockKey.of(block))) == 0o600
            assert _mode(tmp_path / "s" / ".lock") == 0o600
    finally:
        os.umask(old)


def test_index_is_rebuilt_after_restart_in_lru_order(tmp_path: Path) -> None:
    blocks = [make_block(payload_of(KIB, seed=i), start=4 * i, session_id=f"s{i % 2}") for i in range(6)]
    size = encoded_size(blocks[0])
    with DiskTier(tmp_path, 10 * size) as disk:
        for b in blocks:
            disk.put(b)
            os.utime(disk.file_path(BlockKey.of(b)), ns=(0, 10**9 * (1 + b.token_range.start)))
        used = disk.used_bytes
    with DiskTier(tmp_path, 10 * size) as disk:
        assert sorted(disk.keys()) == sorted(BlockKey.of(b) for b in blocks)
        assert disk.keys() == [BlockKey.of(b) for b in blocks]  # oldest mtime first
        assert disk.used_bytes == used
        assert disk.keys_for_session("s1") == [BlockKey.of(b) for b in blocks[1::2]]
        for b in blocks:
            got = disk.get(BlockKey.of(b))
            assert got is not None and got.payload == b.payload
            os.utime(disk.file_path(BlockKey.of(b)), ns=(0, 10**9 * (1 + b.token_range.start)))
    # A smaller budget at start-up drops the least recently used files.
    with DiskTier(tmp_path, 3 * size) as disk:
        assert disk.startup_dropped == [BlockKey.of(b) for b in blocks[:3]]
        assert disk.keys() == [BlockKey.of(b) for b in blocks[3:]]
        assert disk.used_bytes <= 3 * size


def test_startup_removes_partial_and_damaged_files(tmp_path: Path) -> None:
    good = make_block(payload_of(4 * KIB), start=0)
    bad = make_block(payload_of(4 * KIB), start=4)
    with DiskTier(tmp_path, 1 << 20) as disk:
        disk.put(good)
        disk.put(bad)
        bad_path = disk.file_path(BlockKey.of(bad))
    (tmp_path / "tmp" / "deadbeef.part").write_bytes(b"half a block")
    with open(bad_path, "r+b") as f:
        f.truncate(bad_path.stat().st_size - 10)
    stray = tmp_path / "blocks" / "sess-1" / "notes.txt"
    stray.write_text("not ours")
    with DiskTier(tmp_path, 1 << 20) as disk:
        assert disk.keys() == [BlockKey.of(good)]
        assert len(disk.startup_discarded) == 1 and str(bad_path) in disk.startup_discarded[0]
        assert not bad_path.exists() and list((tmp_path / "tmp").iterdir()) == []
        assert stray.exists()  # files that are not blocks are never touched


def test_damaged_file_is_a_typed_error_and_is_removed(tmp_path: Path) -> None:
    block = make_block(payload_of(8 * KIB))
    key = BlockKey.of(block)
    with DiskTier(tmp_path, 1 << 20) as disk:
        disk.put(block)
        path = disk.file_path(key)
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(BlockChecksumError, match=str(path)):
            disk.get(key)
        assert key not in disk and not path.exists() and disk.used_bytes == 0
        assert disk.get(key) is None


def test_file_holding_another_key_is_refused(tmp_path: Path) -> None:
    block = make_block(b"payload", start=0)
    with DiskTier(tmp_path, 1 << 20) as disk:
        disk.put(block)
        impostor = BlockKey("sess-1", Range(0, 4), OTHER_FINGERPRINT)
        os.rename(disk.file_path(BlockKey.of(block)), disk.file_path(impostor))
    with DiskTier(tmp_path, 1 << 20) as disk:
        assert disk.keys() == [] and "fingerprint" in disk.startup_discarded[0]
        moved = BlockKey("sess-1", Range(4, 8), block.fingerprint)
        disk.put(block)
        os.rename(disk.file_path(BlockKey.of(block)), disk.file_path(moved))
        disk._index[moved] = disk._index.pop(BlockKey.of(block))  # simulate a stale index
        with pytest.raises(BlockCorruptError, match="holds session"):
            disk.get(moved)
        swapped = BlockKey("sess-1", Range(0, 4), OTHER_FINGERPRINT)
        disk.put(block)
        os.rename(disk.file_path(BlockKey.of(block)), disk.file_path(swapped))
        disk._index[swapped] = disk._index.pop(BlockKey.of(block))
        with pytest.raises(BlockFingerprintError):
            disk.get(swapped)


def test_budget_drops_coldest_and_reports_them(tmp_path: Path) -> None:
    blocks = [make_block(payload_of(KIB, seed=i), start=4 * i) for i in range(5)]
    size = encoded_size(blocks[0])
    with DiskTier(tmp_path, 3 * size) as disk:
        for b in blocks[:3]:
            assert disk.put(b) == []
        assert disk.get(BlockKey.of(blocks[0])) is not None  # now most recent
        assert disk.put(blocks[3]) == [Evicted(BlockKey.of(blocks[1]), None)]
        assert disk.put(blocks[4]) == [Evicted(BlockKey.of(blocks[2]), None)]
        assert disk.used_bytes == 3 * size
        assert not disk.file_path(BlockKey.of(blocks[1])).exists()
        with pytest.raises(BlockTooLargeError, match=f"budget is {3 * size}"):
            disk.put(make_block(payload_of(4 * KIB), start=40))
        # Replacing a key re-bills it instead of counting it twice.
        disk.put(blocks[4])
        assert disk.used_bytes == 3 * size and len(disk) == 3


def test_drop_session_and_delete(tmp_path: Path) -> None:
    with DiskTier(tmp_path, 1 << 20) as disk:
        for i in range(3):
            disk.put(make_block(b"a", start=4 * i, session_id="gone"))
        keep = make_block(b"b", session_id="kept")
        disk.put(keep)
        assert len(disk.drop_session("gone")) == 3
        assert not (tmp_path / "blocks" / "gone").exists()
        assert disk.keys() == [BlockKey.of(keep)]
        assert disk.delete(BlockKey.of(keep)) and not disk.delete(BlockKey.of(keep))
        assert disk.used_bytes == 0


def test_one_process_per_directory(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path, 1 << 20)
    with pytest.raises(StoreLockedError, match=str(tmp_path)):
        DiskTier(tmp_path, 1 << 20)
    disk.close()
    DiskTier(tmp_path, 1 << 20).close()


# ---- a full disk -----------------------------------------------------------------------------


def _fail_with(code: int):  # type: ignore[no-untyped-def]
    def fake(fd: int, buffers: object, offset: int) -> int:
        raise OSError(code, os.strerror(code))

    return fake


@pytest.mark.parametrize("size", [64 * KIB, 2 << 20])  # inline and threaded checksum paths
@pytest.mark.parametrize("call", ["pwritev", "fsync"])
def test_enospc_is_a_clean_disk_full_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, size: int
) -> None:
    with DiskTier(tmp_path, 16 << 20) as disk:
        first = make_block(b"first", start=0)
        disk.put(first)
        before = (disk.keys(), disk.used_bytes)
        real_fsync = os.fsync

        def fake_fsync(fd: int) -> None:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fsync(fd)

        if call == "pwritev":
            monkeypatch.setattr(os, "pwritev", _fail_with(errno.ENOSPC))
        else:
            monkeypatch.setattr(os, "fsync", fake_fsync)
        second = make_block(payload_of(size), start=4)
        with pytest.raises(DiskFullError, match="No space left") as info:
            disk.put(second)
        assert info.value.errno == errno.ENOSPC and isinstance(info.value, DiskWriteError)
        assert (disk.keys(), disk.used_bytes) == before
        assert not disk.file_path(BlockKey.of(second)).exists()
        assert list((tmp_path / "tmp").iterdir()) == []
        monkeypatch.undo()
        disk.put(second)  # space is back: the tier works again
        got = disk.get(BlockKey.of(second))
        assert got is not None and got.payload == second.payload


def test_other_write_errors_are_disk_write_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with DiskTier(tmp_path, 16 << 20) as disk:
        monkeypatch.setattr(os, "pwritev", _fail_with(errno.EIO))
        with pytest.raises(DiskWriteError) as info:
            disk.put(make_block(b"x"))
        assert not isinstance(info.value, DiskFullError) and info.value.errno == errno.EIO


@pytest.mark.parametrize("size", [50 * KIB, 3 << 20])
def test_short_writes_are_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    real_pwritev = os.pwritev

    def dribble(fd: int, buffers: list[memoryview], offset: int) -> int:
        return real_pwritev(fd, [memoryview(buffers[0])[:100_000]], offset)

    monkeypatch.setattr(os, "pwritev", dribble)
    payload = payload_of(size)
    with DiskTier(tmp_path, 16 << 20) as disk:
        disk.put(make_block(payload))
        monkeypatch.undo()
        got = disk.get(BlockKey.of(make_block(payload)))
        assert got is not None and got.payload == payload
