"""kvres.coldstore: where evicted and suspended KV blocks live (no Ray inside).

Primitives:
- ``KVBlock``, ``KVGeometry``, ``make_fingerprint`` (block.py).
- ``encode_block`` / ``decode_block`` (codec.py): magic + msgpack header + raw payload, checksummed
  and authenticated with an HMAC-SHA256 tag under the store's secret (``new_secret``, auth.py).
- ``BlockKey`` and ``validate_session_id`` (keys.py): (session id, token range, fingerprint).
- ``ColdStore`` with ``PutResult`` and ``Tier`` (interface.py): the one cold-store interface, with
  batched calls.
- ``BlockTier`` and ``Evicted`` (tier.py): the one tier interface, with the bookkeeping the tiers
  share; ``RamTier`` (ram_tier.py, its private copies in payload_pool.py's reused buffers),
  ``DiskTier`` (disk_tier.py, atomic writes from fileio.py, its folder checked by ``private_dir``
  from safe_dir.py); ``TieredStore`` and ``StoreStats`` (tiered.py).
- The ``ColdStoreError`` family (errors.py).
"""

from .auth import new_secret
from .block import KVBlock, KVGeometry, make_fingerprint
from .codec import FORMAT_VERSION, decode_block, encode_block, encoded_size
from .disk_tier import DiskTier
from .errors import (
    BlockAuthError,
    BlockChecksumError,
    BlockCorruptError,
    BlockEncodeError,
    BlockFingerprintError,
    BlockLengthError,
    BlockTooLargeError,
    BlockVersionError,
    ColdStoreError,
    DiskFullError,
    DiskReadError,
    DiskWriteError,
    InvalidKeyError,
    InvalidSecretError,
    InvalidSessionIdError,
    StoreLockedError,
    UnsafeStoreDirError,
)
from .interface import ColdStore, PutResult, Tier
from .keys import MAX_SESSION_ID_LEN, BlockKey, validate_fingerprint, validate_session_id
from .ram_tier import RamTier, ram_cost
from .safe_dir import private_dir
from .tier import BlockTier, Evicted
from .tiered import StoreStats, TieredStore

__all__ = [
    "FORMAT_VERSION",
    "MAX_SESSION_ID_LEN",
    "BlockAuthError",
    "BlockChecksumError",
    "BlockCorruptError",
    "BlockEncodeError",
    "BlockFingerprintError",
    "BlockKey",
    "BlockLengthError",
    "BlockTier",
    "BlockTooLargeError",
    "BlockVersionError",
    "ColdStore",
    "ColdStoreError",
    "DiskFullError",
    "DiskReadError",
    "DiskTier",
    "DiskWriteError",
    "Evicted",
    "InvalidKeyError",
    "InvalidSecretError",
    "InvalidSessionIdError",
    "KVBlock",
    "KVGeometry",
    "PutResult",
    "RamTier",
    "StoreLockedError",
    "StoreStats",
    "Tier",
    "TieredStore",
    "UnsafeStoreDirError",
    "decode_block",
    "encode_block",
    "encoded_size",
    "make_fingerprint",
    "new_secret",
    "private_dir",
    "ram_cost",
    "validate_fingerprint",
    "validate_session_id",
]
