"""A whole session in one file: its token log, policy, last logits and KV blocks, authenticated.

Primitives:
- ``SessionImage``: what a session file holds: ``session_id``, ``fingerprint`` and ``model_id`` of
  the backend that wrote it, ``token_log``, ``resident_ranges``, ``policy`` (a plain dict),
  ``last_logits`` (float32 bytes or None), ``exact``, ``resident`` (blocks of its resident
  ranges) and ``cold`` (blocks it had spilled).
- ``encode_session(image, secret=None) -> bytes`` / ``decode_session(data, secret=None) ->
  SessionImage``; ``peek_session(data) -> (session id, policy)`` (unauthenticated, for placement): the file's bytes. Blocks inside use the block codec (each with its own tag);
  the file as a whole carries an HMAC-SHA256 tag under the same secret, checked before anything is
  parsed, so a file written under another secret, altered or cut short is refused
  (``BlockAuthError``, ``BlockLengthError``, ``BlockVersionError``). Never pickle.

Layout (little endian)::

    offset 0   8 bytes  magic  b"KVRESSES"
           8   u16      format version (SESSION_FORMAT_VERSION, 1)
          10   u16      reserved, 0
          12   u64      length of the rest (header length + blocks)
          20   32 bytes tag: HMAC-SHA256 of bytes [0, 20) and everything after the tag
          52   u32      header length H
          56   H bytes  msgpack map: v, sid, fp, model_id, tokens, resident, policy, logits, exact,
                        lengths (one per block), n_resident
        56+H            the blocks, each ``encode_block``'s bytes, back to back
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

from kvres.policy.ranges import Range

from .auth import block_tag, check_secret, tags_equal
from .block import KVBlock
from .codec import decode_block, encode_block
from .errors import BlockAuthError, BlockLengthError, BlockVersionError

MAGIC = b"KVRESSES"
SESSION_FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sHHQ")  # magic, version, reserved, length of the rest
_TAG = 32
_HEADER_LEN = struct.Struct("<I")


@dataclass
class SessionImage:
    session_id: str
    fingerprint: str
    model_id: str
    token_log: list[int]
    resident_ranges: list[Range]
    policy: dict[str, Any]
    last_logits: bytes | None = None
    exact: bool = True
    resident: list[KVBlock] = field(default_factory=list)
    cold: list[KVBlock] = field(default_factory=list)


def encode_session(image: SessionImage, secret: bytes | None = None) -> bytes:
    secret = check_secret(secret)
    blocks = [encode_block(b, secret) for b in [*image.resident, *image.cold]]
    header = msgpack.packb({
        "v": SESSION_FORMAT_VERSION, "sid": image.session_id, "fp": image.fingerprint, "model_id": image.model_id,
        "tokens": [int(t) for t in image.token_log], "resident": [[r.start, r.end] for r in image.resident_ranges],
        "policy": image.policy, "logits": image.last_logits, "exact": bool(image.exact),
        "lengths": [len(b) for b in blocks], "n_resident": len(image.resident),
    }, use_bin_type=True)
    body = b"".join([_HEADER_LEN.pack(len(header)), header, *blocks])
    prefix = _PREFIX.pack(MAGIC, SESSION_FORMAT_VERSION, 0, len(body))
    return prefix + block_tag(secret, body, prefix) + body


def peek_session(data: bytes | bytearray | memoryview) -> tuple[str, dict[str, Any]]:
    """(session id, policy) as the file states them, for placing it before it is restored; not
    authenticated here (the backend that restores it checks the tag)."""
    view = memoryview(data)
    start = _PREFIX.size + _TAG
    if view.nbytes < start + _HEADER_LEN.size or bytes(view[:8]) != MAGIC:
        raise BlockVersionError(f"not a kvres session file ({view.nbytes} bytes)")
    (n_header,) = _HEADER_LEN.unpack(view[start: start + _HEADER_LEN.size])
    head = msgpack.unpackb(view[start + _HEADER_LEN.size: start + _HEADER_LEN.size + n_header], raw=False)
    return str(head["sid"]), dict(head["policy"])


def decode_session(data: bytes | bytearray | memoryview, secret: bytes | None = None) -> SessionImage:
    secret = check_secret(secret)
    view = memoryview(data)
    if view.nbytes < _PREFIX.size + _TAG or bytes(view[:8]) != MAGIC:
        raise BlockVersionError(f"not a kvres session file ({view.nbytes} bytes; magic {bytes(view[:8])!r})")
    magic, version, _reserved, rest = _PREFIX.unpack(view[: _PREFIX.size])
    if version != SESSION_FORMAT_VERSION:
        raise BlockVersionError(f"session file format {version}; this kvres reads {SESSION_FORMAT_VERSION}")
    body = view[_PREFIX.size + _TAG:]
    if body.nbytes != rest:
        raise BlockLengthError(f"session file is {'truncated' if body.nbytes < rest else 'followed by trailing bytes'}:"
                               f" {body.nbytes} bytes after its tag, its prefix says {rest}")
    tag = bytes(view[_PREFIX.size: _PREFIX.size + _TAG])
    if not tags_equal(tag, block_tag(secret, body, view[: _PREFIX.size])):
        raise BlockAuthError("session file's tag does not verify: it was altered, or written under another "
                             "cluster's secret")
    (n_header,) = _HEADER_LEN.unpack(body[: _HEADER_LEN.size])
    offset = _HEADER_LEN.size + n_header
    head = msgpack.unpackb(body[_HEADER_LEN.size: offset], raw=False)
    blocks = []
    for length in head["lengths"]:
        blocks.append(decode_block(body[offset: offset + length], secret=secret))
        offset += length
    n = int(head["n_resident"])
    return SessionImage(
        str(head["sid"]), str(head["fp"]), str(head["model_id"]), [int(t) for t in head["tokens"]],
        [Range(int(s), int(e)) for s, e in head["resident"]], dict(head["policy"]),
        None if head["logits"] is None else bytes(head["logits"]), bool(head["exact"]), blocks[:n], blocks[n:],
    )
