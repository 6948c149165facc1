"""Disk tier: one encoded block per file, atomic writes, an LRU index rebuilt from the files.

Primitives:
- ``DiskTier(path, budget_bytes, fsync=True, defer_dir_sync=True, secret=None)``: a ``BlockTier``
  (tier.py); ``put(block, priority=0) -> list[Evicted]`` (blocks dropped to make room, coldest
  first, each with no block: its file is gone; ``priority`` is not used, the disk drops by recency
  only), ``get(key)``, ``pop(key)``, ``delete(key)``, ``cost(block)`` (the file's bytes),
  ``drop_session(session_id)``, ``flush()``, ``close()``, ``destroy()`` (delete every block and the
  folder), ``file_path(key)``, and the shared bookkeeping (``keys()``,
  ``keys_for_session(session_id)``, ``session_ids()``, ``used_bytes``, ``budget_bytes``, ...);
  ``startup_dropped`` / ``startup_discarded`` tell what start-up removed (over budget / damaged).

Layout under ``path`` (created 0700 and checked by ``safe_dir.private_dir``: a symlink, another
user's folder, one open to group or others, or one inside a folder others can change is refused
with ``UnsafeStoreDirError``)::

    .lock                                  flock: one process per directory (StoreLockedError)
    tmp/<random>.part                      writes in progress; removed at start-up
    blocks/<session_id>/<start>-<end>.<fingerprint>.kvb

Every file is an encoded block (``codec.py``) whose tag is keyed with ``secret``: a file altered
or forged by someone without the secret is refused at read (``BlockAuthError``, deleted like a
damaged one). A put writes a temp file (0600) through ``fileio.AtomicFileWriter`` (fsync, rename, directory
fsync; see there for the deferred directory fsync). Header and payload are written with
``pwritev`` and never concatenated: small payloads go in one ``pwritev`` after their checksum;
payloads of 1 MiB and more are written first, their writeback started, and their checksum and tag
computed while the device works (the checksum in a helper thread beside the tag), then the header
is written before the fsync. A process killed at any
point leaves either the whole block or none of it.

At start-up the index is rebuilt from the file names (least recently written first), checking
each file's header and size (the tag needs the payload: it is checked when the block is read);
damaged files are deleted (``startup_discarded``), and if the files
exceed the budget the oldest are dropped (``startup_dropped``). Reads verify the payload checksum
and return the payload as a writable ``memoryview`` owned by the caller; a damaged file is deleted
and its ``BlockCorruptError`` raised, so the caller recomputes from the token log.

A full disk (ENOSPC / EDQUOT) raises ``DiskFullError`` and leaves the tier as it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import zlib
from collections import OrderedDict
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from kvres.policy.ranges import Range

from .auth import check_secret, payload_mac
from .block import KVBlock
from .codec import (
    PREFIX_SIZE,
    block_from_parts,
    decode_head,
    encode_head,
    encoded_size,
    head_length,
    head_size,
    payload_view,
)
from .errors import (
    BlockCorruptError,
    BlockFingerprintError,
    BlockLengthError,
    BlockTooLargeError,
    ColdStoreError,
    DiskReadError,
    DiskWriteError,
    StoreLockedError,
)
from .fileio import AtomicFileWriter, pwrite_all, start_writeback
from .keys import BlockKey, validate_session_id
from .safe_dir import private_dir
from .tier import BlockTier, Evicted

_FILE_RE = re.compile(r"(\d+)-(\d+)\.([A-Za-z0-9_-]+)\.kvb")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
OVERLAP_CHECKSUM_MIN_BYTES = 1 << 20


class DiskTier(BlockTier):
    """Encoded blocks in files under ``path``, within ``budget_bytes`` of file bytes."""

    def __init__(
        self, path: str | os.PathLike[str], budget_bytes: int, *, fsync: bool = True,
        defer_dir_sync: bool = True, secret: bytes | None = None,
    ) -> None:
        super().__init__(budget_bytes)
        self._secret = check_secret(secret)
        self.path = private_dir(path)
        self.fsync = fsync
        self._hasher: ThreadPoolExecutor | None = None  # checksums big payloads beside their tag
        self._lock_fd: int | None = os.open(
            self.path / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | _O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StoreLockedError(
                f"disk tier directory {self.path} is in use by another DiskTier ({exc.strerror})"
            ) from exc
        self._blocks_dir = self.path / "blocks"
        self._tmp_dir = self.path / "tmp"
        try:
            private_dir(self._blocks_dir)
            private_dir(self._tmp_dir)
        except BaseException:
            self._release_lock()
            raise
        self._writer = AtomicFileWriter(self._tmp_dir, fsync=fsync, defer_dir_sync=defer_dir_sync)
        self._index: OrderedDict[BlockKey, int] = OrderedDict()  # LRU order, value = file bytes
        self.startup_discarded: list[str] = []
        self._rebuild()

    # ---- bookkeeping -------------------------------------------------------------------------

    @property
    def _held(self) -> Collection[BlockKey]:
        return self._index

    def cost(self, block: KVBlock) -> int:
        """Bytes of the block's file (validates its header fields)."""
        return encoded_size(block)

    def file_path(self, key: BlockKey) -> Path:
        """Where ``key`` is (or would be) stored; every component is validated by BlockKey."""
        rng = key.token_range
        return self._blocks_dir / key.session_id / f"{rng.start}-{rng.end}.{key.fingerprint}.kvb"

    def flush(self) -> None:
        """Make every stored block durable (waits for a deferred directory fsync)."""
        self._writer.flush()

    def close(self) -> None:
        """Flush, then release the directory lock; the tier must not be used afterwards."""
        try:
            self._writer.close()
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        if self._hasher is not None:
            self._hasher.shutdown()
            self._hasher = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def destroy(self) -> int:
        """Delete every block, then the tier's own files and folders, and close the tier; return
        how many blocks were deleted. Files kvres did not make are left alone, and so is the folder
        that holds them."""
        self._check_open()
        count = len(self._index)
        for key in list(self._index):
            self._delete(key)
        for folder in (self._blocks_dir, self._tmp_dir):
            for entry in folder.iterdir():
                if folder is self._tmp_dir and entry.suffix == ".part":
                    entry.unlink(missing_ok=True)
                elif entry.is_dir() and not entry.is_symlink():
                    self._rmdir_if_empty(entry)
        self._writer.close()
        (self.path / ".lock").unlink(missing_ok=True)  # still held: nobody opens the folder meanwhile
        self._release_lock()
        for folder in (self._blocks_dir, self._tmp_dir, self.path):
            self._rmdir_if_empty(folder)
        return count

    def __enter__(self) -> DiskTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._lock_fd is None:
            raise ColdStoreError(f"disk tier {self.path} is closed")

    # ---- start-up ----------------------------------------------------------------------------

    def _rebuild(self) -> None:
        for leftover in self._tmp_dir.iterdir():
            leftover.unlink(missing_ok=True)
        found: list[tuple[int, BlockKey, int]] = []
        for session_dir in self._blocks_dir.iterdir():
            try:
                session_id = validate_session_id(session_dir.name)
            except ColdStoreError:
                continue  # not ours: never touch it
            if not session_dir.is_dir():
                continue
            for file in session_dir.iterdir():
                match = _FILE_RE.fullmatch(file.name)
                if match is None:
                    continue
                try:
                    key = BlockKey(
                        session_id, Range(int(match[1]), int(match[2])), match[3]
                    )
                    size = self._check_file(file, key)
                except (ColdStoreError, ValueError, OSError) as exc:
                    self.startup_discarded.append(f"{file}: {exc}")
                    file.unlink(missing_ok=True)
                    continue
                found.append((file.stat().st_mtime_ns, key, size))
            self._rmdir_if_empty(session_dir)
        for _, key, size in sorted(found, key=lambda item: (item[0], item[1])):
            self._index[key] = size
            self._used += size
        while self._used > self.budget_bytes:
            key, _ = next(iter(self._index.items()))
            self._delete(key)
            self.startup_dropped.append(key)

    def _check_file(self, file: Path, key: BlockKey) -> int:
        """Validate header and size of ``file`` against ``key``; return its size."""
        fd = os.open(file, os.O_RDONLY | _O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            header, offset = decode_head(self._read_head(fd, file))
        finally:
            os.close(fd)
        self._check_header_key(header.session_id, header.token_range, header.fingerprint, key)
        if size != offset + header.payload_len:
            raise BlockLengthError(
                f"{file} is {size} bytes, header + payload need {offset + header.payload_len}"
            )
        return size

    @staticmethod
    def _read_head(fd: int, file: Path) -> bytes:
        prefix = os.pread(fd, PREFIX_SIZE, 0)
        if len(prefix) < PREFIX_SIZE:
            raise BlockLengthError(f"{file} is truncated: {len(prefix)} bytes")
        need = head_length(prefix)
        head = os.pread(fd, need, 0)
        if len(head) < need:
            raise BlockLengthError(f"{file} is truncated: header needs {need} bytes, got {len(head)}")
        return head

    @staticmethod
    def _check_header_key(session_id: str, rng: Range, fingerprint: str, key: BlockKey) -> None:
        if session_id != key.session_id or rng != key.token_range:
            raise BlockCorruptError(
                f"file for {key} holds session {session_id!r} range {rng} instead"
            )
        if fingerprint != key.fingerprint:
            raise BlockFingerprintError(
                f"file for {key} holds a block with fingerprint {fingerprint!r}"
            )

    def _rmdir_if_empty(self, directory: Path) -> None:
        with contextlib.suppress(OSError):
            directory.rmdir()

    # ---- operations --------------------------------------------------------------------------

    def put(self, block: KVBlock, priority: int = 0) -> list[Evicted]:
        """Store ``block`` durably; return the blocks dropped (coldest first, keys only) to stay in
        budget. ``priority`` is accepted as every tier does and not used: the disk drops by recency.

        Raises ``BlockTooLargeError`` when the file would exceed the whole budget, and
        ``DiskFullError`` / ``DiskWriteError`` when the write fails (the tier is then unchanged).
        """
        self._check_open()
        key = BlockKey.of(block)
        head_len = head_size(block)  # validates; the length is final
        payload = payload_view(block.payload)
        size = head_len + payload.nbytes
        if size > self.budget_bytes:
            raise BlockTooLargeError(
                f"block {key} is {size} bytes on disk; the disk tier budget is {self.budget_bytes}"
            )
        room = self.budget_bytes - (self._used - self._index.get(key, 0))
        victims: list[BlockKey] = []
        for other, other_size in self._index.items():
            if room >= size:
                break
            if other != key:
                victims.append(other)
                room += other_size
        self._writer.write(self.file_path(key), self._block_filler(block, payload, head_len), size)
        self._used += size - self._index.pop(key, 0)
        self._index[key] = size
        for victim in victims:
            self._delete(victim)
        return [Evicted(victim, None) for victim in victims]

    def _block_filler(self, block: KVBlock, payload: memoryview, head_len: int) -> Callable[[int], None]:
        """A ``fill(fd)`` writing header and payload without concatenating them."""
        if payload.nbytes < OVERLAP_CHECKSUM_MIN_BYTES:
            head = memoryview(encode_head(block, zlib.crc32(payload), self._secret))
            return lambda fd: pwrite_all(fd, (head, payload), 0)

        def fill(fd: int) -> None:
            pwrite_all(fd, (payload,), head_len)
            if self.fsync:
                start_writeback(fd, head_len, payload.nbytes)  # the device works while we checksum
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvres-crc")
            crc = self._hasher.submit(zlib.crc32, payload)  # both release the GIL: two cores
            mac = payload_mac(self._secret, payload)
            head = encode_head(block, crc.result(), self._secret, payload_tag=mac)
            pwrite_all(fd, (memoryview(head),), 0)

        return fill

    def get(self, key: BlockKey) -> KVBlock | None:
        """The block under ``key`` (payload checksum verified), or None when absent.

        A damaged file is deleted and its ``BlockCorruptError`` raised.
        """
        self._check_open()
        if key not in self._index:
            return None
        path = self.file_path(key)
        try:
            block = self._read(path, key)
        except FileNotFoundError:
            self._forget(key)
            return None
        except BlockCorruptError as exc:
            self._delete(key)
            raise type(exc)(f"{path}: {exc}") from exc
        except BlockFingerprintError:
            self._delete(key)
            raise
        except OSError as exc:
            raise DiskReadError(f"reading {path} failed: {exc.strerror or exc} (errno {exc.errno})") from exc
        self._index.move_to_end(key)
        return block

    def pop(self, key: BlockKey) -> KVBlock | None:
        """Read and remove the block under ``key``, or None."""
        block = self.get(key)
        if block is not None:
            self._delete(key)
        return block

    def delete(self, key: BlockKey) -> bool:
        self._check_open()
        if key not in self._index:
            return False
        self._delete(key)
        return True

    def drop_session(self, session_id: str) -> list[BlockKey]:
        """Delete every block of ``session_id``; return their keys."""
        self._check_open()
        keys = super().drop_session(session_id)
        self._rmdir_if_empty(self._blocks_dir / session_id)
        return keys

    def _read(self, path: Path, key: BlockKey) -> KVBlock:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            header, offset = decode_head(self._read_head(fd, path))
            self._check_header_key(header.session_id, header.token_range, header.fingerprint, key)
            if size != offset + header.payload_len:
                raise BlockLengthError(
                    f"file is {size} bytes, header + payload need {offset + header.payload_len}"
                )
            view = np.empty(header.payload_len, dtype=np.uint8).data
            done = 0
            while done < header.payload_len:
                n = os.preadv(fd, [view[done:]], offset + done)
                if n <= 0:
                    raise BlockLengthError(
                        f"file ended after {offset + done} bytes, header + payload need "
                        f"{offset + header.payload_len}"
                    )
                done += n
        finally:
            os.close(fd)
        return block_from_parts(header, view, self._secret)

    def _forget(self, key: BlockKey) -> None:
        self._used -= self._index.pop(key)

    def _delete(self, key: BlockKey) -> None:
        self._forget(key)
        try:
            self.file_path(key).unlink(missing_ok=True)
        except OSError as exc:  # pragma: no cover - e.g. EIO; the index no longer bills it
            raise DiskWriteError(f"deleting {self.file_path(key)} failed: {exc}", errno=exc.errno) from exc
