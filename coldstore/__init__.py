"""kvres.coldstore: where evicted and suspended KV blocks live (no Ray inside).

Primitives: ``KVBlock``, ``KVGeometry``, ``make_fingerprint`` and the ``ColdStoreError`` family.
"""

from .block import KVBlock, KVGeometry, make_fingerprint
from .errors import BlockCorruptError, BlockFingerprintError, ColdStoreError

__all__ = [
    "BlockCorruptError",
    "BlockFingerprintError",
    "ColdStoreError",
    "KVBlock",
    "KVGeometry",
    "make_fingerprint",
]
