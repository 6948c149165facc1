"""Durable, atomic file writes for the disk tier.

Primitives:
- ``pwrite_all(fd, parts, offset)``: ``os.pwritev`` until every byte of ``parts`` is written
  (resumes short writes; never concatenates the parts).
- ``start_writeback(fd, offset, nbytes) -> bool``: ask the kernel to start writing those dirty
  pages to the device now (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; a no-op returning
  False elsewhere), so the device works while the caller computes something else.
- ``fsync_dirs(dirs)``: fsync each directory (makes renames / creations in it durable).
- ``AtomicFileWriter(tmp_dir, fsync=True, defer_dir_sync=True)``: ``write(dest, fill, size)``,
  ``flush()``, ``close()``.

``write`` creates a temp file (0600, ``O_EXCL``) in ``tmp_dir``, lets ``fill(fd)`` write it,
fsyncs it, and renames it to ``dest``: a reader (or a process restarted after a SIGKILL) sees the
whole file or nothing. On any OS error the temp file is removed and a ``DiskFullError``
(ENOSPC / EDQUOT) or ``DiskWriteError`` is raised; nothing new is visible at ``dest``.

The directory fsync that makes the rename itself survive a power loss runs right after the rename
when ``defer_dir_sync`` is False. When True (the default) it runs in a helper thread, overlapping
the next write, and every ``write`` waits for the previous one before its own rename (a failure
there fails that write, which then commits nothing); ``flush()`` / ``close()`` wait for the last
one. So a power loss can lose at most the most recent rename (the block is then simply absent),
never expose a partial file; a process crash loses nothing that ``write`` returned.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .errors import DiskFullError, DiskWriteError

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


_sync_file_range = _load_sync_file_range()


def pwrite_all(fd: int, parts: Sequence[memoryview], offset: int) -> None:
    """Write ``parts`` back to back from ``offset``; resumes after short writes."""
    views = [v for v in parts if v.nbytes]
    while views:
        written = os.pwritev(fd, views, offset)
        if written <= 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        offset += written
        while written and views:
            first = views[0]
            if written >= first.nbytes:
                written -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[written:]
                written = 0


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Start asynchronous writeback of ``[offset, offset + nbytes)``; False if not supported."""
    if _sync_file_range is None:
        return False
    return _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) == 0


def fsync_dirs(dirs: Iterable[Path]) -> None:
    """fsync each directory; one removed meanwhile (e.g. a dropped session's) needs none."""
    for directory in dirs:
        try:
            fd = os.open(directory, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def disk_error(exc: OSError, message: str, path: Path) -> DiskWriteError:
    """The typed error for an OS error while writing ``path``."""
    cls = DiskFullError if exc.errno in FULL_ERRNOS else DiskWriteError
    return cls(
        f"{message}: {exc.strerror or exc} (errno {exc.errno})",
        errno=exc.errno,
        path=str(path),
    )


class AtomicFileWriter:
    """Atomic, durable file creation with temp files in ``tmp_dir``; see the module docstring."""

    def __init__(self, tmp_dir: Path, *, fsync: bool = True, defer_dir_sync: bool = True) -> None:
        self.tmp_dir = tmp_dir
        self.fsync = fsync
        self.defer_dir_sync = defer_dir_sync
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    def write(self, dest: Path, fill: Callable[[int], None], size: int) -> None:
        """Create ``dest`` holding what ``fill(fd)`` writes (``size`` bytes, for messages)."""
        tmp = self.tmp_dir / f"{uuid.uuid4().hex}.part"
        new_dir = False
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
            try:
                fill(fd)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            self._wait_pending()
            if not dest.parent.is_dir():
                dest.parent.mkdir(mode=0o700, exist_ok=True)
                new_dir = True
            os.rename(tmp, dest)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise disk_error(exc, f"writing {size} bytes to {dest} failed, nothing was stored", dest) from exc
        if not self.fsync:
            return
        dirs = (dest.parent, dest.parent.parent) if new_dir else (dest.parent,)
        if self.defer_dir_sync:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvres-dirsync")
            self._pending = self._pool.submit(fsync_dirs, dirs)
            return
        try:
            fsync_dirs(dirs)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(dest)
            raise disk_error(exc, f"syncing the directory of {dest} failed, nothing was stored", dest) from exc

    def _wait_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except OSError as exc:
            raise OSError(
                exc.errno, f"the directory fsync of an earlier write failed: {exc.strerror or exc}"
            ) from exc

    def flush(self) -> None:
        """Wait until every rename so far is durable; DiskWriteError if one could not be made so."""
        try:
            self._wait_pending()
        except OSError as exc:
            raise disk_error(exc, "flushing the disk tier failed", self.tmp_dir) from exc

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
