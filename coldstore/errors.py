"""Cold-store errors; every one is a ``ColdStoreError``.

Primitives:
- ``ColdStoreError``: base (a ``kvres.policy.KvresError``).
- ``BlockCorruptError``: bad magic, version, length, checksum or header; refined by
  ``BlockVersionError``, ``BlockLengthError`` (truncated or trailing bytes),
  ``BlockChecksumError`` and ``BlockAuthError`` (the HMAC tag does not verify: altered, forged,
  or written under another secret).
- ``BlockFingerprintError``: the block belongs to another model, KV type or geometry.
- ``BlockEncodeError``: a block cannot be encoded (e.g. ``meta`` that msgpack cannot carry).
- ``InvalidSessionIdError`` / ``InvalidKeyError``: a session id or key that is unsafe as a path.
- ``BlockTooLargeError``: a block bigger than every tier budget that could hold it.
- ``DiskWriteError`` and its ``DiskFullError`` (ENOSPC / EDQUOT): a disk write failed; nothing
  was committed and the RAM tier is untouched.
- ``DiskReadError``: a stored file could not be read (I/O error, not damaged content).
- ``StoreLockedError``: another process holds the disk tier's directory.
- ``UnsafeStoreDirError``: a store folder that is a symlink, not this user's, open to group or
  others, or inside a folder others can change (``path`` and ``reason`` attributes).
- ``InvalidSecretError``: a block-authentication secret that is not bytes or too short.
"""

from __future__ import annotations

from kvres.policy.errors import BlockMismatchError, KvresError


class ColdStoreError(KvresError):
    """Base of every cold-store error."""


class BlockCorruptError(ColdStoreError, ValueError):
    """Encoded block bytes are damaged or not a kvres block."""


class BlockVersionError(BlockCorruptError):
    """The block was written in a format version this code does not read."""


class BlockLengthError(BlockCorruptError):
    """The encoded block is truncated or followed by trailing bytes."""


class BlockChecksumError(BlockCorruptError):
    """The header or payload checksum does not match the bytes."""


class BlockAuthError(BlockCorruptError):
    """The block's HMAC tag does not verify under the store's secret: its bytes were altered (with
    their checksums recomputed), forged, or written under another secret. Never imported."""


class BlockFingerprintError(ColdStoreError, BlockMismatchError):
    """A block's fingerprint does not match the one the caller needs."""


class BlockEncodeError(ColdStoreError, ValueError):
    """A block cannot be encoded (a header field msgpack cannot carry, or one out of bounds)."""


class InvalidSessionIdError(ColdStoreError, ValueError):
    """A session id that is empty, too long, or not safe as a single path component."""


class InvalidKeyError(ColdStoreError, ValueError):
    """A block key field (fingerprint, range) that is not safe to store under."""


class BlockTooLargeError(ColdStoreError, ValueError):
    """A block larger than the budget of every tier that could hold it."""


class DiskWriteError(ColdStoreError):
    """Writing a block to disk failed; nothing was committed.

    ``errno`` is the OS error number (or None), ``path`` the file that was being written.
    """

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        # Keep errno and path across pickling (Ray ships errors between processes).
        return (type(self), (str(self),), {"errno": self.errno, "path": self.path})


class DiskFullError(DiskWriteError):
    """The disk (or the user's quota) is full: ENOSPC or EDQUOT."""


class DiskReadError(ColdStoreError):
    """Reading a stored block failed at the OS level (EIO, permissions)."""


class StoreLockedError(ColdStoreError):
    """Another process already uses this disk-tier directory."""


class UnsafeStoreDirError(ColdStoreError, ValueError):
    """A cold-store folder kvres refuses to use; ``path`` and ``reason`` say which and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cold-store folder {path} refused: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.reason))


class InvalidSecretError(ColdStoreError, ValueError):
    """A block-authentication secret kvres cannot use (the message never shows the secret)."""
