"""Atomic file writes: temp + fsync + rename, directory fsync now or deferred, typed failures."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from kvres.coldstore import DiskFullError, DiskWriteError, fileio
from kvres.coldstore.fileio import AtomicFileWriter, pwrite_all, start_writeback


def _fill(data: bytes):  # type: ignore[no-untyped-def]
    return lambda fd: pwrite_all(fd, (memoryview(data),), 0)


@pytest.fixture()
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp, tmp_path / "out"


@pytest.mark.parametrize("defer", [True, False])
def test_write_is_visible_whole_with_mode_0600(dirs: tuple[Path, Path], defer: bool) -> None:
    tmp, out = dirs
    writer = AtomicFileWriter(tmp, defer_dir_sync=defer)
    dest = out / "a.bin"
    writer.write(dest, _fill(b"hello"), 5)
    assert dest.read_bytes() == b"hello" and stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o700 and list(tmp.iterdir()) == []
    writer.close()


def test_deferred_dir_sync_failure_fails_the_next_write_cleanly(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp, out = dirs
    writer = AtomicFileWriter(tmp, defer_dir_sync=True)
    synced: list[Path] = []
    real = fileio.fsync_dirs

    def failing(paths: tuple[Path, ...]) -> None:
        synced.extend(paths)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fileio, "fsync_dirs", failing)
    writer.write(out / "a.bin", _fill(b"a"), 1)  # its directory fsync fails in the background
    monkeypatch.setattr(fileio, "fsync_dirs", real)
    with pytest.raises(DiskWriteError, match="directory fsync of an earlier write failed") as info:
        writer.write(out / "b.bin", _fill(b"b"), 1)
    assert info.value.errno == errno.EIO and out in synced
    assert not (out / "b.bin").exists() and list(tmp.iterdir()) == []
    writer.write(out / "c.bin", _fill(b"c"), 1)  # later writes work again
    writer.flush()
    writer.close()


def test_flush_reports_a_failed_deferred_sync(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    tmp, out = dirs
    writer = AtomicFileWriter(tmp)

    def failing(paths: tuple[Path, ...]) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio, "fsync_dirs", failing)
    writer.write(out / "a.bin", _fill(b"a"), 1)
    with pytest.raises(DiskFullError):
        writer.flush()
    writer.close()


def test_immediate_dir_sync_failure_removes_the_file(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    tmp, out = dirs
    writer = AtomicFileWriter(tmp, defer_dir_sync=False)

    def failing(paths: tuple[Path, ...]) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fileio, "fsync_dirs", failing)
    with pytest.raises(DiskWriteError, match="syncing the directory"):
        writer.write(out / "a.bin", _fill(b"a"), 1)
    assert not (out / "a.bin").exists()


def test_failed_fill_leaves_nothing(dirs: tuple[Path, Path]) -> None:
    tmp, out = dirs
    writer = AtomicFileWriter(tmp)

    def fill(fd: int) -> None:
        os.write(fd, b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError, match="nothing was stored"):
        writer.write(out / "a.bin", fill, 100)
    assert not (out / "a.bin").exists() and list(tmp.iterdir()) == []


def test_start_writeback_is_harmless(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        pwrite_all(fd, (memoryview(b"x" * 10000),), 0)
        assert start_writeback(fd, 0, 10000) in (True, False)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"x" * 10000


def test_fsync_dirs_skips_directories_removed_meanwhile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(fileio.os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real_fsync(fd)))
    (tmp_path / "kept").mkdir()
    fileio.fsync_dirs((tmp_path, tmp_path / "gone", tmp_path / "kept"))
    assert synced == [tmp_path.stat().st_ino, (tmp_path / "kept").stat().st_ino]


def test_dropping_a_session_right_after_a_write_is_fine(tmp_path: Path) -> None:
    from kvres.coldstore import DiskTier

    from .helpers import make_block

    with DiskTier(tmp_path, 1 << 20) as disk:
        for i in range(20):
            disk.put(make_block(b"x", session_id=f"s{i}"))
            disk.drop_session(f"s{i}")
        disk.flush()
        assert len(disk) == 0
