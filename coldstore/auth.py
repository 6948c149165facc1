"""Block authentication: HMAC-SHA256 tags under a per-cluster secret.

Primitives:
- ``SECRET_BYTES`` (32, what ``new_secret`` makes), ``MIN_SECRET_BYTES`` (16), ``TAG_BYTES`` (32).
- ``new_secret() -> bytes``: a fresh random secret (``secrets.token_bytes``).
- ``check_secret(secret) -> bytes | None``: ``None`` (no secret), or ``bytes`` of at least
  ``MIN_SECRET_BYTES``; anything else is an ``InvalidSecretError`` (whose message gives the type
  and length, never the value).
- ``block_tag(secret, *parts) -> bytes``: HMAC-SHA256 of the parts, back to back, keyed with
  ``secret`` (``UNKEYED`` when it is None).
- ``tags_equal(a, b) -> bool``: constant-time comparison.

``UNKEYED`` (the empty key) is what a store without a secret uses: its tags then detect damage but
authenticate nothing, since anyone can compute them. The cluster always hands its cold stores a
secret; standalone stores and tests may go without one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

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


def block_tag(secret: bytes | None, *parts: bytes | bytearray | memoryview) -> bytes:
    mac = hmac.new(UNKEYED if secret is None else secret, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()


def tags_equal(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)
