"""Block authentication: HMAC-SHA256 tags under a per-cluster secret.

Primitives:
- ``SECRET_BYTES`` (32, what ``new_secret`` makes), ``MIN_SECRET_BYTES`` (16), ``TAG_BYTES`` (32).
- ``new_secret() -> bytes``: a fresh random secret (``secrets.token_bytes``).
- ``check_secret(secret) -> bytes | None``: ``None`` (no secret), or ``bytes`` of at least
  ``MIN_SECRET_BYTES``; anything else is an ``InvalidSecretError`` (whose message gives the type
  and length, never the value).
- ``payload_mac(secret, payload)``: an HMAC-SHA256 keyed with ``secret`` (``UNKEYED`` when it is
  None) that has taken the payload's length (8 bytes, little endian) and the payload; a writer
  can start it while it computes the payload's checksum in another thread.
- ``finish_tag(mac, *parts) -> bytes``: the tag once the parts after the payload are known (the
  mac is copied, so it can be finished again).
- ``block_tag(secret, payload, *parts) -> bytes``: both at once. A block's tag is
  ``block_tag(secret, payload, prefix[:20], header)``: the payload's length first fixes where
  every part ends, so no two blocks share a tagged message.
- ``tags_equal(a, b) -> bool``: constant-time comparison.

``UNKEYED`` (the empty key) is what a store without a secret uses: its tags then detect damage but
authenticate nothing, since anyone can compute them. The cluster always hands its cold stores a
secret; standalone stores and tests may go without one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

from .errors import InvalidSecretError

SECRET_BYTES = 32
MIN_SECRET_BYTES = 16
TAG_BYTES = 32
UNKEYED = b""


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def check_secret(secret: object) -> bytes | None:
    if secret is None:
        return None
    if not isinstance(secret, (bytes, bytearray)):
        raise InvalidSecretError(
            f"a cold-store secret must be bytes, got {type(secret).__name__}"
        )
    if len(secret) < MIN_SECRET_BYTES:
        raise InvalidSecretError(
            f"a cold-store secret must have at least {MIN_SECRET_BYTES} bytes, got {len(secret)}"
        )
    return bytes(secret)


def payload_mac(secret: bytes | None, payload: bytes | bytearray | memoryview) -> hmac.HMAC:
    mac = hmac.new(UNKEYED if secret is None else secret, digestmod=hashlib.sha256)
    mac.update(struct.pack("<Q", memoryview(payload).nbytes))
    mac.update(payload)
    return mac


def finish_tag(mac: hmac.HMAC, *parts: bytes | bytearray | memoryview) -> bytes:
    mac = mac.copy()
    for part in parts:
        mac.update(part)
    return mac.digest()


def block_tag(
    secret: bytes | None, payload: bytes | bytearray | memoryview, *parts: bytes | bytearray | memoryview
) -> bytes:
    return finish_tag(payload_mac(secret, payload), *parts)


def tags_equal(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)
